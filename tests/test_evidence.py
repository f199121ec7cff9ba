"""The suite's machinery on real engines, where a verdict could otherwise rest
on nothing: a model run through vLLM's Transformers backend is refused by the
evidence check, and an engine that fails to boot is booted once per session,
however many tests and test modules need it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from npu_conformance.cards import CATALOG_DIR, Card
from npu_conformance.compare import evidence_rules
from npu_conformance.platforms import Platform
from npu_conformance.weights import resolve

pytestmark = pytest.mark.harness

CARD = "synthetic-llama"


# Run in a process of its own: vLLM's Transformers backend rewires transformers'
# model classes for the whole process, which would break every later reference.
BOOT_WITH_FALLBACK = """
import json, sys
from pathlib import Path
from npu_conformance.engines.target import VllmRunner
checkpoint, dtype, engine_args, env, boot_s, request_s = json.loads(sys.argv[1])
runner = VllmRunner(Path(checkpoint), dtype=dtype, trust_remote_code=False, engine_args=engine_args, env=env,
                    boot_timeout_s=boot_s, request_timeout_s=request_s)
with runner:
    print("EVIDENCE " + json.dumps(runner.evidence))
"""


def test_transformers_backend_is_refused(conformance, platform: Platform, pytestconfig: pytest.Config) -> None:
    """vLLM's Transformers backend runs the transformers model code inside vLLM:
    compared with the transformers reference it would pass by construction, so
    the evidence check must fail it unless the card opts in."""
    card: Card = conformance.card(CARD)
    checkpoint = resolve(card.weights, pytestconfig.getoption("cache_dir"), None, True)
    args = [str(checkpoint), card.dtype, {**card.engine_args(platform.name), "model_impl": "transformers"},
            card.env(platform.name), pytestconfig.getoption("boot_timeout"), pytestconfig.getoption("request_timeout")]
    proc = subprocess.run([sys.executable, "-c", BOOT_WITH_FALLBACK, json.dumps(args)], capture_output=True,
                          text=True, timeout=pytestconfig.getoption("boot_timeout") + 120)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("EVIDENCE ")), None)
    assert proc.returncode == 0 and line, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    evidence = json.loads(line.removeprefix("EVIDENCE "))
    rules = dict(architecture=card.architecture, dtype=card.dtype, patch=None, quant_path="auto",
                 tensor_parallel_size=1, attention_backends=card.platform(platform.name).attention_backends)
    refused = evidence_rules.judge(evidence, allow_fallback=False, **rules)
    assert not refused["passed"], evidence
    assert any("not its native" in p and evidence["model_class"] in p for p in refused["problems"]), refused
    assert evidence_rules.judge(evidence, allow_fallback=True, **rules)["passed"]


# A faithful bf16 engine's evidence, and the rules of a card that claims it.
EVIDENCE = {"architecture": "LlamaForCausalLM", "native_class": "llama", "model_class": "llama", "dtype": "bfloat16",
            "parameter_dtypes": {"bfloat16": 20}, "attention_backends": ["CPU_ATTN"],
            "quantization": {"path": "none", "reason": "the checkpoint is not quantized"},
            "tensor_parallel_size": 1, "ranks": 1}
RULES = dict(architecture="LlamaForCausalLM", dtype="bfloat16", patch=None, quant_path="auto", allow_fallback=False,
             tensor_parallel_size=1, attention_backends=("CPU_ATTN",))


@pytest.mark.unit
def test_faithful_evidence_passes() -> None:
    assert evidence_rules.judge(EVIDENCE, **RULES) == {"passed": True, "problems": [], "allowed_quant_paths": ["none"]}


@pytest.mark.unit
@pytest.mark.parametrize("dtypes, quantized, refused", [
    ({"float32": 20}, False, True),  # the whole model loaded in float32, the card says bf16
    ({"bfloat16": 18, "float32": 2}, False, True),  # a layer left in float32
    ({"bfloat16": 12, "float8_e4m3fn": 4, "float32": 4}, True, False),  # FP8 weights and their float32 scales
    ({"bfloat16": 12, "float16": 4}, True, True),  # scales in another half dtype
    ({"int32": 8, "float32": 8}, True, True),  # nothing in the card's dtype
])
def test_parameters_must_load_in_the_cards_dtype(dtypes: dict[str, int], quantized: bool, refused: bool) -> None:
    quant = {"path": "kernel", "reason": "vLLM"} if quantized else EVIDENCE["quantization"]
    rules = {**RULES, "patch": "fp8_block"} if quantized else RULES
    judged = evidence_rules.judge({**EVIDENCE, "parameter_dtypes": dtypes, "quantization": quant}, **rules)
    assert judged["passed"] is not refused, judged
    assert refused == any("the parameters loaded as" in p for p in judged["problems"]), judged


@pytest.mark.unit
def test_a_mix_of_kernel_and_patch_fails_every_quant_path() -> None:
    from npu_conformance.engines.evidence import quant_path

    worker = {"patch_records": [{"patch": "gptq", "tensors": 6}], "kernels": {"CPUWNA16LinearKernel": 2},
              "linear_methods": {"GPTQLinearMethod": 2, "UnquantizedLinearMethod": 6}}
    quant = quant_path(worker, [])
    assert quant["path"] == "mixed" and "dequantized 6 tensors while 2 layers kept" in quant["reason"]
    for path in ("auto", "patch", "kernel"):
        judged = evidence_rules.judge({**EVIDENCE, "dtype": "float16", "parameter_dtypes": {"float16": 9, "int32": 4},
                                       "quantization": quant},
                                      **{**RULES, "dtype": "float16", "patch": "gptq", "quant_path": path})
        assert not judged["passed"] and any("by path 'mixed'" in p for p in judged["problems"]), judged
    # Patched throughout: every quantized layer became a plain one.
    whole = quant_path({**worker, "linear_methods": {"UnquantizedLinearMethod": 8}}, [])
    assert whole["path"] == "patch"


@pytest.mark.unit
def test_attention_backend_must_be_one_the_platform_allows() -> None:
    other = evidence_rules.judge({**EVIDENCE, "attention_backends": ["TORCH_SDPA"]}, **RULES)
    assert other["problems"] == ["attention ran through TORCH_SDPA; the card allows CPU_ATTN on this platform"]
    none_allowed = evidence_rules.judge(EVIDENCE, **{**RULES, "attention_backends": ()})
    assert not none_allowed["passed"] and "allows no attention backend" in none_allowed["problems"][0]


@pytest.mark.unit
def test_missing_evidence_fails_the_evidence_and_the_reported_verdict(tmp_path: Path) -> None:
    lacking = {k: v for k, v in EVIDENCE.items() if k != "parameter_dtypes"}
    judged = evidence_rules.judge(lacking, **RULES)
    assert not judged["passed"] and judged["problems"] == ["the engine's evidence lacks parameter_dtypes: nothing "
                                                           "to judge"]
    from npu_conformance.cards import load_catalog
    from npu_conformance.report import PrecisionReport

    report = PrecisionReport()
    card = load_catalog()[CARD]
    report.add_prompt(card, "p", "text", {"passed": True, "checks": {}})
    written = json.loads(report.write(tmp_path, None).read_text())
    assert written["models"][CARD]["verdict"] == "fail"  # passing figures, no evidence


@pytest.mark.unit
@pytest.mark.parametrize("card_tp, ran_tp, ranks, refused", [(2, 2, 2, False), (2, 1, 1, True), (2, 2, 1, True),
                                                             (1, 1, 1, False)])
def test_tensor_parallelism_must_be_what_the_card_says(card_tp: int, ran_tp: int, ranks: int, refused: bool) -> None:
    evidence = {**EVIDENCE, "tensor_parallel_size": ran_tp, "ranks": ranks}
    judged = evidence_rules.judge(evidence, **{**RULES, "tensor_parallel_size": card_tp})
    assert judged["passed"] is not refused, judged
    assert refused == any("tensor parallel" in p for p in judged["problems"]), judged


def test_failed_boot_boots_once(pytestconfig: pytest.Config, tmp_path: Path) -> None:
    """An inner run of the precision and perf modules on a card whose engine
    cannot boot: every test of the card fails with the boot error, and the
    report counts one boot."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.copy(CATALOG_DIR / "_defaults.yaml", catalog)
    card = yaml.safe_load((CATALOG_DIR / f"{CARD}.yaml").read_text(encoding="utf-8"))
    # A memory fraction above 1: vLLM's cache config refuses it at boot, on any platform.
    card.update(name="unbootable", default=True, engine={"gpu_memory_utilization": 5.0})
    (catalog / "unbootable.yaml").write_text(yaml.safe_dump(card), encoding="utf-8")
    junit, report_dir = tmp_path / "junit.xml", tmp_path / "report"
    root = pytestconfig.rootpath
    argv = [sys.executable, "-m", "pytest", str(root / "tests/test_precision.py"), str(root / "tests/test_perf.py"),
            "-m", "precision or perf", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
            f"--catalog={catalog}", f"--report-dir={report_dir}", f"--cache-dir={pytestconfig.getoption('cache_dir')}"]
    inner = subprocess.run(argv, cwd=root, capture_output=True, text=True,
                           timeout=pytestconfig.getoption("boot_timeout") + 300)
    context = f"inner run: {' '.join(argv)}\n{inner.stdout[-4000:]}{inner.stderr[-2000:]}"
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    outcomes = [next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed") for case in cases]
    modules = {case.get("classname") for case in cases}
    assert len(modules) == 2 and len(cases) > 4 * 6, context  # both modules ran, every prompt's checks
    assert set(outcomes) <= {"failure", "error"} and inner.returncode == 1, context
    entry = json.loads((report_dir / "precision_report.json").read_text(encoding="utf-8"))["models"]["unbootable"]
    assert entry["engine_boots"] == 1, context
    assert len(entry["errors"]) == 1 and "gpu_memory_utilization" in entry["errors"][0], entry["errors"]
