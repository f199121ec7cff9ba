"""A gate that cannot pass by not running, or by lowering its own bar.

The strict gate (--strict-gate, on where CI is set): a selected card that cannot
produce a verdict fails its tests with the reason, and skips with the same
reason otherwise. Inner pytest runs of the real suite on cards that each miss
one thing: their weights, a device, their kernel, their perf settings, their
perf baseline. --expect-platform refuses the wrong platform at start. A change
that edits a card's perf baseline is gated against the merge base's entry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from npu_conformance import baselines, perf
from npu_conformance.cards import CATALOG_DIR, load_catalog
from npu_conformance.platforms import Platform
from npu_conformance.plugin import STRICT_ENV, strict_default

ROOT = Path(__file__).resolve().parents[1]

# Card (a copy of a shipped one) -> what it lacks here, as the skip reason says it.
MISSING = {
    "no-weights": "weights unavailable",
    "no-device": "--devices names [3]",
    "no-kernel": "tests vLLM's own fp8_block kernel, which this host lacks",
    "no-perf": "has no perf settings for platform cpu",
}


# A perf section that times little: these tests judge the gate's logic on a real engine, not its speed.
SMALL_PERF = {"batch_sizes": [1], "input_len": 16, "output_len": 8, "rounds": 3, "warmup_rounds": 1, "slack": 0.12,
              "noise_k": 2.5, "detect_slowdown": 1.25}


def _card(name: str, source: str, **changes: object) -> dict:
    card = yaml.safe_load((CATALOG_DIR / f"{source}.yaml").read_text(encoding="utf-8"))
    return {**card, "name": name, "default": False, **changes}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("strict") / "catalog"
    folder.mkdir()
    shutil.copy(CATALOG_DIR / "_defaults.yaml", folder)
    cards = [
        # A hub card that has never been downloaded, in an offline run.
        _card("no-weights", "llama-68m"),
        # Its engine asks for a device the platform does not have (the run's --devices 3).
        _card("no-device", "synthetic-llama"),
        # vLLM's FP8 kernel path, on a host capped at AVX2 (no FP8 kernel there).
        _card("no-kernel", "sensitivity-qwen3-fp8-inverted-scale-kernel"),
        # Neither perf settings on this platform nor a reason for their absence.
        _card("no-perf", "synthetic-llama", platforms={"cpu": {"perf": None}}),
        # Measured with no recorded baseline (the run's --perf-baselines is empty).
        _card("no-baseline", "synthetic-llama", platforms={"cpu": {"perf": SMALL_PERF}}),
    ]
    for card in cards:
        (folder / f"{card['name']}.yaml").write_text(yaml.safe_dump(card, allow_unicode=True), encoding="utf-8")
    return folder


def _inner(args: list[str], strict: bool, tmp_path: Path, pytestconfig: pytest.Config,
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rsfE",
            "--strict-gate" if strict else "--no-strict-gate", f"--report-dir={tmp_path / 'report'}",
            f"--cache-dir={pytestconfig.getoption('cache_dir')}", *args]
    # A wide terminal: the summary lines carry the whole reason.
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "1000", **(env or {})},
                          timeout=pytestconfig.getoption("boot_timeout") + 600)
    return proc, f"inner run: {' '.join(argv)}\n{proc.stdout[-5000:]}{proc.stderr[-2000:]}"


@pytest.mark.harness
@pytest.mark.parametrize("strict", [False, True], ids=["local", "strict"])
def test_each_missing_part_skips_locally_and_fails_strictly(catalog: Path, strict: bool, tmp_path: Path,
                                                            pytestconfig: pytest.Config) -> None:
    """No engine boots: each card stops at what it lacks, before its engine."""
    args = ["tests/test_precision.py", "tests/test_sensitivity.py", "tests/test_perf.py",
            "-k", "test_top1_match or test_bug_is_caught or test_throughput", f"--catalog={catalog}",
            "--offline", "--devices=3", *(f"--model={name}" for name in MISSING)]
    proc, context = _inner(args, strict, tmp_path, pytestconfig, {"NPU_CONFORMANCE_CPU_ISA": "avx2"})
    lines = proc.stdout.splitlines()
    for name, reason in MISSING.items():
        found = [x for x in lines if reason in x and (x.startswith("SKIPPED") or x.startswith("ERROR"))]
        assert found, f"{name}: no line says '{reason}'\n{context}"
        if strict:
            assert all(x.startswith("ERROR") and "strict gate: " in x for x in found), context
        else:
            assert all(x.startswith("SKIPPED") for x in found), context
    assert proc.returncode == (1 if strict else 0), context
    assert (" passed" not in lines[-1]) and (" error" in lines[-1] if strict else " skipped" in lines[-1]), context


@pytest.mark.harness
@pytest.mark.parametrize("strict", [False, True], ids=["local", "strict"])
def test_a_measured_case_without_baseline_skips_locally_and_fails_strictly(
        catalog: Path, strict: bool, tmp_path: Path, pytestconfig: pytest.Config) -> None:
    baselines = tmp_path / "no-baselines"
    baselines.mkdir()
    args = ["tests/test_perf.py", "-k", "test_throughput", f"--catalog={catalog}", "--model=no-baseline",
            f"--perf-baselines={baselines}"]
    proc, context = _inner(args, strict, tmp_path, pytestconfig)
    wanted = "no perf baseline for no-baseline at batch 1"
    line = next((x for x in proc.stdout.splitlines() if wanted in x and x.startswith(("FAILED", "SKIPPED"))), None)
    assert line is not None, context
    assert line.startswith("FAILED" if strict else "SKIPPED") and ("strict gate: " in line) is strict, context
    assert proc.returncode == (1 if strict else 0), context
    assert not list(baselines.iterdir()), "a gate run recorded a baseline"


@pytest.mark.unit
@pytest.mark.parametrize("environ, strict", [({}, False), ({"CI": "true"}, True), ({"CI": "false"}, False),
                                             ({"CI": "true", STRICT_ENV: "0"}, False), ({STRICT_ENV: "1"}, True)])
def test_strict_is_on_where_ci_is_set_unless_told_otherwise(environ: dict[str, str], strict: bool) -> None:
    assert strict_default(environ) is strict


@pytest.mark.unit
def test_strict_env_is_one_or_zero() -> None:
    with pytest.raises(pytest.UsageError, match=f"{STRICT_ENV}='yes': 1 .strict. or 0"):
        strict_default({STRICT_ENV: "yes"})


@pytest.mark.harness
def test_expect_platform_npu_fails_here_at_start_in_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", "--expect-platform=npu",
            f"--report-dir={tmp_path}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    errors = [x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("ERROR")]
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR and len(errors) == 1, proc.stdout + proc.stderr
    assert errors[0] == ("ERROR: --expect-platform=npu: vLLM's platform is cpu from vllm, expected npu from "
                         "vllm_ascend (is vllm_ascend installed, and did it load?)"), errors
    ok = subprocess.run([*argv[:-2], "--expect-platform=cpu", f"--report-dir={tmp_path}",
                         f"tests/{Path(__file__).name}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c",
                    "commit.gpgsign=false", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.harness
def test_a_baseline_edit_is_gated_against_the_base_entry(tmp_path: Path, platform: Platform,
                                                         pytestconfig: pytest.Config) -> None:
    """Two commits: the base records a bar no engine here reaches; the change
    lowers it to one any engine passes. With --changed-since the change's run is
    judged against the base's entry and fails (and --perf-record keeps the failing
    run out of the file); the work tree's entry alone passes."""
    repo = tmp_path / "repo"
    catalog, recorded = repo / "npu_conformance" / "catalog", repo / baselines.BASELINES_DIR.relative_to(ROOT)
    catalog.mkdir(parents=True)
    recorded.mkdir(parents=True)
    shutil.copy(CATALOG_DIR / "_defaults.yaml", catalog)
    card_data = _card("edited", "synthetic-llama", platforms={"cpu": {"perf": SMALL_PERF}})
    (catalog / "edited.yaml").write_text(yaml.safe_dump(card_data, allow_unicode=True), encoding="utf-8")
    card = load_catalog(catalog)["edited"]
    key = perf.baseline_key(card, platform, card.platform(platform.name).perf, 1, "none")
    versions = baselines.versions_of(platform.versions)

    def bar(tok_s: float) -> str:
        # Runs without a calibration (as hand-measured seeds): gated on tok/s alone, at any host speed.
        runs = tuple(baselines.Run(recorded_at=f"2026-12-0{i}T00:00:00+00:00", rounds=3, tok_s=tok_s,
                                   normalized=None, calibration_tok_s=None) for i in (1, 2, 3))
        entry = baselines.Entry(key=key, versions=versions, source="test", runs=runs)
        file = baselines.BaselineFile(format=baselines.FORMAT, card="edited", entries=(entry,))
        return json.dumps(file.model_dump(mode="json"))

    _git(repo, "init", "-q", "-b", "main")
    (recorded / "edited.json").write_text(bar(1e6), encoding="utf-8")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base: the bar")
    _git(repo, "switch", "-q", "-c", "pr")
    (recorded / "edited.json").write_text(bar(1.0), encoding="utf-8")
    _git(repo, "commit", "-q", "-am", "pr: a lower bar")

    args = ["tests/test_perf.py", "-k", "test_throughput", f"--catalog={catalog}", f"--perf-baselines={recorded}"]
    lowered = (recorded / "edited.json").read_text(encoding="utf-8")
    # Recording too: a run that fails its gate is not appended to the baselines.
    gated, context = _inner([*args, "--changed-since=main", "--perf-record"], False, tmp_path / "gated", pytestconfig)
    line = next((x for x in gated.stdout.splitlines() if x.startswith("FAILED")), "")
    assert gated.returncode == 1 and "edited-bs1" in line and "not recorded" in line, context
    assert (recorded / "edited.json").read_text(encoding="utf-8") == lowered, "a failing run was recorded"
    cases = json.loads((tmp_path / "gated" / "report" / "perf_report.json").read_text())["cases"]
    judged = next(iter(cases.values()))
    assert judged["verdict"] == "fail" and judged["baseline"]["tok_s"] == 1e6, judged
    source = judged["baseline"]["source"]
    assert "at merge base" in source and "npu_conformance/data/perf_baselines/edited.json" in source, source
    # The same change's own entry, read as a plain run reads it: the lowered bar passes.
    plain, context = _inner([*args, "--model=edited"], False, tmp_path / "plain", pytestconfig)
    assert plain.returncode == 0, context
