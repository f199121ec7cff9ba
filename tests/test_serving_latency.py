"""The serving latency gate (TTFT and TPOT at the card's concurrency) proves
itself on the card's real server: `vllm bench serve` rounds in a process of its
own (perf.latency), clean rounds alternating with the case's, judged by
perf.latency_gate. A 1.25x slower decode path must fail TPOT; a 1.25x slower
prefill path must fail TTFT and pass TPOT; the control (no delay) must pass both.
Each case goes to perf_report.json and report.md section 7.5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npu_conformance import baselines, perf
from npu_conformance.cards import Card, LatencySpec
from npu_conformance.perf import latency, latency_gate


@pytest.mark.perf
@pytest.mark.serving
@pytest.mark.xdist_group("perf")
def test_latency_gate_under_injected_slowdown(latency_spec: LatencySpec, card: Card, latency_case: tuple[str, str],
                                              latency_served: tuple[Any, dict[str, Any]],
                                              calibration_checkpoint: Path, perf_report: perf.PerfReport,
                                              request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> None:
    kind = latency_case[1]
    phase = None if kind == "control" else kind
    process, options = latency_served
    timeout = float(pytestconfig.getoption("request_timeout"))
    plan = latency.make_plan(latency_spec, process.base_url, options, calibration_checkpoint, phase, timeout)
    rounds = len(plan["sequence"]) + 1 + 2 * plan["sizing_rounds"]
    ran = latency.run_latency(plan, {**process.env, latency.API_KEY_ENV: process.api_key or ""}, timeout * rounds)
    judged = latency_gate.judge(ran["rounds"], latency.GATED, latency.REPORTED, latency_spec.slack,
                                latency_spec.noise_k)
    band = baselines.settings()["slowdown_self_test"]["achieved_band"]
    decided = f"{latency.METRIC_OF_PHASE[phase]}_p50" if phase else None
    message = latency_gate.describe(judged)
    perf_report.add_case(request.node.nodeid, {
        "card": card.name, "concurrency": latency_spec.concurrency, "prompts": latency_spec.prompts,
        "input_len": latency_spec.input_len, "output_len": latency_spec.output_len,
        "latency": {"case": kind, "factor": latency_spec.detect_slowdown if phase else 1.0,
                    "stretch": ran["stretch"], "judged": judged, "rounds": ran["rounds"], "sizing": ran["sizing"],
                    "achieved_band": band if phase else None},
        "expected_verdict": "fail" if phase else "pass"}, judged["verdict"], message)
    if phase is None:
        assert judged["verdict"] == "pass", f"the control (no delay) failed the latency gate: {message}"
        return
    achieved = judged["figures"][decided]["slowdown"]
    assert band[0] <= achieved <= band[1], (
        f"the injected {latency_spec.detect_slowdown:g}x {phase} slowdown achieved {achieved:.2f}x on {decided}, "
        f"outside {band[0]:g}-{band[1]:g}x (data/perf.yaml slowdown_self_test): the self-test did not test the "
        f"slowdown it claims ({message})")
    assert not judged["figures"][decided]["passed"], (
        f"a {latency_spec.detect_slowdown:g}x slower {phase} path passed the {decided} gate: {message}")
    if phase == "prefill":
        assert judged["figures"]["tpot_p50"]["passed"], f"a slower prefill path failed TPOT: {message}"
