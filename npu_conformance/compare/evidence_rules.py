"""Whether an engine's evidence (engines.evidence) shows that it ran what the
card claims: the card's architecture through vLLM's native class, in the card's
dtype and tensor parallelism, its parameters loaded in that dtype, attention
through a backend the platform allows, and its quantized layers through one
path the card allows. A comparison of transformers with itself, of a path the
card does not name, or of evidence that was never collected, must not pass."""

from __future__ import annotations

from typing import Any, Sequence

# What each card `quant_path` accepts when the card names a `patch`.
ALLOWED_PATHS = {"auto": ("kernel", "patch"), "patch": ("patch",), "kernel": ("kernel",)}

# What every judgement reads: evidence without one of these judges nothing.
REQUIRED = ("architecture", "model_class", "native_class", "dtype", "parameter_dtypes", "attention_backends",
            "quantization", "tensor_parallel_size", "ranks")

# Floating-point parameter dtypes, which must be the card's dtype. Integer and
# float8 tensors are quantized weights' storage; float32 beside them, the
# quantization's scales (GPTQ and FP8 keep theirs in float32 on some kernels).
FLOATING = ("float16", "bfloat16", "float32", "float64")
SCALES = "float32"


def parameter_problem(parameter_dtypes: dict[str, int], dtype: str, quantized: bool) -> str | None:
    """Why the parameters as loaded are not in the card's `dtype`, or None."""
    floating = {d: n for d, n in parameter_dtypes.items() if d in FLOATING}
    allowed = {dtype, SCALES} if quantized else {dtype}
    if dtype not in floating or set(floating) - allowed:
        return (f"the parameters loaded as {dict(sorted(parameter_dtypes.items()))} (tensors per dtype), the card "
                f"says {dtype}" + (" (float32 allowed beside it for quantization scales)" if quantized else ""))
    return None


def judge(evidence: dict[str, Any], *, architecture: str, dtype: str, patch: str | None, quant_path: str,
          allow_fallback: bool, tensor_parallel_size: int, attention_backends: Sequence[str]) -> dict[str, Any]:
    """{passed, problems, allowed_quant_paths}; every problem names what ran and what was expected."""
    allowed = ALLOWED_PATHS[quant_path] if patch else ("none",)
    if missing := [k for k in REQUIRED if k not in evidence]:
        return {"passed": False, "problems": [f"the engine's evidence lacks {', '.join(missing)}: nothing to judge"],
                "allowed_quant_paths": list(allowed)}
    problems = []
    if evidence["architecture"] != architecture:
        problems.append(f"the checkpoint's architecture is {evidence['architecture']}, the card says {architecture}")
    native, ran = evidence["native_class"], evidence["model_class"]
    if not allow_fallback:
        if native is None:
            problems.append(f"vLLM's model registry has no class for {architecture} on this platform")
        elif ran != native:
            problems.append(f"vLLM ran {architecture} through {ran}, not its native {native} "
                            "(a card accepts that only with allow_model_impl_fallback: true)")
    if evidence["dtype"] != dtype:
        problems.append(f"the engine ran in {evidence['dtype']}, the card says {dtype}")
    if (evidence["tensor_parallel_size"], evidence["ranks"]) != (tensor_parallel_size, tensor_parallel_size):
        problems.append(f"the engine ran tensor parallel {evidence['tensor_parallel_size']} with "
                        f"{evidence['ranks']} ranks answering, the card says {tensor_parallel_size}")
    if not evidence["attention_backends"]:
        problems.append("no attention layer with a backend was found in the model")
    elif not attention_backends:
        problems.append("the card allows no attention backend on this platform (platforms.<name>.attention_backends)")
    elif other := sorted(set(evidence["attention_backends"]) - set(attention_backends)):
        problems.append(f"attention ran through {', '.join(other)}; the card allows {', '.join(attention_backends)} "
                        "on this platform")
    quant = evidence["quantization"]
    if problem := parameter_problem(evidence["parameter_dtypes"], dtype, quantized=quant["path"] == "kernel"):
        problems.append(problem)
    if quant["path"] not in allowed:
        problems.append(f"quantized layers were loaded by path '{quant['path']}' ({quant['reason']}); "
                        f"the card allows {', '.join(allowed)}")
    elif quant["path"] == "patch" and quant["patch"] != patch:
        problems.append(f"the {quant['patch']} patch ran, the card names {patch}")
    return {"passed": not problems, "problems": problems, "allowed_quant_paths": list(allowed)}
