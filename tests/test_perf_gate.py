"""The perf gate (npu_conformance.perf.gate): tolerance from the recorded noise, the
host-speed normalization, the runs it reads, and the step delay the self-test injects."""

from __future__ import annotations

import time

import pytest

from npu_conformance import baselines, perf

from perf_samples import sample_entry, sample_measurement, sample_spec

pytestmark = pytest.mark.unit


def test_baseline_median_and_noise():
    e = sample_entry([100.0, 104.0, 96.0, 98.0, 102.0])
    assert e.tok_s == 100.0
    assert e.noise("tok_s") == pytest.approx(0.04)  # (104 - 96) / 2 / 100
    assert sample_entry([100.0, 90.0]).noise("tok_s") is None  # too few runs to say
    assert perf.tolerance(sample_spec(), 0.04) == pytest.approx(0.1)  # slack wins
    assert perf.tolerance(sample_spec(), 0.06) == pytest.approx(0.12)  # 2 x noise wins
    assert perf.tolerance(sample_spec(), None) == 0.1


def test_gate_absolute_only():
    entry = sample_entry([100.0, 100.0, 100.0])
    ok = perf.judge(sample_measurement([0.04] * 3), entry, sample_spec(), "hint")  # 100 tok/s
    assert ok.verdict == "pass" and ok.deciding == "absolute"
    assert ok.message.startswith("output tok/s 100.0 >= floor 90.0 = baseline 100.0 x (1 - 10.0%")
    slow = perf.judge(sample_measurement([0.05] * 3), entry, sample_spec(), "hint")  # 80 tok/s: a 1.25x slowdown
    assert slow.verdict == "fail" and not slow.figures["gate"]["absolute"]["passed"]
    assert slow.figures["gate"]["absolute"]["ratio"] == pytest.approx(0.8)
    none = perf.judge(sample_measurement([0.05] * 3), None, sample_spec(), "record it so")
    assert none.verdict == "measured" and none.passed and "record it so" in none.message


def test_gate_follows_the_host_and_catches_the_engine():
    # Recorded: 100 tok/s while the calibration made 50 tok/s (normalized 2.0).
    entry = sample_entry([100.0] * 3, [2.0] * 3, [50.0] * 3)
    # The whole host at 0.8x (within host_speed_window): both slow alike, the ratio holds, the absolute
    # floor follows the host.
    loaded = perf.judge(sample_measurement([0.05] * 3, [0.1] * 3), entry, sample_spec(), "")
    assert loaded.verdict == "pass", loaded.message
    assert loaded.figures["gate"]["host"]["speed"] == 0.8 and loaded.figures["gate"]["absolute"]["floor"] == 72.0
    assert "(baseline 100.0 x host 0.80)" in loaded.message
    # A faster host never raises the absolute floor.
    fast = perf.judge(sample_measurement([0.032] * 3, [0.064] * 3), entry, sample_spec(), "")
    assert fast.figures["gate"]["absolute"]["floor"] == 90.0 and fast.verdict == "pass"
    # The engine alone 1.25x slower: the ratio drops 20%, and so does the absolute figure.
    slowed = perf.judge(sample_measurement([0.05] * 3, [0.08] * 3), entry, sample_spec(), "")
    assert slowed.verdict == "fail" and slowed.deciding == "normalized"
    assert not slowed.figures["gate"]["normalized"]["passed"] and not slowed.figures["gate"]["absolute"]["passed"]
    # The absolute figure short while the calibration ran at speed: a failure, whatever the ratio says.
    short = perf.judge(sample_measurement([0.05] * 3, [0.1] * 3), sample_entry([100.0] * 3, [1.6] * 3, [40.0] * 3), sample_spec(), "")
    assert short.figures["gate"]["normalized"]["passed"] and not short.figures["gate"]["absolute"]["passed"]
    assert short.verdict == "fail"


def test_gate_reads_the_runs_recorded_at_this_host_speed():
    # One host at two speeds: the normalized figure 2.0 at calibration 50, 2.4 at 85 (its drift between them).
    entry = sample_entry([100.0] * 3 + [204.0] * 3, [2.0] * 3 + [2.4] * 3, [50.0] * 3 + [85.0] * 3)
    window = baselines.settings()["baselines"]["host_speed_window"]
    slow, why = entry.at_host_speed(48.0, window, 3)
    assert slow.normalized == 2.0 and len(slow.runs) == 3 and why.startswith("the 3 of 6 recorded runs nearest")
    # At the faster speed an engine 1.25x slower (normalized 1.92) fails against that speed's runs
    # (floor 2.4 x 0.9); against all six (median 2.2, noise 9%: floor 2.2 x (1 - 18%) = 1.80) it would pass.
    slowed = perf.judge(sample_measurement([4 / 163.2] * 3, [4 / 85] * 3), entry, sample_spec(), "")
    assert slowed.figures["baseline"]["normalized"] == 2.4 and slowed.figures["baseline"]["runs"] == 3
    assert slowed.figures["gate"]["normalized"]["floor"] == pytest.approx(2.16)
    assert slowed.verdict == "fail" and not slowed.figures["gate"]["normalized"]["passed"], slowed.message
    assert "the 3 of 6 recorded runs nearest in host speed" in slowed.message
    # Between two recorded speeds, both within the window: the nearest runs only, not both mixed.
    between = sample_entry([100.0] * 3 + [120.0] * 3, [2.0] * 3 + [2.4] * 3, [50.0] * 3 + [60.0] * 3)
    near, _ = between.at_host_speed(56.0, window, 3)
    assert near.normalized == 2.4 and near.noise("normalized") == 0.0
    # The nearest three straddling this speed (as in CI at 575 tok/s: two runs at 457, one at 730): the
    # nearest run's side only, not the mixed three.
    straddled = sample_entry([100.0, 100.0, 160.0, 160.0], [2.0, 2.0, 2.4, 2.4], [45.0, 45.0, 73.0, 76.0])
    side, why = straddled.at_host_speed(57.0, window, 3)
    assert [r.calibration_tok_s for r in side.runs] == [45.0, 45.0] and side.normalized == 2.0, why
    assert "on one side of this run's" in why
    above, _ = straddled.at_host_speed(66.0, window, 3)
    assert [r.calibration_tok_s for r in above.runs] == [73.0, 76.0]
    # A speed no run was recorded at: no baseline gates it (against all six the slowed run would pass).
    alone, why = entry.at_host_speed(200.0, window, 3)
    assert alone is None and why.startswith("no recorded run at a host speed within")
    unseen = perf.judge(sample_measurement([4 / 384] * 3, [4 / 200] * 3), entry, sample_spec(), "record it so")
    assert unseen.verdict == "measured" and unseen.figures["baseline"] is None, unseen.message
    assert "no recorded run at a host speed" in unseen.message and "record it so" in unseen.message
    assert unseen.figures["baseline_at_other_speeds"]["runs"] == 6
    # Runs without a calibration (hand-measured seeds) are taken as they are.
    assert sample_entry([100.0] * 3).at_host_speed(50.0, window, 3) == (sample_entry([100.0] * 3), None)


def test_gate_refuses_a_baseline_too_noisy_to_catch_the_slowdown():
    noisy = sample_entry([100.0, 80.0, 120.0])  # +-20%: tolerance 40%
    gate = perf.judge(sample_measurement([0.04] * 3), noisy, sample_spec(), "")
    assert gate.verdict == "fail" and "too noisy to gate" in gate.message
    assert gate.figures["gate"]["detectable_slowdown"] == pytest.approx(1 / 0.6)


def test_gate_names_other_versions():
    gate = perf.judge(sample_measurement([0.04] * 3), sample_entry([100.0] * 3, versions={"vllm": "0"}), sample_spec(), "")
    assert gate.verdict == "pass" and "baseline recorded with {'vllm': '0'}, this run {'vllm': '1'}" in gate.message


def test_step_delay_and_its_size():
    wrapped = perf.StepDelay(lambda: time.sleep(0.004) or "out")
    assert wrapped() == "out" and wrapped.calls == 1 and 0.004 <= wrapped.step_s < 0.05
    wrapped.stretch = 0.5
    start = time.perf_counter()
    wrapped()
    # The step's own time, then half as long again.
    assert 0.006 <= time.perf_counter() - start < 0.1
    # A 0.1 s round that spent 0.08 s in its steps: each step 1.3125x makes the round 1.25x.
    assert perf.stretch_for(1.25, 0.1, 0.08) == pytest.approx(0.3125)
    assert perf.stretch_for(1.0, 0.1, 0.08) == 0.0
