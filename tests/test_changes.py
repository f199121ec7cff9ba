"""`--changed-since=REF`: which cards a change selects, and why (npu_conformance.changes,
on a throw-away git repository laid out as the suite), its wiring into the plugin,
and the vllm-ascend CI workflow that runs the selected cards on an NPU."""

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

from npu_conformance.cards import CATALOG_DIR, DEFAULTS_NAME, load_catalog
from npu_conformance.changes import (CARD_DATA, MACHINERY_DIRS, MACHINERY_FILES, PATCHES, ChangesError, Reason,
                                     changed_cards, runner_matrix)
from npu_conformance.plugin import PATH_OPTIONS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "npu-conformance.yaml"
# Self-hosted runner labels the workflow uses, as vllm-ascend's .github/actionlint.yaml lists them.
SELF_HOSTED_LABELS = ("linux-aarch64-a2b3-1", "linux-aarch64-a2b3-2")

# A minimal tree in the suite's layout: cards (raw YAML: the selection reads only
# `prompts` and `patch`), prompt sets, patches, one shared module, a doc.
TREE = {
    "npu_conformance/catalog/_defaults.yaml": "prompts: default\n",
    "npu_conformance/catalog/plain.yaml": "name: plain\n",
    "npu_conformance/catalog/gptq-card.yaml": "name: gptq-card\npatch: gptq\n",
    "npu_conformance/catalog/fp8-card.yaml": "name: fp8-card\npatch: fp8_block\n",
    "npu_conformance/catalog/long-card.yaml": "name: long-card\nprompts: long\n",
    "npu_conformance/catalog/inline-card.yaml": "name: inline-card\nprompts:\n  - {id: a, text: hi}\n",
    "npu_conformance/prompts/default.yaml": "prompts:\n  - {id: a, text: hello}\n",
    "npu_conformance/prompts/long.yaml": "prompts:\n  - {id: b, text: hello, length: 300}\n",
    "npu_conformance/prompts/unused.yaml": "prompts:\n  - {id: c, text: hi}\n",
    "npu_conformance/cards.py": "CARDS = 1\n",
    "npu_conformance/patches/__init__.py": "",
    "npu_conformance/patches/loader.py": "LOADER = 1\n",
    "npu_conformance/patches/gptq.py": "NAME = 'gptq'\n",
    "npu_conformance/patches/fp8_block.py": "NAME = 'fp8_block'\n",
    "fixtures/target.py": "",
    "tests/test_x.py": "",
    "conftest.py": "",
    "pyproject.toml": "",
    "Makefile": "",
    "README.md": "# suite\n",
}
CARDS = ("fp8-card", "gptq-card", "inline-card", "long-card", "plain")


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid",
                           "-c", "commit.gpgsign=false", *args], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def commit(repo: Path, files: dict[str, str], message: str = "change") -> None:
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """TREE committed on `main`, with a branch `pr` checked out."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commit(root, TREE, "base")
    git(root, "switch", "-q", "-c", "pr")
    return root


def selection(repo: Path, ref: str = "main") -> dict[str, tuple[Reason, ...]]:
    return dict(changed_cards(ref, repo / "npu_conformance/catalog", repo / "npu_conformance/prompts").reasons)


def test_a_card_edit_selects_that_card(repo: Path) -> None:
    path = "npu_conformance/catalog/plain.yaml"
    commit(repo, {path: "name: plain\nweights: {modelscope: org/plain, revision: v2}\n"})
    assert selection(repo) == {"plain": (Reason(path, "its card"),)}


def test_a_perf_baseline_selects_its_card(repo: Path) -> None:
    path = "npu_conformance/data/perf_baselines/plain.json"
    commit(repo, {path: "{}\n", "npu_conformance/data/perf_baselines/gone.json": "{}\n"})
    result = changed_cards("main", repo / "npu_conformance/catalog", repo / "npu_conformance/prompts")
    assert result.reasons == {"plain": (Reason(path, "its perf baseline"),)}
    assert result.unmatched == ["npu_conformance/data/perf_baselines/gone.json"]


def test_a_prompt_set_edit_selects_the_cards_that_use_it(repo: Path) -> None:
    default, long = "npu_conformance/prompts/default.yaml", "npu_conformance/prompts/long.yaml"
    commit(repo, {default: "prompts:\n  - {id: a, text: hello there}\n"})
    # The set named in _defaults.yaml: every card that does not name another or list its own.
    assert selection(repo) == {n: (Reason(default, "its prompt set default"),) for n in ("fp8-card", "gptq-card", "plain")}
    commit(repo, {long: "prompts:\n  - {id: b, text: hello, length: 400}\n"})
    assert selection(repo)["long-card"] == (Reason(long, "its prompt set long"),)


def test_a_prompt_set_no_card_uses_selects_none(repo: Path) -> None:
    commit(repo, {"npu_conformance/prompts/unused.yaml": "prompts:\n  - {id: c, text: bye}\n"})
    result = changed_cards("main", repo / "npu_conformance/catalog", repo / "npu_conformance/prompts")
    assert result.cards == [] and result.unmatched == ["npu_conformance/prompts/unused.yaml"]


@pytest.mark.parametrize(("path", "cards"), [
    ("npu_conformance/patches/gptq.py", ["gptq-card"]),
    ("npu_conformance/patches/fp8_block.py", ["fp8-card"]),
])
def test_a_patch_edit_selects_the_cards_with_that_patch(repo: Path, path: str, cards: list[str]) -> None:
    commit(repo, {path: "NAME = 'changed'\n"})
    patch = Path(path).stem
    assert selection(repo) == {n: (Reason(path, f"its patch {patch}"),) for n in cards}


@pytest.mark.parametrize("path", [f"npu_conformance/patches/{name}.py" for name in ("loader", "__init__", "new_format")])
def test_the_patch_hooks_select_every_card(repo: Path, path: str) -> None:
    """vLLM runs the hooks in every engine, around every model's weights."""
    commit(repo, {path: "# changed\n"})
    assert selection(repo) == {n: (Reason(path, "load-time hooks every engine runs"),) for n in CARDS}


@pytest.mark.parametrize(("path", "why"), [
    ("npu_conformance/cards.py", "shared machinery"),
    ("fixtures/target.py", "shared machinery"),
    ("tests/test_x.py", "shared machinery"),
    ("conftest.py", "shared machinery"),
    ("pyproject.toml", "shared machinery"),
    ("npu_conformance/catalog/_defaults.yaml", "catalog data under every card"),
])
def test_shared_machinery_selects_every_card(repo: Path, path: str, why: str) -> None:
    commit(repo, {path: TREE[path] + "# changed\n"})
    assert selection(repo) == {n: (Reason(path, why),) for n in CARDS}


@pytest.mark.parametrize("path", ["README.md", "Makefile", "docs/notes.md"])
def test_a_change_outside_the_suite_selects_no_card(repo: Path, path: str) -> None:
    commit(repo, {path: "changed\n"})
    result = changed_cards("main", repo / "npu_conformance/catalog", repo / "npu_conformance/prompts")
    assert result.reasons == {} and result.unmatched == [path]
    assert result.describe()[-1] == f"  selecting no card: {path}"


def test_several_changes_give_each_card_all_its_reasons(repo: Path) -> None:
    card, patch = "npu_conformance/catalog/gptq-card.yaml", "npu_conformance/patches/gptq.py"
    commit(repo, {card: "name: gptq-card\npatch: gptq\nmax_tokens: 8\n", patch: "NAME = 'x'\n", "README.md": "x\n"})
    result = changed_cards("main", repo / "npu_conformance/catalog", repo / "npu_conformance/prompts")
    assert result.reasons == {"gptq-card": (Reason(card, "its card"), Reason(patch, "its patch gptq"))}
    assert result.describe()[1:] == [f"  gptq-card: {card} (its card) and 1 more", "  selecting no card: README.md"]


def test_merge_base_semantics_ignore_what_landed_on_the_base(repo: Path) -> None:
    """As a pull request's diff: a commit on main after the branch point is not the PR's change."""
    commit(repo, {"npu_conformance/catalog/plain.yaml": "name: plain\nmax_tokens: 9\n"})
    git(repo, "switch", "-q", "main")
    commit(repo, {"npu_conformance/catalog/long-card.yaml": "name: long-card\nprompts: long\nmax_tokens: 3\n"})
    git(repo, "switch", "-q", "pr")
    assert list(selection(repo)) == ["plain"]


def test_uncommitted_changes_count(repo: Path) -> None:
    """Staged, unstaged and untracked files: what the PR will hold once committed."""
    write(repo, {"npu_conformance/catalog/plain.yaml": "name: plain\nmax_tokens: 9\n",
                 "npu_conformance/catalog/new-card.yaml": "name: new-card\npatch: gptq\n",
                 "npu_conformance/patches/fp8_block.py": "NAME = 'staged'\n"})
    git(repo, "add", "npu_conformance/patches/fp8_block.py")
    assert sorted(selection(repo, "HEAD")) == ["fp8-card", "new-card", "plain"]


def test_a_deleted_card_selects_nothing(repo: Path) -> None:
    git(repo, "rm", "-q", "npu_conformance/catalog/plain.yaml")
    git(repo, "commit", "-q", "-m", "drop plain")
    assert selection(repo) == {}


def test_an_unknown_ref_is_a_clear_error(repo: Path) -> None:
    with pytest.raises(ChangesError, match=r"--changed-since no-such-branch: fatal: Not a valid object name"):
        selection(repo, "no-such-branch")
    with pytest.raises(ChangesError, match="not a git ref"):
        selection(repo, "--output=/tmp/x")


def test_outside_a_git_repository_is_a_clear_error(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    with pytest.raises(ChangesError, match=r"--changed-since main: fatal: not a git repository"):
        changed_cards("main", catalog, tmp_path)


# ---- the plugin: pytest --changed-since ----


def run_pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The plugin loads as the venv's pytest11 entry point; `cwd` holds no tests."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def card_repo(tmp_path: Path) -> Path:
    """A git repository holding a valid catalog of cards a and b, both changed on branch `pr`."""
    root = tmp_path / "cards"
    catalog = root / "catalog"
    catalog.mkdir(parents=True)
    shutil.copy(CATALOG_DIR / DEFAULTS_NAME, catalog / DEFAULTS_NAME)
    card = "name: {}\narchitecture: LlamaForCausalLM\nweights: {{synthetic: llama}}\n"
    git(root, "init", "-q", "-b", "main")
    commit(root, {f"catalog/{n}.yaml": card.format(n) for n in ("a", "b", "c")}, "base")
    git(root, "switch", "-q", "-c", "pr")
    commit(root, {f"catalog/{n}.yaml": card.format(n) + "max_tokens: 8\n" for n in ("a", "b")})
    return root


@pytest.mark.parametrize(("model", "selected"), [([], "a, b"), (["--model", "b", "--model", "c"], "b")])
def test_the_header_says_what_changed_selects(card_repo: Path, model: list[str], selected: str) -> None:
    """--model narrows the changed cards (c is named but unchanged)."""
    proc = run_pytest(card_repo, "--co", f"--catalog={card_repo / 'catalog'}", "--changed-since=main", *model)
    header = proc.stdout + proc.stderr
    assert "--changed-since main (merge base" in header and "select 2 card(s)" in header, header
    assert "  a: catalog/a.yaml (its card)" in header, header
    assert f"selected: {selected}\n" in header, header


def test_a_bad_ref_stops_the_run(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, "--co", "--changed-since=no-such-ref")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "--changed-since no-such-ref: fatal: Not a valid object name no-such-ref" in proc.stderr


# ---- the workflow ----


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


def test_the_npu_job_runs_precision_then_perf_of_the_changed_cards(tmp_path: Path) -> None:
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
    assert [argv[argv.index("-m") + 1] for argv in runs] == ["precision", "sensitivity", "perf"]
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
