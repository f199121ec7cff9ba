"""The perf figures of an engine and of a case, and the run's perf_report.json."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from npu_conformance.cards import Card
from npu_conformance.engines.target import VllmRunner
from npu_conformance.perf.gate import Gate, engine_mode
from npu_conformance.perf.measure import Measurement
from npu_conformance.perf.roofline import Bandwidth, decode_weight_bytes, roofline_tok_s
from npu_conformance.platforms import Platform
from npu_conformance.report import write_report
from npu_conformance.report_schema import PerfCaseRecord, PerfDocument, checked


def model_figures(card: Card, runner: VllmRunner, checkpoint: Path, bandwidth: Bandwidth) -> dict[str, Any]:
    """Per-engine figures: load time, engine arguments, KV-cache capacity and the
    batch-1 roofline."""
    config = runner.llm.llm_engine.vllm_config
    cache = config.cache_config
    max_model_len = config.model_config.max_model_len
    # vLLM 0.32 stores its own group-aware figures; older engines only know blocks.
    kv_tokens = getattr(cache, "kv_cache_size_tokens", None) or cache.num_gpu_blocks * cache.block_size
    concurrency = getattr(cache, "kv_cache_max_concurrency", None) or kv_tokens / max_model_len
    tp = config.parallel_config.tensor_parallel_size
    weight_bytes = decode_weight_bytes(checkpoint, card.dtype, card.trust_remote_code)
    return {
        "card": card.name,
        "checkpoint": str(checkpoint),
        "dtype": card.dtype,
        "load_time_s": runner.load_time_s,
        "engine_args": runner.kwargs,
        "engine_env": runner.env,
        "max_model_len": max_model_len,
        "kv_cache_tokens": kv_tokens,
        "kv_cache_blocks": cache.num_gpu_blocks,
        "kv_block_size": cache.block_size,
        # Requests of max_model_len tokens the KV cache holds at once (the seed's "~61x").
        "max_concurrency": concurrency,
        "tensor_parallel_size": tp,
        "decode_weight_bytes": weight_bytes,
        "bandwidth": bandwidth.as_dict(),
        # Each device streams its 1/tp share of the weights.
        "roofline_tok_s_batch1": roofline_tok_s(weight_bytes / tp, bandwidth.roofline_gb_s, 1),
    }


def case_figures(card: Card, platform: Platform, measurement: Measurement, gate: Gate | None,
                 model: dict[str, Any]) -> dict[str, Any]:
    """Everything one case measured and was judged on, for benchmark.extra_info and the report."""
    roofline = model["roofline_tok_s_batch1"] * measurement.batch_size
    return {
        "card": card.base_name,
        "mode": engine_mode(card, platform.name),
        "platform": platform.name,
        "device_name": platform.device_name,
        "device_key": platform.perf_device,
        "dtype": card.dtype,
        **measurement.figures(),
        **(gate.figures if gate else {}),
        "roofline_tok_s": roofline,
        "roofline_fraction": measurement.output_tok_s / roofline,
        "model": model,
    }


class PerfReport:
    """Per engine and per case: every figure, baseline and verdict of the run."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {}
        self.cases: dict[str, dict[str, Any]] = {}

    def add_case(self, test_id: str, figures: dict[str, Any], verdict: str, message: str = "") -> None:
        # The engine's figures are kept once, under models; a case the schema does not know fails its own test.
        self.cases[test_id] = checked(PerfCaseRecord, {**{k: v for k, v in figures.items() if k != "model"},
                                                       "verdict": verdict, "message": message}, test_id)

    def write(self, directory: Path, platform: Platform) -> Path:
        return write_report(directory / "perf_report.json", PerfDocument,
                            generated_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            platform=platform.as_dict(), models=self.models, cases=self.cases)
