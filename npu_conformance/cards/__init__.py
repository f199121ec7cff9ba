"""Model cards: one YAML file per model in npu_conformance/catalog/, validated on load.

Every card is merged over the catalog's _defaults.yaml (nested mappings merge key
by key), then validated by the pydantic models of this package, which forbid
unknown keys as vLLM's own configs do. `engine:` is checked against vLLM's
EngineArgs and `serve:` is validated with the rest, so a bad card stops the run
before any model is touched. The error is a CardError naming the file and the
dotted path of the field, so a typo never silently falls back to a default.

The modules, lowest first: errors (CardError, pydantic's errors as messages),
files (reading user files), schema (the base models and types), engine_args,
prompts, serve, accuracy, sections, thresholds (the YAML spec and the resolved rules),
card (Card) and catalog (loading). Importers use the names re-exported here.
"""

from npu_conformance.cards.accuracy import AccuracyBaseline, AccuracySpec
from npu_conformance.cards.card import Card
from npu_conformance.cards.catalog import (CATALOG_DIR, DEFAULTS_NAME, adhoc_card, load_card, load_catalog,
                                           load_defaults, parse_card)
from npu_conformance.cards.engine_args import (ARG_NAME, SUITE_ENV, SUITE_FLAGS, EngineOptions, EnvVars, ServerFlags,
                                               engine_arg_names)
from npu_conformance.cards.errors import CardError
from npu_conformance.cards.files import read_json, read_text, read_yaml, validated
from npu_conformance.cards.prompts import PROMPT_SET_NAME, PROMPTS_DIR, Prompt, PromptList
from npu_conformance.cards.schema import (PLATFORMS, WEIGHT_KINDS, Dtype, PlatformName, PositiveInt, PositiveNumber,
                                          WeightKind)
from npu_conformance.cards.sections import (VARIANT_MARK, ConditionName, ConditionSpec, DevicePart, DiagnosisSpec,
                                            Expectation, FaultSpec, LatencySpec, PerfSpec, PlatformSettings,
                                            WeightSource)
from npu_conformance.cards.serve import MENTION_FIELDS, BadRequest, ServeSpec
from npu_conformance.cards.thresholds import NoiseSpec, Thresholds, ThresholdSpec

__all__ = [
    "ARG_NAME", "CATALOG_DIR", "DEFAULTS_NAME", "MENTION_FIELDS", "PLATFORMS", "PROMPTS_DIR", "PROMPT_SET_NAME",
    "SUITE_ENV", "SUITE_FLAGS", "VARIANT_MARK", "WEIGHT_KINDS",
    "AccuracyBaseline", "AccuracySpec", "BadRequest", "Card", "CardError", "ConditionName", "ConditionSpec", "DevicePart", "DiagnosisSpec", "Dtype",
    "EngineOptions", "EnvVars", "Expectation", "FaultSpec", "LatencySpec", "NoiseSpec", "PerfSpec", "PlatformName",
    "PlatformSettings", "PositiveInt", "PositiveNumber", "Prompt", "PromptList", "ServeSpec", "ServerFlags",
    "ThresholdSpec", "Thresholds", "WeightKind", "WeightSource",
    "adhoc_card", "engine_arg_names", "load_card", "load_catalog", "load_defaults", "parse_card", "read_json",
    "read_text", "read_yaml", "validated",
]
