"""Whether an engine's evidence (engines.evidence) shows that it ran what the
card claims: the card's architecture through vLLM's native class, in the card's
dtype and tensor parallelism, with attention through a backend, and its quantized layers through a path
the card allows. A comparison of transformers with itself, or of a path the card
does not name, must not pass."""

from __future__ import annotations

from typing import Any

# What each card `quant_path` accepts when the card names a `patch`.
ALLOWED_PATHS = {"auto": ("kernel", "patch"), "patch": ("patch",), "kernel": ("kernel",)}


def judge(evidence: dict[str, Any], *, architecture: str, dtype: str, patch: str | None, quant_path: str,
          allow_fallback: bool, tensor_parallel_size: int) -> dict[str, Any]:
    """{passed, problems, allowed_quant_paths}; every problem names what ran and what was expected."""
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
    allowed = ALLOWED_PATHS[quant_path] if patch else ("none",)
    quant = evidence["quantization"]
    if quant["path"] not in allowed:
        problems.append(f"quantized layers were loaded by path '{quant['path']}' ({quant['reason']}); "
                        f"the card allows {', '.join(allowed)}")
    elif quant["path"] == "patch" and quant["patch"] != patch:
        problems.append(f"the {quant['patch']} patch ran, the card names {patch}")
    return {"passed": not problems, "problems": problems, "allowed_quant_paths": list(allowed)}
