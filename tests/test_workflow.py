"""The vllm-ascend CI workflow (.github/workflows/npu-conformance.yaml): its schema
and actionlint, the CPU job's command (the README's), the NPU job's runs of the
changed cards, the one stable check, its trigger paths, and the plan job's
runner matrix (npu_conformance.changes.runner_matrix)."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_changes import run_pytest

from npu_conformance.cards import CATALOG_DIR, load_catalog
from npu_conformance.changes import CARD_DATA, MACHINERY_DIRS, MACHINERY_FILES, PATCHES, ChangesError, runner_matrix
from npu_conformance.plugin import PATH_OPTIONS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "npu-conformance.yaml"
# Self-hosted runner labels the workflow uses, as vllm-ascend's .github/actionlint.yaml lists them.
SELF_HOSTED_LABELS = ("linux-aarch64-a2b3-1", "linux-aarch64-a2b3-2")


def workflow() -> dict[str, Any]:
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    # YAML 1.1 reads the key `on` as true.
    data["on"] = data.pop(True)
    return data


def commands(job: dict[str, Any]) -> list[list[str]]:
    """Every shell command line of the job's run steps, split as the shell would."""
    lines = []
    for step in job["steps"]:
        script = step.get("run", "").replace("\\\n", " ")
        lines += [shlex.split(line) for line in script.splitlines() if line.strip() and not line.strip().startswith("#")]
    return lines


def pytest_commands(job: dict[str, Any]) -> list[list[str]]:
    out = []
    for argv in commands(job):
        if argv[:1] == ["pytest"]:
            out.append(argv[1:])
        elif argv[1:3] == ["-m", "pytest"] and argv[0].startswith("python"):
            out.append(argv[3:])
    return out


def test_the_workflow_matches_the_github_workflow_schema() -> None:
    # check-jsonschema ships the schema (SchemaStore's github-workflow.json), so this runs offline everywhere.
    binary = Path(sys.executable).parent / "check-jsonschema"
    proc = subprocess.run([str(binary), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    # The check must be able to fail: a job without runs-on is not a workflow GitHub accepts.
    broken = workflow()
    del broken["jobs"]["cpu"]["runs-on"]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken), encoding="utf-8")
    proc = subprocess.run([str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema",
                           "vendor.github-workflows", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout


def test_actionlint_passes_the_workflow(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    binary = shutil.which("actionlint", path=os.pathsep.join([str(venv_bin), os.environ.get("PATH", "")]))
    if binary is None:
        pytest.skip("actionlint is not installed: pip install -e '.[lint]' (its build downloads the binary from GitHub)")
    config = tmp_path / "actionlint.yaml"
    config.write_text(yaml.safe_dump({"self-hosted-runner": {"labels": list(SELF_HOSTED_LABELS)}}), encoding="utf-8")
    # shellcheck, where installed, checks the run scripts too (actionlint skips it otherwise).
    proc = subprocess.run([binary, "-config-file", str(config), str(WORKFLOW)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_cpu_job_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## The two commands\n+```sh\n(.*?)```", readme, re.S)
    assert block, "README.md has no '## The two commands' code block"
    readme_test = [line.split("#")[0].strip() for line in block.group(1).splitlines() if "# the whole suite" in line]
    assert readme_test == ["make test"], block.group(1)
    ci_run = [line for line in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#")]
    assert ci_run[-1] == readme_test[0], ".ci/run does not end with the README's test command"
    cpu = workflow()["jobs"]["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    assert ["bash", ".ci/run"] in commands(cpu)
    assert next(s for s in cpu["steps"] if s.get("run") == "bash .ci/run")["env"]["CI"] == "true"


def test_the_cpu_job_installs_the_pinned_actionlint() -> None:
    pin = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["lint"]
    installs = [argv[argv.index("install") + 1:] for argv in commands(workflow()["jobs"]["cpu"])
                if "pip" in " ".join(argv) and "install" in argv]
    assert pin in installs, installs


def pytest_options(tmp_path: Path) -> tuple[set[str], set[str]]:
    """(every option pytest knows here, the plugin's own), from `pytest --help`."""
    proc = run_pytest(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    known = set()
    for part in re.findall(r"^ {2}(-\S.*?)(?: {2,}|$)", proc.stdout, re.M):
        known.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", part))
    group = proc.stdout.split("vLLM NPU conformance:\n", 1)[1].split("\n\n", 1)[0]
    return known, set(re.findall(r"^ {2}(--[\w-]+)", group, re.M))


def test_the_npu_job_runs_precision_accuracy_then_perf_of_the_changed_cards(tmp_path: Path) -> None:
    data = workflow()
    npu = data["jobs"]["npu"]
    # One job per runner the plan job found in the changed cards' npu entries.
    assert npu["runs-on"] == "${{ matrix.runner }}" and "ascend" in npu["container"]["image"]
    assert npu["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert npu["env"]["MODELS"] == "${{ matrix.models }}"
    assert ["pip", "install", "-e", ".", "--no-deps"] in commands(npu)  # as the README's Ascend host
    assert npu["env"]["BASE_REF"] == "${{ github.base_ref }}"
    known, ours = pytest_options(tmp_path)
    runs = pytest_commands(npu)
    # Precision and task accuracy in one run: one precision_report.json holds both verdicts.
    assert [argv[argv.index("-m") + 1] for argv in runs] == ["precision or accuracy", "sensitivity", "perf"]
    for argv in runs:
        options = {a.split("=", 1)[0]: a.partition("=")[2] for a in argv if a.startswith("--")}
        assert set(options) <= known, f"options pytest does not define: {set(options) - known}"
        # Every run is strict, on the NPU platform from vllm-ascend or not at all.
        assert "--strict-gate" in options and options["--expect-platform"] == "npu", argv
        if argv[argv.index("-m") + 1] == "sensitivity":
            # One known-buggy card, so the job shows the gate can fail on the device.
            card = load_catalog()[options["--model"]]
            assert card.expect.verdict == "fail" and card.weights.kind == "synthetic", card.name
        else:
            assert "$MODELS" in argv
            assert options["--changed-since"] == "origin/$BASE_REF" and "--changed-since" in ours
        assert "--report-dir" in ours and options["--junit-xml"].startswith("results/")
        # A path option given as '--opt DIR' would make DIR pytest's root directory.
        for name in PATH_OPTIONS:
            flag = "--" + name.replace("_", "-")
            assert flag not in argv, f"write {flag}=VALUE"
    assert dict(a.partition("=")[::2] for a in runs[2] if a.startswith("--"))["--benchmark-json"].startswith("results/")
    uploads = [s["with"]["path"] for s in npu["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads == ["results/"]
    assert any("GITHUB_STEP_SUMMARY" in s.get("run", "") and "report.md" in s["run"] for s in npu["steps"])


def test_one_stable_check_needs_every_job() -> None:
    jobs = workflow()["jobs"]
    gate = jobs["npu-conformance"]
    assert gate["name"] == "npu-conformance"
    assert set(gate["needs"]) == set(jobs) - {"npu-conformance"}
    assert "always()" in gate["if"]


def test_the_workflow_triggers_on_every_path_that_selects_a_card() -> None:
    globs = workflow()["on"]["pull_request"]["paths"]
    samples = [*(f"{d}x/y.py" for d in (*CARD_DATA, PATCHES, *MACHINERY_DIRS)), *MACHINERY_FILES]
    missing = [p for p in samples if not any(fnmatch.fnmatchcase(p, g) for g in globs)]
    assert not missing, f"{missing} select cards but do not trigger the workflow"


def test_the_plan_routes_every_card_to_a_known_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every card of the shipped catalog names an npu runner the workflow knows;
    the matrix groups them by it, the TP=2 card on a two-card runner."""
    catalog = CATALOG_DIR
    names = sorted(p.stem for p in catalog.glob("*.yaml") if not p.name.startswith("_"))
    matrix = runner_matrix(names, catalog, "npu")
    assert {job["runner"] for job in matrix} <= set(SELF_HOSTED_LABELS)
    routed = {card: job["runner"] for job in matrix for card in job["cards"].split()}
    assert sorted(routed) == names and routed["synthetic-llama-tp2"] == "linux-aarch64-a2b3-2"
    for job in matrix:
        assert job["models"].split() == [f"--model={c}" for c in job["cards"].split()]
    plan = [argv[:6] for argv in commands(workflow()["jobs"]["plan"]) if "npu_conformance.changes" in argv]
    assert plan == [["python", "-m", "npu_conformance.changes", "origin/$BASE_REF", "--platform", "npu"]]


def test_a_card_without_a_runner_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_defaults.yaml").write_text("prompts: default\n")
    (tmp_path / "lost.yaml").write_text("name: lost\n")
    (tmp_path / "found.yaml").write_text("name: found\nplatforms: {npu: {runner: linux-aarch64-a2b3-1}}\n")
    with pytest.raises(ChangesError, match="cards with no platforms.npu.runner: lost"):
        runner_matrix(["found", "lost"], tmp_path, "npu")
    assert runner_matrix(["found"], tmp_path, "npu") == [
        {"runner": "linux-aarch64-a2b3-1", "cards": "found", "models": "--model=found"}]
