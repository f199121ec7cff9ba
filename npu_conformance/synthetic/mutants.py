"""Variants derived from a good checkpoint by `mutate`: known-buggy ones, for tests
that check that the suite notices a bug, and reshaped ones (the package's docstring
says what each mutation does)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npu_conformance.cache import MANIFEST
from npu_conformance.merge import deep_merge
from npu_conformance.synthetic.files import now, write_json

MUTATIONS = ("config", "zero", "scale", "pad_vocab")


def normalise_mutation(mutate: Mapping[str, Any] | None) -> dict[str, Any]:
    """`mutate` checked and in one canonical form (its cache key hashes it); {} for none."""
    if not mutate:
        return {}
    for key in mutate:
        if key not in MUTATIONS:
            raise ValueError(f"unknown mutate key {key!r}; known: {', '.join(MUTATIONS)}")
    mutation: dict[str, Any] = {}
    if "config" in mutate:
        if not isinstance(mutate["config"], Mapping):
            raise ValueError("mutate['config'] must be a mapping merged into config.json")
        mutation["config"] = json.loads(json.dumps(mutate["config"]))  # plain, JSON-able
    if "zero" in mutate:
        prefixes = mutate["zero"]
        if isinstance(prefixes, str) or not all(isinstance(p, str) for p in prefixes):
            raise ValueError("mutate['zero'] must be a list of tensor-name prefixes")
        mutation["zero"] = sorted(set(prefixes))  # order does not change the result
    if "scale" in mutate:
        factors = mutate["scale"]
        if not isinstance(factors, Mapping) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                for k, v in factors.items()):
            raise ValueError("mutate['scale'] must map tensor names to numeric factors")
        mutation["scale"] = {k: float(v) for k, v in sorted(factors.items())}
    if "pad_vocab" in mutate:
        pad = mutate["pad_vocab"]
        if not isinstance(pad, Mapping) or set(pad) != {"size", "logit_std", "seed"}:
            raise ValueError("mutate['pad_vocab'] must be a mapping of size, logit_std and seed")
        mutation["pad_vocab"] = {"size": int(pad["size"]), "logit_std": float(pad["logit_std"]), "seed": int(pad["seed"])}
    return mutation


def build_mutant(base: Path, mutation: Mapping[str, Any], key: str, out: Path) -> None:
    """Write into `out` a copy of `base` with `mutation` (config and weight changes) applied."""
    started = time.monotonic()
    for item in base.iterdir():
        if item.name not in ("build.json", MANIFEST):  # both describe the base
            shutil.copy2(item, out / item.name)
    if "config" in mutation:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
        write_json(out / "config.json", deep_merge(config, mutation["config"]))
    if "zero" in mutation or "scale" in mutation:
        _change_tensors(out / "model.safetensors", mutation.get("zero", []), mutation.get("scale", {}))
    if "pad_vocab" in mutation:
        _pad_vocab(out, **mutation["pad_vocab"])
    # The base's training record still describes these weights, bar the mutation.
    record = json.loads((base / "build.json").read_text(encoding="utf-8"))
    write_json(
        out / "build.json",
        {
            **record,
            "key": key,
            "built_at": now(),
            "build_seconds": round(time.monotonic() - started, 1),
            "base": base.name,
            "mutate": mutation,
        },
    )


def _change_tensors(path: Path, prefixes: list[str], factors: Mapping[str, float]) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    # A typo would otherwise yield a "mutant" identical to the base.
    for prefix in prefixes:
        names = [n for n in tensors if n.startswith(prefix)]
        if not names:
            raise ValueError(f"mutate['zero'] prefix {prefix!r} matches no tensor")
        for name in names:
            tensors[name] = torch.zeros_like(tensors[name])
    for name, factor in factors.items():
        if name not in tensors:
            raise ValueError(f"mutate['scale'] names {name!r}, which is no tensor of the checkpoint")
        tensors[name] = tensors[name] * factor
    save_file(tensors, path, metadata={"format": "pt"})


def _pad_vocab(out: Path, size: int, logit_std: float, seed: int) -> None:
    """Grow the input embedding and the output layer to `size` rows (config.json's vocab_size with them)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    embed, head = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"]
    if size <= embed.shape[0]:
        raise ValueError(f"mutate['pad_vocab'] size {size} does not grow the vocabulary of {embed.shape[0]}")
    generator = torch.Generator().manual_seed(seed)
    extra = size - embed.shape[0]
    hidden = head.shape[1]
    # The final norm's output has a norm of about sqrt(hidden) x the rms of its weight:
    # rows of this entry size give logits of about logit_std.
    h_norm = hidden ** 0.5 * tensors["model.norm.weight"].float().pow(2).mean().sqrt()
    new_head = torch.randn(extra, hidden, generator=generator) * (logit_std / h_norm)
    new_embed = torch.randn(extra, hidden, generator=generator) * embed.float().std()
    tensors["model.embed_tokens.weight"] = torch.cat([embed, new_embed.to(embed.dtype)])
    tensors["lm_head.weight"] = torch.cat([head, new_head.to(head.dtype)])
    save_file(tensors, path, metadata={"format": "pt"})
    write_json(out / "config.json", {**config, "vocab_size": size})
