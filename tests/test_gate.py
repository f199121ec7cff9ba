"""The strict gate (--strict-gate, on where CI is set): a selected card that
cannot produce a verdict fails its tests with the reason, and skips with the
same reason otherwise. Inner pytest runs of the real suite on cards that each
miss one thing: their weights, a device, their kernel, their perf settings,
their perf baseline. And --expect-platform refuses the wrong platform at start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from npu_conformance.cards import CATALOG_DIR
from npu_conformance.plugin import STRICT_ENV, strict_default

ROOT = Path(__file__).resolve().parents[1]

# Card (a copy of a shipped one) -> what it lacks here, as the skip reason says it.
MISSING = {
    "no-weights": "weights unavailable",
    "no-device": "--devices names [3]",
    "no-kernel": "tests vLLM's own fp8_block kernel, which this host lacks",
    "no-perf": "has no perf settings for platform cpu",
}


def _card(name: str, source: str, **changes: object) -> dict:
    card = yaml.safe_load((CATALOG_DIR / f"{source}.yaml").read_text(encoding="utf-8"))
    return {**card, "name": name, "default": False, **changes}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("strict") / "catalog"
    folder.mkdir()
    shutil.copy(CATALOG_DIR / "_defaults.yaml", folder)
    perf = {"batch_sizes": [1], "input_len": 16, "output_len": 8, "rounds": 3, "warmup_rounds": 1, "slack": 0.12,
            "noise_k": 2.5, "detect_slowdown": 1.25}
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
        _card("no-baseline", "synthetic-llama", platforms={"cpu": {"perf": perf}}),
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
    ok = subprocess.run([*argv[:-2], "--expect-platform=cpu", f"--report-dir={tmp_path}", "tests/test_strict.py"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
