"""A card's `accuracy:` section: the lm-evaluation-harness task its served model
is scored on, what the score is compared with, and the statistics of the gate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from npu_conformance.cards.errors import Problem
from npu_conformance.cards.schema import PlatformName, PositiveInt, Section

Probability = Annotated[StrictFloat, Field(gt=0, lt=1)]


class AccuracyBaseline(Section):
    """A score recorded on a platform's reference system, as vllm-ascend's
    tests/e2e/models/configs record theirs: the value, the items it was scored
    on, and where it comes from."""

    value: Annotated[StrictFloat, Field(ge=0, le=1)]
    n: PositiveInt
    source: Annotated[StrictStr, Field(min_length=1)]


class AccuracySpec(Section):
    """The task gate (npu_conformance.accuracy): the target's score on `task`
    against the reference's, by a one-sided test at `alpha` and `power`."""

    run: StrictBool
    # A task of npu_conformance/data/accuracy_tasks.yaml (built from the embedded
    # corpus, no hub) or of lm-eval's own registry (gsm8k, ceval-valid, mmlu).
    task: Annotated[StrictStr, Field(min_length=1)]
    # The score's names in lm-eval's results: `<metric>,<filter>`.
    metric: Annotated[StrictStr, Field(min_length=1)]
    filter: Annotated[StrictStr, Field(min_length=1)]
    # cpu: the same task through lm-eval's transformers model on CPU, from the card's
    # reference weights in its reference dtype; baseline: the platform's recorded score.
    reference: Literal["cpu", "baseline"]
    baselines: dict[PlatformName, AccuracyBaseline] = Field(default_factory=dict)
    # The chance of failing a faithful model, and of catching a drop of the size the report
    # states (TensorRT-LLM's accuracy tests: alpha 0.05, beta 0.2).
    alpha: Probability
    power: Probability
    # Requests the lm-eval client keeps in flight against the server.
    concurrency: PositiveInt
    # Few-shot examples per item (None: the task's own setting); vllm-ascend runs gsm8k 5-shot.
    num_fewshot: Annotated[StrictInt, Field(ge=0)] | None = None
    # The first `limit` items only, where a task is too long for the runner (None: all).
    limit: PositiveInt | None = None

    @model_validator(mode="after")
    def _power_above_chance(self) -> AccuracySpec:
        if self.power <= self.alpha:
            raise Problem(("power",), f"is {self.power:g}, at most alpha ({self.alpha:g}): the gate would catch a "
                                      "drop no more often than it fails a faithful model")
        return self
