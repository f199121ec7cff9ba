"""Performance conformance: output tok/s against the card's recorded baseline
(npu_conformance/baselines.py), normalized to a host-speed calibration run in
the same session; request latencies, KV-cache capacity and the memory-bandwidth
roofline of one engine.

A round is one `generate` of `batch_size` random token-id prompts of exactly
`input_len` tokens, each decoding exactly `output_len` tokens (EOS ignored,
min_tokens = max_tokens), so every round does the same work. Prompts are fresh in
every round of the session, so prefix caching never skips a prefill. pytest-benchmark
times the rounds; this package turns its figures into tok/s and judges them.

cases: which cases run; workload: a round's prompts; calibration: the host's speed;
measure: the timed rounds and their figures; gate: the verdict against the baseline;
bench: `vllm bench throughput` in its own process; roofline: the bandwidth-bound
limit; report: the figures of an engine and a case, and perf_report.json.
"""

from __future__ import annotations

from npu_conformance.perf.calibration import Calibration
from npu_conformance.perf.cases import NoCase, perf_batch_sizes, perf_cards, skip_reason
from npu_conformance.perf.gate import (StepDelay, baseline_key, check_lengths, engine_mode, judge, quant_key,
                                       stretch_for, tolerance)
from npu_conformance.perf.measure import (Alternating, ContentionLimit, HostBusy, Measurement, Rounds, load_figures,
                                          measure, measure_alternating, spread, time_rounds)
from npu_conformance.perf.report import PerfReport, case_figures, model_figures
from npu_conformance.perf.roofline import (Bandwidth, device_bandwidth, load_bandwidths, published_bandwidth,
                                           roofline_tok_s)
from npu_conformance.perf.workload import exact_length_params, fresh_prompts, synthetic_prompts

# Not re-exported: bench is also the entry point `python -m npu_conformance.perf.bench`,
# and a module already in sys.modules when runpy runs it warns in every bench process.
__all__ = [
    "Alternating",
    "Bandwidth",
    "Calibration",
    "ContentionLimit",
    "HostBusy",
    "Measurement",
    "NoCase",
    "PerfReport",
    "Rounds",
    "StepDelay",
    "baseline_key",
    "case_figures",
    "check_lengths",
    "device_bandwidth",
    "engine_mode",
    "exact_length_params",
    "fresh_prompts",
    "judge",
    "load_bandwidths",
    "load_figures",
    "measure",
    "measure_alternating",
    "model_figures",
    "perf_batch_sizes",
    "perf_cards",
    "published_bandwidth",
    "quant_key",
    "roofline_tok_s",
    "skip_reason",
    "spread",
    "stretch_for",
    "synthetic_prompts",
    "time_rounds",
    "tolerance",
]
