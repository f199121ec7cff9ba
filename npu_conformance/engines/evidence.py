"""What an engine actually ran, read from the engine itself after it booted:
the model class vLLM instantiated, the linear methods and kernels of its layers,
the attention backend, the weights' dtypes, and what the load-time patches did.

The worker half (inspect_model) runs inside every worker through the suite's
worker extension (engines.worker), with the in-process engine here and with
multiprocess engines on an NPU alike.
"""

from __future__ import annotations

import collections
import os
from typing import Any

RPC = "conformance_evidence"


def inspect_model(model: Any) -> dict[str, Any]:
    """The evidence one worker can give about its model (plain data: it is sent back over RPC)."""
    from npu_conformance import patches
    from npu_conformance.platforms import cpu_kernel_build

    methods: collections.Counter[str] = collections.Counter()
    kernels: collections.Counter[str] = collections.Counter()
    backends: set[str] = set()
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            methods[type(method).__name__] += 1
            # vLLM's quantized linear methods hold the kernel they selected (GPTQ's
            # `kernel`, FP8's `fp8_linear`); the names differ, the class suffix does not.
            for value in vars(method).values():
                if type(value).__name__.endswith("Kernel"):
                    kernels[type(value).__name__] += 1
        backend = getattr(module, "attn_backend", None)
        if backend is not None:
            backends.add(backend.get_name())
    dtypes = collections.Counter(str(p.dtype).removeprefix("torch.") for p in model.parameters())
    return {
        "pid": os.getpid(),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "linear_methods": dict(sorted(methods.items())),
        "kernels": dict(sorted(kernels.items())),
        "attention_backends": sorted(backends),
        "parameter_dtypes": dict(sorted(dtypes.items())),
        "patch_records": patches.applied(),
        # vLLM's CPU kernel build this worker loaded (None off CPU).
        "cpu_kernel_build": cpu_kernel_build(),
    }


def native_class(architecture: str) -> str | None:
    """The class vLLM's model registry maps `architecture` to on this platform
    (plugins such as vllm-ascend register theirs there too), or None."""
    from npu_conformance import vllm_api

    return vllm_api.registered_model(architecture)


def quant_path(worker: dict[str, Any], decisions: list[dict[str, Any]]) -> dict[str, Any]:
    """Which path loaded the quantized layers and why: `patch` (the load-time
    dequantization ran), `kernel` (vLLM's own quantized layers), `mixed` (both:
    no card allows it), or `none`."""
    reason = decisions[-1]["reason"] if decisions else None
    quantized = {m: n for m, n in worker["linear_methods"].items() if not m.startswith("Unquantized")}
    if worker["patch_records"]:
        record = worker["patch_records"][-1]
        if quantized:
            # Some layers dequantized at load, others left to vLLM's kernels: neither path's figures.
            return {"path": "mixed", "patch": record["patch"], "tensors": record["tensors"], "methods": quantized,
                    "kernels": worker["kernels"],
                    "reason": f"the {record['patch']} patch dequantized {record['tensors']} tensors while "
                              f"{sum(quantized.values())} layers kept vLLM's quantized methods {quantized}"}
        return {"path": "patch", "patch": record["patch"], "reason": reason, "tensors": record["tensors"]}
    if quantized:
        return {"path": "kernel", "methods": quantized, "kernels": worker["kernels"],
                "reason": reason or "vLLM loaded the checkpoint's quantization itself"}
    return {"path": "none", "reason": reason or "the checkpoint is not quantized"}


def collect(llm: Any, architecture: str, records_before: int, decisions_before: int) -> dict[str, Any]:
    """Evidence of a booted engine. `records_before`/`decisions_before`: how many
    patch records and decisions this process held before the boot, so an earlier
    engine's in the same process are not taken for this one's."""
    from npu_conformance import patches

    answers = llm.collective_rpc(RPC)
    worker = dict(answers[0])
    # With the in-process engine the worker's records are this process's.
    if worker["pid"] == os.getpid():
        worker["patch_records"] = worker["patch_records"][records_before:]
    decisions = patches.decisions()[decisions_before:]
    model_config = llm.llm_engine.model_config
    return {
        "architecture": architecture,
        "model_class": worker["model_class"],
        "native_class": native_class(architecture),
        "model_impl": str(getattr(model_config, "model_impl", "auto")),
        "dtype": str(model_config.dtype).removeprefix("torch."),
        "parameter_dtypes": worker["parameter_dtypes"],
        "attention_backends": worker["attention_backends"],
        "linear_methods": worker["linear_methods"],
        "kernels": worker["kernels"],
        "quantization": quant_path(worker, decisions),
        "patch_decisions": decisions,
        "patch_records": worker["patch_records"],
        # One answer per rank: that the card's tensor parallelism really ran.
        "tensor_parallel_size": llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size,
        "ranks": len(answers),
        "worker_pids": sorted({a["pid"] for a in answers}),
        # Every rank's build of vLLM's CPU kernels: which ISA's kernels computed the figures.
        "cpu_kernel_builds": sorted({str(a["cpu_kernel_build"]) for a in answers}),
    }
