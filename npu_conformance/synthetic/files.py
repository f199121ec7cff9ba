"""The files of a built checkpoint directory, and what every build.json records."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
from pathlib import Path
from typing import Any

# Files whose presence makes a cached directory usable (build.json is the last the build writes;
# the cache manifest, written after it, says whether they are intact).
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def versions() -> dict[str, str]:
    """The versions of the libraries that decide a build's bytes."""
    # From package metadata, so that the reuse path does not have to import torch.
    return {p: importlib.metadata.version(p) for p in ("torch", "transformers", "tokenizers", "safetensors")}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
