"""Precision thresholds: a card's `thresholds:` as YAML gives them (ThresholdSpec,
per-dtype tables included), and the rules the comparison applies, resolved for
the card's dtype (Thresholds)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, StrictFloat, model_validator

from npu_conformance.cards.errors import Problem
from npu_conformance.cards.schema import Dtype, PositiveInt, PositiveNumber, Section

# The formats' machine epsilon (the spacing of their numbers at 1.0): facts of the dtypes, not card data.
DTYPE_EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}

# How the mean cosine of raw logits is judged: against the mission's absolute figure, or the noise floor.
CosineRule = Literal["absolute", "noise"]


@dataclass(frozen=True)
class Thresholds:
    """Pass/fail rules for compare.metrics.compare; the values live in YAML data, not here.

    The noise-floor rule (msprobe's dual benchmark): a figure of the target
    against the fp32 golden passes when it is at most ``noise_k`` (mean-type
    figures) or ``noise_k_max`` (the worst position) times the same figure of
    the noise-floor reference (transformers in the target's dtype, same
    weights, same positions), and never needs to beat ``dtype_floor``, the
    target dtype's own rounding. Without a noise-floor reference (the target
    runs in the golden's dtype) the floor alone rules.
    """

    # The mission's "< 1%", in the seeds' own formulations (full-vocabulary
    # log-probs, raw logits' mean and median relative difference).
    mission_rel_err: float
    # The mission's cosine of raw logits, absolute where `cosine_rule` is "absolute".
    cosine: float
    cosine_rule: CosineRule
    tie_margin: float
    logprob_top_k: int
    logprob_floor: float
    noise_k: float
    noise_k_max: float
    dtype_floor: float
    # The target dtype's machine epsilon: its logits lie on a grid of
    # dtype_eps x 2^floor(log2 |logit|) (0.25 for a bf16 logit of 32-64).
    dtype_eps: float
    # Not a precision check: where diagnosis (compare.diagnosis) says a hidden state diverges.
    diagnosis_rel_l2: float


def _every_dtype(value: Any) -> Any:
    """A per-dtype table names each dtype a card may run in: a card's dtype must never fall through."""
    if isinstance(value, Mapping) and (missing := [d for d in get_args(Dtype) if d not in value]):
        raise Problem((), f"needs an entry for every dtype ({', '.join(get_args(Dtype))}); missing {missing}")
    return value


def _per_dtype(kind: Any) -> Any:
    return Annotated[dict[Dtype, kind], AfterValidator(_every_dtype)]


class NoiseSpec(Section):
    """The noise-floor rule (Thresholds): a figure passes at most `k` (mean-type)
    or `k_max` (worst position) times the noise-floor reference's, and never has
    to beat the target dtype's `floor`."""

    k: PositiveNumber
    k_max: PositiveNumber
    floor: _per_dtype(PositiveNumber)
    # How the mean cosine of raw logits is judged in each target dtype.
    cosine: _per_dtype(CosineRule)


class ThresholdSpec(Section):
    """A card's `thresholds:`, checked here; the comparison gets them, resolved for
    the card's dtype, as Thresholds."""

    mission_rel_err: PositiveNumber
    cosine: StrictFloat
    tie_margin: Annotated[StrictFloat, Field(ge=0)]
    logprob_top_k: PositiveInt
    logprob_floor: PositiveNumber
    noise: NoiseSpec
    diagnosis_rel_l2: _per_dtype(PositiveNumber)

    @model_validator(mode="after")
    def _ranges(self) -> ThresholdSpec:
        if not -1 <= self.cosine <= 1:
            raise Problem(("cosine",), f"must be in [-1, 1], got {self.cosine}")
        return self

    def resolve(self, dtype: str) -> Thresholds:
        """The rules for a target running in `dtype`."""
        return Thresholds(
            mission_rel_err=self.mission_rel_err, cosine=self.cosine, cosine_rule=self.noise.cosine[dtype],
            tie_margin=self.tie_margin, logprob_top_k=self.logprob_top_k, logprob_floor=self.logprob_floor,
            noise_k=self.noise.k, noise_k_max=self.noise.k_max, dtype_floor=self.noise.floor[dtype],
            dtype_eps=DTYPE_EPS[dtype], diagnosis_rel_l2=self.diagnosis_rel_l2[dtype])
