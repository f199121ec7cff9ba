"""The quantized-checkpoint patches (patches/) as vLLM loads them: through the
`vllm.general_plugins` entry point, in real engines, on small real checkpoints.

Each checkpoint is a random-init transformers model (shapes as the synthetic
recipes: hidden 256, head_dim 64) quantized by npu_conformance/quantize.py, with its
fake-quantized float32 twin as the reference. Per format, two engine boots:
- forced off, vLLM fails the way the patches' probe predicts for this platform
  (on CPU without AMX: no ScaledMM kernel for FP8 at load); skipped where vLLM has
  the kernels (GPTQ on any AVX-512 build). vLLM's AVX2 build, which AVX2-only
  hosts load, has no cpu_gemm_wna16 op for GPTQ: a fresh process that loads it
  checks that host's verdict on any x86 host;
- patched, the engine loads (one warning line, one load record) and its greedy
  tokens and logits match transformers on the reference. (vLLM's CPU linear
  layers repack their weights after loading, so the dense tensors themselves are
  compared with the reference in test_dequant.py, on the loader's stream.)
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from npu_conformance import patches
from npu_conformance.quantize import write_quantized
from npu_conformance.engines.reference import ReferenceRunner
from npu_conformance.engines.target import VllmRunner
from npu_conformance.patches.common import HOOK_MARK

pytestmark = pytest.mark.patches

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [900, 17, 300, 42]]
MAX_TOKENS = 8
ENGINE = {"max_model_len": 256, "enforce_eager": True, "seed": 0, "skip_tokenizer_init": True}
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
# The patched engines run in float32, where vLLM on CPU matches transformers to
# ~1e-8, so greedy tokens agree even on a random model's near-ties.
PATCHED_DTYPE = "float32"


@dataclass(frozen=True)
class Case:
    architecture: str
    intermediate_size: int
    spec: dict[str, Any]
    quant_method: str  # as config.json names it
    dtype: str  # of the public checkpoints, for the unpatched engine


CASES = {
    # 688 is not a multiple of 128: gate/up rows and down columns end in partial blocks.
    "fp8_block": Case("Qwen3ForCausalLM", 688, {"method": "fp8_block"}, "fp8", "bfloat16"),
    # GPTQ groups of 128 need in_features (hidden, intermediate) divisible by 128.
    "gptq": Case("Qwen2ForCausalLM", 768, {"method": "gptq"}, "gptq", "float16"),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Case, Path, Path]:
    """(patch name, case, quantized checkpoint, reference checkpoint)."""
    import transformers

    name = request.param
    spec = CASES[name]
    root = tmp_path_factory.mktemp(name)
    model_cls = getattr(transformers, spec.architecture)
    config = model_cls.config_class(
        vocab_size=1024, hidden_size=256, head_dim=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, intermediate_size=spec.intermediate_size, max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model_cls(config).float().save_pretrained(root / "base")
    quantized = write_quantized(root / "base", root / "quantized", spec.spec)
    reference = write_quantized(root / "base", root / "reference", spec.spec, reference=True)
    return name, spec, quantized, reference


def raising(error: Exception) -> Callable[..., Any]:
    """A stand-in for one of the patch's vLLM-facing steps that fails with `error`."""
    def step(*args: Any) -> Any:
        raise error
    return step


def runner(checkpoint: Path, dtype: str, mode: str) -> VllmRunner:
    return VllmRunner(checkpoint, dtype=dtype, trust_remote_code=False, engine_args=ENGINE,
                      env={**ENGINE_ENV, patches.ENV: mode}, boot_timeout_s=600, request_timeout_s=300)


# --- registration --------------------------------------------------------------------


@pytest.mark.unit
def test_entry_point_is_installed() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("npu_conformance_patches") == "npu_conformance.patches:register", (
        "the patches load only through the entry point: reinstall the suite (pip install -e .)")


@pytest.mark.unit
def test_register_is_idempotent() -> None:
    from vllm.config.model import ModelConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    patches.register()
    hooks = (ModelConfig._verify_quantization, DefaultModelLoader.get_all_weights)
    patches.register()
    assert (ModelConfig._verify_quantization, DefaultModelLoader.get_all_weights) == hooks
    for hook in hooks:
        # Wrapped once: the wrapped function is vLLM's own.
        assert getattr(hook, HOOK_MARK, False)
        assert not getattr(hook.__wrapped__, HOOK_MARK, False)


@pytest.mark.unit
@pytest.mark.parametrize(("value", "mode"), [(None, "auto"), ("", "auto"), ("ON", "on"), (" off ", "off")])
def test_mode(value: str | None, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_conformance.patches.config import mode as current_mode

    if value is None:
        monkeypatch.delenv(patches.ENV, raising=False)
    else:
        monkeypatch.setenv(patches.ENV, value)
    assert current_mode() == mode


@pytest.mark.unit
def test_bad_mode_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_conformance.patches.config import mode

    monkeypatch.setenv(patches.ENV, "yes")
    with pytest.raises(ValueError, match=f"{patches.ENV}='yes': expected one of auto, on, off"):
        mode()


# --- engines -------------------------------------------------------------------------


def test_unpatched_engine_fails(case: tuple[str, Case, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, spec, quantized, _ = case
    reason = patches.probe(str(quantized), spec.dtype)
    if reason is None:
        pytest.skip("vLLM has kernels for this checkpoint on this platform: nothing to patch")
    # FP8 fails while the engine builds its layers, GPTQ at the first forward.
    with pytest.raises(Exception) as failure:  # vLLM's own error, whatever its type: the message is checked below
        with runner(quantized, spec.dtype, "off") as engine:
            engine.greedy(PROMPTS[:1], 1)
    assert not isinstance(failure.value, patches.CheckpointError)
    # The failure is the one the probe predicted: a missing op by name, or vLLM's
    # kernel-selection (or platform) error, of which the first sentence is stable.
    expected = re.findall(r"torch\.ops\.\w+\.(\w+)", reason) or [reason.split(" Reasons:")[0]]
    assert any(fragment in str(failure.value) for fragment in expected), (
        f"expected one of {expected} in vLLM's error, got: {failure.value}")


# Loads vLLM's AVX2 build by telling vLLM's ISA check (platforms/cpu.py
# import_kernels) that this host has no AVX-512, as on an AVX2-only host; then
# probes, and boots the engine in-process with the patches in the given mode.
AVX2_BUILD = """
import json, sys, torch
torch.cpu._is_avx512_supported = lambda: False
from npu_conformance import patches
from npu_conformance.engines.target import VllmRunner
checkpoint, dtype, mode, engine_args, env = sys.argv[1:4] + [json.loads(a) for a in sys.argv[4:]]
result = {"probe": patches.probe(checkpoint, dtype), "error": None}
try:
    with VllmRunner(checkpoint, dtype=dtype, trust_remote_code=False, engine_args=engine_args,
                    env={**env, patches.ENV: mode}, boot_timeout_s=600, request_timeout_s=300) as engine:
        result["tokens"] = engine.greedy([[1, 2, 3, 4]], 2)[0][0]
        result["path"] = engine.evidence["quantization"]["path"]
except Exception as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(result))
"""


def run_on_avx2_build(checkpoint: Path, dtype: str, mode: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", AVX2_BUILD, str(checkpoint), dtype, mode, json.dumps(ENGINE),
                           json.dumps(ENGINE_ENV)], capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}; stderr tail:\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not torch.cpu._is_avx2_supported(),
                    reason="vLLM for CPU ships its AVX2 build for x86 hosts with AVX2")
@pytest.mark.parametrize("case", ["gptq"], indirect=True)
@pytest.mark.parametrize("mode", ["off", "auto"])
def test_avx2_build_lacks_the_gptq_op(case: tuple[str, Case, Path, Path], mode: str) -> None:
    """vLLM selects its CPU WNA16 kernel on the AVX2 build too, which registers no
    cpu_gemm_wna16: the probe must say so, the unpatched engine must fail on that
    op at its first forward, and auto must load the checkpoint dequantized."""
    if not torch.cpu._is_avx512_supported():
        pytest.skip("this host loads the AVX2 build itself: test_unpatched_engine_fails covers it")
    _, spec, quantized, _ = case
    result = run_on_avx2_build(quantized, spec.dtype, mode)
    assert result["probe"] == ("CPUWNA16LinearKernel calls torch.ops._C.cpu_gemm_wna16 on this host, "
                               "which this vLLM build does not register"), result
    if mode == "off":
        assert result["error"] is not None and "cpu_gemm_wna16" in result["error"], result
    else:
        assert result["error"] is None and result["path"] == "patch" and len(result["tokens"]) == 2, result


@pytest.mark.parametrize("mode", ["on", "off"])
def test_mode_forces_the_path_on_any_host(case: tuple[str, Case, Path, Path], mode: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`on` dequantizes and `off` leaves the checkpoint to vLLM, whatever kernels
    this host has: each path can be forced anywhere (vLLM's own model config, no boot)."""
    from vllm.config import ModelConfig

    name, spec, quantized, _ = case
    patches.register()
    monkeypatch.setenv(patches.ENV, mode)
    before = len(patches.decisions())
    try:
        model_config = ModelConfig(model=str(quantized), dtype=spec.dtype, skip_tokenizer_init=True)
    except ValueError as exc:
        assert mode == "off", exc  # vLLM's own refusal, where the platform refuses the method
        return
    decision = patches.decisions()[before:]
    assert [(d["patch"], d["mode"], d["dequantize"]) for d in decision] == [(name, mode, mode == "on")]
    assert decision[0]["reason"] == f"{patches.ENV}={mode}"
    assert (model_config.quantization is None) == (mode == "on")


def test_only_no_kernel_errors_turn_the_patch_on(case: tuple[str, Case, Path, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's "no kernel can implement this layer" turns the patch on (auto);
    any other error from its checks is vLLM's own and must surface."""
    from vllm.config import ModelConfig

    from npu_conformance.patches.config import missing_kernel
    from npu_conformance.patches.loader import patch_for

    _, spec, quantized, _ = case
    monkeypatch.setenv(patches.ENV, "off")
    try:
        model_config = ModelConfig(model=str(quantized), dtype=spec.dtype, skip_tokenizer_init=True)
    except ValueError as exc:
        pytest.skip(f"this platform refuses the method before kernel selection: {exc}")
    patch = patch_for(model_config.model_arch_config.quantization_config)

    monkeypatch.setattr(patch, "select_kernel", raising(ValueError("Failed to find a kernel that can implement "
                                                                   "the layer. Reasons: \n no")))
    assert missing_kernel(patch, model_config).startswith("Failed to find a kernel")
    monkeypatch.setattr(patch, "select_kernel", raising(ValueError("weight_shape (7, 3) is not a valid shape")))
    with pytest.raises(ValueError, match="not a valid shape"):
        missing_kernel(patch, model_config)


@pytest.mark.parametrize("case", ["gptq"], indirect=True)
def test_only_a_missing_op_in_the_layer_run_turns_the_patch_on(case: tuple[str, Case, Path, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPTQ kernel's one-layer run reports a custom op the build lacks;
    any other error from it is vLLM's own and must surface."""
    from vllm.config import ModelConfig

    from npu_conformance.patches import gptq
    from npu_conformance.patches.config import missing_kernel

    _, spec, quantized, _ = case
    monkeypatch.setenv(patches.ENV, "off")
    model_config = ModelConfig(model=str(quantized), dtype=spec.dtype, skip_tokenizer_init=True)
    missing_op = AttributeError("'_OpNamespace' '_C' object has no attribute 'x'")
    monkeypatch.setattr(gptq, "run_one_layer", raising(missing_op))
    assert missing_kernel(gptq, model_config).endswith("calls torch.ops._C.x on this host, "
                                                        "which this vLLM build does not register")
    monkeypatch.setattr(gptq, "run_one_layer", raising(AttributeError("'Module' object has no attribute 'bias'")))
    with pytest.raises(AttributeError, match="bias"):
        missing_kernel(gptq, model_config)


def test_patched_engine_matches_reference(case: tuple[str, Case, Path, Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    name, spec, quantized, reference = case
    # vLLM's FP8 and GPTQ layers take 16-bit activations only: in float32 the
    # default (auto) patches on every platform.
    assert patches.probe(str(quantized), PATCHED_DTYPE) is not None
    before = len(patches.decisions())
    with runner(quantized, PATCHED_DTYPE, "auto") as engine:
        outputs = engine.greedy(PROMPTS, MAX_TOKENS)
        evidence = engine.evidence

    # The patch's own records, from the process that decided and the worker that loaded.
    decisions = patches.decisions()[before:]
    assert [(d["patch"], d["method"], d["dequantize"]) for d in decisions] == [(name, spec.quant_method, True)]
    assert decisions[0]["reason"].startswith("no kernel for it here"), decisions[0]
    assert evidence["quantization"]["path"] == "patch" and evidence["linear_methods"].keys() <= {
        "UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"}, evidence
    records = evidence["patch_records"]
    # 2 decoder layers of 7 linear layers (q, o: 256x256; k, v: 128x256; gate, up,
    # down: 256 x intermediate), dense in float32.
    dense_bytes = 2 * 4 * (256 * 256 + 2 * 128 * 256 + 256 * 256 + 3 * 256 * spec.intermediate_size)
    assert [(r["patch"], r["model"], r["dtype"], r["tensors"], r["bytes_after"]) for r in records] == [
        (name, str(quantized), PATCHED_DTYPE, 14, dense_bytes)]
    assert 0 < records[0]["bytes_before"] < dense_bytes / 2

    with ReferenceRunner(reference, PATCHED_DTYPE, trust_remote_code=False) as transformers_model:
        for prompt, (tokens, logits) in zip(PROMPTS, outputs):
            expected = transformers_model.run(prompt, MAX_TOKENS)
            assert tokens == expected.tokens
            np.testing.assert_allclose(logits, expected.generated_logits, rtol=1e-4, atol=1e-5)
