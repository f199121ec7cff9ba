"""Config-layer half of the patches: decide, once per engine, whether vLLM should
build dense layers for a quantized checkpoint.

Hook: ModelConfig._verify_quantization, where vLLM resolves the checkpoint's
quantization method and asks the platform to accept it (the NPU platform rejects
fp8 there). When a patch applies, the method is left unset (None): vLLM then
builds unquantized linear layers everywhere, and the load-time half
(patches.loader) turns the checkpoint's tensors into their dense weights. The
decision travels inside the model config to the engine and worker processes.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from types import ModuleType
from typing import Any

from patches.common import HOOK_MARK, LOGGER
from patches.loader import patch_for

ENV = "NPU_CONFORMANCE_DEQUANT"
MODES = ("auto", "on", "off")
# `ops.<fn>(` calls in a kernel's source, and `torch.ops.<ns>.<op>` in the wrapper.
_OPS_CALL = re.compile(r"\bops\.(\w+)\(")
_TORCH_OP = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)\b")


def mode() -> str:
    """NPU_CONFORMANCE_DEQUANT: auto (default) dequantizes where the platform lacks
    the checkpoint's kernels; on always; off never (vLLM's own path and errors)."""
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def unregistered_ops(kernel: type) -> list[str]:
    """Custom ops that `kernel`'s code calls (through vllm._custom_ops) and this
    build does not register. vLLM selects some kernels without checking: the CPU
    WNA16 kernel is chosen on builds compiled without its cpu_gemm_wna16 op, and
    fails only at the first forward."""
    import torch
    from vllm import _custom_ops

    missing = []
    for fn in sorted(set(_OPS_CALL.findall(inspect.getsource(kernel)))):
        wrapper = getattr(_custom_ops, fn, None)
        if not inspect.isfunction(wrapper):
            continue
        for namespace, op in _TORCH_OP.findall(inspect.getsource(wrapper)):
            if not hasattr(getattr(torch.ops, namespace), op):
                missing.append(f"torch.ops.{namespace}.{op}")
    return sorted(set(missing))


def missing_kernel(patch: ModuleType, model_config: Any) -> str | None:
    """Why vLLM could not run this checkpoint's quantized layers here in the
    model's dtype, or None if it can: the platform's quantization check, the
    method's activation dtypes and config validation, kernel selection for a
    representative layer, and the custom ops the selected kernel calls."""
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.platforms import current_platform

    quant_cfg = model_config.model_arch_config.quantization_config
    config_cls = get_quantization_config(quant_cfg["quant_method"])
    supported = [str(d).removeprefix("torch.") for d in config_cls.get_supported_act_dtypes()]
    dtype = str(model_config.dtype).removeprefix("torch.")
    if dtype not in supported:
        return f"vLLM's {config_cls.get_name()} layers take {', '.join(supported)}, not {dtype}"
    try:
        current_platform.verify_quantization(config_cls.get_name())
        kernel = patch.select_kernel(config_cls.from_config(quant_cfg), model_config)
    except ValueError as exc:
        # One line: vLLM lists a reason per candidate kernel on lines of their own.
        return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    missing = unregistered_ops(kernel)
    if missing:
        return f"{kernel.__name__} needs {', '.join(missing)}, which this vLLM build does not register"
    return None


def dequantize_instead(model_config: Any) -> bool:
    """Leave the quantization method unset (and say so) if a patch should load
    this checkpoint dequantized; False leaves the decision to vLLM."""
    patch = patch_for(model_config.model_arch_config.quantization_config)
    if patch is None:
        return False
    setting = mode()
    # A contradicting --quantization is vLLM's to report.
    if setting == "off" or model_config.quantization not in (None, *patch.USER_METHODS):
        return False
    if setting == "on":
        why = f"{ENV}=on"
    elif (missing := missing_kernel(patch, model_config)) is not None:
        why = f"no kernel for it here: {missing}; {ENV}=off keeps vLLM's own path"
    else:
        return False
    model_config.quantization = None
    method = model_config.model_arch_config.quantization_config["quant_method"]
    architecture = (model_config.architectures or ["model"])[0]
    LOGGER.warning(
        "Detected %s %s checkpoint (%s). Disabling %s quantization and loading dequantized %s weights instead.",
        method, architecture, why, method, str(model_config.dtype).removeprefix("torch."),
    )
    return True


def install() -> None:
    """Wrap ModelConfig._verify_quantization (once per process)."""
    from vllm.config.model import ModelConfig

    original = ModelConfig._verify_quantization
    if getattr(original, HOOK_MARK, False):
        return

    @functools.wraps(original)
    def _verify_quantization(self: ModelConfig) -> None:
        if not dequantize_instead(self):
            original(self)

    setattr(_verify_quantization, HOOK_MARK, True)
    ModelConfig._verify_quantization = _verify_quantization
