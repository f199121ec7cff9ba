"""A slower path on the server, for the latency gate's self-test: the real engine,
its prefill or its decode steps made longer, as a slower kernel of that phase would.

Installed in every worker through the worker extension (the server's
`/collective_rpc`, in vLLM's dev mode), it wraps `model.forward`: a step is a
decode step when every request in it computes one token, a prefill step
otherwise (engines.faults reads the step's requests the same way). Each step's
forward time is kept per phase, so the caller can size the stretch that makes
a latency figure the wanted factor longer; after a step of the chosen phase it
sleeps `stretch` times that step's own time. A sleep, not a spin (unlike the
offline self-test's perf.gate.StepDelay): a slower device kernel leaves the host's
CPU to the server's other processes while it waits, and on 2 cores a spin took
that CPU from them: measured on synthetic-llama, the spin's TPOT slowdown read
1.12-1.27x for a sized 1.25x (once passing the gate), the sleep's 1.26-1.39x.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from npu_conformance import vllm_api
from npu_conformance.engines.faults import query_start_loc

PHASES = ("prefill", "decode")


def step_phase(starts: torch.Tensor) -> str:
    """"decode" where each request of the step (offsets `starts`, [requests + 1]) computes one token."""
    lengths = starts[1:] - starts[:-1]
    return "decode" if bool((lengths <= 1).all()) else "prefill"


class PhaseDelay:
    """Wraps a model's forward; `set` chooses the phase and stretch, `record` says
    what ran since the last `set`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._forward = model.forward
        self.phase: str | None = None
        self.stretch = 0.0
        self._reset()
        model.forward = self

    def _reset(self) -> None:
        self.steps = dict.fromkeys(PHASES, 0)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.waited_s = 0.0

    def set(self, phase: str | None, stretch: float) -> None:
        if phase is not None and phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r} (known: {', '.join(PHASES)})")
        if stretch < 0:
            raise ValueError(f"stretch {stretch} is negative")
        self.phase, self.stretch = phase, stretch
        self._reset()

    def record(self) -> dict[str, Any]:
        return {"phase": self.phase, "stretch": self.stretch, "steps": dict(self.steps),
                "forward_s": dict(self.seconds), "waited_s": self.waited_s}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = self._forward(*args, **kwargs)
        elapsed = time.perf_counter() - start
        starts = query_start_loc(vllm_api.attention_metadata())
        if starts is None:  # a profiling or dummy step
            return out
        phase = step_phase(starts.to("cpu"))
        self.steps[phase] += 1
        self.seconds[phase] += elapsed
        if phase == self.phase and self.stretch:
            wait_start = time.perf_counter()
            time.sleep(self.stretch * elapsed)
            self.waited_s += time.perf_counter() - wait_start
        return out
