"""The serving latency gate on alternating rounds: lower is better.

Rounds run clean, case, clean, case, ..., clean on one server (perf.latency), so
each case round has a clean round on each side and a load or host speed that
comes and goes falls on both alike. A case round's figure is taken over the
geometric mean of its two neighbours', and the median of those ratios is the
case's slowdown. The noise is read the same way from the clean rounds between
two others: the spread of their ratios to their neighbours, as the standard
error of a median of as many ratios as the case has. The case fails where its
slowdown is over 1 + max(slack, noise_k x noise), the throughput gate's rule.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

# The standard error of a median over that of a mean (normal errors, large n).
MEDIAN_SE = math.sqrt(math.pi / 2)


def neighbour_ratios(values: Sequence[float], at: Sequence[int]) -> list[float]:
    """values[i] over the geometric mean of values[i - 1] and values[i + 1], for each i in `at`."""
    return [values[i] / math.sqrt(values[i - 1] * values[i + 1]) for i in at]


def alternating_indices(sequence: Sequence[str | None]) -> tuple[list[int], list[int]]:
    """The case rounds (odd places) and the clean rounds with a round on each side
    (even places but the first and last) of a clean-first alternating sequence
    (None: clean); ValueError where it does not alternate."""
    if len(sequence) < 3 or len(sequence) % 2 == 0 or any(p is not None for p in sequence[::2]):
        raise ValueError(f"latency rounds must alternate clean, case, ..., clean (odd length >= 3): {sequence}")
    return list(range(1, len(sequence), 2)), list(range(2, len(sequence) - 1, 2))


def judge_figure(values: Sequence[float], cases: Sequence[int], cleans: Sequence[int], slack: float,
                 noise_k: float) -> dict[str, Any]:
    """One figure (say TPOT p50) of the alternating rounds: the case's slowdown
    against its neighbours, the clean rounds' noise, the tolerance and whether it passed."""
    slowdown = statistics.median(neighbour_ratios(values, cases))
    clean = neighbour_ratios(values, cleans)
    noise = (MEDIAN_SE * statistics.stdev(math.log(r) for r in clean) / math.sqrt(len(cases))
             if len(clean) >= 2 else None)
    tolerance = max(slack, noise_k * noise) if noise is not None else slack
    return {"slowdown": slowdown, "noise": noise, "tolerance": tolerance, "limit": 1 + tolerance,
            "passed": slowdown <= 1 + tolerance, "case_rounds": len(cases), "clean_rounds_for_noise": len(clean)}


def judge(rounds: Sequence[Mapping[str, Any]], gated: Mapping[str, str], reported: Mapping[str, str],
          slack: float, noise_k: float) -> dict[str, Any]:
    """Every figure of the rounds (perf.latency's result rounds): `gated` (name ->
    the rounds' key) decide the verdict, `reported` are judged the same way and
    only shown. Returns {verdict, figures: {name: judge_figure + gated}, failed: [names]}."""
    cases, cleans = alternating_indices([r["phase"] for r in rounds])
    figures = {}
    for name, key in {**gated, **reported}.items():
        figures[name] = {**judge_figure([float(r[key]) for r in rounds], cases, cleans, slack, noise_k),
                         "gated": name in gated}
    failed = [name for name in gated if not figures[name]["passed"]]
    return {"verdict": "fail" if failed else "pass", "figures": figures, "failed": failed}


def describe(judged: Mapping[str, Any]) -> str:
    """One line per verdict: each figure's slowdown against its limit."""
    parts = []
    for name, f in judged["figures"].items():
        noise = f"{f['noise']:.1%}" if f["noise"] is not None else "unknown"
        parts.append(f"{name} {f['slowdown']:.3f}x {'<=' if f['passed'] else '>'} {f['limit']:.3f} "
                     f"(noise {noise}{'' if f['gated'] else ', reported'})")
    return "; ".join(parts)
