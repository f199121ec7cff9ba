"""The sections of a card besides its prompts, serving and thresholds: where its
weights come from, how it deploys per platform and device part, how it is
perf-gated, the conditions it runs under and what a known-buggy card expects."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from npu_conformance.cards.engine_args import EngineOptions, EnvVars
from npu_conformance.cards.errors import Problem
from npu_conformance.cards.schema import Positional, PositiveInt, PositiveNumber, Section, WeightKind


class WeightSource(Positional):
    """Where a checkpoint comes from. `ref` is the builder recipe, hub id or path; a
    card writes `{<kind>: <ref>}` (see Card._weights_from_yaml)."""

    kind: WeightKind
    ref: StrictStr
    revision: StrictStr | None = None
    # Synthetic only: the builder's variants (known-buggy or quantized copies).
    mutate: dict[StrictStr, Any] | None = None
    quantize: dict[StrictStr, Any] | None = None

    @model_validator(mode="after")
    def _variants_are_synthetic(self) -> WeightSource:
        if (self.mutate or self.quantize) and self.kind != "synthetic":
            raise Problem(("mutate" if self.mutate else "quantize",),
                          "only synthetic checkpoints can be mutated or quantized")
        return self

    def describe(self) -> str:
        text = f"{self.kind}:{self.ref}"
        if self.revision:
            text += f"@{self.revision}"
        if self.mutate:
            text += f" mutate={json.dumps(self.mutate, sort_keys=True)}"
        if self.quantize:
            text += f" quantize={json.dumps(self.quantize, sort_keys=True)}"
        return text


class PerfSpec(Section):
    """How a card's throughput is measured and gated. The gate compares against a
    recorded baseline (npu_conformance/baselines.py), never a hand-set floor:
    `measured >= baseline x (1 - max(slack, noise_k x noise))`, noise being the
    spread of the baseline's recorded runs."""

    batch_sizes: Annotated[tuple[PositiveInt, ...], Field(min_length=1)]
    input_len: PositiveInt
    output_len: PositiveInt
    # Timed rounds per case: the gate reads their median.
    rounds: PositiveInt
    warmup_rounds: Annotated[StrictInt, Field(ge=0)]
    # The smallest tolerance the gate allows, whatever the recorded noise.
    slack: Annotated[StrictFloat, Field(ge=0, lt=1)]
    # How many times the recorded run-to-run noise the tolerance covers.
    noise_k: Annotated[StrictFloat, Field(ge=0)]
    # The slowdown the gate must catch (tests/test_perf.py injects it): a case
    # whose tolerance lets it through is reported as unable to gate.
    detect_slowdown: Annotated[StrictFloat, Field(gt=1)]
    # Also measured with the graph condition's engine (enforce_eager: false).
    graph: StrictBool = False
    # Compared with `vllm bench throughput` run in its own processes (boots an engine each time).
    fidelity: StrictBool = False


class LatencySpec(Section):
    """How a card's serving latency is measured and gated (npu_conformance/perf/latency.py,
    latency_gate.py): `vllm bench serve` rounds against the card's server at
    `concurrency`, clean rounds alternating with the case's, TTFT and TPOT p50
    gated as `slowdown <= 1 + max(slack, noise_k x noise)`."""

    # Whether the latency tests boot this card's server (a third boot per card).
    run: StrictBool
    concurrency: PositiveInt
    # Requests per round, `concurrency` at a time.
    prompts: PositiveInt
    input_len: PositiveInt
    output_len: PositiveInt
    # The case's rounds, each between two clean rounds.
    case_rounds: Annotated[StrictInt, Field(ge=2)]
    # Trial rounds of the injected slowdown, each after a clean one, that size it (and warm the server).
    sizing_rounds: PositiveInt
    # Calibration runs after each round (host speed, reported beside each round).
    calibration_runs: PositiveInt
    slack: Annotated[StrictFloat, Field(ge=0, lt=1)]
    noise_k: Annotated[StrictFloat, Field(ge=0)]
    # The slowdown of one phase's figure the gate must catch (tests/test_serving_latency.py injects it).
    detect_slowdown: Annotated[StrictFloat, Field(gt=1)]


# Joins a card's name and a condition's in a variant's name.
VARIANT_MARK = "+"
ConditionName = Literal["single", "batch", "prefix_cache", "chunked_prefill", "graph"]


class ConditionSpec(Section):
    """One serving condition the card's prompts run under again, compared with
    the same reference and checks (npu_conformance/conditions.py says how each runs)."""

    run: StrictBool
    # Engine arguments over the card's: a condition with any gets an engine of its own.
    engine: EngineOptions = Field(default_factory=dict)
    # `batch`: how many requests go in one call (the prompts cycled, mixed lengths).
    batch_size: PositiveInt | None = None


class DevicePart(Section):
    """How the card deploys on devices of at most `max_memory_gb` each (seed 000:
    granite-4.1-8b with TP=2 on 32 GB parts): engine arguments and environment
    over the platform's, its own runner and device count, and its own perf
    settings (the platform's figures are another deployment's)."""

    max_memory_gb: PositiveNumber
    runner: StrictStr | None = None
    devices: Annotated[StrictInt, Field(ge=1)] | None = None
    engine: EngineOptions = Field(default_factory=dict)
    env: EnvVars = Field(default_factory=dict)
    perf: PerfSpec | None = None


class PlatformSettings(Section):
    # The CI runner label the workflow routes the card to, and how many devices
    # that runner gives its engine (the product of its parallel sizes).
    runner: StrictStr | None = None
    devices: Annotated[StrictInt, Field(ge=1)] | None = None
    engine: EngineOptions = Field(default_factory=dict)
    env: EnvVars = Field(default_factory=dict)
    perf: PerfSpec | None = None
    # Why the card has no perf gate on this platform (another card measures the
    # same engine): a strict run skips its perf cases only with a reason given.
    perf_exempt: StrictStr | None = None
    latency: LatencySpec | None = None
    # The attention backends an engine may run on this platform (their get_name()):
    # evidence of another one fails the card.
    attention_backends: tuple[StrictStr, ...] = ()
    parts: dict[StrictStr, DevicePart] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _exempt_without_perf(self) -> "PlatformSettings":
        if self.perf_exempt is not None and self.perf is not None:
            raise ValueError("perf_exempt gives why the card has no perf gate: set perf: null with it")
        return self


class DiagnosisSpec(Section):
    """Where a known-buggy card's diagnosis must find the first divergence
    (compare.diagnosis): a layer's sublayer (`output`: after its residual adds),
    `embed_tokens` or `norm` (no layer), or `none` (every hidden state within the
    limit: the bug is after the final norm or off the prefill path)."""

    sublayer: Literal["embed_tokens", "input_layernorm", "self_attn", "post_attention_layernorm", "mlp", "output",
                      "norm", "none"]
    layer: Annotated[StrictInt, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _layer_where_one_is(self) -> DiagnosisSpec:
        if (self.layer is None) != (self.sublayer in ("embed_tokens", "norm", "none")):
            raise Problem(("layer",), f"is required for sublayer {self.sublayer!r}, and only for a layer's sublayers")
        return self


class Expectation(Section):
    """`fail` marks a known-buggy card: the sensitivity tests require the checks
    in `caught_by` to fail on every prompt its fault reaches (`reaches`, default
    all), every check to pass on the prompts it does not reach, the checks in
    `passes` to pass on every prompt (they do not reach the faulty path), and each
    condition in `conditions` to give its verdict. `accuracy`: the verdict the task
    gate must give (a buggy card without it is not scored on its task)."""

    verdict: Literal["pass", "fail"]
    caught_by: tuple[StrictStr, ...] = ()
    reaches: tuple[StrictStr, ...] = ()
    passes: tuple[StrictStr, ...] = ()
    # Conditions without engine arguments only: they run on the card's own engine.
    conditions: dict[ConditionName, Literal["pass", "fail"]] = Field(default_factory=dict)
    diagnosis: DiagnosisSpec | None = None
    accuracy: Literal["pass", "fail"] | None = None

    @model_validator(mode="after")
    def _fail_names_its_checks(self) -> Expectation:
        if self.verdict == "fail" and not self.caught_by:
            raise Problem(("caught_by",), "is required (the checks that must fail) with verdict fail")
        if both := sorted(set(self.caught_by) & set(self.passes)):
            raise Problem(("passes",), f"{both} cannot both fail (caught_by) and pass")
        return self


class FaultSpec(Section):
    """A known fault built into the target engine (engines.faults), for sensitivity
    cards: the final hidden states of the tokens on `path` scaled by 1 +- `scale`."""

    path: Literal["decode", "past_block", "batch"]
    scale: PositiveNumber
    # `batch`: steps holding at least this many sequences.
    min_batch: PositiveInt = 8
