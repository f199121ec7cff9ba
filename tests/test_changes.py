"""`--changed-since=REF`: which cards a change selects, and why (npu_conformance.changes,
on a throw-away git repository laid out as the suite), and its wiring into the
plugin. The CI workflow that runs the selected cards is tested in test_workflow.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu_conformance.cards import CATALOG_DIR, DEFAULTS_NAME
from npu_conformance.changes import ChangesError, Reason, changed_cards

pytestmark = pytest.mark.unit

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
