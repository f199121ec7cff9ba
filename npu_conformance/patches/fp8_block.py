"""FP8 block-quantized checkpoints (`quant_method: fp8` with `weight_block_size`).

The layout of DeepSeek-V3 and Qwen3-*-FP8: each quantized linear layer stores
`weight` in float8 (e4m3) and `weight_scale_inv` in float32 with one entry per
[block_n, block_k] block of the weight, [ceil(out / block_n), ceil(in / block_k)];
the last row and column of blocks are partial when a dimension is not a multiple
of the block. Despite its name, `weight_scale_inv` is the multiplier of dequantization:
dense = weight * weight_scale_inv (broadcast over each block).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from npu_conformance import vllm_api
from npu_conformance.patches.common import CheckpointError

NAME = "fp8_block"
# What vLLM's kernel selection says when no kernel can run these layers here.
NO_KERNEL = re.compile(r"Failed to find a kernel that can implement")
# `--quantization` values a user may pass for such a checkpoint.
USER_METHODS = ("fp8",)
SCALE_SUFFIX = ".weight_scale_inv"


def matches(quant_cfg: Mapping[str, Any]) -> bool:
    return quant_cfg.get("quant_method") == "fp8" and quant_cfg.get("weight_block_size") is not None


def _is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.dtype.is_floating_point and tensor.element_size() == 1


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block_size: Sequence[int],
               dtype: torch.dtype, name: str = "weight") -> torch.Tensor:
    """Dense [out, in] weight in `dtype` from an fp8 `weight` and its block scales.

    `name` is the layer's prefix in the checkpoint, for error messages. The product
    is formed in float32 and rounded once to `dtype`.
    """
    if weight.dim() != 2 or not _is_fp8(weight):
        raise CheckpointError(
            f"{name}.weight: expected a 2-D float8 tensor, got {weight.dtype} of shape {list(weight.shape)}"
        )
    if len(block_size) != 2 or min(block_size) <= 0:
        raise CheckpointError(f"{name}: weight_block_size must be two positive ints, got {list(block_size)}")
    block_n, block_k = block_size
    out_features, in_features = weight.shape
    expected = [math.ceil(out_features / block_n), math.ceil(in_features / block_k)]
    if not scale_inv.dtype.is_floating_point or list(scale_inv.shape) != expected:
        raise CheckpointError(
            f"{name}{SCALE_SUFFIX}: expected a float tensor of shape {expected} "
            f"(blocks of {list(block_size)} over {name}.weight {list(weight.shape)}), "
            f"got {scale_inv.dtype} of shape {list(scale_inv.shape)}"
        )
    scale = scale_inv.float().repeat_interleave(block_n, 0)[:out_features]
    scale = scale.repeat_interleave(block_k, 1)[:, :in_features]
    return (weight.float() * scale).to(dtype)


class Assembler:
    """Collects each layer's fp8 `weight` and `weight_scale_inv` from the checkpoint
    stream and turns the pair into one dense `weight`."""

    def __init__(self, quant_cfg: Mapping[str, Any], dtype: torch.dtype) -> None:
        self.block_size = list(quant_cfg["weight_block_size"])
        self.dtype = dtype

    def claim(self, name: str, tensor: torch.Tensor) -> tuple[str, str] | None:
        """(layer prefix, part) for the tensors this patch consumes; None passes a tensor through."""
        if name.endswith(SCALE_SUFFIX):
            return name[: -len(SCALE_SUFFIX)], "weight_scale_inv"
        # Unquantized tensors (embeddings, norms, lm_head) are not float8.
        if name.endswith(".weight") and _is_fp8(tensor):
            return name[: -len(".weight")], "weight"
        return None

    def complete(self, parts: Mapping[str, torch.Tensor]) -> bool:
        return len(parts) == 2

    def build(self, prefix: str, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if "weight" not in parts:
            raise CheckpointError(f"{prefix}{SCALE_SUFFIX} has no float8 {prefix}.weight beside it in the checkpoint")
        if "weight_scale_inv" not in parts:
            raise CheckpointError(
                f"{prefix}{SCALE_SUFFIX} is missing: {prefix}.weight is {parts['weight'].dtype} "
                f"and cannot be dequantized without its block scales"
            )
        return dequantize(parts["weight"], parts["weight_scale_inv"], self.block_size, self.dtype, prefix)


def select_kernel(quant_config: Any, model_config: Any) -> type:
    """The linear kernel vLLM would pick for this checkpoint's layers (raises
    ValueError, as vLLM does at load, when none can implement them)."""
    from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_BLOCK_KERNELS, FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, create_fp8_quant_key

    block_n, block_k = quant_config.weight_block_size
    hidden = model_config.get_hidden_size()
    # The same keys as vLLM's Fp8LinearMethod builds for a block-quantized layer.
    config = FP8ScaledMMLinearLayerConfig(
        weight_quant_key=create_fp8_quant_key(static=True, group_shape=GroupShape(block_n, block_k)),
        activation_quant_key=create_fp8_quant_key(static=False, group_shape=GroupShape(1, block_n)),
        input_dtype=model_config.dtype,
        out_dtype=model_config.dtype,
        weight_shape=(hidden, hidden),
    )
    return vllm_api.choose_scaled_mm_linear_kernel(config, _POSSIBLE_FP8_BLOCK_KERNELS, "fp8_block_w8a8")
