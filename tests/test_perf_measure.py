"""Timing a perf case (npu_conformance.perf.measure and workload): the prompts, the
rounds and their calibrations, the figures, and the rounds a busy host leaves out."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from npu_conformance import perf
from npu_conformance.host_load import SwitchingLoad

from perf_samples import KEEP_ALL, StubRunner

pytestmark = pytest.mark.unit


def test_synthetic_prompts_exact_and_fresh():
    a = perf.synthetic_prompts(50, 3, 7, seed=1)
    assert [len(p) for p in a] == [7, 7, 7] and all(0 <= t < 50 for p in a for t in p)
    assert a == perf.synthetic_prompts(50, 3, 7, seed=1)
    assert perf.fresh_prompts(1000, 2, 16) != perf.fresh_prompts(1000, 2, 16)


def test_measurement_figures():
    from types import SimpleNamespace as NS

    def out(first: float, ttft: float) -> Any:
        metrics = NS(first_token_latency=ttft, first_token_ts=first, last_token_ts=first + 0.3, num_generation_tokens=4)
        return NS(prompt_token_ids=[0] * 8, outputs=[NS(token_ids=[1] * 4)], metrics=metrics)

    m = perf.Measurement.of(2, 8, 4, [2.0, 1.0, 4.0], [[out(0, 0.05), out(0, 0.07)]], [1.0, 1.0, 2.0], 4)
    assert m.output_tok_s == 4.0 and m.total_tok_s == 12.0  # median round: 2 s
    assert m.output_tok_s_best == 8.0
    assert m.output_tok_s_overall == pytest.approx(8 * 3 / 7.0)
    assert m.calibration_tok_s == 4.0
    assert m.normalized == pytest.approx(1.0)  # per round: 4/4, 8/4, 2/2
    assert m.lengths == {(8, 4)}
    f = m.figures()
    assert f["ttft_ms_median"] == pytest.approx(60.0) and f["tpot_ms_median"] == pytest.approx(100.0)
    no_stats = perf.Measurement.of(1, 8, 4, [1.0], [[NS(prompt_token_ids=[0] * 8, outputs=[NS(token_ids=[1] * 4)],
                                                        metrics=None)]])
    assert no_stats.figures()["ttft_ms_median"] is None and no_stats.normalized is None
    assert no_stats.figures()["latency_source"].startswith("unavailable")
    assert perf.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(0.5)


def test_time_rounds_discards_warmup_and_pairs_calibration() -> None:
    from types import SimpleNamespace as NS

    runner = StubRunner()
    runs = iter([0.5, 0.5, 1.0, 2.0])
    calibration = NS(run=lambda: next(runs), tokens=4)
    m = perf.time_rounds(perf.Rounds(runner, 2, 8, 4, calibration, KEEP_ALL), rounds=3, warmup_rounds=1, versions={})
    assert len(runner.calls) == 4 and len(m.round_s) == 3
    assert m.lengths == {(8, 4)}
    # The warm-up round's calibration is dropped with it.
    assert m.calibration_s == (0.5, 1.0, 2.0) and m.calibration_tok_s == 4.0
    # Fresh prompts every round, as in the suite: prefix caching never skips a prefill.
    assert len({json.dumps(c) for c in runner.calls}) == 4


def test_alternating_rounds_take_turns_each_with_its_calibration() -> None:
    from types import SimpleNamespace as NS

    runner = StubRunner()
    calibrations = iter([1.0, 2.0, 1.0, 2.0, 1.0, 2.0])
    calibration = NS(run=lambda: next(calibrations), tokens=4)
    sides = (perf.Rounds(runner, 1, 8, 4, calibration, KEEP_ALL), perf.Rounds(runner, 1, 8, 4, calibration, KEEP_ALL))
    switched: list[int] = []
    alternating = perf.Alternating(sides, switched.append)
    for _ in range(6):
        args, _ = alternating.setup()
        alternating.one_round(*args)
    assert switched == [0, 1, 0, 1, 0, 1]
    assert [len(s.outputs) for s in sides] == [3, 3]
    assert sides[0].calibration_s == [1.0, 1.0, 1.0] and sides[1].calibration_s == [2.0, 2.0, 2.0]
    # Each pair's window runs from its calibration's start to its round's end, in turn.
    windows = sorted(sides[0].windows + sides[1].windows)
    assert windows == sorted(windows, key=lambda w: w[1]) and all(a <= b for a, b in windows)
    # As pytest-benchmark's data, timed rounds in turn: A's at even places, B's at odd.
    data = [0.5, 1.0, 0.5, 1.0]
    a, b = (side.result(data[i::2], 1, 2, {}) for i, side in enumerate(sides))
    assert a.round_s == (0.5, 0.5) and b.round_s == (1.0, 1.0)
    # Twice the round time over twice the calibration time: the same normalized figure.
    assert a.normalized == pytest.approx(b.normalized) and a.output_tok_s == 2 * b.output_tok_s


def test_contention_limit_keeps_clean_rounds_and_refuses_a_busy_host() -> None:
    from types import SimpleNamespace as NS

    limit = perf.ContentionLimit(max_wait_share=0.3, min_clean_share=0.5)
    assert limit.clean([0.0, 0.3, 0.31, None]) == [True, True, False, True]
    limit.check([0.0, 0.9, 0.1, 0.9])
    with pytest.raises(perf.HostBusy, match="3 of 4 rounds waited for a CPU more than 0.3 s per s"):
        limit.check([0.0, 0.9, 0.8, 0.7])
    # The measurement reads the clean rounds only, and keeps the others' shares as evidence.
    calibrations = iter([1.0] * 5)
    rounds = perf.Rounds(StubRunner(), 1, 8, 4, NS(run=lambda: next(calibrations), tokens=4), limit)
    for _ in range(5):
        args, _ = rounds.setup()
        rounds.one_round(*args)
    rounds.wait_shares[:] = [0.9, 0.0, 0.9, 0.1, 0.0]  # the first is the warm-up round
    m = rounds.result([1.0, 5.0, 1.0, 1.0], warmup_rounds=1, rounds=4, versions={})
    assert m.round_s == (1.0, 1.0, 1.0) and m.wait_shares == (0.0, 0.1, 0.0) and m.left_out == (0.9,)
    assert m.figures()["contention"] == {"rounds_left_out": 1, "left_out_wait_shares": [0.9],
                                         "max_wait_share_kept": 0.1, "measured": True}
    rounds.wait_shares[:] = [0.0, 0.9, 0.9, 0.9, 0.0]
    with pytest.raises(perf.HostBusy):
        rounds.result([1.0] * 4, warmup_rounds=1, rounds=4, versions={})


def test_load_figures() -> None:
    assert perf.load_figures(None, [(0.0, 1.0)]) is None
    with SwitchingLoad() as load:
        load.switch(True)
        start = time.monotonic()
        time.sleep(0.2)
        load.switch(False)
        time.sleep(0.2)
        end = time.monotonic()
    figures = perf.load_figures(load, [(start, end)])
    assert figures["on_fraction"] == pytest.approx(0.5, abs=0.15) and figures["load"] == load.describe()
