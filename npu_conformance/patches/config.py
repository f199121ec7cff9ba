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
import os
import re
from types import ModuleType
from typing import Any

from npu_conformance.patches.common import HOOK_MARK, LOGGER
from npu_conformance.process import env_overrides
from npu_conformance.patches.loader import patch_for

ENV = "NPU_CONFORMANCE_DEQUANT"
MODES = ("auto", "on", "off")
# torch's words when a build does not register a custom op that a kernel calls.
MISSING_OP = re.compile(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'")
# vLLM's own words when a platform refuses a quantization method. Only this, a
# dtype the method does not take, a patch's NO_KERNEL words from kernel selection
# and a custom op missing from the build (MISSING_OP) count as "no kernel here";
# any other error from these checks is vLLM's to report, so it propagates.
PLATFORM_REFUSES = re.compile(r"quantization is currently not supported")
# One record per decision in this process (the one that builds the model config:
# the LLM front end or the API server); see patches.decisions().
DECISIONS: list[dict[str, Any]] = []


def mode() -> str:
    """NPU_CONFORMANCE_DEQUANT: auto (default) dequantizes where the platform lacks
    the checkpoint's kernels; on always; off never (vLLM's own path and errors)."""
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def missing_kernel(patch: ModuleType, model_config: Any) -> str | None:
    """Why vLLM could not run this checkpoint's quantized layers here in the
    model's dtype, or None if it can: the platform's quantization check, the
    method's activation dtypes and config validation, kernel selection for a
    representative layer, and, for a patch whose kernels vLLM selects without
    checking their ops, one layer run through the selected kernel."""
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
    except ValueError as exc:
        if not PLATFORM_REFUSES.search(str(exc)):
            raise
        return _one_line(exc)
    try:
        quant_config = config_cls.from_config(quant_cfg)
        kernel = patch.select_kernel(quant_config, model_config)
    except ValueError as exc:
        if not patch.NO_KERNEL.search(str(exc)):
            raise
        return _one_line(exc)
    run_one_layer = getattr(patch, "run_one_layer", None)
    if run_one_layer is None:
        return None
    try:
        run_one_layer(kernel, quant_config, model_config)
    except AttributeError as exc:
        if not (op := MISSING_OP.search(str(exc))):
            raise
        return (f"{kernel.__name__} calls torch.ops.{op[1]}.{op[2]} on this host, "
                "which this vLLM build does not register")
    return None


def probe(checkpoint: str, dtype: str) -> str | None:
    """Why vLLM here has no kernel for the quantized `checkpoint` in `dtype`, or
    None where it has one (or the checkpoint is in no format a patch handles).
    Builds vLLM's own model config only: no weights are read, no engine boots."""
    from vllm.config.model import ModelConfig

    # With the patch off the config is vLLM's own; the platform's refusal comes as its error.
    try:
        with env_overrides({ENV: "off"}):
            model_config = ModelConfig(model=checkpoint, dtype=dtype, skip_tokenizer_init=True)
    except ValueError as exc:
        if not PLATFORM_REFUSES.search(str(exc)):
            raise
        return _one_line(exc)
    patch = patch_for(model_config.model_arch_config.quantization_config)
    return None if patch is None else missing_kernel(patch, model_config)


def _one_line(exc: Exception) -> str:
    # vLLM lists a reason per candidate kernel on lines of their own.
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def dequantize_instead(model_config: Any) -> bool:
    """Leave the quantization method unset (and say so) if a patch should load
    this checkpoint dequantized; False leaves the decision to vLLM."""
    patch = patch_for(model_config.model_arch_config.quantization_config)
    if patch is None:
        return False
    setting = mode()
    method = model_config.model_arch_config.quantization_config["quant_method"]
    record = {"patch": patch.NAME, "method": method, "model": model_config.model,
              "dtype": str(model_config.dtype).removeprefix("torch."), "mode": setting}
    # A contradicting --quantization is vLLM's to report.
    if model_config.quantization not in (None, *patch.USER_METHODS):
        DECISIONS.append({**record, "dequantize": False, "reason": f"--quantization {model_config.quantization}"})
        return False
    if setting == "off":
        DECISIONS.append({**record, "dequantize": False, "reason": f"{ENV}=off"})
        return False
    if setting == "on":
        why = f"{ENV}=on"
    elif (missing := missing_kernel(patch, model_config)) is not None:
        why = f"no kernel for it here: {missing}; {ENV}=off keeps vLLM's own path"
    else:
        DECISIONS.append({**record, "dequantize": False, "reason": "vLLM has a kernel for it here"})
        return False
    DECISIONS.append({**record, "dequantize": True, "reason": why})
    model_config.quantization = None
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
