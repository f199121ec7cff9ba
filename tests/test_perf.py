"""Performance conformance: output tok/s per card and batch size, on the session's
engine, measured with pytest-benchmark and gated by the card's floors for the
platform (floor_tok_s, or baseline_tok_s x slack as vllm-ascend's nightly gates);
plus the checks that the measurement itself is sound."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from npu_conformance import perf
from npu_conformance.cards import Card, PerfSpec
from npu_conformance.platform import Platform
from npu_conformance.engines.target import VllmRunner


@pytest.fixture(scope="session")
def perf_report(pytestconfig: pytest.Config, platform: Platform) -> Iterator[perf.PerfReport]:
    """Collects every perf case; written as perf_report.json when the session ends."""
    report = perf.PerfReport()
    yield report
    if report.cases:
        report.write(pytestconfig.getoption("report_dir"), platform)


# Session scope, and listed before `target` by the tests: a card without perf
# settings is skipped before its engine boots.
@pytest.fixture(scope="session")
def perf_spec(card: Card, platform: Platform) -> PerfSpec:
    if reason := perf.skip_reason(card, platform.name):
        pytest.skip(reason)
    return card.platform(platform.name).perf


@pytest.fixture(scope="session")
def batch(card: Card, platform: Platform, perf_spec: PerfSpec, perf_case: tuple[str, int | None]) -> int:
    """The case's batch size (conftest parametrizes perf_case as (card name, batch size))."""
    batch_size = perf_case[1]
    if reason := perf.skip_reason(card, platform.name, batch_size):
        pytest.skip(reason)
    return batch_size


@pytest.fixture(scope="session")
def device_bandwidth(platform: Platform) -> perf.Bandwidth:
    """Measured once per session."""
    return perf.device_bandwidth(platform)


@pytest.fixture(scope="session")
def perf_model(card: Card, target: VllmRunner, checkpoint: Path, device_bandwidth: perf.Bandwidth,
               perf_report: perf.PerfReport) -> dict[str, Any]:
    figures = perf.model_figures(card, target, checkpoint, device_bandwidth)
    perf_report.models[card.name] = figures
    return figures


@pytest.fixture
def timed(benchmark: Any) -> Any:
    """pytest-benchmark's fixture, required on: a perf case without timings has
    nothing to judge, so it fails, saying why, instead of passing or skipping unseen."""
    if benchmark.disabled:
        pytest.fail("pytest-benchmark is disabled (--benchmark-disable, or xdist, where it turns itself off): "
                    "a perf verdict needs timings. Run `-m perf` without -n, or add --benchmark-enable "
                    "--dist loadgroup (the perf cases share one xdist group, so one worker runs them in turn)",
                    pytrace=False)
    return benchmark


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_throughput(perf_spec: PerfSpec, batch: int, card: Card, platform: Platform, target: VllmRunner,
                    perf_model: dict[str, Any], perf_report: perf.PerfReport, timed: Any,
                    request: pytest.FixtureRequest) -> None:
    """Output tok/s at the card's exact lengths meets the card's floor at this batch size."""
    timed.group = card.name
    m = perf.measure(timed, target, batch, perf_spec.input_len, perf_spec.output_len,
                     perf_spec.rounds, perf_spec.warmup_rounds)
    floor = perf.floor_for(perf_spec, batch)
    figures = perf.case_figures(card, platform, m, floor, perf_model)
    timed.extra_info.update(figures)
    check = perf.check_floor(m.output_tok_s, floor) if floor else None
    lengths = perf.check_lengths(m, perf_spec)
    verdict = ("fail" if not lengths.passed else "measured" if check is None else "pass" if check.passed else "fail")
    messages = [c.message for c in (lengths, check) if c is not None and not c.passed] or [
        check.message if check else "no floor for this case"]
    perf_report.add_case(request.node.nodeid, figures, verdict, "; ".join(messages))

    assert lengths.passed, lengths.message
    if check is not None:
        assert check.passed, check.message


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_agrees_with_vllm_benchmark(perf_spec: PerfSpec, card: Card, platform: Platform, target: VllmRunner,
                                    perf_model: dict[str, Any], perf_report: perf.PerfReport, timed: Any,
                                    request: pytest.FixtureRequest) -> None:
    """The suite's output tok/s (pytest-benchmark's timing, the suite's token count)
    agrees with what vLLM's own throughput benchmark reports (its timer, its count)
    for the very same rounds, run through that benchmark's code on the session's
    engine at the card's largest batch. Timing the same execution twice makes the
    comparison immune to load from other processes, which on a shared machine moves
    separate runs by far more than 10%."""
    run = perf.vllm_throughput_runner()
    if run is None:
        pytest.skip("this vLLM's benchmarks cannot take a built engine: compare by hand with "
                    "`vllm bench throughput --dataset-name random` at the card's lengths and engine arguments")
    batch = max(perf_spec.batch_sizes)
    timed.group = card.name
    reported: list[float] = []

    def vllm_round(prompts: list[list[int]]) -> list[Any]:
        tok_s, outputs = perf.vllm_benchmark_round(run, target.llm, prompts, perf_spec.output_len)
        reported.append(tok_s)
        return outputs

    m = perf.measure(timed, target, batch, perf_spec.input_len, perf_spec.output_len,
                     perf_spec.rounds, perf_spec.warmup_rounds, run_round=vllm_round)
    vllm_tok_s = reported[perf_spec.warmup_rounds : perf_spec.warmup_rounds + perf_spec.rounds]
    ratios = perf.fidelity_ratios(m, vllm_tok_s)
    figures = {**perf.case_figures(card, platform, m, None, perf_model),
               "vllm_benchmark_output_tok_s": vllm_tok_s, "ratios": ratios, "tolerance": perf.FIDELITY_TOLERANCE}
    timed.extra_info.update(figures)
    worst = max(ratios, key=lambda r: abs(r - 1))
    message = (f"suite vs vLLM benchmark output tok/s at batch {batch}, per round: "
               + ", ".join(f"{m.batch_size * m.output_len / s:.1f} vs {v:.1f}" for s, v in zip(m.round_s, vllm_tok_s))
               + f"; worst ratio {worst:.3f}, allowed 1 +- {perf.FIDELITY_TOLERANCE:g}")
    agrees = abs(worst - 1) <= perf.FIDELITY_TOLERANCE
    lengths = perf.check_lengths(m, perf_spec)
    perf_report.add_case(request.node.nodeid, figures, "pass" if agrees and lengths.passed else "fail",
                         message if lengths.passed else f"{lengths.message}; {message}")
    assert lengths.passed, lengths.message
    assert agrees, message


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_slowed_engine_fails_floor(perf_spec: PerfSpec, card: Card, platform: Platform, target: VllmRunner,
                                   timed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a sleep injected into every step of the real engine, the floor check
    fails, saying by how much; the engine is restored afterwards."""
    batch = min(perf_spec.batch_sizes)
    floor = perf.floor_for(perf_spec, batch)
    if floor is None:
        pytest.skip(f"{card.name} has no {platform.name} floor at batch {batch}: nothing to fail")
    engine = target.llm.llm_engine
    step = engine.step
    delay = perf.slowdown_delay_s(floor, batch)

    def slowed_step() -> Any:
        time.sleep(delay)
        return step()

    timed.group = f"{card.name} (slowed)"
    with monkeypatch.context() as patch:
        patch.setattr(engine, "step", slowed_step)
        m = perf.measure(timed, target, batch, perf_spec.input_len, perf_spec.output_len, rounds=1, warmup_rounds=0)
    assert "step" not in vars(engine), "the engine's step was not restored"
    timed.extra_info.update({"card": card.name, "delay_per_step_s": delay, **m.figures()})

    check = perf.check_floor(m.output_tok_s, floor)
    assert not check.passed, f"a {delay * 1e3:.0f} ms sleep per step went unnoticed: {check.message}"
    assert re.fullmatch(r"output tok/s [\d.]+ below floor [\d.]+ \(.+\)", check.message), check.message


# --- unit tests of the pure parts --------------------------------------------------


def _spec(**kw: Any) -> PerfSpec:
    return PerfSpec(**{"batch_sizes": (1, 4), "input_len": 8, "output_len": 4, "rounds": 3, "warmup_rounds": 1, **kw})


@pytest.mark.unit
def test_floor_absolute_and_baseline():
    assert perf.floor_for(_spec(floor_tok_s={1: 10.0}), 1) == perf.Floor(10.0)
    assert perf.floor_for(_spec(baseline_tok_s={4: 100.0}, slack=0.97), 4) == perf.Floor(97.0, 100.0, 0.97)
    # Both given: the stricter gates.
    both = _spec(floor_tok_s={1: 50.0}, baseline_tok_s={1: 100.0}, slack=0.97)
    assert perf.floor_for(both, 1).tok_s == 97.0
    assert perf.floor_for(_spec(floor_tok_s={1: 10.0}), 4) is None
    assert perf.floor_for(_spec(), 1) is None


@pytest.mark.unit
def test_check_floor_messages():
    gate = perf.Floor(97.0, 100.0, 0.97)
    below = perf.check_floor(50.04, gate)
    assert not below.passed
    assert below.message == "output tok/s 50.0 below floor 97.0 (= 0.97 x baseline 100.0)"
    assert perf.check_floor(97.0, gate).passed
    assert perf.check_floor(12.0, perf.Floor(10.0)).message == "output tok/s 12.0 meets floor 10.0 (absolute, no baseline)"


@pytest.mark.unit
def test_slowdown_caps_tok_s_below_floor():
    gate = perf.Floor(40.0)
    for batch in (1, 4, 16):
        delay = perf.slowdown_delay_s(gate, batch)
        # A step yields at most `batch` tokens, so tok/s <= batch / delay.
        assert batch / delay == pytest.approx(gate.tok_s / perf.SLOWDOWN)


@pytest.mark.unit
def test_batch_sizes_and_skips():
    from npu_conformance.cards import PlatformSettings, load_catalog

    card = load_catalog()["granite-4.1-8b"]
    npu = card.platform("npu").perf.batch_sizes
    assert set(npu) <= set(perf.perf_batch_sizes(card))
    assert perf.skip_reason(card, "npu", npu[0]) is None
    assert "not in granite-4.1-8b's npu perf batch_sizes" in perf.skip_reason(card, "npu", 3)
    bare = card.model_copy(update={"platforms": {"npu": PlatformSettings()}})
    assert perf.perf_batch_sizes(bare) == [None]
    assert perf.skip_reason(bare, "npu") == "granite-4.1-8b has no perf settings for platform npu"


@pytest.mark.unit
def test_synthetic_prompts_exact_and_fresh():
    a = perf.synthetic_prompts(50, 3, 7, seed=1)
    assert [len(p) for p in a] == [7, 7, 7] and all(0 <= t < 50 for p in a for t in p)
    assert a == perf.synthetic_prompts(50, 3, 7, seed=1)
    assert perf.fresh_prompts(1000, 2, 16) != perf.fresh_prompts(1000, 2, 16)


@pytest.mark.unit
def test_measurement_figures():
    from types import SimpleNamespace as NS

    def out(first: float, ttft: float) -> Any:
        metrics = NS(first_token_latency=ttft, first_token_ts=first, last_token_ts=first + 0.3, num_generation_tokens=4)
        return NS(prompt_token_ids=[0] * 8, outputs=[NS(token_ids=[1] * 4)], metrics=metrics)

    m = perf.Measurement.of(2, 8, 4, [2.0, 1.0, 4.0], [[out(0, 0.05), out(0, 0.07)]])
    assert m.output_tok_s == 8.0 and m.total_tok_s == 24.0  # fastest round: 1 s
    assert m.output_tok_s_median == 4.0
    assert m.lengths == {(8, 4)}
    f = m.figures()
    assert f["ttft_ms_median"] == pytest.approx(60.0) and f["tpot_ms_median"] == pytest.approx(100.0)
    no_stats = perf.Measurement.of(1, 8, 4, [1.0], [[NS(prompt_token_ids=[0] * 8, outputs=[NS(token_ids=[1] * 4)],
                                                        metrics=None)]])
    assert no_stats.figures()["ttft_ms_median"] is None
    assert no_stats.figures()["latency_source"].startswith("unavailable")


@pytest.mark.unit
def test_fidelity_ratios():
    m = perf.Measurement.of(2, 8, 4, [1.0, 2.0], [])
    assert perf.fidelity_ratios(m, [8.0, 4.4]) == pytest.approx([1.0, 4.0 / 4.4])


@pytest.mark.unit
def test_roofline():
    assert perf.roofline_tok_s(2e9, 1000.0, 1) == pytest.approx(500.0)
    assert perf.roofline_tok_s(2e9, 1000.0, 8) == pytest.approx(4000.0)


@pytest.mark.unit
@pytest.mark.parametrize("name, gb_s", [
    ("Ascend910B4", 800), ("Ascend910B3", 1600), ("Ascend910B2", 1600),
    ("NVIDIA H200", 4800), ("NVIDIA H20", 4000), ("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H100 PCIe", 2000),
    ("NVIDIA A100-SXM4-80GB", 2039), ("NVIDIA A100-SXM4-40GB", 1555), ("NVIDIA L4", 300), ("NVIDIA L40S", 864),
    ("NVIDIA A10G", 600), ("Tesla T4", 320), ("AMD EPYC", None), ("NVIDIA GH200 480GB", None),
])
def test_published_bandwidth(name, gb_s):
    entry = perf.published_bandwidth(name, perf.load_devices()["devices"])
    assert (entry["bandwidth_gb_s"] if entry else None) == gb_s
