"""Known faults for the sensitivity cards: the real engine, wrong on one path only.

NPU adaptations break on one path at a time: the decode kernel but not the
prefill one, positions past the first KV block, steps that hold many sequences.
A card's `fault:` installs one such fault in every worker (through the worker
extension, after boot), so the sensitivity tests can prove that the checks of
that path fail and that every check not reaching it still passes.

The fault scales the model's final hidden states of the selected tokens by
(1 + scale * u), u a fixed +-1 vector: a relative error of about `scale` in
their logits, deterministic and independent of the batch it runs in. Which
tokens it selects is read from the step itself (positions and the attention
metadata's `query_start_loc`, which every vLLM attention backend builds).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from npu_conformance import vllm_api

# How a card's fault chooses its tokens: each path a different kernel family on an NPU.
PATHS = ("decode", "past_block", "batch")


def selected_tokens(path: str, positions: torch.Tensor, query_start_loc: torch.Tensor, block_size: int,
                    min_batch: int) -> torch.Tensor:
    """Boolean mask over a step's tokens that `path` perturbs. `query_start_loc`:
    offsets of each request's tokens in the step ([requests + 1]); tokens past its
    last entry are padding and never selected."""
    starts = query_start_loc.to(device="cpu", dtype=torch.long)
    lengths = starts[1:] - starts[:-1]
    real = int(starts[-1])
    mask = torch.zeros(positions.shape[0], dtype=torch.bool)
    if path == "decode":
        # A decode step is one new token of a request whose context is in the KV cache.
        mask[:real] = torch.repeat_interleave(lengths == 1, lengths)
    elif path == "past_block":
        mask[:real] = positions[:real].to("cpu") >= block_size
    elif path == "batch":
        mask[:real] = len(lengths) >= min_batch
    else:
        raise ValueError(f"unknown fault path {path!r} (known: {', '.join(PATHS)})")
    return mask


def query_start_loc(attn_metadata: Any) -> torch.Tensor | None:
    """The step's request offsets from vLLM's forward context (one metadata per
    attention layer, all alike; None in a profiling or dummy step)."""
    if isinstance(attn_metadata, list):  # micro-batched steps: not used by these cards
        attn_metadata = attn_metadata[0] if attn_metadata else None
    if not attn_metadata:
        return None
    first = next(iter(attn_metadata.values())) if isinstance(attn_metadata, dict) else attn_metadata
    return getattr(first, "query_start_loc", None)


def install(model: torch.nn.Module, fault: Mapping[str, Any], block_size: int) -> dict[str, Any]:
    """Wrap `model.forward` with `fault` ({path, scale, min_batch}); returns the
    record the evidence carries. Counts of perturbed steps and tokens accumulate in it."""
    path, scale, min_batch = fault["path"], float(fault["scale"]), int(fault["min_batch"])
    if path not in PATHS:
        raise ValueError(f"unknown fault path {path!r} (known: {', '.join(PATHS)})")
    generator = torch.Generator().manual_seed(0)
    record: dict[str, Any] = {"path": path, "scale": scale, "min_batch": min_batch, "block_size": block_size,
                              "steps": 0, "tokens": 0, "model_class": type(model).__name__}
    original = model.forward
    signs: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}

    def forward(*args: Any, **kwargs: Any) -> Any:
        hidden = original(*args, **kwargs)
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if not isinstance(hidden, torch.Tensor) or positions is None:
            return hidden
        starts = query_start_loc(vllm_api.attention_metadata())
        if starts is None:
            return hidden
        mask = selected_tokens(path, positions, starts, block_size, min_batch).to(hidden.device)
        if not bool(mask.any()):
            return hidden
        key = (hidden.shape[-1], hidden.dtype, hidden.device)
        if key not in signs:
            signs[key] = (torch.randint(0, 2, (hidden.shape[-1],), generator=generator) * 2 - 1).to(hidden.device,
                                                                                                   hidden.dtype)
        hidden = hidden.clone()
        hidden[mask] = hidden[mask] * (1 + scale * signs[key])
        record["steps"] += 1
        record["tokens"] += int(mask.sum())
        return hidden

    model.forward = forward
    return record
