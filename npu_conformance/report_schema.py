"""The typed schema of the run's two JSON reports, after lm-evaluation-harness's
result_schema: precision_report.json and perf_report.json are checked against these
models when written (npu_conformance.report, perf.report), when an xdist worker's
part is merged, and when the renderer reads them (reports.run).

Every file carries `schema_version`. A file without it was written before the
schema was typed (version 1, the same shape) and still reads; a newer version
fails with a message naming it, never with a renderer's KeyError.

Records that judge (verdicts, checks, the serving and accuracy sections) forbid unknown keys,
so a misspelt field fails the run that writes it. A prompt's figures and a perf
case's figures stay open: their names are those of the code that measures them
(compare.metrics.figures_of, perf.measure.Measurement.figures, the self-tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from npu_conformance.compare.diagnosis import Diagnosis

# A figure keeps the type it was measured in: an int read into a float field would print as 3.0.
Number = int | float

SCHEMA_VERSION = 2
# Version 1: the files before `schema_version`; they have the shape of version 2.
OLDEST_READABLE = 1


class ReportFileError(ValueError):
    """A report file this suite cannot read: its path, and why."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Figures(BaseModel):
    # Figures named by the code that measures them; the typed fields are those read by name elsewhere.
    model_config = ConfigDict(extra="allow")


class Check(_Record):
    """One threshold check of a prompt (compare.rules): value against threshold."""

    value: Number
    threshold: Number
    passed: bool
    rule: str
    noise: Number | None = None  # the noise-floor reference's own figure, where one ran
    ratio: Number | None = None  # value / noise


class PromptRecord(_Figures):
    """One prompt's comparison (compare.precision.compare): its figures, checks and verdict."""

    text: str
    passed: bool
    checks: dict[str, Check]
    top1_rate: Number | None = None
    top1_exact_rate: Number | None = None
    top1_mismatch_positions: list[int] = Field(default_factory=list)
    logprob_rel_err_max: Number | None = None
    logprob_rel_err_mean: Number | None = None
    logprob_rel_err_per_position: list[Number] = Field(default_factory=list)
    max_abs_logprob_err: Number | None = None
    cosine_min: Number | None = None
    cosine_mean: Number | None = None
    kl_max: Number | None = None
    top5_overlap_mean: Number | None = None
    greedy_prefix: int | None = None
    greedy_len: int | None = None
    greedy_ratio: Number | None = None
    greedy_divergence_is_tie: bool | None = None
    reference_tokens: list[int] = Field(default_factory=list)
    target_tokens: list[int] = Field(default_factory=list)
    # {"reference"|"target": [[token id, probability], ...]} at the first generated position.
    top5_first_position: dict[str, list[tuple[int, Number]]] | None = None


class ServingRecord(_Record):
    """The card's OpenAI-server section: per stage (dummy, real) and per check."""

    stages: dict[str, dict[str, Any]]
    checks: dict[str, dict[str, Any]]
    verdict: Literal["pass", "fail", "incomplete"] | None = None
    skipped: list[str] = Field(default_factory=list)


class AccuracyRecord(_Record):
    """The card's task accuracy (npu_conformance.accuracy): both sides' scores,
    the gate's statistics and its verdict, or the error that stopped it."""

    task: str
    task_source: str
    metric: str
    expected: Literal["pass", "fail"]
    target: dict[str, Any] | None = None  # harness.TaskResult.record(), with the server it ran against
    reference: dict[str, Any] | None = None  # the same, or the recorded baseline, with its source
    gate: dict[str, Any] | None = None  # accuracy.gate.judge()
    disagreement: dict[str, int] | None = None  # items scored differently by the two sides
    verdict: Literal["pass", "fail", "error"]
    message: str


class ModelRecord(_Record):
    """One card's entry in precision_report.json."""

    card: str
    architecture: str
    weights: str
    reference_weights: str
    dtype: str
    reference_dtype: str | None = None
    noise_dtype: str | None = None
    part: str | None = None
    max_tokens: int
    thresholds: dict[str, Number | str]
    expect: Literal["pass", "fail"]
    prompts: dict[str, PromptRecord]
    errors: list[str]
    verdict: Literal["pass", "fail", "error", "not run"] | None = None  # set when the file is written
    reference: dict[str, Any] | None = None
    conditions: dict[str, dict[str, Any]] | None = None
    diagnosis: Diagnosis | None = None
    evidence: dict[str, Any] | None = None
    patches: list[dict[str, Any]] | None = None
    engine_boots: int | None = None
    devices: dict[str, Any] | None = None
    load_time_s: Number | None = None
    checkpoint: str | None = None
    serving: ServingRecord | None = None
    accuracy: AccuracyRecord | None = None


class PerfModelRecord(_Record):
    """One engine's figures in perf_report.json (perf.report.model_figures)."""

    card: str
    checkpoint: str
    dtype: str
    load_time_s: Number
    engine_args: dict[str, Any]
    engine_env: dict[str, str]
    max_model_len: int
    kv_cache_tokens: Number
    kv_cache_blocks: int | None = None
    kv_block_size: int | None = None
    max_concurrency: Number
    tensor_parallel_size: int
    decode_weight_bytes: Number
    bandwidth: dict[str, Any]
    roofline_tok_s_batch1: Number
    variants: dict[str, dict[str, Any]] | None = None  # a condition's engine (graph mode), by condition


class PerfCaseRecord(_Figures):
    """One perf test's figures and verdict; the figures differ by kind of test
    (a throughput case, an injected slowdown, the load and bench self-tests)."""

    card: str
    verdict: Literal["pass", "fail", "measured"]
    message: str
    mode: str = "eager"
    batch_size: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    rounds: int | dict[str, int] | None = None  # the load self-test counts its rounds per load state
    calibration: str | None = None
    output_tok_s: Number | None = None
    output_tok_s_best: Number | None = None
    total_tok_s: Number | None = None
    ttft_ms_median: Number | None = None
    tpot_ms_median: Number | None = None
    baseline: dict[str, Any] | None = None  # None: no recorded run to judge against
    gate: dict[str, Any] | None = None
    roofline_tok_s: Number | None = None
    roofline_fraction: Number | None = None
    injected: dict[str, Any] | None = None  # the slowdown self-test's injection
    expected_verdict: str | None = None


class PrecisionDocument(_Record):
    schema_version: int = SCHEMA_VERSION
    generated_at: str
    platform: dict[str, Any] | None
    models: dict[str, ModelRecord]


class PerfDocument(_Record):
    schema_version: int = SCHEMA_VERSION
    generated_at: str
    platform: dict[str, Any]
    models: dict[str, PerfModelRecord]
    cases: dict[str, PerfCaseRecord]


def dump(record: BaseModel) -> dict[str, Any]:
    """The record as JSON data, with the keys its writer gave (no defaults added):
    a file holds what was measured, and the same figures as before typing."""
    return record.model_dump(mode="json", exclude_unset=True)


def checked(kind: type[BaseModel], data: dict[str, Any], what: str) -> dict[str, Any]:
    """`data` checked against `kind` and dumped again, for a writer; a key or
    value the schema does not know fails here, naming `what` and the field."""
    try:
        return dump(kind.model_validate(data))
    except ValidationError as exc:
        raise ReportFileError(f"{what} does not fit the report schema ({kind.__name__}): {exc}") from exc


def read(path: Path, kind: type[PrecisionDocument] | type[PerfDocument]) -> PrecisionDocument | PerfDocument | None:
    """The file at `path` (None where there is none), checked against `kind`."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportFileError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ReportFileError(f"{path}: expected a JSON object, found {type(data).__name__}")
    version = data.setdefault("schema_version", OLDEST_READABLE)
    if not isinstance(version, int) or not OLDEST_READABLE <= version <= SCHEMA_VERSION:
        raise ReportFileError(
            f"{path}: report schema version {version!r}; this suite reads versions {OLDEST_READABLE}-{SCHEMA_VERSION}. "
            "Render it with the suite version that wrote it, or run the tests again to write it anew")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise ReportFileError(f"{path}: does not fit report schema version {version} ({kind.__name__}): {exc}") from exc
