"""Performance conformance: output tok/s per card, batch size and engine mode, on
the session's engine, measured with pytest-benchmark and gated against the card's
recorded baseline for this device (npu_conformance/baselines.py), normalized to a
host-speed calibration run before every round; plus the checks that the gate
catches the slowdown it must, and that the suite's figure is vLLM's own."""

from __future__ import annotations

import contextlib
import os
import statistics
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


@pytest.fixture(autouse=True)
def _under_the_runs_load(host_load: SwitchingLoad | None) -> None:
    """Every test here runs under --perf-load's switching load where it is given."""


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
    # The recorded gate decides here only where its runs ran near this host's speed (data/perf.yaml).
    speed_window = baselines.settings()["slowdown_self_test"]["recorded_speed_window"]
    speed = recorded.figures["gate"].get("host", {}).get("speed") if recorded else None
    if speed is not None and max(speed, 1 / speed) > speed_window:
        judged_far, recorded = recorded, None
    else:
        judged_far = None
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
               "recorded_gate": ("recorded" if recorded else
                                 f"reported, not decided: its runs at {speed:.2f}x this host's speed, beyond "
                                 f"{speed_window:g}x (slowdown_self_test.recorded_speed_window); its verdict "
                                 f"{judged_far.verdict}: {judged_far.message}" if judged_far
                                 else judged.message if judged else f"none recorded for {key.device}"),
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
              # "measured": no recorded run near this host's speed, so none gates it (perf.judge says why).
              "recorded baseline": gate is None or gate.verdict != "fail"}
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
