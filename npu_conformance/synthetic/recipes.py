"""The recipes of data/synthetic_models.yaml and the corpus files they train on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).parent.parent / "data"
RECIPES_FILE = DATA_DIR / "synthetic_models.yaml"
CORPUS_DIR = DATA_DIR / "corpus"


def load_recipes() -> dict[str, Any]:
    """The parsed YAML: tokenizer and corpus settings, and the recipes by name."""
    return yaml.safe_load(RECIPES_FILE.read_text(encoding="utf-8"))


def available_recipes() -> list[str]:
    return sorted(load_recipes()["recipes"])


def read_corpus(names: list[str], separator: str) -> list[str]:
    """The documents of the corpus files `names`, in order."""
    # A document ends at a line that holds only the separator.
    split = re.compile(rf"\n?^{re.escape(separator)}$\n?", re.MULTILINE)
    docs: list[str] = []
    for name in names:
        docs += [d for d in split.split((CORPUS_DIR / name).read_text(encoding="utf-8")) if d.strip()]
    return docs
