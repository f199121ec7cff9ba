"""NPU_CONFORMANCE_CPU_ISA (platforms.force_isa): the AVX2 path is forceable on any
x86 host, and a forced run reports the capped flags. Each case runs in a fresh
interpreter: the caps are process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import os, torch
from npu_conformance import platforms
print(platforms.force_isa())
print(os.environ["ATEN_CPU_CAPABILITY"], os.environ["ONEDNN_MAX_CPU_ISA"])
print(torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported(), torch.cpu._is_amx_tile_supported())
print(" ".join(platforms._cpu_flags()))
"""


def _probe(value: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NPU_CONFORMANCE_CPU_ISA": value}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_avx2_caps_torch_onednn_and_vllms_feature_checks() -> None:
    run = _probe("avx2")
    assert run.returncode == 0, run.stderr[-2000:]
    isa, env, checks, flags = run.stdout.strip().splitlines()
    assert isa == "avx2" and env == "avx2 AVX2"
    assert checks == "False False False"  # vLLM then loads _C_AVX2 and no AMX kernel
    assert set(flags.split()) <= {"avx2"}


def test_unknown_isa_is_refused_by_name() -> None:
    run = _probe("avx9")
    assert run.returncode != 0 and "NPU_CONFORMANCE_CPU_ISA='avx9'" in run.stderr
