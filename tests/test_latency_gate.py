"""The serving latency gate's arithmetic (perf.latency_gate), the stretch sizing
(perf.latency) and the delay's step phases (engines.delays), on small arrays."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from npu_conformance import perf
from npu_conformance.engines.delays import PhaseDelay, step_phase
from npu_conformance.perf import latency, latency_gate

pytestmark = pytest.mark.unit

GATED = {"tpot_p50": "tpot"}


def _rounds(clean: list[float], case: list[float], phase: str | None = "decode") -> list[dict]:
    rounds = []
    for i, c in enumerate(clean):
        rounds.append({"phase": None, "tpot": c})
        if i < len(case):
            rounds.append({"phase": phase, "tpot": case[i]})
    return rounds


def test_a_slowdown_over_the_tolerance_fails_and_the_clean_rounds_give_its_noise() -> None:
    judged = latency_gate.judge(_rounds([10, 10.2, 9.9, 10.1, 10], [12.5, 12.6, 12.4, 12.5]), GATED, {}, 0.12, 2.5)
    figure = judged["figures"]["tpot_p50"]
    assert judged["verdict"] == "fail" and judged["failed"] == ["tpot_p50"]
    assert figure["slowdown"] == pytest.approx(12.5 / math.sqrt(10.2 * 9.9), rel=0.02)
    assert figure["noise"] is not None and figure["tolerance"] == pytest.approx(0.12)


def test_the_same_figures_without_a_slowdown_pass() -> None:
    judged = latency_gate.judge(_rounds([10, 10.2, 9.9, 10.1, 10], [10.1, 9.9, 10.2, 10]), GATED, {}, 0.12, 2.5)
    assert judged["verdict"] == "pass"


def test_noisy_clean_rounds_widen_the_tolerance_and_a_reported_figure_never_decides() -> None:
    rounds = _rounds([10, 14, 8, 13, 9], [12.5, 12.6, 12.4, 12.5])
    judged = latency_gate.judge(rounds, {}, {"tpot_p99": "tpot"}, 0.12, 2.5)
    figure = judged["figures"]["tpot_p99"]
    assert figure["tolerance"] > 0.12 and not figure["gated"] and judged["verdict"] == "pass"


def test_a_load_that_comes_and_goes_falls_on_both_sides() -> None:
    # The host at half speed for the middle rounds: each case round is still 1.25x its neighbours.
    clean = [10, 10, 20, 20, 10]
    case = [12.5 * math.sqrt(a * b) / 10 for a, b in zip(clean, clean[1:])]
    assert latency_gate.judge(_rounds(clean, case), GATED, {}, 0.12, 2.5)["figures"]["tpot_p50"]["slowdown"] == \
        pytest.approx(1.25)


def _waited(rounds: list[dict], shares: dict[int, float]) -> list[dict]:
    return [{**r, "neighbour_share": shares.get(i, 0.02)} for i, r in enumerate(rounds)]


LIMIT = latency_gate.NeighbourLimit(max_neighbour_share=0.25, min_clean_share=0.25)


def test_rounds_a_neighbour_ran_beside_are_left_out_and_their_neighbours_read_the_next_kept_ones() -> None:
    # A 1.25x slowdown; a load falls hard (5x) on clean round 4 and case round 7: read
    # whole, the noise they add passes the slowdown; left out, it fails.
    clean = [10, 10.2, 50, 10.1, 9.9, 10, 10.2, 9.8, 10, 10.1, 10]
    case = [12.5, 12.4, 12.6, 60, 12.5, 12.4, 12.6, 12.5, 12.5, 12.4]
    rounds = _rounds(clean, case)
    shares = {4: 1.1, 7: 0.9}
    whole = latency_gate.judge(_waited(rounds, shares), GATED, {}, 0.12, 2.5)
    assert whole["verdict"] == "pass" and not whole["left_out"]
    judged = latency_gate.judge(_waited(rounds, shares), GATED, {}, 0.12, 2.5, LIMIT)
    figure = judged["figures"]["tpot_p50"]
    assert judged["verdict"] == "fail" and judged["left_out"] == {4: 1.1, 7: 0.9}
    assert figure["slowdown"] == pytest.approx(1.25, rel=0.02) and figure["case_rounds"] == 9
    assert latency_gate.neighbours(3, latency_gate.kept_rounds(_waited(rounds, shares), LIMIT)) == (2, 6)
    assert "2 rounds left out, the host running others beside them (1.10, 0.90 CPU s per s)" in \
        latency_gate.describe(judged)


def test_a_host_too_busy_for_enough_case_rounds_gives_no_figure() -> None:
    rounds = _rounds([10] * 5, [12.5] * 4)
    # A neighbour beside all but the first three rounds: only case round 1 keeps a
    # clean round on each side, and half must.
    waited = _waited(rounds, {i: 1.0 for i in range(3, 9)})
    limit = latency_gate.NeighbourLimit(max_neighbour_share=0.25, min_clean_share=0.5)
    assert latency_gate.usable_case_rounds(waited, limit) == 1
    with pytest.raises(perf.HostBusy, match="1 of 4 case rounds"):
        latency_gate.judge(waited, GATED, {}, 0.12, 2.5, limit)
    # Unmeasured shares (no schedstat) leave nothing out.
    assert latency_gate.usable_case_rounds(rounds, limit) == 4


@pytest.mark.parametrize("sequence", [[None, "decode"], ["decode", None, "decode"], [None, "decode", "decode"]])
def test_rounds_that_do_not_alternate_from_a_clean_one_are_refused(sequence: list) -> None:
    with pytest.raises(ValueError, match="alternate"):
        latency_gate.alternating_indices(sequence)


def test_the_stretch_makes_the_phase_figure_the_factor_longer() -> None:
    # TPOT 8 ms, decode forward 2 ms a step: 1.25x needs 2 ms more a step, a stretch of 1.
    forward = {"steps": {"decode": 100, "prefill": 4}, "forward_s": {"decode": 0.2, "prefill": 0.04}}
    assert latency.stretch_for(1.25, 8.0, forward, "decode") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no prefill step"):
        latency.stretch_for(1.25, 8.0, {"steps": {"prefill": 0}, "forward_s": {"prefill": 0.0}}, "prefill")


def test_a_step_is_decode_only_where_every_request_computes_one_token() -> None:
    assert step_phase(torch.tensor([0, 1, 2, 3])) == "decode"
    assert step_phase(torch.tensor([0, 1, 65, 66])) == "prefill"


def test_the_delay_refuses_an_unknown_phase_and_a_negative_stretch() -> None:
    delay = PhaseDelay(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown phase"):
        delay.set("sampling", 1.0)
    with pytest.raises(ValueError, match="negative"):
        delay.set("decode", -1.0)
    delay.set("decode", 0.5)
    assert delay.record()["stretch"] == 0.5 and delay.record()["steps"] == {"prefill": 0, "decode": 0}


def test_a_latency_is_gated_as_a_rate_by_the_throughput_rule() -> None:
    # Clean rounds at 8 ms TPOT with the calibration at 500 tok/s: rate 125, normalized 0.25.
    rounds = [{"phase": None, "median_tpot_ms": 8.0, "median_ttft_ms": 50.0, "calibration_tok_s": 500.0}] * 3
    rate = latency.Rate.of(rounds, "tpot", {"vllm": "1"})
    assert rate.output_tok_s == pytest.approx(125) and rate.normalized == pytest.approx(0.25)
    run = rate.as_run()
    assert run.rounds == 3 and run.calibration_tok_s == 500.0


def test_a_latency_entry_is_keyed_by_its_metric_and_an_output_entry_is_written_as_before(tmp_path) -> None:
    from npu_conformance import baselines

    key = dict(platform="cpu", device="d", mode="eager", quant="server", batch_size=16, input_len=64, output_len=32)
    run = baselines.Run(recorded_at="t", rounds=3, tok_s=125.0, normalized=0.25, calibration_tok_s=500.0)
    baselines.record("card", baselines.Key(**key, metric="tpot"), {}, run, tmp_path)
    baselines.record("card", baselines.Key(**{**key, "quant": "none"}), {}, run, tmp_path)
    loaded = baselines.load("card", tmp_path)
    assert baselines.find(loaded, baselines.Key(**key, metric="ttft"), {}) is None
    assert baselines.find(loaded, baselines.Key(**key, metric="tpot"), {}) is not None
    text = (tmp_path / "card.json").read_text()
    assert text.count('"metric"') == 1, "an output tok/s entry's key gained a field its older files lack"


def test_the_timeout_counts_every_round_the_driver_runs() -> None:
    class Spec:
        concurrency, prompts, input_len, output_len = 16, 64, 64, 32
        calibration_runs, sizing_rounds, case_rounds, detect_slowdown = 5, 3, 10, 1.25

    plan = latency.make_plan(Spec(), "http://127.0.0.1:1", {"model": "m"}, Path("c"), "decode", 60.0)
    extra = 2 * plan["extra_case_rounds"]
    assert extra > 0
    retries = latency.REFERENCE_RETRIES
    assert latency.planned_rounds(plan) == 2 + retries + latency.CORRECTIONS * 6 + 21 + extra
    assert latency.planned_rounds({**plan, "factors": {}}) == 2 + retries + 21 + extra
