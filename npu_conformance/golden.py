"""Golden references: a card's CPU reference results, computed once on any CPU
machine and shipped to hosts that cannot afford them (an 8B card in float32
needs ~32 GB and minutes of CPU per run).

A golden reference is a directory `<card>/` holding `reference.npz` (per prompt:
its token ids, the greedy continuation and the logits of every position the
precision checks compare, float32 as the cache holds them, so figures computed
from it equal those computed from a fresh reference (float16 moved a figure by
0.8%, float32 cut to 16 mantissa bits by 0.03%, on the 152k-vocabulary card); for a target below fp32,
the noise-floor reference's logits at the same positions too, so an NPU host
runs no CPU pass in the target's dtype) and GOLDEN, the manifest that says what
it was computed from. It is published whole or not at all
(cache.cached_directory, with a manifest of sizes and hashes), so a damaged copy
is found, never used.

A run with `--reference-path=DIR` (DIR holding `<card>/` folders, or one card's
folder) uses it only if the manifest matches the card here: the target
checkpoint's fingerprint (the weights and tokenizer the prompts were cut with),
the token ids of every prompt, the reference dtype, the noise-floor dtype,
max_tokens and trust_remote_code. Anything else is refused with the file and the field.
"""

from __future__ import annotations

import json
import platform as _host
import shutil
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from npu_conformance import cache
from npu_conformance.cards import Card
from npu_conformance.engines.reference import ReferenceResult

GOLDEN = "golden.json"
ARRAYS = "reference.npz"
# 2: the noise-floor reference beside the golden (format 1 had none).
FORMAT = 2


class GoldenError(ValueError):
    """A golden reference that cannot be used here; the message names the file and the field."""

    def __init__(self, file: Path, field: str, problem: str) -> None:
        super().__init__(f"golden reference {file}: field '{field}': {problem}")
        self.file = file
        self.field = field


class Manifest(BaseModel):
    """What a golden reference was computed from (GOLDEN)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[2]
    card: str
    weights: str
    checkpoint: str  # fingerprint of the target checkpoint
    reference_weights: str
    reference_checkpoint: str  # fingerprint of the checkpoint the reference ran
    reference_dtype: str
    noise_dtype: str | None  # the noise-floor reference's (the target's dtype), None for an fp32 target
    trust_remote_code: bool
    max_tokens: int
    prompts: dict[str, str]  # prompt id -> digest of its token ids
    versions: dict[str, str]  # the libraries that computed it: evidence, not a condition
    host: str


def expected(card: Card, checkpoint: Path, prompts: dict[str, list[int]]) -> dict[str, object]:
    """The fields a golden reference of `card` must have on this host."""
    return {"card": card.name, "checkpoint": cache.fingerprint(checkpoint), "reference_dtype": card.reference_dtype,
            "noise_dtype": card.noise_dtype, "trust_remote_code": card.trust_remote_code, "max_tokens": card.max_tokens,
            "prompts": {pid: cache.digest(ids) for pid, ids in prompts.items()}}


def mismatch(manifest: Manifest, wanted: dict[str, object]) -> tuple[str, str] | None:
    """The first field where `manifest` is not what `wanted` says, with the problem; None if it matches."""
    for field, value in wanted.items():
        found = getattr(manifest, field)
        if found == value:
            continue
        if field == "prompts" and isinstance(value, dict):
            missing = sorted(set(value) - set(found))
            if missing:
                return "prompts", f"has no prompt {missing[0]!r} of the card's (it has {sorted(found)})"
            changed = sorted(p for p in value if found[p] != value[p])
            if changed:
                return f"prompts.{changed[0]}", "other token ids than the card's prompt (other text or tokenizer)"
            return "prompts", f"has prompts the card does not: {sorted(set(found) - set(value))}"
        if field == "checkpoint":
            return field, (f"computed for the checkpoint {found[:16]}…, this run's is {str(value)[:16]}… (other "
                           f"weights or revision: {manifest.weights})")
        return field, f"is {found!r}, the card's is {value!r}"
    return None


def find(root: Path, card: str) -> Path | None:
    """The golden reference of `card` under `root` (root/<card>, or root itself), if any."""
    for candidate in (root / card, root):
        if (candidate / GOLDEN).is_file():
            return candidate
    return None


def is_golden(root: Path) -> bool:
    """Whether `root` holds golden references (as --save-reference writes them), not a checkpoint."""
    return (root / GOLDEN).is_file() or any((d / GOLDEN).is_file() for d in root.iterdir() if d.is_dir())


def load(directory: Path, wanted: dict[str, object]) -> tuple[Manifest, dict[str, ReferenceResult]]:
    """The golden reference in `directory`, checked against `wanted` (expected())."""
    file = directory / GOLDEN
    if (problem := cache.damage(directory)) is not None:
        raise GoldenError(file, "<files>", f"the directory is damaged ({problem})")
    try:
        text = file.read_text(encoding="utf-8")
        data = json.loads(text)
        if isinstance(data, dict) and (found := data.get("format")) != FORMAT:
            raise GoldenError(file, "format", f"is {found!r}, this suite reads {FORMAT} (the noise-floor reference "
                                              "beside the golden)")
        manifest = Manifest.model_validate_json(text)
    except json.JSONDecodeError as exc:
        raise GoldenError(file, "<json>", f"not valid JSON: {exc}") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        raise GoldenError(file, ".".join(map(str, error["loc"])) or "<top>", error["msg"]) from None
    if (wrong := mismatch(manifest, wanted)) is not None:
        raise GoldenError(file, *wrong)
    with np.load(directory / ARRAYS, allow_pickle=False) as data:
        results = {pid: ReferenceResult(data[f"{pid}/prompt_ids"].tolist(), data[f"{pid}/tokens"].tolist(),
                                        data[f"{pid}/logits"],
                                        data[f"{pid}/noise"] if manifest.noise_dtype else None)
                   for pid in manifest.prompts}
    return manifest, results


def save(directory: Path, card: Card, checkpoint: Path, reference_checkpoint: Path,
         prompts: dict[str, list[int]], results: dict[str, ReferenceResult]) -> Manifest:
    """Publish `results` as the golden reference of `card` in `directory` (replacing one there)."""
    import torch
    import transformers

    manifest = Manifest(
        format=FORMAT, **expected(card, checkpoint, prompts), weights=card.weights.describe(),
        reference_weights=(card.reference_weights or card.weights).describe(),
        reference_checkpoint=cache.fingerprint(reference_checkpoint),
        versions={"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__},
        host=f"{_host.machine()} {_host.node()}")
    arrays = {f"{pid}/{name}": value for pid, r in results.items()
              for name, value in (("prompt_ids", np.array(r.prompt_ids)), ("tokens", np.array(r.tokens)),
                                  ("logits", r.logits), ("noise", r.noise)) if value is not None}

    def build(tmp: Path) -> None:
        # Uncompressed: float32 logits compress by 7.5% at 32 MB/s (measured on the
        # 152k-vocabulary card), a minute per GB to save and again to load.
        np.savez(tmp / ARRAYS, **arrays)
        (tmp / GOLDEN).write_text(manifest.model_dump_json(indent=1), encoding="utf-8")

    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    cache.cached_directory(directory, build, lambda d: (d / GOLDEN).is_file(), verify=True)
    return manifest


def size_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
