"""Which cards a change touches: the selection behind `--changed-since=REF`.

The change is what a pull request's diff shows (`git diff REF...HEAD`: from the
merge base of REF and HEAD, so commits that landed on REF meanwhile do not
count) plus what is not committed yet (staged, unstaged and untracked files), so
`pytest --changed-since=origin/main` before a commit selects what the pull
request will. In CI the checkout is clean and both are the same.

A changed path (relative to the top of the git repository holding the catalog)
selects:

- `<catalog>/<card>.yaml`: that card (its weights and revision are in it too);
- `<catalog>/_<name>.yaml` (`_defaults.yaml`): every card, merged over it;
- `<prompts>/<set>.yaml`: the cards whose `prompts:` names that set;
- `npu_conformance/data/perf_baselines/<card>.json`: that card (its recorded perf
  baselines: a refresh is gated like any change, against the merge base's
  entries: a change must not lower the bar it is judged by);
- `patches/<patch>.py`: the cards whose `patch:` is `<patch>` (fp8_block, gptq);
- any other file in `patches/`: every card: vLLM runs those hooks in every
  engine, around every model's quantization check and weight stream;
- the suite's machinery (MACHINERY_DIRS, MACHINERY_FILES): every card;
- anything else (README.md, the CPU set-up, another catalog's cards): none.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from npu_conformance.cards import CATALOG_DIR, DEFAULTS_NAME, PROMPTS_DIR
from npu_conformance.merge import deep_merge

# The suite's own layout, relative to the repository root. Card data that the
# rules for the run's catalog and prompt sets did not claim selects no card (a
# card of the shipped catalog while --catalog names another, a deleted card).
CARD_DATA = ("npu_conformance/catalog/", "npu_conformance/prompts/", "npu_conformance/data/perf_baselines/")
BASELINES = "npu_conformance/data/perf_baselines/"
PATCHES = "npu_conformance/patches/"
# How every card is run and judged; the NPU workflow too, which runs them.
MACHINERY_DIRS = ("npu_conformance/", "fixtures/", "tests/")
MACHINERY_FILES = ("conftest.py", "pyproject.toml", ".github/workflows/npu-conformance.yaml")


class ChangesError(ValueError):
    """The change cannot be computed: unknown ref, not a git repository, no git."""


@dataclass(frozen=True)
class Reason:
    path: str  # the changed file, relative to the repository root
    why: str


@dataclass(frozen=True)
class CardInputs:
    """What of a card's own files a change can touch, read from its raw YAML
    merged over the catalog's defaults (no validation: load_catalog does that)."""

    name: str
    prompt_set: str | None  # None: the card lists its prompts inline
    patch: str | None
    runners: Mapping[str, str]  # platform -> the CI runner label its entry routes the card to


@dataclass(frozen=True)
class ChangedCards:
    ref: str
    base: str  # the merge base of ref and HEAD
    changed: tuple[str, ...]
    reasons: Mapping[str, tuple[Reason, ...]]  # selected card -> the changes that select it
    root: Path  # the repository's top

    def changed_baseline(self, card: str) -> str | None:
        """The repository path of `card`'s perf baselines, where the change touches them."""
        path = f"{BASELINES}{card}.json"
        return path if path in self.changed else None

    def at_base(self, path: str) -> str | None:
        """`path`'s text at the merge base (what the change is judged against), None where it did not exist."""
        try:
            return _git(self.root, "show", f"{self.base}:{path}")
        except ChangesError:  # git's "does not exist in <base>"
            return None

    @property
    def cards(self) -> list[str]:
        return sorted(self.reasons)

    @property
    def unmatched(self) -> list[str]:
        """Changed files that select no card."""
        used = {r.path for reasons in self.reasons.values() for r in reasons}
        return [p for p in self.changed if p not in used]

    def describe(self) -> list[str]:
        """Lines for the session header: what was selected and why."""
        lines = [f"--changed-since {self.ref} (merge base {self.base[:12]}): {len(self.changed)} changed "
                 f"file(s) select {len(self.reasons)} card(s)"]
        for name in self.cards:
            first, *rest = self.reasons[name]
            more = f" and {len(rest)} more" if rest else ""
            lines.append(f"  {name}: {first.path} ({first.why}){more}")
        if self.unmatched:
            lines.append(f"  selecting no card: {', '.join(self.unmatched)}")
        return lines


def _git(root: Path, *args: str) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    except FileNotFoundError:
        raise ChangesError("git is not installed") from None
    if proc.returncode != 0:
        raise ChangesError(proc.stderr.strip() or f"git {' '.join(args)} exited {proc.returncode}")
    return proc.stdout


def changed_files(ref: str, directory: Path) -> tuple[Path, str, list[str]]:
    """(repository root, merge base, changed paths) of the repository holding `directory`."""
    if ref.startswith("-"):
        raise ChangesError(f"--changed-since {ref}: not a git ref")
    try:
        root = Path(_git(directory, "rev-parse", "--show-toplevel").strip())
        base = _git(root, "merge-base", ref, "HEAD").strip()
        # -z: paths verbatim (no quoting of unusual names); --no-renames: a rename
        # lists both paths, so each is matched by its own rule.
        tracked = _git(root, "diff", "--name-only", "--no-renames", "-z", base).split("\0")
        untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z").split("\0")
    except ChangesError as exc:
        raise ChangesError(f"--changed-since {ref}: {exc}") from None
    return root, base, sorted({p for p in (*tracked, *untracked) if p})


def card_inputs(catalog: Path) -> dict[str, CardInputs]:
    """Every card of `catalog` (files starting with '_' are shared data, as in load_catalog)."""
    defaults_file = catalog / DEFAULTS_NAME
    defaults = _yaml_mapping(defaults_file) if defaults_file.is_file() else {}
    inputs = {}
    for file in sorted(catalog.glob("*.yaml")):
        if file.name.startswith("_"):
            continue
        data = deep_merge(defaults, _yaml_mapping(file))
        prompts, patch = data.get("prompts"), data.get("patch")
        platforms = data.get("platforms") if isinstance(data.get("platforms"), dict) else {}
        runners = {name: entry["runner"] for name, entry in platforms.items()
                   if isinstance(entry, dict) and isinstance(entry.get("runner"), str)}
        inputs[file.stem] = CardInputs(file.stem, prompts if isinstance(prompts, str) else None,
                                       patch if isinstance(patch, str) else None, runners)
    return inputs


def runner_matrix(cards: Sequence[str], catalog: Path, platform: str) -> list[dict[str, Any]]:
    """The selected cards grouped by the runner their `platform` entry names, as a
    GitHub Actions matrix: one job per runner label, `--model` per card. A card
    with no runner for the platform is refused: it would silently not run."""
    inputs = card_inputs(catalog)
    unrouted = sorted(c for c in cards if platform not in inputs[c].runners)
    if unrouted:
        raise ChangesError(f"cards with no platforms.{platform}.runner: {', '.join(unrouted)}")
    groups: dict[str, list[str]] = {}
    for card in sorted(cards):
        groups.setdefault(inputs[card].runners[platform], []).append(card)
    return [{"runner": runner, "cards": " ".join(names), "models": " ".join(f"--model={n}" for n in names)}
            for runner, names in sorted(groups.items())]




def _yaml_mapping(file: Path) -> dict[str, Any]:
    data = yaml.safe_load(file.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _relative(path: Path, root: Path) -> str | None:
    """`path` as a repository path ending in '/', or None outside the repository."""
    try:
        return f"{path.resolve().relative_to(root.resolve()).as_posix()}/"
    except ValueError:
        return None


def select(changed: Sequence[str], cards: Mapping[str, CardInputs], catalog: str | None,
           prompts: str | None) -> dict[str, tuple[Reason, ...]]:
    """Card -> the changed paths that select it; `catalog` and `prompts` are the
    run's folders as repository paths ending in '/' (None: outside the repository)."""
    reasons: dict[str, list[Reason]] = {}

    def add(names: Iterable[str], path: str, why: str) -> None:
        for name in names:
            reasons.setdefault(name, []).append(Reason(path, why))

    for path in changed:
        file = PurePosixPath(path)
        folder = f"{file.parent.as_posix()}/"
        if folder == catalog:
            if file.name.startswith("_"):
                add(cards, path, "catalog data under every card")
            elif file.suffix == ".yaml" and file.stem in cards:
                add([file.stem], path, "its card")
        elif folder == prompts and file.suffix == ".yaml":
            add([c.name for c in cards.values() if c.prompt_set == file.stem], path, f"its prompt set {file.stem}")
        elif folder == BASELINES and file.suffix == ".json" and file.stem in cards:
            add([file.stem], path, "its perf baseline")
        elif path.startswith(CARD_DATA):
            continue
        elif path.startswith(PATCHES):
            users = [c.name for c in cards.values() if c.patch == file.stem]
            if file.suffix == ".py" and users:
                add(users, path, f"its patch {file.stem}")
            else:
                add(cards, path, "load-time hooks every engine runs")
        elif path in MACHINERY_FILES or path.startswith(MACHINERY_DIRS):
            add(cards, path, "shared machinery")
    return {name: tuple(r) for name, r in reasons.items()}


def changed_cards(ref: str, catalog: Path, prompts: Path) -> ChangedCards:
    """The cards of `catalog` that the change since `ref` touches, with why.

    Raises ChangesError naming the ref and git's message when `ref` is unknown or
    `catalog` is not in a git repository."""
    root, base, changed = changed_files(ref, catalog)
    reasons = select(changed, card_inputs(catalog), _relative(catalog, root), _relative(prompts, root))
    return ChangedCards(ref, base, tuple(changed), reasons, root)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m npu_conformance.changes REF --platform npu`: the workflow's job
    matrix for the cards the change since REF touches (JSON on stdout; why on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m npu_conformance.changes", description=main.__doc__)
    parser.add_argument("ref")
    parser.add_argument("--platform", required=True)
    args = parser.parse_args(argv)
    try:
        changes = changed_cards(args.ref, CATALOG_DIR, PROMPTS_DIR)
        matrix = runner_matrix(changes.cards, CATALOG_DIR, args.platform)
    except ChangesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(changes.describe()), file=sys.stderr)
    print(json.dumps({"include": matrix}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
