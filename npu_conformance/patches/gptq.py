"""GPTQ checkpoints (`quant_method: gptq`), in the AutoGPTQ / exllama v1 layout.

Per quantized linear layer of shape [out, in], with pack = 32 // bits:
- `qweight` int32 [in / pack, out]: `bits`-bit codes packed along the input dim,
  lowest bits first;
- `qzeros` int32 [groups, out / pack]: zero points packed along the output dim,
  stored as zero - 1 (the exllama / AutoGPTQ convention: readers add 1 back);
- `scales` float16 [groups, out];
- `g_idx` int32 [in]: the group of each input channel; i // group_size unless the
  checkpoint was quantized in activation order (`desc_act`), which permutes it.
dense[o, i] = (q[i, o] - zero[g_idx[i], o]) * scales[g_idx[i], o].
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch

from npu_conformance.patches.common import CheckpointError

NAME = "gptq"
# What vLLM's kernel selection says when no kernel can run these layers here.
NO_KERNEL = re.compile(r"Failed to find a kernel that can implement|Marlin does not support")
# `--quantization` values a user may pass for such a checkpoint (vLLM's own list).
USER_METHODS = ("gptq", "gptq_marlin", "auto_gptq", "marlin")
PARTS = ("qweight", "qzeros", "scales", "g_idx")
# Stored zero = zero - ZERO_OFFSET.
ZERO_OFFSET = 1


def matches(quant_cfg: Mapping[str, Any]) -> bool:
    return quant_cfg.get("quant_method") == "gptq"


def unpack(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 codes of `packed` spread along `dim` (0 or 1), lowest bits first."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    mask = (1 << bits) - 1
    if dim == 0:
        codes = (packed.unsqueeze(1) >> shifts.view(1, -1, 1)) & mask
        return codes.reshape(-1, packed.shape[1])
    codes = (packed.unsqueeze(2) >> shifts.view(1, 1, -1)) & mask
    return codes.reshape(packed.shape[0], -1)


def _check(condition: bool, tensor: str, problem: str) -> None:
    if not condition:
        raise CheckpointError(f"{tensor}: {problem}")


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
               bits: int, group_size: int, dtype: torch.dtype | None = None, name: str = "layer") -> torch.Tensor:
    """Dense [out, in] weight; `dtype` defaults to that of `scales` (float16).

    `name` is the layer's prefix in the checkpoint, for error messages. The product
    is formed in float32 and rounded once to `dtype`.
    """
    if bits not in (2, 4, 8):
        raise CheckpointError(f"{name}: {bits}-bit GPTQ is not supported (2, 4 or 8 bits pack evenly into int32)")
    pack = 32 // bits
    _check(qweight.dim() == 2 and qweight.dtype == torch.int32, f"{name}.qweight",
           f"expected a 2-D int32 tensor, got {qweight.dtype} of shape {list(qweight.shape)}")
    in_features, out_features = qweight.shape[0] * pack, qweight.shape[1]
    _check(out_features % pack == 0, f"{name}.qweight",
           f"{out_features} outputs do not pack evenly into qzeros ({pack} {bits}-bit zeros per int32)")
    groups = 1 if group_size == -1 else math.ceil(in_features / group_size)
    _check(scales.dtype.is_floating_point and list(scales.shape) == [groups, out_features], f"{name}.scales",
           f"expected a float tensor of shape {[groups, out_features]} ({groups} groups of {group_size} over "
           f"{in_features} inputs), got {scales.dtype} of shape {list(scales.shape)}")
    _check(qzeros.dtype == torch.int32 and list(qzeros.shape) == [groups, out_features // pack], f"{name}.qzeros",
           f"expected an int32 tensor of shape {[groups, out_features // pack]}, "
           f"got {qzeros.dtype} of shape {list(qzeros.shape)}")
    _check(not g_idx.dtype.is_floating_point and list(g_idx.shape) == [in_features], f"{name}.g_idx",
           f"expected an integer tensor of shape {[in_features]}, got {g_idx.dtype} of shape {list(g_idx.shape)}")
    g_idx = g_idx.long()
    _check(bool(((g_idx >= 0) & (g_idx < groups)).all()), f"{name}.g_idx", f"group indices must lie in [0, {groups})")
    codes = unpack(qweight, bits, 0)
    zeros = unpack(qzeros, bits, 1) + ZERO_OFFSET
    dense = (codes - zeros[g_idx]).float() * scales.float()[g_idx]
    return dense.t().contiguous().to(scales.dtype if dtype is None else dtype)


class Assembler:
    """Collects each layer's qweight / qzeros / scales / g_idx from the checkpoint
    stream and turns them into one dense `weight`."""

    def __init__(self, quant_cfg: Mapping[str, Any], dtype: torch.dtype) -> None:
        self.bits = int(quant_cfg["bits"])
        self.group_size = int(quant_cfg["group_size"])
        self.dtype = dtype

    def claim(self, name: str, tensor: torch.Tensor) -> tuple[str, str] | None:
        prefix, _, part = name.rpartition(".")
        return (prefix, part) if part in PARTS else None

    def complete(self, parts: Mapping[str, torch.Tensor]) -> bool:
        return len(parts) == len(PARTS)

    def build(self, prefix: str, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        missing = [p for p in PARTS if p not in parts]
        if missing:
            present = ", ".join(f"{prefix}.{p}" for p in parts)
            raise CheckpointError(f"{prefix}.{missing[0]} is missing from the checkpoint (present: {present})")
        return dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], self.bits,
                          self.group_size, self.dtype, prefix)


def _layer_config(quant_config: Any, model_config: Any) -> Any:
    """The MPLinearLayerConfig AutoGPTQLinearMethod builds, for a square hidden x hidden layer."""
    from vllm.model_executor.kernels.linear import MPLinearLayerConfig

    hidden = model_config.get_hidden_size()
    return MPLinearLayerConfig(
        full_weight_shape=(hidden, hidden),
        partition_weight_shape=(hidden, hidden),
        weight_type=quant_config.quant_type,
        act_type=model_config.dtype,
        group_size=quant_config.group_size,
        zero_points=False,
    )


def select_kernel(quant_config: Any, model_config: Any) -> type:
    """The linear kernel vLLM would pick for this checkpoint's layers (raises
    ValueError, as vLLM does at load, when none can implement them)."""
    from vllm.model_executor.kernels.linear import choose_mp_linear_kernel
    from vllm.model_executor.layers.quantization.utils.marlin_utils import verify_marlin_supported

    # AutoGPTQLinearMethod's own checks, in its order.
    verify_marlin_supported(quant_type=quant_config.quant_type, group_size=quant_config.group_size)
    return choose_mp_linear_kernel(_layer_config(quant_config, model_config))


def run_one_layer(kernel: type, quant_config: Any, model_config: Any) -> None:
    """Drive one all-zero hidden x hidden layer through `kernel` as vLLM does:
    process_weights_after_loading, then one forward of one token. vLLM selects
    its mixed-precision kernels without asking whether the build has their
    custom ops, and the CPU kernel picks its ops only inside these two calls (by
    ISA and the W4A8 setting), so running them is how to learn whether this host
    can; a missing op raises vLLM's own AttributeError here, as it would at the
    engine's first forward."""
    hidden = model_config.get_hidden_size()
    pack = quant_config.pack_factor
    groups = 1 if quant_config.group_size == -1 else hidden // quant_config.group_size
    layer = torch.nn.Module()
    # AutoGPTQLinearMethod.create_weights' tensors and their layout attributes.
    for name, data, dims in (
        ("qweight", torch.zeros(hidden // pack, hidden, dtype=torch.int32),
         {"input_dim": 0, "output_dim": 1, "packed_dim": 0}),
        ("scales", torch.ones(groups, hidden, dtype=model_config.dtype), {"input_dim": 0, "output_dim": 1}),
        ("qzeros", torch.zeros(groups, hidden // pack, dtype=torch.int32),
         {"input_dim": 0, "output_dim": 1, "packed_dim": 1}),
    ):
        parameter = torch.nn.Parameter(data, requires_grad=False)
        for attribute, value in dims.items():
            setattr(parameter, attribute, value)
        layer.register_parameter(name, parameter)
    layer.register_parameter("bias", None)
    instance = kernel(_layer_config(quant_config, model_config), w_q_param_name="qweight",
                      w_s_param_name="scales", w_zp_param_name="qzeros")
    instance.process_weights_after_loading(layer)
    instance.apply_weights(layer, torch.zeros(1, hidden, dtype=model_config.dtype))
