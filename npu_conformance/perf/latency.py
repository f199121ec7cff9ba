"""Serving latency in a process of its own: rounds of `vllm bench serve` against
the suite's server, each round's TTFT and TPOT percentiles, with a slower
prefill or decode path switched on for some rounds (engines.delays, through the
server's /collective_rpc) and the host-speed calibration after every round.

The suite's side (latency_command, run_latency) writes the plan, starts this
module as `python -m npu_conformance.perf.latency PLAN`, and reads back the one
line it prints after RESULT_LINE. The plan's rounds say which phase to slow and
by what factor of which figure; the stretch that gives that factor is sized here,
from the sizing rounds' figures and the forward time the server kept per phase:
a phase's share of a request's latency differs by host and engine.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import httpx

from npu_conformance import baselines, contention, process, vllm_api
from npu_conformance.cards import Card, LatencySpec
from npu_conformance.perf.calibration import Calibration
from npu_conformance.perf.gate import engine_mode
from npu_conformance.perf.latency_gate import NeighbourLimit, kept_rounds, neighbour_ratios, usable_case_rounds
from npu_conformance.platforms import Platform

LATENCY_MODULE = "npu_conformance.perf.latency"
# The server's key, as vllm bench serve reads it; the delay switch sends the same.
API_KEY_ENV = "OPENAI_API_KEY"
RESULT_LINE = "npu-conformance latency rounds:"
RESULT = re.compile(re.escape(RESULT_LINE) + r" (\{.*\})$", re.MULTILINE)
# vllm bench serve's result keys for the figures the gate reads, per metric.
FIGURES = {"ttft": ("median_ttft_ms", "p99_ttft_ms"), "tpot": ("median_tpot_ms", "p99_tpot_ms")}
# The figure a phase's slower path lengthens: prefill the first token, decode the tokens after it.
METRIC_OF_PHASE = {"prefill": "ttft", "decode": "tpot"}
# Corrections of the injected stretch by trial rounds (main says why).
CORRECTIONS = 2
# Clean rounds more, at most, while a neighbour ran beside the sizing's reference round.
REFERENCE_RETRIES = 3
# What the gate decides on (the medians), and what it judges alike and only reports:
# a round's p99 is its one or two slowest requests of 64.
GATED = {f"{metric}_p50": keys[0] for metric, keys in FIGURES.items()}
REPORTED = {f"{metric}_p99": keys[1] for metric, keys in FIGURES.items()}


@dataclass(frozen=True)
class Rate:
    """A latency figure of clean rounds as the throughput gate reads a measurement
    (perf.gate.Measured): the rate 1000 / its p50 in ms (a TTFT as first tokens per
    second, a TPOT as tokens per second of one request), so a 1.25x longer latency
    is a 0.8x rate; the median over rounds, and the median of each round's rate over
    the calibration's tok/s after that round."""

    rounds: tuple[tuple[float, float | None], ...]  # (p50 in ms, calibration tok/s) per clean round
    versions: dict[str, str]

    @classmethod
    def of(cls, rounds: Sequence[Mapping[str, Any]], metric: str, versions: dict[str, str]) -> "Rate":
        key = FIGURES[metric][0]
        return cls(tuple((float(r[key]), r["calibration_tok_s"]) for r in rounds if r["phase"] is None), versions)

    @property
    def output_tok_s(self) -> float:
        return statistics.median(1000 / ms for ms, _ in self.rounds)

    @property
    def calibration_tok_s(self) -> float | None:
        speeds = [c for _, c in self.rounds if c is not None]
        return statistics.median(speeds) if speeds else None

    @property
    def normalized(self) -> float | None:
        ratios = [1000 / ms / c for ms, c in self.rounds if c is not None]
        return statistics.median(ratios) if ratios else None

    def as_run(self) -> baselines.Run:
        return baselines.Run(recorded_at=baselines.now(), rounds=len(self.rounds), tok_s=self.output_tok_s,
                             normalized=self.normalized, calibration_tok_s=self.calibration_tok_s)


def latency_key(card: Card, platform: Platform, spec: LatencySpec, metric: str) -> baselines.Key:
    """The baseline key of a card's serving latency `metric` (ttft, tpot) at `spec`'s
    concurrency and lengths. `quant` is "server": the server's quantization path is
    not observed (an engine's is, perf.quant_key), only the card's."""
    return baselines.Key(platform=platform.name, device=platform.perf_device, mode=engine_mode(card, platform.name),
                         quant="server", batch_size=spec.concurrency, input_len=spec.input_len,
                         output_len=spec.output_len, metric=metric)


def bench_args(plan: Mapping[str, Any]) -> list[str]:
    """`vllm bench serve` arguments for one round of the plan: the card's lengths,
    exact (random dataset, no range, EOS ignored), at the plan's concurrency."""
    return ["--backend", "vllm", "--base-url", plan["base_url"], "--model", plan["model"],
            *(["--served-model-name", plan["served_model_name"]] if plan.get("served_model_name") else []),
            "--tokenizer", plan["tokenizer"], "--dataset-name", "random",
            "--random-input-len", str(plan["input_len"]), "--random-output-len", str(plan["output_len"]),
            "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(plan["prompts"]),
            "--max-concurrency", str(plan["concurrency"]), "--seed", str(plan["seed"]),
            "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50,99", "--disable-tqdm",
            *(["--trust-remote-code"] if plan.get("trust_remote_code") else [])]


def stretch_for(factor: float, figure_ms: float, forward: Mapping[str, Any], phase: str) -> float:
    """The stretch of each `phase` step that makes `figure_ms` (that phase's figure,
    METRIC_OF_PHASE) `factor` times as long: one such step per token of that figure,
    its mean forward time from the delay's record (`steps`, `forward_s`)."""
    steps = forward["steps"][phase]
    if not steps:
        raise ValueError(f"the sizing rounds ran no {phase} step: nothing to stretch")
    return (factor - 1) * figure_ms / 1000 / (forward["forward_s"][phase] / steps)


def make_plan(spec: LatencySpec, base_url: str, options: Mapping[str, Any], calibration: Path, phase: str | None,
              request_timeout_s: float, server_pid: int | None = None) -> dict[str, Any]:
    """The rounds of one case on the server at `base_url` (started with `options`,
    its process tree under `server_pid`: what else the host ran, each round reads):
    `spec`'s settings, clean rounds alternating with `phase`'s (None:
    the control, clean throughout), that phase sized to `spec.detect_slowdown`."""
    names = options.get("served_model_name")
    return {"base_url": base_url, "server_pid": server_pid, "model": options["model"], "tokenizer": options.get("tokenizer", options["model"]),
            "served_model_name": names if isinstance(names, str) else (names[0] if names else None),
            "trust_remote_code": options.get("trust_remote_code", False),
            "concurrency": spec.concurrency, "prompts": spec.prompts, "input_len": spec.input_len,
            "output_len": spec.output_len, "seed": 0, "request_timeout_s": request_timeout_s,
            "calibration": str(calibration), "calibration_runs": spec.calibration_runs,
            "sizing_rounds": spec.sizing_rounds, "factors": {phase: spec.detect_slowdown} if phase else {},
            "sequence": [None, phase] * spec.case_rounds + [None], "case_rounds": spec.case_rounds,
            **_round_settings()}


def _round_settings() -> dict[str, Any]:
    """data/perf.yaml's latency_rounds: the neighbour limit and how many case rounds may be added."""
    settings = dict(baselines.settings()["latency_rounds"])
    return {"extra_case_rounds": settings.pop("extra_case_rounds"), "neighbours": settings}


def planned_rounds(plan: Mapping[str, Any]) -> int:
    """How many rounds main runs for `plan` at most: a warm-up and a clean round (and
    its retries), the trial rounds of each correction of each slowed phase (one
    clean after each), the sequence, and the case and clean rounds added for those
    a busy host left out."""
    return (2 + REFERENCE_RETRIES + len(plan["factors"]) * CORRECTIONS * 2 * plan["sizing_rounds"]
            + len(plan["sequence"]) + 2 * plan["extra_case_rounds"])


def latency_command(plan_path: Path) -> list[str]:
    return [sys.executable, "-m", LATENCY_MODULE, str(plan_path)]


def run_latency(plan: Mapping[str, Any], env: Mapping[str, str], timeout_s: float) -> dict[str, Any]:
    """Run the plan in its own process group (process.run_in_group), killed whole
    at the deadline: {"sizing": [rounds], "stretch": {phase: stretch}, "rounds": [rounds]}. A failure
    raises with the output's tail."""
    with tempfile.TemporaryDirectory(prefix="latency-") as folder:
        path = Path(folder) / "plan.json"
        path.write_text(json.dumps(plan), encoding="utf-8")
        returncode, out = process.run_in_group(latency_command(path), env, timeout_s, "vllm bench serve rounds")
    if returncode:
        raise RuntimeError(f"vllm bench serve rounds exited {returncode}:\n{out[-3000:]}")
    found = RESULT.search(out)
    if found is None:
        raise ValueError(f"no '{RESULT_LINE}' line after vllm bench serve rounds:\n{out[-3000:]}")
    return json.loads(found.group(1))


class _Server:
    """The server's delay switch (engines.worker's conformance_delay over /collective_rpc)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = base_url + "/collective_rpc"
        self.client = httpx.Client(timeout=timeout_s, trust_env=False, headers=headers)

    def delay(self, phase: str | None, stretch: float) -> dict[str, Any]:
        """Switch to `phase` at `stretch`; what the worker ran since the last switch."""
        reply = self.client.post(self.url, json={"method": "conformance_delay",
                                                 "args": [phase or "none", repr(stretch)]})
        if reply.status_code != 200:
            raise RuntimeError(f"POST /collective_rpc conformance_delay: {reply.status_code} {reply.text[:500]}")
        return reply.json()["results"][0]


def _others(server_pid: int | None) -> contention.Others:
    """What the host ran besides the server's process tree and this one (the client and the calibration)."""
    return contention.Others([contention.Contention(),
                              *([contention.Contention(server_pid)] if server_pid else [])])


def _round(server: _Server, args: list[str], phase: str | None, stretch: float,
           calibration: Calibration | None, calibration_runs: int, others: contention.Others) -> dict[str, Any]:
    started, others_before = time.monotonic(), others.ran_s()
    server.delay(phase, stretch)
    result = vllm_api.run_serve_benchmark(args)
    ran = server.delay(None, 0.0)
    if result.get("failed"):
        raise RuntimeError(f"{result['failed']} of {result['completed'] + result['failed']} requests failed: "
                           f"{[e for e in result.get('errors', []) if e][:3]}")
    figures = {key: float(result[key]) for keys in FIGURES.values() for key in keys}
    cal = (calibration.tokens / statistics.median(calibration.run() for _ in range(calibration_runs))
           if calibration else None)
    return {"phase": phase, "stretch": stretch, **figures, "output_tok_s": float(result["output_throughput"]),
            "completed": result["completed"], "forward": ran, "calibration_tok_s": cal,
            "neighbour_share": contention.share(others_before, others.ran_s(), time.monotonic() - started)}


def main(argv: list[str] | None = None) -> None:
    plan = json.loads(Path((sys.argv[1:] if argv is None else argv)[0]).read_text(encoding="utf-8"))
    server = _Server(plan["base_url"], os.environ.get(API_KEY_ENV), plan["request_timeout_s"])
    others = _others(plan.get("server_pid"))
    args = bench_args(plan)
    calibration = None
    if plan.get("calibration"):
        spec = baselines.settings()["calibration"]
        calibration = Calibration(Path(plan["calibration"]), vllm_api.current_platform().device_type,
                                  spec["batch_size"], spec["input_len"], spec["output_len"], spec["warmup_rounds"])
    # Sized from a clean round's figure and forward time, then corrected twice, each
    # time by the achieved slowdown of `sizing_rounds` trial rounds between clean ones
    # (the gate's own estimate): a figure is more than its steps (the server's other
    # work overlaps them, a sleep overshoots), so the first size read 1.2-1.8x for
    # 1.25x, and one correction from 3 noisy trials still left 1.26-1.50x.
    def measure(phase: str | None, stretch: float) -> dict[str, Any]:
        return _round(server, args, phase, stretch, calibration, plan["calibration_runs"], others)

    # The first round after the server idled reads apart from the next: a warm-up, not a reference.
    measure(None, 0.0)
    # Rounds a neighbour ran beside size nothing (latency_gate): a loaded reference
    # or trial read 2.6x for 1.25x. A clean round more while the reference had one.
    limit = NeighbourLimit(**plan["neighbours"])
    sizing, stretch = [measure(None, 0.0)], {}
    for _ in range(REFERENCE_RETRIES):
        if kept_rounds(sizing[-1:], limit)[0]:
            break
        sizing.append(measure(None, 0.0))
    reference = sizing[-1]
    for phase, factor in plan["factors"].items():
        key = FIGURES[METRIC_OF_PHASE[phase]][0]
        stretch[phase] = stretch_for(factor, reference[key], reference["forward"], phase)
        for _ in range(CORRECTIONS):
            trial = [sizing[-1]]
            for _ in range(plan["sizing_rounds"]):
                trial += [measure(phase, stretch[phase]), measure(None, 0.0)]
            sizing += trial[1:]
            ratios = neighbour_ratios([r[key] for r in trial], range(1, len(trial), 2), kept_rounds(trial, limit))
            if not ratios:
                continue
            achieved = statistics.median(ratios)
            scale = (factor - 1) / (achieved - 1) if achieved > 1 else 3.0
            stretch[phase] *= min(max(scale, 0.5), 3.0)
    rounds = [measure(phase, stretch[phase] if phase else 0.0) for phase in plan["sequence"]]
    # While fewer than the plan's case rounds can be read, a case and a clean round more.
    case = plan["sequence"][1]
    for _ in range(plan["extra_case_rounds"]):
        if usable_case_rounds(rounds, limit) >= plan["case_rounds"]:
            break
        rounds += [measure(case, stretch[case] if case else 0.0), measure(None, 0.0)]
    print(f"{RESULT_LINE} {json.dumps({'sizing': sizing, 'stretch': stretch, 'rounds': rounds})}", flush=True)


if __name__ == "__main__":
    main()
