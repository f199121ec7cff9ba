"""The performance part of a report's view model: the engine's figures, the
throughput and slowdown cases with their gates, and pytest-benchmark's timings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from npu_conformance.report_schema import PerfCaseRecord
from npu_conformance.reports.formatting import num, pct
from npu_conformance.reports.run import Model


def _gate_cells(c: PerfCaseRecord) -> list[str]:
    """Baseline +- noise, normalized ratio against the baseline's, host speed and tolerance of one perf case."""
    gate = c.gate or {}
    base, norm, host = c.baseline or {}, gate.get("normalized") or {}, gate.get("host") or {}

    def band(value: float | None, noise: float | None, spec: str) -> str:
        return "—" if value is None else f"{value:{spec}}" + (f" ± {noise:.1%}" if noise is not None else "")

    return [band(base.get("tok_s"), base.get("tok_s_noise"), ".1f"),
            "—" if not norm else f"{norm['measured']:.3f} / {band(norm['baseline'], norm.get('noise'), '.3f')}",
            num(host.get("speed"), ".2f"),
            pct((norm or gate.get("absolute") or {}).get("tolerance"))]


def _latency_cell(c: PerfCaseRecord, name: str) -> str:
    """A latency figure's slowdown against its neighbouring clean rounds, and its limit."""
    f = (c.model_extra or {})["latency"]["judged"]["figures"][name]
    return f"{f['slowdown']:.3f}x / {f['limit']:.3f}" + ("" if f["gated"] else " (reported)")


def performance(m: Model, files: dict[str, Path], verdict: Callable[[str], str]) -> dict[str, Any]:
    pm, cases = m.perf_model, m.throughput_cases
    bw = pm.bandwidth if pm else {}
    return {
        "has_data": bool(pm or m.perf_cases),
        "engine": None if not pm else {
            "load_time_s": num(pm.load_time_s, ".1f"), "max_model_len": pm.max_model_len,
            "kv_cache_tokens": num(pm.kv_cache_tokens, ","),
            "max_concurrency": num(pm.max_concurrency, ".1f"),
            "tensor_parallel_size": pm.tensor_parallel_size,
            "weight_mib": num(pm.decode_weight_bytes / 2**20, ".1f"),
            "measured_gb_s": num(bw.get("measured_gb_s"), ".1f"), "measure_method": bw.get("measure_method", "—"),
            "published_gb_s": num(bw.get("published_gb_s"), ".1f"), "published": bw.get("published") or "—",
            "roofline_gb_s": num(bw.get("roofline_gb_s"), ".1f"),
            "roofline_tok_s_batch1": num(pm.roofline_tok_s_batch1, ".1f")},
        "throughput": None if not cases else {
            "input_len": cases[0].input_len, "output_len": cases[0].output_len, "rounds": cases[0].rounds,
            "calibration": cases[0].calibration or "—",
            "picture": str(files["throughput"]),
            "rows": [[c.mode, c.batch_size, num(c.output_tok_s, ".1f"),
                      num(c.output_tok_s_best, ".1f"), num(c.total_tok_s, ".1f"),
                      num(c.ttft_ms_median, ".1f"), num(c.tpot_ms_median, ".1f"),
                      *_gate_cells(c), num(c.roofline_tok_s, ".1f"), pct(c.roofline_fraction),
                      f"{verdict(c.verdict)}: {c.message}"] for c in cases]},
        "slowdown": [[(c.injected or {}).get("factor"), num((c.injected or {}).get("achieved_slowdown"), ".2f"),
                      num(c.output_tok_s, ".1f"), *_gate_cells(c), c.expected_verdict or "—",
                      f"{verdict(c.verdict)}: {c.message}"] for c in m.slowdown_cases],
        "latency": [[(c.model_extra or {})["latency"]["case"], (c.model_extra or {})["latency"]["factor"],
                     *(_latency_cell(c, name) for name in ("ttft_p50", "tpot_p50", "ttft_p99", "tpot_p99")),
                     c.expected_verdict or "—", f"{verdict(c.verdict)}: {c.message}"] for c in m.latency_cases],
        # The bench and load self-tests, told apart by the figures only they record.
        "fidelity": [{"verdict": verdict(c.verdict), "message": c.message}
                     for c in m.perf_cases.values() if "ratios" in (c.model_extra or {})],
        "load": [{"verdict": verdict(c.verdict), "message": c.message}
                 for c in m.perf_cases.values() if "detector" in (c.model_extra or {})],
        "benchmarks": [[b["name"], b["stats"]["rounds"],
                        *(f"{b['stats'][k]:.3f}" for k in ("min", "median", "mean", "stddev"))] for b in m.benchmarks],
    }
