"""The perf gate: a case's baseline key, its tolerance, and the verdict on a
measurement against the recorded baseline; StepDelay injects the slowdown the
gate must catch."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from npu_conformance import baselines
from npu_conformance.cards import Card, PerfSpec
from npu_conformance.perf.measure import Measurement
from npu_conformance.platforms import Platform


class Measured(Protocol):
    """What the gate reads of a measurement (perf.Measurement, perf.latency.Rate):
    a rate, higher is better, its median ratio to the calibration, the calibration's speed."""

    versions: dict[str, str]

    @property
    def output_tok_s(self) -> float: ...

    @property
    def normalized(self) -> float | None: ...

    @property
    def calibration_tok_s(self) -> float | None: ...


class Tolerances(Protocol):
    """The gate's settings (a card's PerfSpec or LatencySpec)."""

    slack: float
    noise_k: float
    detect_slowdown: float


def engine_mode(card: Card, platform: str) -> baselines.Mode:
    """Eager or graph, from the engine arguments that run (vLLM compiles unless told not to)."""
    return "eager" if card.engine_args(platform).get("enforce_eager", False) else "graph"


def quant_key(quantization: dict[str, Any]) -> str:
    """How an engine ran its quantized layers (engines.evidence.quant_path), as a
    baseline is keyed by it: none, patch:<patch>, or kernel:<vLLM's kernel classes>.
    The patch's dense layers and vLLM's kernels are different engines to time."""
    path = quantization["path"]
    if path in ("patch", "mixed"):
        return f"{path}:{quantization['patch']}"
    if path == "kernel":
        return "kernel:" + "+".join(sorted(quantization.get("kernels") or quantization["methods"]))
    return path


def baseline_key(card: Card, platform: Platform, spec: PerfSpec, batch_size: int, quant: str) -> baselines.Key:
    return baselines.Key(platform=platform.name, device=platform.perf_device, mode=engine_mode(card, platform.name),
                         quant=quant, batch_size=batch_size, input_len=spec.input_len, output_len=spec.output_len)


def tolerance(spec: Tolerances, noise: float | None) -> float:
    """`max(slack, noise_k x noise)`: the slack alone where the baseline has no noise figure."""
    return max(spec.slack, spec.noise_k * noise) if noise is not None else spec.slack


@dataclass(frozen=True)
class Gate:
    verdict: str  # "pass", "fail", or "measured" (no baseline: nothing to gate against)
    message: str
    figures: dict[str, Any]

    @property
    def passed(self) -> bool:
        return self.verdict != "fail"

    @property
    def deciding(self) -> str:
        return self.deciding_in(self.figures["gate"])

    @staticmethod
    def deciding_in(checks: dict[str, Any]) -> str:
        """The check a slowdown of the engine's own path fails: the normalized ratio
        where both sides have one (the absolute floor moves with the host)."""
        return "normalized" if "normalized" in checks else "absolute"


def _check(name: str, measured: float, base: float, noise: float | None, spec: Tolerances,
           fmt: str) -> tuple[bool, str, dict[str, Any]]:
    tol = tolerance(spec, noise)
    floor = base * (1 - tol)
    ok = measured >= floor
    noise_text = f"noise {noise:.1%}" if noise is not None else "noise unknown (too few recorded runs)"
    text = (f"{name} {measured:{fmt}} {'>=' if ok else '<'} floor {floor:{fmt}} = baseline {base:{fmt}} x (1 - "
            f"{tol:.1%}; max(slack {spec.slack:.0%}, {spec.noise_k:g} x {noise_text}))")
    return ok, text, {"measured": measured, "baseline": base, "noise": noise, "tolerance": tol, "floor": floor,
                      "ratio": measured / base, "passed": ok}


def judge(measured: Measured, entry: baselines.Entry | None, spec: Tolerances,
          record_hint: str, *, match_host_speed: bool = True, figure: str = "output tok/s") -> Gate:
    """The gate of one case, against the runs recorded at a host speed like this
    run's (Entry.at_host_speed; none at such a speed: "measured", as with no
    baseline; `match_host_speed` False for an entry from this run's own
    alternating rounds, which ran at its speed by construction). Both checks must hold, each within max(slack,
    noise_k x the baseline's noise of that figure):
    - normalized: the median of each round's tok/s over its calibration's, against the baseline's;
    - absolute: median tok/s against the baseline's, the floor lowered by as much as
      the calibration runs slower than at recording (never raised): a uniformly
      slower or loaded host does not move the verdict, a slower engine path does.
    `figure` names the rate in messages (a latency's rate: perf.latency.Rate)."""
    checks: dict[str, Any] = {}
    if entry is None:
        return Gate("measured", f"no baseline recorded for this case ({record_hint}); "
                                f"{figure} {measured.output_tok_s:.1f}, not gated", {"baseline": None, "gate": checks})
    messages = []
    chosen = None
    if match_host_speed and measured.calibration_tok_s is not None:
        near, chosen = entry.at_host_speed(measured.calibration_tok_s,
                                           baselines.settings()["baselines"]["host_speed_window"],
                                           baselines.settings()["baselines"]["min_runs_for_noise"])
        if near is None:
            return Gate("measured", f"{chosen}; {figure} {measured.output_tok_s:.1f}, not gated ({record_hint} "
                                    f"at this speed)",
                        {"baseline": None, "baseline_at_other_speeds": entry.summary(), "gate": checks})
        entry = near
    figures: dict[str, Any] = {"baseline": {**entry.summary(), "chosen_runs": chosen}, "gate": checks}
    host = 1.0
    if entry.normalized is not None and measured.normalized is not None:
        host = measured.calibration_tok_s / entry.calibration_tok_s
        checks["host"] = {"calibration_tok_s": measured.calibration_tok_s,
                          "baseline_calibration_tok_s": entry.calibration_tok_s, "speed": host}
        ok_norm, norm_text, checks["normalized"] = _check("normalized", measured.normalized, entry.normalized,
                                                          entry.noise("normalized"), spec, ".3f")
        messages += [norm_text, f"host calibration at {host:.2f}x its recorded speed"]
    ok_abs, abs_text, checks["absolute"] = _check(figure, measured.output_tok_s, entry.tok_s * min(1.0, host),
                                                  entry.noise("tok_s"), spec, ".1f")
    checks["absolute"]["host_allowance"] = min(1.0, host)
    messages.insert(0, abs_text if host >= 1 else f"{abs_text} (baseline {entry.tok_s:.1f} x host {host:.2f})")
    verdict = "pass" if ok_abs and checks.get("normalized", {}).get("passed", True) else "fail"
    # The slowdown the deciding check still lets through: it must be below the one the card must catch.
    detectable = 1 / (1 - checks[Gate.deciding_in(checks)]["tolerance"])
    checks["detectable_slowdown"] = detectable
    if detectable >= spec.detect_slowdown:
        verdict = "fail"
        messages.append(f"the baseline is too noisy to gate: a {detectable:.2f}x slowdown would pass, and "
                        f"the card must catch {spec.detect_slowdown:g}x; record more runs on a quieter host")
    if chosen:
        messages.append(chosen)
    if entry.versions != measured.versions:
        messages.append(f"baseline recorded with {entry.versions}, this run {measured.versions}")
    return Gate(verdict, "; ".join(messages), figures)


def check_lengths(measurement: Measurement, spec: PerfSpec) -> tuple[bool, str]:
    """Every request of the measured rounds had the card's exact prompt and output
    lengths: tok/s over other lengths is not the figure the gate is about."""
    expected = {(spec.input_len, spec.output_len)}
    passed = measurement.lengths == expected
    return passed, f"(prompt, generated) token counts {sorted(measurement.lengths)}, expected {expected}"


class StepDelay:
    """Wraps an engine's `step`: counts the calls, times them, and after each
    spins `stretch` times the step's own duration, so the engine's path runs
    slower by a factor whatever the host's speed does meanwhile, as a slower
    kernel would (a spin, not a sleep: a sub-millisecond sleep overshoots,
    measured 1.37x for 1.25x; and a fixed delay shrinks relative to the round
    when the host slows down, measured 1.19x for 1.25x)."""

    def __init__(self, step: Callable[[], Any]) -> None:
        self._step = step
        self.calls = 0
        self.step_s = 0.0
        self.stretch = 0.0

    def __call__(self) -> Any:
        start = time.perf_counter()
        out = self._step()
        elapsed = time.perf_counter() - start
        self.calls += 1
        self.step_s += elapsed
        end = time.perf_counter() + self.stretch * elapsed
        while time.perf_counter() < end:
            pass
        return out


def stretch_for(factor: float, round_s: float, step_s: float) -> float:
    """The stretch of each step that makes a round `factor` times as long: a
    round of `round_s` seconds spent `step_s` of them inside the engine's steps."""
    return (factor - 1) * round_s / step_s
