"""The model card: every section validated together, with the cross-field rules,
and what the suite asks of a loaded card (its engine arguments, environment and
variants per platform and device part)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import AliasPath, Field, StrictBool, StrictStr, ValidationInfo, field_validator, model_validator

from npu_conformance import device_pool
from npu_conformance.cards.accuracy import AccuracySpec
from npu_conformance.cards.engine_args import EngineOptions
from npu_conformance.cards.errors import Problem, kind_of, unknown_field
from npu_conformance.cards.prompts import PromptList, prompt_set
from npu_conformance.cards.schema import PLATFORMS, WEIGHT_KINDS, Dtype, PlatformName, PositiveInt, Section
from npu_conformance.cards.sections import (VARIANT_MARK, ConditionName, ConditionSpec, Expectation, FaultSpec,
                                            PlatformSettings, WeightSource)
from npu_conformance.cards.serve import ServeSpec
from npu_conformance.cards.thresholds import Thresholds, ThresholdSpec
from npu_conformance.patches import ENV as DEQUANT_ENV


class Card(Section):
    name: StrictStr
    # Set by parse_card from the file it read, never by the YAML.
    file: str
    description: StrictStr = ""
    architecture: StrictStr
    weights: WeightSource
    trust_remote_code: StrictBool
    dtype: Dtype
    reference_dtype: Dtype = Field(validation_alias=AliasPath("reference", "dtype"))
    reference_weights: WeightSource | None = Field(None, validation_alias=AliasPath("reference", "weights"))
    engine: EngineOptions = Field(default_factory=dict)
    serve: ServeSpec
    accuracy: AccuracySpec
    # A prompt set's name (a file in npu_conformance/prompts/) or an inline list.
    prompts: PromptList
    max_tokens: PositiveInt
    # The length of a `length: fill` prompt where max_model_len allows it (_defaults.yaml says why).
    long_prompt_tokens: PositiveInt
    thresholds: Thresholds
    platforms: dict[PlatformName, PlatformSettings] = Field(default_factory=dict)
    conditions: dict[ConditionName, ConditionSpec] = Field(default_factory=dict)
    default: StrictBool
    patch: Literal["fp8_block", "gptq"] | None = None
    # With a patch: auto = the patch or vLLM's own quantized kernel may run; patch =
    # the load-time dequant patch must run; kernel = vLLM's own kernel must run.
    quant_path: Literal["auto", "patch", "kernel"] = "auto"
    # Opt-in to vLLM running the architecture through a non-native implementation
    # (e.g. its Transformers backend).
    allow_model_impl_fallback: StrictBool
    expect: Expectation = Expectation(verdict="pass")
    fault: FaultSpec | None = None

    # Set only on a variant (Card.variant): the condition whose engine arguments it adds.
    condition: ConditionName | None = None
    # Set only on a card deployed on a device part (Card.on_device): that part's name.
    part: str | None = None

    @classmethod
    def _yaml_keys(cls) -> frozenset[str]:
        return super()._yaml_keys() - {"file", "condition", "part"}

    @classmethod
    def _from_yaml(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        reference = data.get("reference", {})
        if not isinstance(reference, Mapping):
            raise Problem(("reference",), f"expected a mapping, got {kind_of(reference)}")
        unknown = sorted(str(k) for k in reference if k not in ("dtype", "weights"))
        if unknown:
            raise Problem(("reference", unknown[0]), "unknown field (known: dtype, weights)")
        if not info.context or "file" not in info.context:
            raise TypeError("cards are built by parse_card, which gives the card's file")
        return {**data, "reference": {k: v for k, v in reference.items() if v is not None},
                "file": str(info.context["file"])}

    @field_validator("weights", "reference_weights", mode="before")
    @classmethod
    def _weights_from_yaml(cls, value: Any) -> Any:
        """`{hf: org/name, revision: main}` -> WeightSource(kind="hf", ref="org/name", revision="main")."""
        if not isinstance(value, Mapping):
            return value
        known = (*WEIGHT_KINDS, "revision", "mutate", "quantize")
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise unknown_field(unknown[0], known)
        value = {k: v for k, v in value.items() if v is not None}
        kinds = [k for k in WEIGHT_KINDS if k in value]
        if len(kinds) != 1:
            raise Problem((), f"give exactly one of {', '.join(WEIGHT_KINDS)}, got {kinds or 'none'}")
        ref = value.pop(kinds[0])
        if not isinstance(ref, str):
            raise Problem((kinds[0],), f"expected str, got {kind_of(ref)}")
        return {"kind": kinds[0], "ref": ref, **value}

    @field_validator("prompts", mode="before")
    @classmethod
    def _named_prompt_set(cls, value: Any) -> Any:
        return prompt_set(value) if isinstance(value, str) else value

    @field_validator("thresholds", mode="before")
    @classmethod
    def _thresholds(cls, value: Any, info: ValidationInfo) -> Thresholds:
        spec = ThresholdSpec.model_validate(value)
        if "dtype" not in info.data:
            raise Problem((), "are resolved for the card's dtype, which is not valid")
        return spec.resolve(info.data["dtype"])

    @field_validator("reference_dtype")
    @classmethod
    def _golden_in_float32(cls, value: str) -> str:
        if value != "float32":
            raise Problem((), f"must be float32, got {value!r}: the golden reference runs in float32, and a "
                              "low-precision target is judged against the noise of its own dtype beside it "
                              "(the target's dtype is the card's `dtype`)")
        return value

    @field_validator("platforms", mode="before")
    @classmethod
    def _known_platforms(cls, value: Any) -> Any:
        for name in value if isinstance(value, Mapping) else ():
            if name not in PLATFORMS:
                raise Problem((str(name),), f"unknown platform (known: {', '.join(PLATFORMS)})")
        return value

    @model_validator(mode="after")
    def _quant_path_needs_patch(self) -> Card:
        if "quant_path" in self.model_fields_set and self.patch is None:
            raise Problem(("quant_path",), "only a card with a `patch` chooses a quantized path (auto, patch or "
                                           "kernel); this card sets no patch")
        return self

    @model_validator(mode="after")
    def _expectations_are_runnable(self) -> Card:
        if self.fault is not None and self.expect.verdict != "fail":
            raise Problem(("fault",), "only a known-buggy card (expect.verdict: fail) is built with a fault")
        # A real model's card that declares itself buggy would leave every gate (precision,
        # perf, serving) for the sensitivity tests, which the gate's runs do not select.
        if self.expect.verdict == "fail" and self.weights.kind != "synthetic":
            raise Problem(("expect", "verdict"), f"fail is for the suite's own buggy models (synthetic weights); "
                                                 f"this card's weights are {self.weights.kind}")
        prompt_ids = {p.id for p in self.prompts}
        if unknown := sorted(set(self.expect.reaches) - prompt_ids):
            raise Problem(("expect", "reaches"), f"prompts {unknown} are not in the card's prompts")
        for name in self.expect.conditions:
            spec = self.conditions.get(name)
            if spec is None or spec.engine:
                raise Problem(("expect", "conditions", name),
                              "only a condition without engine arguments (it runs on the card's own engine)")
        return self

    @model_validator(mode="after")
    def _device_counts_add_up(self) -> Card:
        """A declared device count is what the engine's parallel sizes use: the
        workflow routes by one, the engine boots by the other."""
        for platform, settings in self.platforms.items():
            deployments = [((platform, "devices"), settings.devices, {**self.engine, **settings.engine})]
            deployments += [((platform, "parts", name, "devices"), part.devices,
                             {**self.engine, **settings.engine, **part.engine}) for name, part in settings.parts.items()]
            for loc, declared, engine in deployments:
                if declared is not None and declared != (used := device_pool.needed(engine)):
                    raise Problem(("platforms", *loc), f"is {declared}, and the engine's parallel sizes use {used} "
                                                       f"({', '.join(device_pool.PARALLEL_ARGS)})")
        return self

    def platform(self, name: str) -> PlatformSettings:
        return self.platforms.get(name) or PlatformSettings()

    def on_device(self, platform: str, memory_gb: float | None) -> "Card":
        """The card as it deploys on `platform`'s devices of `memory_gb` each: the
        platform entry's part with the smallest `max_memory_gb` that holds them
        merged in (named in `part`), or the card itself when none does."""
        settings = self.platform(platform)
        fitting = sorted(((p.max_memory_gb, n) for n, p in settings.parts.items()
                          if memory_gb is not None and memory_gb <= p.max_memory_gb))
        if not fitting:
            return self
        name = fitting[0][1]
        part = settings.parts[name]
        merged = settings.model_copy(update={
            "runner": part.runner or settings.runner, "devices": part.devices or settings.devices,
            "engine": {**settings.engine, **part.engine}, "env": {**settings.env, **part.env}, "perf": part.perf,
            "parts": {}})
        return self.model_copy(update={"platforms": {**self.platforms, platform: merged}, "part": name})

    @property
    def gates_latency(self) -> bool:
        """Whether some platform measures this card's serving latency (its `latency.run`)."""
        return any(p.latency is not None and p.latency.run for p in self.platforms.values())

    @property
    def gates_accuracy(self) -> bool:
        """Whether the accuracy tests run this card: a passing card whose `accuracy.run`
        is on, or a known-buggy one that names the accuracy verdict it must give."""
        return self.accuracy.run and (self.expect.verdict == "pass" or self.expect.accuracy is not None)

    def engine_args(self, platform: str) -> dict[str, Any]:
        """vLLM engine arguments on `platform`: the common ones, then its overrides,
        then those of the variant's condition."""
        extra = self.conditions[self.condition].engine if self.condition else {}
        return {**self.engine, **self.platform(platform).engine, **extra}

    @property
    def base_name(self) -> str:
        return self.name.split(VARIANT_MARK)[0]

    def variant(self, condition: str) -> "Card":
        """The card with a condition's engine arguments: its own engine, named
        `<card>+<condition>`, booted after the card's own engine is freed (two
        in-process engines would share, and tear down, one distributed state)."""
        return self.model_copy(update={"name": f"{self.name}{VARIANT_MARK}{condition}", "condition": condition})

    def run_conditions(self) -> list[str]:
        """The conditions this card runs, in the catalog's order."""
        return [name for name, spec in self.conditions.items() if spec.run]

    @property
    def noise_dtype(self) -> str | None:
        """The noise-floor reference's dtype: the target's, where it runs below the golden's fp32."""
        return self.dtype if self.dtype != self.reference_dtype else None

    def fill_tokens(self, platform: str) -> int | None:
        """Prompt tokens a `length: fill` prompt gets on `platform`: long_prompt_tokens,
        or fewer where the context, minus the generated tokens and the one the
        teacher-forced pass asks for, leaves fewer."""
        max_model_len = self.engine_args(platform).get("max_model_len")
        return None if max_model_len is None else min(self.long_prompt_tokens, max_model_len - self.max_tokens - 1)

    def env(self, platform: str) -> dict[str, str]:
        """Environment of the card's engines and servers on `platform`. A card that
        tests the load-time patch (quant_path: patch) forces it on, whatever
        kernels vLLM has here."""
        env = dict(self.platform(platform).env)
        if self.patch and self.quant_path == "patch":
            env[DEQUANT_ENV] = "on"
        return env
