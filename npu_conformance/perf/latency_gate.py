"""The serving latency gate on alternating rounds: lower is better.

Rounds run clean, case, clean, case, ..., clean on one server (perf.latency), so
each case round has a clean round on each side and a load or host speed that
comes and goes falls on both alike. A case round's figure is taken over the
geometric mean of its two neighbours', and the median of those ratios is the
case's slowdown. The noise is read the same way from the clean rounds between
two others: the spread of their ratios to their neighbours, as the standard
error of a median of as many ratios as the case has. The case fails where its
slowdown is over 1 + max(slack, noise_k x noise), the throughput gate's rule.

A load that comes and goes in step with the rounds falls on one kind more than
the other (measured: a load 5 s on, 5 s off fell on rounds 3, 7, 11 and 19 of
one run, all case rounds), and one round it falls on hard (TPOT 2.5-7x) widens
the noise past any slowdown. So a round beside which the host ran something else for more than
NeighbourLimit's share of a CPU is left out, and each kept round is taken over
the nearest kept rounds of the other kind. (Not the wait for a CPU, as the
throughput gate reads: a server and its client fill 2 cores and wait for each
other, 0.65-0.95 s per s with the host to themselves, 0.94-1.02 beside a spinner.)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from npu_conformance.perf.measure import HostBusy

# The standard error of a median over that of a mean (normal errors, large n).
MEDIAN_SE = math.sqrt(math.pi / 2)


def neighbours(at: int, kept: Sequence[bool]) -> tuple[int, int] | None:
    """The nearest kept rounds of the other kind (the other parity) on each side
    of round `at`; None where `at` is left out or a side has none."""
    left = next((j for j in range(at - 1, -1, -2) if kept[j]), None)
    right = next((j for j in range(at + 1, len(kept), 2) if kept[j]), None)
    return None if not kept[at] or left is None or right is None else (left, right)


def neighbour_ratios(values: Sequence[float], at: Sequence[int], kept: Sequence[bool] | None = None) -> list[float]:
    """values[i] over the geometric mean of its neighbours' (all rounds kept:
    values[i - 1] and values[i + 1]), for each i in `at` that has them."""
    kept = [True] * len(values) if kept is None else kept
    sides = {i: neighbours(i, kept) for i in at}
    return [values[i] / math.sqrt(values[s[0]] * values[s[1]]) for i, s in sides.items() if s is not None]


@dataclass(frozen=True)
class NeighbourLimit:
    """Which rounds the gate reads (data/perf.yaml latency_rounds): those beside which
    the host ran others for at most `max_neighbour_share` CPU seconds per second,
    if at least `min_clean_share` of the case rounds are left to read."""

    max_neighbour_share: float
    min_clean_share: float


def kept_rounds(rounds: Sequence[Mapping[str, Any]], limit: NeighbourLimit | None) -> list[bool]:
    """Which rounds the gate reads: those whose `neighbour_share` is within `limit` (all, without one)."""
    if limit is None:
        return [True] * len(rounds)
    return [r.get("neighbour_share") is None or r["neighbour_share"] <= limit.max_neighbour_share for r in rounds]


def usable_case_rounds(rounds: Sequence[Mapping[str, Any]], limit: NeighbourLimit | None) -> int:
    """How many case rounds give a ratio: kept, with a kept clean round on each side."""
    kept = kept_rounds(rounds, limit)
    cases, _ = alternating_indices([r["phase"] for r in rounds])
    return sum(neighbours(i, kept) is not None for i in cases)


def alternating_indices(sequence: Sequence[str | None]) -> tuple[list[int], list[int]]:
    """The case rounds (odd places) and the clean rounds with a round on each side
    (even places but the first and last) of a clean-first alternating sequence
    (None: clean); ValueError where it does not alternate."""
    if len(sequence) < 3 or len(sequence) % 2 == 0 or any(p is not None for p in sequence[::2]):
        raise ValueError(f"latency rounds must alternate clean, case, ..., clean (odd length >= 3): {sequence}")
    return list(range(1, len(sequence), 2)), list(range(2, len(sequence) - 1, 2))


def judge_figure(values: Sequence[float], cases: Sequence[int], cleans: Sequence[int], slack: float,
                 noise_k: float, kept: Sequence[bool] | None = None) -> dict[str, Any]:
    """One figure (say TPOT p50) of the alternating rounds: the case's slowdown
    against its neighbours, the clean rounds' noise, the tolerance and whether it
    passed; rounds not `kept` are read by none of them."""
    ratios = neighbour_ratios(values, cases, kept)
    if not ratios:
        raise ValueError("no case round has a kept clean round on each side: no slowdown to read")
    slowdown = statistics.median(ratios)
    clean = neighbour_ratios(values, cleans, kept)
    noise = (MEDIAN_SE * statistics.stdev(math.log(r) for r in clean) / math.sqrt(len(ratios))
             if len(clean) >= 2 else None)
    tolerance = max(slack, noise_k * noise) if noise is not None else slack
    return {"slowdown": slowdown, "noise": noise, "tolerance": tolerance, "limit": 1 + tolerance,
            "passed": slowdown <= 1 + tolerance, "case_rounds": len(ratios), "clean_rounds_for_noise": len(clean)}


def judge(rounds: Sequence[Mapping[str, Any]], gated: Mapping[str, str], reported: Mapping[str, str],
          slack: float, noise_k: float, limit: NeighbourLimit | None = None) -> dict[str, Any]:
    """Every figure of the rounds (perf.latency's result rounds): `gated` (name ->
    the rounds' key) decide the verdict, `reported` are judged the same way and
    only shown; rounds with a neighbour past `limit` are left out, and HostBusy where
    fewer than its share of the case rounds give a ratio. Returns {verdict,
    figures: {name: judge_figure + gated}, failed: [names], left_out: {round: neighbour share}}."""
    cases, cleans = alternating_indices([r["phase"] for r in rounds])
    kept = kept_rounds(rounds, limit)
    usable = usable_case_rounds(rounds, limit)
    if limit is not None and usable < max(1.0, limit.min_clean_share * len(cases)):
        raise HostBusy(f"the host was busy: {usable} of {len(cases)} case rounds ran, with a clean round on each "
                       f"side, while the host ran others for at most {limit.max_neighbour_share:g} CPU s per s, "
                       f"and at least {limit.min_clean_share:.0%} must (data/perf.yaml latency_rounds); no "
                       f"figure is read from a host shared this much")
    figures = {}
    for name, key in {**gated, **reported}.items():
        figures[name] = {**judge_figure([float(r[key]) for r in rounds], cases, cleans, slack, noise_k, kept),
                         "gated": name in gated}
    failed = [name for name in gated if not figures[name]["passed"]]
    return {"verdict": "fail" if failed else "pass", "figures": figures, "failed": failed,
            "left_out": {i: r.get("neighbour_share") for i, r in enumerate(rounds) if not kept[i]}}


def describe(judged: Mapping[str, Any]) -> str:
    """One line per verdict: each figure's slowdown against its limit, and the rounds left out."""
    left_out = judged.get("left_out") or {}
    parts = [f"{len(left_out)} rounds left out, the host running others beside them "
             f"({', '.join(f'{w:.2f}' for w in left_out.values())} CPU s per s)"] if left_out else []
    for name, f in judged["figures"].items():
        noise = f"{f['noise']:.1%}" if f["noise"] is not None else "unknown"
        parts.append(f"{name} {f['slowdown']:.3f}x {'<=' if f['passed'] else '>'} {f['limit']:.3f} "
                     f"(noise {noise}{'' if f['gated'] else ', reported'})")
    return "; ".join(parts)
