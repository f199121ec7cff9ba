"""Load-time patches for quantized checkpoints on platforms without their kernels.

A vLLM general plugin (entry point `vllm.general_plugins` -> `patches:register`),
so vLLM calls `register()` in every process it starts: the front end (LLM or the
OpenAI server), the engine core and the workers. Two patches, chosen by the
checkpoint's `quantization_config`:

- `fp8_block`: FP8 e4m3 weights with `weight_scale_inv` blocks (Qwen3-*-FP8, DeepSeek-V3);
- `gptq`: GPTQ 2/4/8-bit qweight / qzeros / scales / g_idx (exllama v1 zero points).

Each works in two places: the config layer (patches.config) makes vLLM build
dense layers, and the loader (patches.loader) dequantizes the checkpoint's
tensors into them, in the model's dtype.

NPU_CONFORMANCE_DEQUANT selects when: `auto` (default) where vLLM here has no
kernel for the checkpoint in the model's dtype (the platform refuses the method,
the method does not take that activation dtype, no kernel can implement the
layer, or, for GPTQ, whose kernels vLLM selects without checking their ops, one
layer run through the selected kernel calls an op the build lacks); `on` always;
`off` never. A patch that acts logs one warning line.
"""

from __future__ import annotations

import copy
from typing import Any

from npu_conformance.patches.common import CheckpointError
from npu_conformance.patches.config import ENV, probe

__all__ = ["CheckpointError", "ENV", "applied", "decisions", "probe", "register"]


def register() -> None:
    """Install both hooks; safe to call any number of times. Also caps this
    process's CPU kernels where NPU_CONFORMANCE_CPU_ISA says so (platforms.force_isa)."""
    from npu_conformance.patches import config, loader
    from npu_conformance.platforms import force_isa

    force_isa()
    config.install()
    loader.install()


def applied() -> list[dict[str, Any]]:
    """What the load-time patches did in this process, one record per dequantized
    load: {patch, model, dtype, tensors, bytes_before, bytes_after} (bytes of the
    quantized checkpoint tensors consumed and of the dense weights produced).
    Loading happens in the worker: with the in-process engine
    (VLLM_ENABLE_V1_MULTIPROCESSING=0) that is the calling process."""
    from npu_conformance.patches.loader import RECORDS

    return copy.deepcopy(RECORDS)


def decisions() -> list[dict[str, Any]]:
    """Every decision the config-layer half took in this process, one per model
    config of a checkpoint a patch handles: {patch, method, model, dtype, mode,
    dequantize, reason}. Taken where the model config is built (the LLM front end
    or the API server), so it is there with every kind of engine."""
    from npu_conformance.patches.config import DECISIONS

    return copy.deepcopy(DECISIONS)
