"""Performance conformance: output tok/s per card, batch size and engine mode, on
the session's engine, measured with pytest-benchmark and gated against the card's
recorded baseline for this device (npu_conformance/baselines.py), normalized to a
host-speed calibration run before every round; plus the checks that the gate
catches the slowdown it must, and that the suite's figure is vLLM's own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from npu_conformance import baselines, contention, perf
from npu_conformance.host_load import SwitchingLoad
from npu_conformance.perf import bench as vllm_bench
from npu_conformance.cards import Card, PerfSpec
from npu_conformance.engines.target import NO_TELEMETRY, VllmRunner
from npu_conformance.platforms import Platform
from npu_conformance.plugin import ConformanceSession


@pytest.fixture(scope="session")
def perf_report(pytestconfig: pytest.Config, platform: Platform) -> Iterator[perf.PerfReport]:
    """Collects every perf case; written as perf_report.json when the session ends."""
    report = perf.PerfReport()
    yield report
    if report.cases:
        report.write(pytestconfig.getoption("report_dir"), platform)


# Session scope, and listed before `target` by the tests: a card without perf
# settings is skipped before its engine boots.
def _no_case(card: Card, found: perf.NoCase, conformance: ConformanceSession) -> None:
    if found.gap:
        conformance.unavailable(card, found.reason)
    pytest.skip(found.reason)


@pytest.fixture(scope="session")
def perf_spec(card: Card, platform: Platform, conformance: ConformanceSession) -> PerfSpec:
    if found := perf.skip_reason(card, platform.name):
        _no_case(card, found, conformance)
    return card.platform(platform.name).perf


@pytest.fixture(scope="session")
def batch(card: Card, platform: Platform, perf_spec: PerfSpec, perf_case: tuple[str, int | None],
          conformance: ConformanceSession) -> int:
    """The case's batch size (conftest parametrizes perf_case as (card name, batch size))."""
    batch_size = perf_case[1]
    if found := perf.skip_reason(card, platform.name, batch_size):
        _no_case(card, found, conformance)
    return batch_size


@pytest.fixture(scope="session")
def device_bandwidth(platform: Platform) -> perf.Bandwidth:
    """Measured once per session."""
    return perf.device_bandwidth(platform)


@pytest.fixture(scope="session")
def versions(platform: Platform) -> dict[str, str]:
    """The library versions a baseline is keyed by."""
    return baselines.versions_of(platform.versions)


@pytest.fixture(scope="session")
def calibration(calibration_checkpoint: Path, platform: Platform) -> perf.Calibration:
    """The host-speed calibration (data/perf.yaml), loaded once per session."""
    spec = baselines.settings()["calibration"]
    return perf.Calibration(calibration_checkpoint, platform.name, spec["batch_size"], spec["input_len"],
                            spec["output_len"], spec["warmup_rounds"])


@pytest.fixture(scope="session")
def card_baselines(pytestconfig: pytest.Config,
                   conformance: ConformanceSession) -> Callable[[str], baselines.BaselineFile]:
    """A card's recorded baselines, read from --perf-baselines (a malformed file
    fails its card's cases); where the run's --changed-since change touches them,
    the merge base's: a change is judged against the bar it found, and its own new
    entries are only recorded."""
    directory = pytestconfig.getoption("perf_baselines")

    def read(name: str) -> baselines.BaselineFile:
        changes = conformance.changes
        if changes is not None and (path := changes.changed_baseline(name)):
            return baselines.load_text(name, changes.at_base(path), f"{path} at merge base {changes.base[:12]}")
        return baselines.load(name, directory)

    return read


@pytest.fixture(scope="session")
def host_load(pytestconfig: pytest.Config) -> Iterator[SwitchingLoad | None]:
    """The run's switching CPU load (--perf-load=SECONDS), on from the first perf
    test to the end of the session; None without the option."""
    period = pytestconfig.getoption("perf_load")
    if not period:
        yield None
        return
    with SwitchingLoad(period) as load:
        yield load


@pytest.fixture(autouse=True)
def _under_the_runs_load(host_load: SwitchingLoad | None) -> None:
    """Every test here runs under --perf-load's switching load where it is given."""


@pytest.fixture(scope="session")
def perf_model(card: Card, target: VllmRunner, checkpoint: Path, device_bandwidth: perf.Bandwidth,
               perf_report: perf.PerfReport) -> dict[str, Any]:
    figures = perf.model_figures(card, target, checkpoint, device_bandwidth)
    if card.condition is None:
        perf_report.models.setdefault(card.name, {}).update(figures)
    else:
        # A variant's engine (graph mode) is reported under its card.
        perf_report.models.setdefault(card.base_name, {}).setdefault("variants", {})[card.condition] = figures
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


# Untimed rounds that measure the share of a round spent in the engine's steps.
STEP_SHARE_ROUNDS = 3


def _record_hint(card: Card) -> str:
    return f"record one with `pytest -m perf --model {card.base_name} --perf-record`, run at least 3 times"


def _baseline(card: Card, platform: Platform, spec: PerfSpec, batch: int, versions: dict[str, str],
              card_baselines: Callable[[str], baselines.BaselineFile],
              target: VllmRunner) -> tuple[baselines.Key, baselines.Entry | None]:
    key = perf.baseline_key(card, platform, spec, batch, perf.quant_key(target.evidence["quantization"]))
    return key, baselines.find(card_baselines(card.base_name), key, versions)


@contextlib.contextmanager
def _busy_host_gives_no_verdict(card: Card, conformance: ConformanceSession) -> Iterator[None]:
    """Too few rounds that did not wait for a CPU: no figure, so no verdict (a
    skip that says why, a failure in strict mode), never one read from a shared host."""
    try:
        yield
    except perf.HostBusy as busy:
        conformance.unavailable(card, f"{card.name}: {busy}")


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_throughput(perf_spec: PerfSpec, batch: int, card: Card, platform: Platform, target: VllmRunner,
                    perf_model: dict[str, Any], perf_report: perf.PerfReport, calibration: perf.Calibration,
                    versions: dict[str, str], card_baselines: Callable[[str], baselines.BaselineFile],
                    host_load: SwitchingLoad | None, timed: Any, request: pytest.FixtureRequest,
                    pytestconfig: pytest.Config, conformance: ConformanceSession) -> None:
    """Median output tok/s at the card's exact lengths, and its ratio to the
    calibration, within the gate's tolerance of the recorded baseline."""
    timed.group = card.name
    rounds = perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration)
    with _busy_host_gives_no_verdict(card, conformance):
        m = perf.measure(timed, rounds, perf_spec.rounds, perf_spec.warmup_rounds, versions)
    key, entry = _baseline(card, platform, perf_spec, batch, versions, card_baselines, target)
    gate = perf.judge(m, entry, perf_spec, _record_hint(card))
    lengths_ok, lengths = perf.check_lengths(m, perf_spec)
    figures = {**perf.case_figures(card, platform, m, gate, perf_model), "calibration": calibration.describe(),
               "contention_rule": rounds.limit.describe(),
               "host_load": perf.load_figures(host_load, rounds.windows[perf_spec.warmup_rounds:])}
    timed.extra_info.update(figures)
    recording = pytestconfig.getoption("perf_record")
    # A failing run is not recorded: a baseline must not drift down with the slowdown it should catch.
    if recording and lengths_ok and gate.verdict != "fail":
        figures["recorded_to"] = str(baselines.record(card.base_name, key, versions, m.as_run(),
                                                      pytestconfig.getoption("perf_baselines")))
    perf_report.add_case(request.node.nodeid, figures, gate.verdict if lengths_ok else "fail",
                         gate.message if lengths_ok else f"{lengths}; {gate.message}")
    assert lengths_ok, lengths
    assert gate.passed, gate.message + ("; not recorded (--perf-record keeps passing runs only)" if recording else "")
    if gate.verdict == "measured" and not recording:
        conformance.unavailable(card, f"no perf baseline for {card.name} at batch {batch} on {key.device}: {gate.message}")


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_gate_under_injected_slowdown(perf_spec: PerfSpec, card: Card, platform: Platform, target: VllmRunner,
                                      perf_model: dict[str, Any], perf_report: perf.PerfReport,
                                      calibration: perf.Calibration, versions: dict[str, str],
                                      card_baselines: Callable[[str], baselines.BaselineFile],
                                      host_load: SwitchingLoad | None, slowdown_case: tuple[str, str], timed: Any,
                                      request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                      conformance: ConformanceSession) -> None:
    """A busy wait after every engine step, proportional to the step's own time
    and sized so rounds take `detect_slowdown` times as long (1.25x), fails the
    gate; the control, the same wrapper waiting 0, passes. The case's rounds
    alternate with reference rounds (the wrapper waiting 0) on the same engine,
    round by round, so a load that comes and goes falls on both alike: the case
    is judged against the reference rounds, and against the recorded baseline
    where this device has one. No run is compared with another run of its session."""
    batch = min(perf_spec.batch_sizes)
    slowed = slowdown_case[1] == "slowed"
    factor = perf_spec.detect_slowdown if slowed else 1.0
    key, entry = _baseline(card, platform, perf_spec, batch, versions, card_baselines, target)
    engine = target.llm.llm_engine
    delay = perf.StepDelay(engine.step)
    with monkeypatch.context() as patch:
        patch.setattr(engine, "step", delay)
        # Untimed rounds: how much of a round the engine's steps take.
        start = time.perf_counter()
        for _ in range(STEP_SHARE_ROUNDS):
            target.generate(perf.fresh_prompts(target.vocab_size, batch, perf_spec.input_len),
                            perf.exact_length_params(perf_spec.output_len))
        round_s, steps = time.perf_counter() - start, delay.calls // STEP_SHARE_ROUNDS
        share = delay.step_s / round_s
        stretch = perf.stretch_for(factor, round_s, delay.step_s)

        def switch(side: int) -> None:
            delay.stretch = stretch if side else 0.0

        sides = tuple(perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration)
                      for _ in range(2))
        timed.group = f"{card.name} (injected slowdown)"
        with _busy_host_gives_no_verdict(card, conformance):
            reference, m = perf.measure_alternating(timed, perf.Alternating(sides, switch), perf_spec.rounds,
                                                    perf_spec.warmup_rounds, versions)
    assert "step" not in vars(engine), "the engine's step was not restored"
    interleaved = perf.judge(m, baselines.Entry(key=key, versions=versions, runs=(reference.as_run(),),
                                                source="this test's reference rounds, alternating with the case's"),
                             perf_spec, _record_hint(card), match_host_speed=False)
    judged = perf.judge(m, entry, perf_spec, _record_hint(card)) if entry else None
    # "measured": runs recorded for this device, none at this host's speed (perf.judge says why).
    recorded = judged if judged and judged.verdict != "measured" else None
    achieved = reference.normalized / m.normalized
    band = baselines.settings()["slowdown_self_test"]["achieved_band"]
    gate = recorded or interleaved
    figures = {**perf.case_figures(card, platform, m, gate, perf_model), "calibration": calibration.describe(),
               "injected": {"factor": factor, "stretch_per_step": stretch, "steps_per_round": steps,
                            "step_share_of_round": share, "achieved_slowdown": achieved,
                            "achieved_band": band if slowed else None},
               "reference_rounds": {"normalized": reference.normalized, "output_tok_s": reference.output_tok_s,
                                    "calibration_tok_s": reference.calibration_tok_s},
               "interleaved_gate": {"verdict": interleaved.verdict, "message": interleaved.message,
                                    **interleaved.figures},
               "recorded_gate": ("recorded" if recorded else judged.message if judged
                                 else f"none recorded for {key.device}"),
               "host_load": perf.load_figures(host_load, sides[1].windows[perf_spec.warmup_rounds:]),
               "expected_verdict": "fail" if slowed else "pass"}
    timed.extra_info.update(figures)
    verdicts = [("against the alternating reference rounds", interleaved)]
    if recorded:
        verdicts.append((f"against the baseline recorded for {key.device}", recorded))
    perf_report.add_case(request.node.nodeid, figures,
                         "fail" if any(g.verdict == "fail" for _, g in verdicts) else "pass",
                         "; ".join(f"{what}: {g.message}" for what, g in verdicts))
    if slowed:
        assert band[0] <= achieved <= band[1], (
            f"the injected {factor:g}x slowdown achieved {achieved:.2f}x on normalized figures, outside "
            f"{band[0]:g}-{band[1]:g}x (data/perf.yaml slowdown_self_test): the self-test did not test the "
            f"slowdown it claims")
    for what, g in verdicts:
        if slowed:
            assert g.verdict == "fail" and not g.figures["gate"][g.deciding]["passed"], (
                f"a {factor:g}x slowdown (each of {steps} steps per round stretched by {stretch:.2f}x its time) "
                f"passed the gate {what}: {g.message}")
        else:
            assert g.verdict == "pass", f"the control (no delay) failed the gate {what}: {g.message}"


def _switched_rounds(load: SwitchingLoad, rounds: perf.Rounds, settings: dict[str, Any],
                     warmup_rounds: int) -> tuple[dict[bool, list[int]], dict[int, float], list[float], list[float]]:
    """Rounds with `load` switched on and off every `block_rounds` (data/perf.yaml
    load_self_test) until `rounds_per_state` ran wholly under each state, "on"
    only where the spinner ran `min_neighbour_share` of a core (switched on, the
    scheduler may hold it back). Returns the round indices per state, the
    spinner's share of a core per timed round, the shares of the on-rounds it was
    held back in, and every round's seconds."""
    sorted_rounds: dict[bool, list[int]] = {True: [], False: []}
    starved: list[float] = []
    held: dict[int, float] = {}
    times: list[float] = []
    for i in range(settings["max_rounds"]):
        if min(map(len, sorted_rounds.values())) >= settings["rounds_per_state"]:
            break
        timed_round = i - warmup_rounds
        load.switch(timed_round >= 0 and timed_round // settings["block_rounds"] % 2 == 0)
        spun = load.cpu_s()
        args, _ = rounds.setup()
        start = time.perf_counter()
        rounds.one_round(*args)
        times.append(time.perf_counter() - start)
        if timed_round >= 0:
            window = rounds.windows[i]
            on = load.on_fraction(*window)
            held[i] = (load.cpu_s() - spun) / (window[1] - window[0])
            if on == 0.0:
                sorted_rounds[False].append(i)
            elif on == 1.0 and held[i] >= settings["min_neighbour_share"]:
                sorted_rounds[True].append(i)
            elif on == 1.0:
                starved.append(held[i])
    return sorted_rounds, held, starved, times


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_gate_leaves_out_rounds_a_switching_load_fell_on(perf_spec: PerfSpec, card: Card, platform: Platform,
                                                         target: VllmRunner, perf_report: perf.PerfReport,
                                                         calibration: perf.Calibration,
                                                         versions: dict[str, str],
                                                         card_baselines: Callable[[str], baselines.BaselineFile],
                                                         host_load: SwitchingLoad | None,
                                                         request: pytest.FixtureRequest) -> None:
    """Rounds under a CPU-bound process on one core, switched on and off between
    blocks of rounds (the run's --perf-load where given, its period held); an
    on-round counts where the process did run (its CPU time over the round).
    The load slows the raw rounds; the wait share (contention.py) flags the
    rounds it fell on and not the others; and the figure the gate reads from all
    the rounds, the flagged ones left out, is within the card's slack of the
    rounds run without the load, and passes the baseline recorded for this device
    where there is one. How far the normalized figure alone moved is reported:
    the calibration does not cancel such a load."""
    if not contention.Contention().available:
        pytest.skip("this kernel keeps no per-thread schedstat (/proc/<pid>/schedstat): rounds that wait for a CPU "
                    "cannot be told apart, and none is left out")
    settings = baselines.settings()["load_self_test"]
    batch = min(perf_spec.batch_sizes)
    # The raw slowdown of each attempt: a load the scheduler kept off the engine's threads tests nothing.
    slowdowns: list[float] = []
    with contextlib.ExitStack() as stack:
        # The run's --perf-load is switched by hand here: rounds it slows past its period never run wholly on.
        load = stack.enter_context(host_load.by_hand() if host_load else SwitchingLoad())
        for _ in range(settings["attempts"]):
            rounds = perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration)
            sorted_rounds, held, starved, times = _switched_rounds(load, rounds, settings, perf_spec.warmup_rounds)
            counts = {("on" if k else "off"): len(v) for k, v in sorted_rounds.items()}
            if min(counts.values()) < settings["rounds_per_state"]:
                break
            on, off = (rounds.pick(sorted_rounds[k], [times[i] for i in sorted_rounds[k]], versions)
                       for k in (True, False))
            slowdowns.append(off.output_tok_s / on.output_tok_s)
            if slowdowns[-1] >= settings["min_raw_slowdown"]:
                break
        described = load.describe()
    limit = rounds.limit
    assert min(counts.values()) >= settings["rounds_per_state"], (
        f"after {settings['max_rounds']} rounds, {counts} ran wholly with the load on (running at least "
        f"{settings['min_neighbour_share']:.0%} of a core) / off, and the test needs {settings['rounds_per_state']} "
        f"of each ({described}; {len(starved)} rounds switched on had the spinner held back by the scheduler)")
    flagged = {k: 1 - statistics.mean(limit.clean([rounds.wait_shares[i] for i in v]))
               for k, v in sorted_rounds.items()}
    timed_idx = list(range(perf_spec.warmup_rounds, len(times)))
    gated = rounds.pick(timed_idx, [times[i] for i in timed_idx], versions, clean_only=True)
    raw_slowdown = slowdowns[-1]
    normalized_shift = on.normalized / off.normalized
    gated_shift = gated.normalized / off.normalized
    key, entry = _baseline(card, platform, perf_spec, batch, versions, card_baselines, target)
    gate = perf.judge(gated, entry, perf_spec, _record_hint(card)) if entry else None
    message = (f"load ({described}; on-rounds count where it ran at least {settings['min_neighbour_share']:.0%} "
               f"of a core, {len(starved)} switched on but held back by the scheduler left out): raw tok/s {off.output_tok_s:.1f} off, {on.output_tok_s:.1f} on "
               f"({raw_slowdown:.2f}x slower, at least {settings['min_raw_slowdown']:g}x needed for the test to "
               f"test anything; attempt {len(slowdowns)} of at most {settings['attempts']}, raw slowdowns "
               f"{', '.join(f'{x:.2f}x' for x in slowdowns)}); rounds flagged as waiting for a CPU: "
               f"{flagged[True]:.0%} of {counts['on']} on "
               f"(at least {settings['min_flagged_on']:.0%}), {flagged[False]:.0%} of {counts['off']} off (at most "
               f"{settings['max_flagged_off']:.0%}); the gate's figure over the {len(gated.round_s)} rounds kept of "
               f"{len(timed_idx)}: normalized {gated.normalized:.3f} against {off.normalized:.3f} off "
               f"({gated_shift:.3f}x, allowed 1 +- slack {perf_spec.slack:g}); normalized alone, on vs off: "
               f"{normalized_shift:.3f}x"
               + (f"; against the recorded baseline: {gate.message}" if gate
                  else f"; no baseline recorded for {key.device}"))
    checks = {"load slows the rounds": raw_slowdown >= settings["min_raw_slowdown"],
              "on-rounds flagged": flagged[True] >= settings["min_flagged_on"],
              "off-rounds kept": flagged[False] <= settings["max_flagged_off"],
              "gate's figure unmoved": abs(gated_shift - 1) <= perf_spec.slack,
              "recorded baseline": gate is None or gate.verdict == "pass"}
    perf_report.add_case(request.node.nodeid, {
        "card": card.base_name, "mode": perf.engine_mode(card, platform.name), "batch_size": batch,
        "load": described, "rounds": counts,
        "neighbour_cpu_share": {"on": sorted(held[i] for i in sorted_rounds[True]),
                                "held_back": sorted(starved), "min_for_on": settings["min_neighbour_share"]}, "raw_output_tok_s": {"off": off.output_tok_s, "on": on.output_tok_s},
        "calibration_tok_s": {"off": off.calibration_tok_s, "on": on.calibration_tok_s},
        "wait_shares": {("on" if k else "off"): sorted(rounds.wait_shares[i] for i in v)
                        for k, v in sorted_rounds.items()},
        "detector": {"max_wait_share": limit.max_wait_share, "flagged_on": flagged[True],
                     "flagged_off": flagged[False]},
        "normalized": {"off": off.normalized, "on": on.normalized, "gated": gated.normalized},
        "raw_slowdown": raw_slowdown, "attempts_raw_slowdown": slowdowns, "normalized_shift": normalized_shift,
        "gated_shift": gated_shift,
        "slack": perf_spec.slack, "checks": checks,
        **({"gate": gate.figures["gate"], "baseline": gate.figures["baseline"]} if gate else {})},
        "pass" if all(checks.values()) else "fail", message)
    assert all(checks.values()), f"{[k for k, ok in checks.items() if not ok]} did not hold: {message}"


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_agrees_with_vllm_benchmark(perf_spec: PerfSpec, card: Card, platform: Platform, target: VllmRunner,
                                    checkpoint: Path, perf_model: dict[str, Any], perf_report: perf.PerfReport,
                                    calibration: perf.Calibration,
                                    versions: dict[str, str], request: pytest.FixtureRequest,
                                    pytestconfig: pytest.Config, conformance: ConformanceSession) -> None:
    """The suite's output tok/s at the card's largest batch agrees with what
    `vllm bench throughput`, run in its own process at the same lengths, batch and
    engine arguments, reports: suite and bench runs alternate, and the median of
    their ratios is within the tolerance (data/perf.yaml), each side over the
    host-speed calibration measured with it. The suite's figure is taken as the
    bench counts, tokens over the summed round times (the gate's median round is
    a few percent faster: rounds scatter to the slow side)."""
    if not perf_spec.fidelity:
        pytest.skip(f"{card.name} does not compare with vllm bench throughput on {platform.name} (perf.fidelity)")
    settings = baselines.settings()["fidelity"]
    batch = max(perf_spec.batch_sizes)
    command = vllm_bench.bench_command(checkpoint, card, platform.name, batch, perf_spec, calibration.checkpoint,
                                 settings["calibration_runs"])
    env = {**os.environ, **card.env(platform.name), **NO_TELEMETRY}
    suite, bench, suite_host, bench_host = [], [], [], []
    busy: list[str] = []
    # An alternation whose suite rounds or bench run waited for a CPU (contention.py)
    # compares two speeds of a shared host: it is taken again, up to max_alternations.
    for _ in range(settings["max_alternations"]):
        if len(suite) == settings["alternations"]:
            break
        rounds = perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration)
        try:
            m = perf.time_rounds(rounds, perf_spec.rounds, perf_spec.warmup_rounds, versions)
        except perf.HostBusy as why:
            busy.append(f"suite rounds: {why}")
            continue
        run = vllm_bench.run_bench(command, env, pytestconfig.getoption("boot_timeout"))
        if run.wait_share is not None and run.wait_share > rounds.limit.max_wait_share:
            busy.append(f"bench run waited {run.wait_share:.2f} s per s for a CPU")
            continue
        suite.append(m.output_tok_s_overall)
        suite_host.append(m.calibration_tok_s)
        bench.append(run.output_tok_s)
        bench_host.append(run.calibration_tok_s)
    if len(suite) < settings["alternations"]:
        conformance.unavailable(card, f"{card.name}: the host was busy in {len(busy)} of "
                                      f"{settings['max_alternations']} suite/bench alternations: " + "; ".join(busy))
    # Host speed moves by 10-30% over the half minute between a suite run and a bench
    # run here: each side is taken over the calibration measured with it (the bench's
    # in its own process, right after its timed requests).
    ratios = [(s / sh) / (b / bh) for s, sh, b, bh in zip(suite, suite_host, bench, bench_host)]
    ratio = statistics.median(ratios)
    agrees = abs(ratio - 1) <= settings["tolerance"]
    message = (f"suite vs `vllm bench throughput` output tok/s at batch {batch}, alternating: "
               + ", ".join(f"{s:.1f} vs {b:.1f} (host {sh / bh:.2f}x)"
                           for s, b, sh, bh in zip(suite, bench, suite_host, bench_host))
               + f"; median ratio over the host's speed {ratio:.3f}, allowed 1 +- {settings['tolerance']:g}")
    perf_report.add_case(request.node.nodeid, {
        "card": card.base_name, "mode": perf.engine_mode(card, platform.name), "batch_size": batch,
        "suite_output_tok_s": suite, "vllm_bench_output_tok_s": bench, "suite_calibration_tok_s": suite_host,
        "bench_calibration_tok_s": bench_host, "calibration": calibration.describe(), "ratios": ratios,
        "median_ratio": ratio, "tolerance": settings["tolerance"], "bench_command": command,
        "alternations_taken_again": busy},
        "pass" if agrees else "fail", message)
    assert agrees, message


# --- unit tests of the pure parts --------------------------------------------------


def _spec(**kw: Any) -> PerfSpec:
    return PerfSpec(**{"batch_sizes": (1, 4), "input_len": 8, "output_len": 4, "rounds": 3, "warmup_rounds": 1,
                       "slack": 0.1, "noise_k": 2.0, "detect_slowdown": 1.25, **kw})


KEY = baselines.Key(platform="cpu", device="X [avx2]", mode="eager", quant="none", batch_size=1, input_len=8,
                    output_len=4)


def _entry(tok_s: list[float], normalized: list[float] | None = None, calibration: list[float] | None = None,
           versions: dict[str, str] | None = None, at: str = "2026-12-03T00:00:00+00:00") -> baselines.Entry:
    runs = tuple(baselines.Run(recorded_at=at, rounds=20, tok_s=t, normalized=(normalized or [None] * len(tok_s))[i],
                               calibration_tok_s=(calibration or [None] * len(tok_s))[i]) for i, t in enumerate(tok_s))
    return baselines.Entry(key=KEY, versions=versions or {"vllm": "1"}, source="test", runs=runs)


def _measured(round_s: list[float], calibration_s: list[float] | None = None) -> perf.Measurement:
    # batch 1 x 4 tokens per round; the calibration makes 4 tokens per run.
    return perf.Measurement.of(1, 8, 4, round_s, [], calibration_s or (), 4 if calibration_s else 0, {"vllm": "1"})


@pytest.mark.unit
def test_baseline_median_and_noise():
    e = _entry([100.0, 104.0, 96.0, 98.0, 102.0])
    assert e.tok_s == 100.0
    assert e.noise("tok_s") == pytest.approx(0.04)  # (104 - 96) / 2 / 100
    assert _entry([100.0, 90.0]).noise("tok_s") is None  # too few runs to say
    assert perf.tolerance(_spec(), 0.04) == pytest.approx(0.1)  # slack wins
    assert perf.tolerance(_spec(), 0.06) == pytest.approx(0.12)  # 2 x noise wins
    assert perf.tolerance(_spec(), None) == 0.1


@pytest.mark.unit
def test_gate_absolute_only():
    entry = _entry([100.0, 100.0, 100.0])
    ok = perf.judge(_measured([0.04] * 3), entry, _spec(), "hint")  # 100 tok/s
    assert ok.verdict == "pass" and ok.deciding == "absolute"
    assert ok.message.startswith("output tok/s 100.0 >= floor 90.0 = baseline 100.0 x (1 - 10.0%")
    slow = perf.judge(_measured([0.05] * 3), entry, _spec(), "hint")  # 80 tok/s: a 1.25x slowdown
    assert slow.verdict == "fail" and not slow.figures["gate"]["absolute"]["passed"]
    assert slow.figures["gate"]["absolute"]["ratio"] == pytest.approx(0.8)
    none = perf.judge(_measured([0.05] * 3), None, _spec(), "record it so")
    assert none.verdict == "measured" and none.passed and "record it so" in none.message


@pytest.mark.unit
def test_gate_follows_the_host_and_catches_the_engine():
    # Recorded: 100 tok/s while the calibration made 50 tok/s (normalized 2.0).
    entry = _entry([100.0] * 3, [2.0] * 3, [50.0] * 3)
    # The whole host at 0.8x (within host_speed_window): both slow alike, the ratio holds, the absolute
    # floor follows the host.
    loaded = perf.judge(_measured([0.05] * 3, [0.1] * 3), entry, _spec(), "")
    assert loaded.verdict == "pass", loaded.message
    assert loaded.figures["gate"]["host"]["speed"] == 0.8 and loaded.figures["gate"]["absolute"]["floor"] == 72.0
    assert "(baseline 100.0 x host 0.80)" in loaded.message
    # A faster host never raises the absolute floor.
    fast = perf.judge(_measured([0.032] * 3, [0.064] * 3), entry, _spec(), "")
    assert fast.figures["gate"]["absolute"]["floor"] == 90.0 and fast.verdict == "pass"
    # The engine alone 1.25x slower: the ratio drops 20%, and so does the absolute figure.
    slowed = perf.judge(_measured([0.05] * 3, [0.08] * 3), entry, _spec(), "")
    assert slowed.verdict == "fail" and slowed.deciding == "normalized"
    assert not slowed.figures["gate"]["normalized"]["passed"] and not slowed.figures["gate"]["absolute"]["passed"]
    # The absolute figure short while the calibration ran at speed: a failure, whatever the ratio says.
    short = perf.judge(_measured([0.05] * 3, [0.1] * 3), _entry([100.0] * 3, [1.6] * 3, [40.0] * 3), _spec(), "")
    assert short.figures["gate"]["normalized"]["passed"] and not short.figures["gate"]["absolute"]["passed"]
    assert short.verdict == "fail"


@pytest.mark.unit
def test_gate_reads_the_runs_recorded_at_this_host_speed():
    # One host at two speeds: the normalized figure 2.0 at calibration 50, 2.4 at 85 (its drift between them).
    entry = _entry([100.0] * 3 + [204.0] * 3, [2.0] * 3 + [2.4] * 3, [50.0] * 3 + [85.0] * 3)
    window = baselines.settings()["baselines"]["host_speed_window"]
    slow, why = entry.at_host_speed(48.0, window, 3)
    assert slow.normalized == 2.0 and len(slow.runs) == 3 and why.startswith("the 3 of 6 recorded runs nearest")
    # At the faster speed an engine 1.25x slower (normalized 1.92) fails against that speed's runs
    # (floor 2.4 x 0.9); against all six (median 2.2, noise 9%: floor 2.2 x (1 - 18%) = 1.80) it would pass.
    slowed = perf.judge(_measured([4 / 163.2] * 3, [4 / 85] * 3), entry, _spec(), "")
    assert slowed.figures["baseline"]["normalized"] == 2.4 and slowed.figures["baseline"]["runs"] == 3
    assert slowed.figures["gate"]["normalized"]["floor"] == pytest.approx(2.16)
    assert slowed.verdict == "fail" and not slowed.figures["gate"]["normalized"]["passed"], slowed.message
    assert "the 3 of 6 recorded runs nearest in host speed" in slowed.message
    # Between two recorded speeds, both within the window: the nearest runs only, not both mixed.
    between = _entry([100.0] * 3 + [120.0] * 3, [2.0] * 3 + [2.4] * 3, [50.0] * 3 + [60.0] * 3)
    near, _ = between.at_host_speed(56.0, window, 3)
    assert near.normalized == 2.4 and near.noise("normalized") == 0.0
    # A speed no run was recorded at: no baseline gates it (against all six the slowed run would pass).
    alone, why = entry.at_host_speed(200.0, window, 3)
    assert alone is None and why.startswith("no recorded run at a host speed within")
    unseen = perf.judge(_measured([4 / 384] * 3, [4 / 200] * 3), entry, _spec(), "record it so")
    assert unseen.verdict == "measured" and unseen.figures["baseline"] is None, unseen.message
    assert "no recorded run at a host speed" in unseen.message and "record it so" in unseen.message
    assert unseen.figures["baseline_at_other_speeds"]["runs"] == 6
    # Runs without a calibration (hand-measured seeds) are taken as they are.
    assert _entry([100.0] * 3).at_host_speed(50.0, window, 3) == (_entry([100.0] * 3), None)


@pytest.mark.unit
def test_gate_refuses_a_baseline_too_noisy_to_catch_the_slowdown():
    noisy = _entry([100.0, 80.0, 120.0])  # +-20%: tolerance 40%
    gate = perf.judge(_measured([0.04] * 3), noisy, _spec(), "")
    assert gate.verdict == "fail" and "too noisy to gate" in gate.message
    assert gate.figures["gate"]["detectable_slowdown"] == pytest.approx(1 / 0.6)


@pytest.mark.unit
def test_gate_names_other_versions():
    gate = perf.judge(_measured([0.04] * 3), _entry([100.0] * 3, versions={"vllm": "0"}), _spec(), "")
    assert gate.verdict == "pass" and "baseline recorded with {'vllm': '0'}, this run {'vllm': '1'}" in gate.message


@pytest.mark.unit
def test_record_and_find(tmp_path: Path):
    run = _measured([0.04] * 3, [0.08] * 3).as_run()
    assert run.tok_s == 100.0 and run.normalized == pytest.approx(2.0) and run.calibration_tok_s == 50.0
    for _ in range(12):
        baselines.record("c", KEY, {"vllm": "1"}, run, tmp_path)
    baselines.record("c", KEY, {"vllm": "2"}, run.model_copy(update={"recorded_at": "2027"}), tmp_path)
    loaded = baselines.load("c", tmp_path)
    assert [len(e.runs) for e in loaded.entries] == [baselines.settings()["baselines"]["keep"], 1]
    assert baselines.find(loaded, KEY, {"vllm": "1"}).versions == {"vllm": "1"}
    # Versions never recorded: the newest entry for the key.
    assert baselines.find(loaded, KEY, {"vllm": "3"}).versions == {"vllm": "2"}
    assert baselines.find(loaded, KEY.model_copy(update={"batch_size": 4}), {"vllm": "1"}) is None
    assert baselines.load("absent", tmp_path).entries == ()


@pytest.mark.unit
@pytest.mark.parametrize("text, field", [
    ('{"format": 2, "card": "c", "entries": [{"key": {}}]}', "entries[0].key.platform"),
    ('{"format": 2, "card": "c", "extra": 1}', "extra"),
    ('{"format": 2, "card": "other"}', "card"),
    # A file of the format before keys named the quantization path: told so, not misread.
    ('{"format": 1, "card": "c"}', "format"),
    ('{"format": 1,', "<json>"),
])
def test_malformed_baseline_names_file_and_field(tmp_path: Path, text: str, field: str):
    from npu_conformance.cards import CardError

    (tmp_path / "c.json").write_text(text)
    with pytest.raises(CardError, match=f"perf baseline {tmp_path / 'c.json'}: field '{re.escape(field)}'"):
        baselines.load("c", tmp_path)


@pytest.mark.unit
def test_shipped_baselines_are_valid():
    from npu_conformance.cards import load_catalog

    catalog = load_catalog()
    for file in baselines.BASELINES_DIR.glob("*.json"):
        assert file.stem in catalog, f"{file}: no card {file.stem!r}"
        loaded = baselines.load(file.stem)
        for entry in loaded.entries:
            spec = catalog[file.stem].platform(entry.key.platform).perf
            assert spec and entry.key.batch_size in spec.batch_sizes, f"{file}: {entry.key} is no perf case of the card"


@pytest.mark.unit
def test_a_host_reads_only_its_own_devices_baselines():
    from npu_conformance.cards import load_catalog
    from npu_conformance.platforms import Platform

    npu = Platform(name="npu", plugin="vllm_ascend", device_name="Ascend910B4", host="Linux aarch64", versions={},
                   device_count=8)
    assert npu.perf_device == "Ascend910B4"
    xeon = {"name": "cpu", "plugin": "vllm", "device_name": "Intel(R) Xeon(R) Processor", "host": "Linux x86_64",
            "versions": {}}
    avx512 = Platform(**xeon, cpu_flags=("avx2", "avx512f"))
    amx = Platform(**xeon, cpu_flags=("avx2", "avx512f", "amx_tile"))
    assert avx512.perf_device == "Intel(R) Xeon(R) Processor [avx2 avx512f]" != amx.perf_device
    card = load_catalog()["synthetic-llama"]
    spec = card.platform("cpu").perf
    shipped = baselines.load(card.name)
    # The shipped CPU baselines were recorded on an AVX-512 host without AMX: an AMX
    # (or AVX2-only) host finds none, and its cases are measured, not gated.
    assert baselines.find(shipped, perf.baseline_key(card, avx512, spec, 1, "none"), {}) is not None
    assert baselines.find(shipped, perf.baseline_key(card, amx, spec, 1, "none"), {}) is None
    assert perf.judge(_measured([0.04] * 3), None, spec, "hint").verdict == "measured"


@pytest.mark.unit
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


@pytest.mark.unit
def test_bench_output_parsed():
    text = "...\nThroughput: 35.48 requests/s, 3419.47 total tokens/s, 1135.24 output tokens/s\nTotal num ..."
    assert vllm_bench.bench_output_tok_s(text) == 1135.24
    with pytest.raises(ValueError, match="no 'Throughput"):
        vllm_bench.bench_output_tok_s("Traceback ...")


@pytest.mark.unit
def test_bench_command_carries_the_cards_lengths_and_engine():
    from npu_conformance.cards import load_catalog

    card = load_catalog()["synthetic-llama"]
    spec = card.platform("cpu").perf
    cmd = vllm_bench.bench_command(Path("/ck"), card, "cpu", 4, spec, Path("/cal"), 10)
    assert cmd[1:6] == ["-m", vllm_bench.BENCH_MODULE, "--calibration", "/cal", "10"]
    text = " ".join(cmd)
    for part in (f"--random-input-len {spec.input_len}", f"--random-output-len {spec.output_len}",
                 f"--num-prompts {4 * spec.rounds}", "--max-num-seqs 4", "--enforce-eager", "--max-model-len 512"):
        assert part in text


@pytest.mark.unit
def test_batch_sizes_and_skips():
    from npu_conformance.cards import PlatformSettings, load_catalog

    card = load_catalog()["granite-4.1-8b"]
    npu = card.platform("npu").perf.batch_sizes
    assert set(npu) <= set(perf.perf_batch_sizes(card))
    assert perf.skip_reason(card, "npu", npu[0]) is None
    other = perf.skip_reason(card, "npu", 3)
    assert "not in granite-4.1-8b's npu perf batch_sizes" in other.reason and not other.gap
    bare = card.model_copy(update={"platforms": {"npu": PlatformSettings()}})
    assert perf.perf_batch_sizes(bare) == [None]
    gap = perf.skip_reason(bare, "npu")
    assert gap.gap and gap.reason.startswith("granite-4.1-8b has no perf settings for platform npu")
    exempt = card.model_copy(update={"platforms": {"npu": PlatformSettings(perf_exempt="measured by another card")}})
    assert perf.skip_reason(exempt, "npu") == perf.NoCase(
        "granite-4.1-8b is exempt from the perf gate on npu: measured by another card", False)


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


class _StubRunner:
    """Just what Rounds uses of a VllmRunner: outputs of the requested lengths."""

    vocab_size = 100

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        from types import SimpleNamespace as NS

        self.calls.append(prompts)
        return [NS(prompt_token_ids=p, outputs=[NS(token_ids=[0] * params.max_tokens)], metrics=None) for p in prompts]


@pytest.mark.unit
def test_time_rounds_discards_warmup_and_pairs_calibration() -> None:
    from types import SimpleNamespace as NS

    runner = _StubRunner()
    runs = iter([0.5, 0.5, 1.0, 2.0])
    calibration = NS(run=lambda: next(runs), tokens=4)
    m = perf.time_rounds(perf.Rounds(runner, 2, 8, 4, calibration), rounds=3, warmup_rounds=1, versions={})
    assert len(runner.calls) == 4 and len(m.round_s) == 3
    assert m.lengths == {(8, 4)}
    # The warm-up round's calibration is dropped with it.
    assert m.calibration_s == (0.5, 1.0, 2.0) and m.calibration_tok_s == 4.0
    # Fresh prompts every round, as in the suite: prefix caching never skips a prefill.
    assert len({json.dumps(c) for c in runner.calls}) == 4


@pytest.mark.unit
def test_alternating_rounds_take_turns_each_with_its_calibration() -> None:
    from types import SimpleNamespace as NS

    runner = _StubRunner()
    calibrations = iter([1.0, 2.0, 1.0, 2.0, 1.0, 2.0])
    calibration = NS(run=lambda: next(calibrations), tokens=4)
    sides = (perf.Rounds(runner, 1, 8, 4, calibration), perf.Rounds(runner, 1, 8, 4, calibration))
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


@pytest.mark.unit
def test_switching_load_stops_and_continues_one_spinning_process() -> None:
    import psutil

    with SwitchingLoad() as load:
        proc = psutil.Process(load.pid)
        assert proc.status() == psutil.STATUS_STOPPED and proc.cpu_affinity() == [load.cpu]
        before = time.monotonic()
        load.switch(True)
        time.sleep(0.3)
        assert proc.status() == psutil.STATUS_RUNNING and proc.cpu_times().user > 0.1
        middle = time.monotonic()
        load.switch(False)
        time.sleep(0.3)
        assert proc.status() == psutil.STATUS_STOPPED
        after = time.monotonic()
        assert load.on_fraction(before, middle) == pytest.approx(1.0, abs=0.02)
        assert load.on_fraction(middle + 0.01, after) == 0.0
        assert load.on_fraction(before, after) == pytest.approx(0.5, abs=0.1)
        assert "switched on and off by the test" in load.describe()
    assert not psutil.pid_exists(proc.pid) or proc.status() == psutil.STATUS_ZOMBIE
    with SwitchingLoad(period_s=0.2) as timed:
        time.sleep(0.9)
    assert timed.switches() >= 5 and "every 0.2 s" in timed.describe()
    with pytest.raises(ValueError, match="period > 0"):
        SwitchingLoad(period_s=0)


@pytest.mark.unit
def test_switching_load_held_by_hand_and_gone_with_its_starter() -> None:
    import psutil

    with SwitchingLoad(period_s=0.1) as load:
        with load.by_hand():
            load.switch(False)
            held = load.switches()
            time.sleep(0.4)
            assert load.switches() == held and "by the test" in load.describe()
        time.sleep(0.4)
        assert load.switches() >= held + 2 and "every 0.1 s" in load.describe()
    # A starter killed outright (no cleanup runs) takes its spinner with it, stopped or not.
    starter = subprocess.Popen([sys.executable, "-c", "import time\nfrom npu_conformance.host_load import "
                                "SwitchingLoad\nwith SwitchingLoad() as load:\n    print(load.pid, flush=True)\n"
                                "    time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        spinner = psutil.Process(int(starter.stdout.readline()))
        assert spinner.status() == psutil.STATUS_STOPPED
    finally:
        starter.kill()
        starter.wait()
    spinner.wait(timeout=5)


@pytest.mark.unit
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


@pytest.mark.unit
def test_contention_limit_keeps_clean_rounds_and_refuses_a_busy_host() -> None:
    from types import SimpleNamespace as NS

    limit = perf.ContentionLimit(max_wait_share=0.3, min_clean_share=0.5)
    assert limit.clean([0.0, 0.3, 0.31, None]) == [True, True, False, True]
    limit.check([0.0, 0.9, 0.1, 0.9])
    with pytest.raises(perf.HostBusy, match="3 of 4 rounds waited for a CPU more than 0.3 s per s"):
        limit.check([0.0, 0.9, 0.8, 0.7])
    # The measurement reads the clean rounds only, and keeps the others' shares as evidence.
    calibrations = iter([1.0] * 5)
    rounds = perf.Rounds(_StubRunner(), 1, 8, 4, NS(run=lambda: next(calibrations), tokens=4), limit)
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


def _spinners(count: int, cpu: int, own_session: bool) -> list[subprocess.Popen[bytes]]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=own_session)
             for _ in range(count)]
    for proc in procs:
        os.sched_setaffinity(proc.pid, {cpu})
    return procs


@pytest.mark.unit
@pytest.mark.skipif(not contention.Contention().available, reason="this kernel keeps no per-thread schedstat")
def test_contention_counts_the_waits_of_this_process_tree_only() -> None:
    """Two spinning children on one CPU wait for each other, about half the time
    each; the same two in a session of their own are someone else's."""
    cpu = max(os.sched_getaffinity(0))
    for own_session, expected in ((False, (0.6, 2.5)), (True, (0.0, 0.3))):
        procs = _spinners(2, cpu, own_session)
        try:
            time.sleep(0.2)
            watch = contention.Contention()
            before, start = watch.waited_s(), time.monotonic()
            time.sleep(0.6)
            share = contention.share(before, watch.waited_s(), time.monotonic() - start)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        assert expected[0] <= share <= expected[1], (own_session, share)
    assert contention.share(None, 1.0, 1.0) is None and contention.share(2.0, 1.0, 1.0) == 0.0


@pytest.mark.unit
def test_bench_wait_line_parsed() -> None:
    assert vllm_bench.WAIT_FIGURE.search(f"x\n{vllm_bench.WAIT_LINE} 0.042\n").group(1) == "0.042"
    assert vllm_bench.WAIT_FIGURE.search(f"{vllm_bench.WAIT_LINE} unmeasured").group(1) == "unmeasured"


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
    entry = perf.published_bandwidth(name, perf.load_bandwidths()["devices"])
    assert (entry["bandwidth_gb_s"] if entry else None) == gb_s
