"""Small *trained* Hugging Face checkpoints, built deterministically on disk.

The suite's default models must not need a network, and must not be random init: on
near-uniform distributions (log-probs all close to -ln V) a wrong implementation hardly
moves any error metric. So each recipe of data/synthetic_models.yaml is trained here for
a minute or so on CPU, fp32, on the small corpus in data/corpus/, into a directory with
the layout of a Hugging Face checkpoint that transformers and vLLM both load.

Tokenizer: byte-level BPE trained with `tokenizers`; <|endoftext|> is eos and pad (it
ends every training document), the chat template is ChatML (<|im_start|>, <|im_end|>),
generation_config.json stops on both <|endoftext|> and <|im_end|>, and there is no BOS.

`mutate` derives variants from a good checkpoint: known-buggy ones, for tests that check
that the suite notices a bug, and reshaped ones. {"config": {...}} is deep-merged into
config.json, {"zero": [prefix, ...]} zeroes every tensor whose name starts with a prefix,
{"scale": {name: factor}} multiplies one tensor (a norm weight a few percent off), and
{"pad_vocab": {"size": N, "logit_std": s, "seed": k}} grows the embedding and the output
layer to N rows, as real checkpoints' vocabularies are (Qwen's 151,936): the new rows'
tokens never occur in a prompt, and their logits spread with about `s` around 0, far
below a confident model's top-1 (so the distribution keeps its shape, while every
full-vocabulary figure and the logits' size are a real vocabulary's).

    python -m npu_conformance.synthetic llama [--cache DIR]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from npu_conformance.cache import cached_directory, digest
from npu_conformance.synthetic.files import CHECKPOINT_FILES, versions
from npu_conformance.synthetic.mutants import build_mutant, normalise_mutation
from npu_conformance.synthetic.recipes import CORPUS_DIR, available_recipes, load_recipes
from npu_conformance.synthetic.training import build_base


def build_checkpoint(
    recipe: str, cache_root: Path, mutate: Mapping[str, Any] | None = None
) -> Path:
    """Return cache_root/synthetic/<recipe>-<key>, building it first if needed.

    The key hashes everything that decides the bytes, so a directory that holds its
    files, each matching the size and sha256 of its manifest, is reused as is; a
    damaged one is reported and rebuilt. Builds are serialised across processes by a
    lock file and land by an atomic rename, so a half-built directory is never visible.
    """
    spec = load_recipes()
    if recipe not in spec["recipes"]:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(available_recipes())}")
    mutation = normalise_mutation(mutate)
    base = base_key(recipe, spec)
    parent = Path(cache_root) / "synthetic"
    if not mutation:
        return _cached(parent, recipe, base, lambda tmp: build_base(recipe, spec, base, tmp))
    base_dir = build_checkpoint(recipe, cache_root)
    key = digest({"base": base, "mutate": mutation})
    return _cached(parent, recipe, key, lambda tmp: build_mutant(base_dir, mutation, key, tmp))


# --- caching -------------------------------------------------------------------------


def _cached(parent: Path, recipe: str, key: str, build: Callable[[Path], None]) -> Path:
    return cached_directory(parent / f"{recipe}-{key[:16]}", build, lambda path: _is_valid(path, key), verify=True)


def _is_valid(path: Path, key: str) -> bool:
    try:
        record = json.loads((path / "build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return record.get("key") == key and all((path / f).is_file() for f in CHECKPOINT_FILES)


def base_key(recipe: str, spec: Mapping[str, Any]) -> str:
    """Cache key of a recipe's trained base: everything the build depends on."""
    return digest(
        {
            "recipe": recipe,
            "spec": spec["recipes"][recipe],
            "tokenizer": spec["tokenizer"],
            "corpus": {
                name: hashlib.sha256((CORPUS_DIR / name).read_bytes()).hexdigest()
                for name in spec["corpus"]
            },
            # Every module of this package, so that an edit to any of them rebuilds.
            "source": {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
                       for path in sorted(Path(__file__).parent.glob("*.py"))},
            "versions": versions(),
        }
    )
