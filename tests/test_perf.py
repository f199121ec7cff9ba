"""Performance conformance: output tok/s per card, batch size and engine mode, on
the session's engine, measured with pytest-benchmark and gated against the card's
recorded baseline for this device (npu_conformance/baselines.py), normalized to a
host-speed calibration run before every round; plus the checks that the gate
catches the slowdown it must, and that the suite's figure is vLLM's own."""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from npu_conformance import baselines, perf
from npu_conformance.cards import Card, PerfSpec
from npu_conformance.engines.target import NO_TELEMETRY, VllmRunner
from npu_conformance.platform import Platform
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
def clean_runs() -> dict[tuple[str, int], perf.Measurement]:
    """This session's clean measurements, by (card, batch size): the injected slowdown's
    baseline where none is recorded, and what its achieved slowdown is reported against."""
    return {}


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


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_throughput(perf_spec: PerfSpec, batch: int, card: Card, platform: Platform, target: VllmRunner,
                    perf_model: dict[str, Any], perf_report: perf.PerfReport, calibration: perf.Calibration,
                    versions: dict[str, str], card_baselines: Callable[[str], baselines.BaselineFile],
                    clean_runs: dict[tuple[str, int], perf.Measurement], timed: Any,
                    request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                    conformance: ConformanceSession) -> None:
    """Median output tok/s at the card's exact lengths, and its ratio to the
    calibration, within the gate's tolerance of the recorded baseline."""
    timed.group = card.name
    rounds = perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration)
    m = perf.measure(timed, rounds, perf_spec.rounds, perf_spec.warmup_rounds, versions)
    clean_runs[(card.name, batch)] = m
    key, entry = _baseline(card, platform, perf_spec, batch, versions, card_baselines, target)
    gate = perf.judge(m, entry, perf_spec, _record_hint(card))
    lengths_ok, lengths = perf.check_lengths(m, perf_spec)
    figures = {**perf.case_figures(card, platform, m, gate, perf_model), "calibration": calibration.describe()}
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
                                      clean_runs: dict[tuple[str, int], perf.Measurement],
                                      slowdown_case: tuple[str, str], timed: Any, request: pytest.FixtureRequest,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy wait after every engine step, proportional to the step's own time
    and sized so rounds take `detect_slowdown` times as long (1.25x), fails the
    gate; the control, the same wrapper waiting 0, passes. Both against the baseline the
    clean case used (this session's clean run where the device has none recorded)."""
    batch = min(perf_spec.batch_sizes)
    slowed = slowdown_case[1] == "slowed"
    factor = perf_spec.detect_slowdown if slowed else 1.0
    clean = clean_runs.get((card.name, batch)) or perf.time_rounds(
        perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration),
        perf_spec.rounds, perf_spec.warmup_rounds, versions)
    key, entry = _baseline(card, platform, perf_spec, batch, versions, card_baselines, target)
    if entry is None:
        entry = baselines.Entry(key=key, versions=versions, source="this session's clean run (none recorded)",
                                runs=(clean.as_run(),))
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
        delay.stretch = perf.stretch_for(factor, round_s, delay.step_s)
        timed.group = f"{card.name} (injected slowdown)"
        m = perf.measure(timed, perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration),
                         perf_spec.rounds, perf_spec.warmup_rounds, versions)
    assert "step" not in vars(engine), "the engine's step was not restored"
    gate = perf.judge(m, entry, perf_spec, _record_hint(card))
    # Normalized: a change in the host's speed between the clean and the slowed run cancels.
    achieved = (clean.normalized / m.normalized if clean.normalized and m.normalized
                else clean.output_tok_s / m.output_tok_s)
    band = baselines.settings()["slowdown_self_test"]["achieved_band"]
    figures = {**perf.case_figures(card, platform, m, gate, perf_model), "calibration": calibration.describe(),
               "injected": {"factor": factor, "stretch_per_step": delay.stretch, "steps_per_round": steps,
                            "step_share_of_round": share, "achieved_slowdown": achieved,
                            "achieved_band": band if slowed else None},
               "expected_verdict": "fail" if slowed else "pass"}
    timed.extra_info.update(figures)
    deciding = gate.figures["gate"][gate.deciding]
    perf_report.add_case(request.node.nodeid, figures, gate.verdict, gate.message)
    if slowed:
        assert band[0] <= achieved <= band[1], (
            f"the injected {factor:g}x slowdown achieved {achieved:.2f}x on normalized figures, outside "
            f"{band[0]:g}-{band[1]:g}x (data/perf.yaml slowdown_self_test): the self-test did not test the "
            f"slowdown it claims")
        assert gate.verdict == "fail" and not deciding["passed"], (
            f"a {factor:g}x slowdown (each of {steps} steps per round stretched by {delay.stretch:.2f}x its time) "
            f"passed the gate: {gate.message}")
    else:
        assert gate.verdict == "pass", f"the control (no delay) failed the gate: {gate.message}"


@pytest.mark.perf
@pytest.mark.xdist_group("perf")
def test_agrees_with_vllm_benchmark(perf_spec: PerfSpec, card: Card, platform: Platform, target: VllmRunner,
                                    checkpoint: Path, perf_model: dict[str, Any], perf_report: perf.PerfReport,
                                    calibration: perf.Calibration,
                                    versions: dict[str, str], request: pytest.FixtureRequest,
                                    pytestconfig: pytest.Config) -> None:
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
    command = perf.bench_command(checkpoint, card, platform.name, batch, perf_spec, calibration.checkpoint,
                                 settings["calibration_runs"])
    env = {**os.environ, **card.env(platform.name), **NO_TELEMETRY}
    suite, bench, suite_host, bench_host = [], [], [], []
    for _ in range(settings["alternations"]):
        rounds = perf.Rounds(target, batch, perf_spec.input_len, perf_spec.output_len, calibration)
        m = perf.time_rounds(rounds, perf_spec.rounds, perf_spec.warmup_rounds, versions)
        suite.append(m.output_tok_s_overall)
        suite_host.append(m.calibration_tok_s)
        tok_s, host = perf.run_bench(command, env, pytestconfig.getoption("boot_timeout"))
        bench.append(tok_s)
        bench_host.append(host)
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
        "median_ratio": ratio, "tolerance": settings["tolerance"], "bench_command": command},
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
    # The whole host at half speed: both halve, the ratio holds, the absolute floor follows the host.
    loaded = perf.judge(_measured([0.08] * 3, [0.16] * 3), entry, _spec(), "")
    assert loaded.verdict == "pass", loaded.message
    assert loaded.figures["gate"]["host"]["speed"] == 0.5 and loaded.figures["gate"]["absolute"]["floor"] == 45.0
    assert "(baseline 100.0 x host 0.50)" in loaded.message
    # A faster host never raises the absolute floor.
    fast = perf.judge(_measured([0.02] * 3, [0.04] * 3), entry, _spec(), "")
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
    from npu_conformance.platform import Platform

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
    assert perf.bench_output_tok_s(text) == 1135.24
    with pytest.raises(ValueError, match="no 'Throughput"):
        perf.bench_output_tok_s("Traceback ...")


@pytest.mark.unit
def test_bench_command_carries_the_cards_lengths_and_engine():
    from npu_conformance.cards import load_catalog

    card = load_catalog()["synthetic-llama"]
    spec = card.platform("cpu").perf
    cmd = perf.bench_command(Path("/ck"), card, "cpu", 4, spec, Path("/cal"), 10)
    assert cmd[1:6] == ["-m", perf.BENCH_MODULE, "--calibration", "/cal", "10"]
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
