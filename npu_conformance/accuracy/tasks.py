"""The accuracy tasks: the local ones of data/accuracy_tasks.yaml, whose items the
suite builds from the embedded corpus and writes with their lm-eval task YAML into
a folder for lm-eval's --include_path, and the standard ones of lm-eval's registry."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from npu_conformance.synthetic.recipes import DATA_DIR, load_recipes, read_corpus

TASKS_FILE = DATA_DIR / "accuracy_tasks.yaml"
# Trailing punctuation is not part of the word a model is asked for.
PUNCTUATION = ".,!?;:\"()"


def local_tasks() -> dict[str, dict[str, Any]]:
    """data/accuracy_tasks.yaml: task name -> {items, lm_eval}."""
    return yaml.safe_load(TASKS_FILE.read_text(encoding="utf-8"))


def next_word_items(corpus: str, min_words: int) -> list[dict[str, str]]:
    """Every prefix of at least `min_words` words of each document of the corpus
    file, with the word that follows it (trailing punctuation off)."""
    separator = load_recipes()["tokenizer"]["eos_token"]
    items = []
    for doc in read_corpus([corpus], separator):
        words = doc.split()
        items += [{"context": " ".join(words[:i]), "answer": words[i].strip(PUNCTUATION)}
                  for i in range(min_words, len(words)) if words[i].strip(PUNCTUATION)]
    return items


BUILDERS: dict[str, Callable[..., list[dict[str, str]]]] = {"next_word": next_word_items}


@dataclass(frozen=True)
class Task:
    """A task as lm-eval is given it: its name, and for a local task the folder
    holding its YAML and items (--include_path), their count and digest."""

    name: str
    include_path: Path | None = None
    items: int | None = None
    digest: str | None = None

    @property
    def local(self) -> bool:
        return self.include_path is not None

    def describe(self) -> str:
        if not self.local:
            return f"{self.name} (lm-eval's registry)"
        return f"{self.name} (local: {self.items} items built from the embedded corpus, sha256 {self.digest[:12]})"


def prepare(name: str, folder: Path) -> Task:
    """The task `name`: a local one written into `folder`, else lm-eval's own (which
    lm-eval resolves, and refuses by name if it has none)."""
    tasks = local_tasks()
    if name not in tasks:
        return Task(name)
    spec = tasks[name]
    build = dict(spec["items"])
    builder = BUILDERS[build.pop("builder")]
    items = builder(**build)
    if not items:
        raise ValueError(f"{TASKS_FILE}: task {name} builds no items from {spec['items']}")
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")
    config = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
              **spec["lm_eval"]}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
                                         encoding="utf-8")
    return Task(name, folder, len(items), hashlib.sha256(data.read_bytes()).hexdigest())
