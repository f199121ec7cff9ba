"""The serving latency gate: TTFT and TPOT at the card's concurrency, on the
card's real server, from `vllm bench serve` rounds in a process of their own
(perf.latency).

- The control (every round clean) is the card's latency of this session: gated
  against the baseline recorded for this device (TTFT and TPOT as rates,
  perf.latency.Rate, by the throughput gate's rule, perf.judge) and recorded with
  --perf-record; its rounds, judged as case against their neighbours, must pass.
- A 1.25x slower decode path must fail TPOT, and a 1.25x slower prefill path must
  fail TTFT and pass TPOT, against the clean rounds they alternate with
  (perf.latency_gate).
Rounds beside which the host ran something else are left out of both (a busy
host: too few left gives no verdict, as the throughput gate's does). With
--perf-load they run under its switching load, as the throughput cases do.
Each case goes to perf_report.json and report.md section 7.5."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from npu_conformance import baselines, perf
from npu_conformance.cards import Card, LatencySpec
from npu_conformance.perf import latency, latency_gate
from npu_conformance.platforms import Platform
from npu_conformance.plugin import ConformanceSession

# Under --perf-load's switching load where it is given, as the throughput cases.
pytestmark = pytest.mark.usefixtures("host_load")


def _record_hint(card: Card) -> str:
    return (f"record one with `pytest -m perf --model {card.base_name} -k latency --perf-record`, "
            f"run at least 3 times")


def _recorded_gates(card: Card, platform: Platform, spec: LatencySpec, rounds: list[dict[str, Any]],
                    versions: dict[str, str], card_baselines: Callable[[str], baselines.BaselineFile],
                    pytestconfig: pytest.Config) -> dict[str, Any]:
    """Each metric of the clean session against its recorded baseline; recorded
    where --perf-record asks and the gate did not fail."""
    gates = {}
    for metric in latency.FIGURES:
        rate = latency.Rate.of(rounds, metric, versions)
        key = latency.latency_key(card, platform, spec, metric)
        gate = perf.judge(rate, baselines.find(card_baselines(card.base_name), key, versions), spec,
                          _record_hint(card), figure=f"{metric} rate (1000 / p50 ms)")
        gates[metric] = {"verdict": gate.verdict, "message": gate.message, "p50_ms": 1000 / rate.output_tok_s,
                         **gate.figures}
        if pytestconfig.getoption("perf_record") and gate.verdict != "fail":
            gates[metric]["recorded_to"] = str(baselines.record(card.base_name, key, versions, rate.as_run(),
                                                                pytestconfig.getoption("perf_baselines")))
    return gates


@pytest.mark.perf
@pytest.mark.serving
@pytest.mark.xdist_group("perf")
def test_latency_gate(latency_spec: LatencySpec, card: Card, platform: Platform, latency_case: tuple[str, str],
                      latency_served: tuple[Any, dict[str, Any]], calibration_checkpoint: Path,
                      versions: dict[str, str], card_baselines: Callable[[str], baselines.BaselineFile],
                      perf_report: perf.PerfReport, request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                      conformance: ConformanceSession) -> None:
    kind = latency_case[1]
    phase = None if kind == "control" else kind
    process, options = latency_served
    timeout = float(pytestconfig.getoption("request_timeout"))
    plan = latency.make_plan(latency_spec, process.base_url, options, calibration_checkpoint, phase, timeout,
                               process.pid)
    ran = latency.run_latency(plan, {**process.env, latency.API_KEY_ENV: process.api_key or ""},
                              timeout * latency.planned_rounds(plan))
    limit = latency_gate.NeighbourLimit(**plan["neighbours"])
    try:
        judged = latency_gate.judge(ran["rounds"], latency.GATED, latency.REPORTED, latency_spec.slack,
                                    latency_spec.noise_k, limit)
    except perf.HostBusy as busy:
        conformance.unavailable(card, f"{card.name} serving latency ({kind}): {busy}")
    kept = [r for r, k in zip(ran["rounds"], latency_gate.kept_rounds(ran["rounds"], limit)) if k]
    recorded = (_recorded_gates(card, platform, latency_spec, kept, versions, card_baselines, pytestconfig)
                if phase is None else {})
    band = baselines.settings()["latency_self_test"]["achieved_band"]
    message = "; ".join([f"against the alternating clean rounds: {latency_gate.describe(judged)}",
                         *(f"{m} against the baseline recorded for {platform.perf_device}: {g['message']}"
                           for m, g in recorded.items())])
    verdicts = [judged["verdict"], *(g["verdict"] for g in recorded.values())]
    perf_report.add_case(request.node.nodeid, {
        "card": card.name, "concurrency": latency_spec.concurrency, "prompts": latency_spec.prompts,
        "input_len": latency_spec.input_len, "output_len": latency_spec.output_len,
        "latency": {"case": kind, "factor": latency_spec.detect_slowdown if phase else 1.0,
                    "stretch": ran["stretch"], "judged": judged, "recorded": recorded, "rounds": ran["rounds"],
                    "sizing": ran["sizing"], "achieved_band": band if phase else None},
        "expected_verdict": "fail" if phase else "pass"},
        "fail" if "fail" in verdicts else "measured" if "measured" in verdicts else "pass", message)
    if phase is None:
        assert judged["verdict"] == "pass", f"the control (no delay) failed against its own clean rounds: {message}"
        assert all(g["verdict"] != "fail" for g in recorded.values()), message
        if any(g["verdict"] == "measured" for g in recorded.values()) and not pytestconfig.getoption("perf_record"):
            conformance.unavailable(card, f"no serving latency baseline for {card.name} on "
                                          f"{platform.perf_device}: {message}")
        return
    decided = f"{latency.METRIC_OF_PHASE[phase]}_p50"
    achieved = judged["figures"][decided]["slowdown"]
    assert band[0] <= achieved <= band[1], (
        f"the injected {latency_spec.detect_slowdown:g}x {phase} slowdown achieved {achieved:.2f}x on {decided}, "
        f"outside {band[0]:g}-{band[1]:g}x (data/perf.yaml latency_self_test): the self-test did not test the "
        f"slowdown it claims ({message})")
    assert not judged["figures"][decided]["passed"], (
        f"a {latency_spec.detect_slowdown:g}x slower {phase} path passed the {decided} gate: {message}")
    if phase == "prefill":
        assert judged["figures"]["tpot_p50"]["passed"], f"a slower prefill path failed TPOT: {message}"
