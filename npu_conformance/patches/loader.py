"""Load-time half of the patches: the checkpoint's quantized tensors become dense
weights before the model sees them.

vLLM's DefaultModelLoader hands `model.load_weights` one stream of (name, tensor)
pairs from `get_all_weights`. Wrapping that stream is architecture-neutral: every
model class receives plain `<layer>.weight` tensors, exactly as from an
unquantized checkpoint, and shards them with its own loaders (TP included).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import torch

from npu_conformance.patches import fp8_block, gptq
from npu_conformance.patches.common import HOOK_MARK, LOGGER, CheckpointError

PATCHES = (fp8_block, gptq)
# One record per dequantized load in this process; see patches.applied().
RECORDS: list[dict[str, Any]] = []


def patch_for(quant_cfg: Mapping[str, Any] | None) -> ModuleType | None:
    """The patch module that can dequantize checkpoints with this quantization config, if any."""
    if not quant_cfg:
        return None
    return next((p for p in PATCHES if p.matches(quant_cfg)), None)


def active_patch(model_config: Any) -> ModuleType | None:
    """The patch to apply while loading: the checkpoint is quantized in a format a
    patch handles, and the config layer (patches.config) left vLLM without a
    quantization method, so the model was built with dense layers. This reads only
    the model config, which vLLM ships to every engine and worker process."""
    if model_config.quantization is not None:
        return None
    return patch_for(model_config.model_arch_config.quantization_config)


def dequantized(weights: Iterator[tuple[str, torch.Tensor]], patch: ModuleType, quant_cfg: Mapping[str, Any],
                dtype: torch.dtype, model: str) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` with each quantized layer's tensors replaced by one dense
    `<layer>.weight` in `dtype`; other tensors pass through unchanged."""
    assembler = patch.Assembler(quant_cfg, dtype)
    record = {"patch": patch.NAME, "model": model, "dtype": str(dtype).removeprefix("torch."),
              "tensors": 0, "bytes_before": 0, "bytes_after": 0}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    seen: set[str] = set()

    def emit(prefix: str, parts: dict[str, torch.Tensor]) -> tuple[str, torch.Tensor]:
        dense = assembler.build(prefix, parts)
        record["tensors"] += 1
        record["bytes_before"] += sum(t.nbytes for t in parts.values())
        record["bytes_after"] += dense.nbytes
        return f"{prefix}.weight", dense

    for name, tensor in weights:
        claim = assembler.claim(name, tensor)
        if claim is None:
            yield name, tensor
            continue
        if name in seen:
            raise CheckpointError(f"checkpoint tensor {name} appears more than once")
        seen.add(name)
        prefix, part = claim
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        # Emit as soon as a layer is whole, so only a layer's worth is held at a time.
        if assembler.complete(parts):
            yield emit(prefix, pending.pop(prefix))
    # Incomplete layers left at the end raise, naming the missing tensor.
    for prefix in list(pending):
        yield emit(prefix, pending.pop(prefix))
    RECORDS.append(record)
    LOGGER.info(
        "%s: dequantized %d tensors to %s: %.1f MiB of quantized weights became %.1f MiB",
        patch.NAME, record["tensors"], record["dtype"], record["bytes_before"] / 2**20, record["bytes_after"] / 2**20,
    )


def install() -> None:
    """Wrap DefaultModelLoader.get_all_weights (once per process)."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    original = DefaultModelLoader.get_all_weights
    if getattr(original, HOOK_MARK, False):
        return

    @functools.wraps(original)
    def get_all_weights(self: DefaultModelLoader, model_config: Any, model: torch.nn.Module
                        ) -> Iterator[tuple[str, torch.Tensor]]:
        weights = original(self, model_config, model)
        patch = active_patch(model_config)
        if patch is None:
            return weights
        return dequantized(weights, patch, model_config.model_arch_config.quantization_config,
                           model_config.dtype, model_config.model)

    setattr(get_all_weights, HOOK_MARK, True)
    DefaultModelLoader.get_all_weights = get_all_weights
