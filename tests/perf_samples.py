"""Sample perf data for the unit tests of the gate, the baselines and the rounds:
a card's perf settings, a baseline key and entry, a measurement, and a stub runner."""

from __future__ import annotations

from typing import Any

from npu_conformance import baselines, perf
from npu_conformance.cards import PerfSpec


def sample_spec(**kw: Any) -> PerfSpec:
    return PerfSpec(**{"batch_sizes": (1, 4), "input_len": 8, "output_len": 4, "rounds": 3, "warmup_rounds": 1,
                       "slack": 0.1, "noise_k": 2.0, "detect_slowdown": 1.25, **kw})


KEY = baselines.Key(platform="cpu", device="X [avx2]", mode="eager", quant="none", batch_size=1, input_len=8,
                    output_len=4)


def sample_entry(tok_s: list[float], normalized: list[float] | None = None, calibration: list[float] | None = None,
           versions: dict[str, str] | None = None, at: str = "2026-12-03T00:00:00+00:00") -> baselines.Entry:
    runs = tuple(baselines.Run(recorded_at=at, rounds=20, tok_s=t, normalized=(normalized or [None] * len(tok_s))[i],
                               calibration_tok_s=(calibration or [None] * len(tok_s))[i]) for i, t in enumerate(tok_s))
    return baselines.Entry(key=KEY, versions=versions or {"vllm": "1"}, source="test", runs=runs)


def sample_measurement(round_s: list[float], calibration_s: list[float] | None = None) -> perf.Measurement:
    # batch 1 x 4 tokens per round; the calibration makes 4 tokens per run.
    return perf.Measurement.of(1, 8, 4, round_s, [], calibration_s or (), 4 if calibration_s else 0, {"vllm": "1"})


class StubRunner:
    """Just what Rounds uses of a VllmRunner: outputs of the requested lengths."""

    vocab_size = 100

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        from types import SimpleNamespace as NS

        self.calls.append(prompts)
        return [NS(prompt_token_ids=p, outputs=[NS(token_ids=[0] * params.max_tokens)], metrics=None) for p in prompts]


# Keeps every round: the wait shares of a stub round are this test process's, which
# a busy host (another xdist worker, a CI neighbour) would otherwise leave out.
KEEP_ALL = perf.ContentionLimit(max_wait_share=float("inf"), min_clean_share=0.0)
