"""Model cards: one YAML file per model in npu_conformance/catalog/, validated on load.

Every card is merged over the catalog's _defaults.yaml (nested mappings merge key
by key), then validated by the pydantic models below, which forbid unknown keys as
vLLM's own configs do. `engine:` is checked against vLLM's EngineArgs and `serve:`
is validated with the rest, so a bad card stops the run before any model is
touched. The error is a CardError naming the file and the dotted path of the
field, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    AliasPath,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from npu_conformance import devices
from npu_conformance.compare.metrics import Thresholds
from npu_conformance.merge import deep_merge
from npu_conformance.patches import ENV as DEQUANT_ENV

CATALOG_DIR = Path(__file__).parent / "catalog"
DEFAULTS_NAME = "_defaults.yaml"
PROMPTS_DIR = Path(__file__).parent / "prompts"

Dtype = Literal["float32", "float16", "bfloat16"]
WeightKind = Literal["synthetic", "modelscope", "hf", "path"]
PlatformName = Literal["cpu", "cuda", "npu"]
WEIGHT_KINDS = get_args(WeightKind)
PLATFORMS = get_args(PlatformName)
# Engine arguments and server flags the suite sets from the card's own fields or per
# boot, refused in every section a card gives engine arguments or server flags in:
# the server binds 127.0.0.1 with a key of the suite's, and only the card's
# top-level trust_remote_code may run a checkpoint's code.
SUITE_FLAGS = ("model", "host", "port", "dtype", "trust_remote_code", "load_format", "api_key")
# The server's key, which the suite sets per boot (serving.new_server).
SUITE_ENV = ("VLLM_API_KEY",)
# Argument names as EngineArgs spells them; serving writes them as --kebab-case.
ARG_NAME = re.compile(r"[a-z][a-z0-9_]*")
# What a bad request's `mentions` may refer to, filled in from the running server.
MENTION_FIELDS = {"model": "", "max_model_len": 0}

# Strict types: YAML's `true` is not 1 and "10" is not 10; a float field takes an int.
PositiveInt = Annotated[StrictInt, Field(gt=0)]
PositiveNumber = Annotated[StrictFloat, Field(gt=0)]


class CardError(ValueError):
    """A user-supplied file that cannot be used (a card, a prompt set, a prompt file,
    a checkpoint's config.json); the message names the file and the field."""

    def __init__(self, file: Path | str, field_path: str, problem: str, what: str = "model card") -> None:
        super().__init__(f"{what} {file}: field '{field_path}': {problem}")
        self.file = str(file)
        self.field = field_path
        self.problem = problem


def read_text(file: Path, what: str = "model card") -> str:
    """A user-supplied file's text; one that cannot be read or decoded is a CardError."""
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise CardError(file, "<file>", f"cannot be read: {exc.strerror or exc}", what) from None
    except UnicodeDecodeError as exc:
        raise CardError(file, "<file>", f"not UTF-8 text: {exc}", what) from None


def read_yaml(file: Path, what: str = "model card") -> Any:
    try:
        return yaml.safe_load(read_text(file, what))
    except yaml.YAMLError as exc:
        raise CardError(file, "<yaml>", f"not valid YAML: {exc}", what) from None


def read_json(file: Path, what: str) -> Any:
    try:
        return json.loads(read_text(file, what))
    except json.JSONDecodeError as exc:
        raise CardError(file, "<json>", f"not valid JSON: {exc}", what) from None


def validated(model: type[BaseModel], data: Any, file: Path, what: str) -> Any:
    """`data`, read from `file`, validated as `model`; a CardError naming the file
    and the dotted field otherwise (for the suite's other user-editable files)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        loc, problem, _ = _first_error(exc)
        raise CardError(file, _dotted(loc), problem, what) from None


class _Problem(ValueError):
    """Raised by the validators below. `path` continues the location pydantic
    reports (a key of a mapping, the field a cross-field rule is about); with
    `file`, the problem is in that file (a prompt set) at `path` from its top."""

    def __init__(self, path: tuple[str | int, ...], problem: str, file: Path | None = None) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem
        self.file = file

    @classmethod
    def of(cls, exc: CardError) -> _Problem:
        """A CardError about a prompt set, raised on inside the card's validation."""
        return cls((exc.field,), exc.problem, Path(exc.file))


# ---- turning pydantic's errors into today's messages ----

_EXPECTED = {
    "int_type": "int", "string_type": "str", "bool_type": "bool", "float_type": "a number",
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "dataclass_type": "a mapping", "tuple_type": "a list", "list_type": "a list",
}
_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
           "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}


def _kind_of(value: Any) -> str:
    """`bool`, `list`, or `str ('ten')`: the value itself where it is short and telling."""
    name = type(value).__name__
    return name if isinstance(value, (bool, Mapping, list, type(None))) else f"{name} ({value!r})"


def _describe(err: ErrorDetails) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx", {})
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_kind_of(value)}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {value!r}"
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return f"must be {op} {ctx[key]}, got {value!r}"
    if kind == "too_short":  # min_length=1 is the only length rule on lists
        return "expected a non-empty list"
    if kind == "string_too_short":
        return "must not be empty"
    return err["msg"]


def _first_error(exc: ValidationError) -> tuple[tuple[str | int, ...], str, Path | None]:
    """The first error as (location, problem, file it lies in when not the card)."""
    err = exc.errors(include_url=False)[0]
    # '[key]' marks a bad mapping key; the key itself is already in the location.
    loc = tuple(part for part in err["loc"] if part != "[key]")
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, _Problem):
        return (cause.path if cause.file else loc + cause.path), cause.problem, cause.file
    return loc, _describe(err), None


def _dotted(loc: Sequence[str | int]) -> str:
    """('prompts', 1, 'id') -> 'prompts[1].id'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top>"


def _unknown(key: Any, known: Iterable[str]) -> _Problem:
    return _Problem((str(key),), f"unknown field (known: {', '.join(sorted(known))})")


# ---- the models ----


class _Section(BaseModel):
    """One mapping of a card: unknown keys are typos, and it is frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def _yaml_keys(cls) -> frozenset[str]:
        """The keys a card may give: a field's name, or the first step of its alias path."""
        return frozenset(f.validation_alias.path[0] if isinstance(f.validation_alias, AliasPath) else name
                         for name, f in cls.model_fields.items())

    @classmethod
    def _from_yaml(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """What a section does to its checked mapping before its fields are validated."""
        return data

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping):
            return data  # pydantic reports the type
        known = cls._yaml_keys()
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise _unknown(unknown[0], known)
        # `key:` with no value reads as "not given" (a required field is then missing).
        return cls._from_yaml({k: v for k, v in data.items() if v is not None}, info)


class _Positional(_Section):
    """Also built positionally in code, in field order (`Prompt("cli", text)`), as
    the dataclasses these models replaced were."""

    def __init__(self, /, *args: Any, **data: Any) -> None:
        names = list(type(self).model_fields)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional arguments")
        super().__init__(**dict(zip(names, args)), **data)


def _keyword_items(items: Any) -> Any:
    """A custom __init__ makes pydantic build each list item by calling it with the
    item's mapping as keywords, which Python refuses for a non-string key (YAML's
    `1: x`): such a key is reported here instead of as a TypeError."""
    if isinstance(items, list):
        for i, item in enumerate(items):
            bad = [k for k in item if not isinstance(k, str)] if isinstance(item, Mapping) else []
            if bad:
                raise _Problem((i, str(bad[0])), "unknown field (field names are strings)")
    return items


def _unique_ids(items: Sequence[Prompt | BadRequest]) -> Sequence[Prompt | BadRequest]:
    """ids become test ids and report keys."""
    ids = [item.id for item in items]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise _Problem((), f"duplicate ids {dup}")
    return items


def _env_strings(value: Any) -> Any:
    if isinstance(value, Mapping):
        bad = [k for k, v in value.items() if not isinstance(v, str)]
        if bad:
            raise _Problem((str(bad[0]),), "environment values must be strings (quote them in YAML)")
    return value


def _no_suite_env(value: dict[str, str]) -> dict[str, str]:
    if owned := sorted(set(value) & set(SUITE_ENV)):
        raise _Problem((owned[0],), "is set by the suite (the server's key, new per boot)")
    return value


def _suite_flag(key: str) -> _Problem:
    return _Problem((key,), f"is set by the suite ({', '.join(SUITE_FLAGS)} come from the card's own fields, "
                            "the stage and the boot)")


def _check_arg(key: str, value: Any) -> None:
    """What every engine argument and server flag must be: a snake_case name that is
    not the suite's, and no value that reads as a flag on a command line."""
    if not ARG_NAME.fullmatch(key):
        raise _Problem((key,), "an argument name is snake_case (lower-case letters, digits and '_'; the server "
                               "gets it as --kebab-case)")
    if key in SUITE_FLAGS:
        raise _suite_flag(key)
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and item.startswith("-"):
            raise _Problem((key,), f"a value starting with '-' reads as a flag on the server's command line, "
                                   f"got {item!r}")


@functools.lru_cache(maxsize=1)
def engine_arg_names() -> frozenset[str] | None:
    """The fields of vLLM's EngineArgs, read from its source without importing vllm
    (that takes ~9 s, and a bad card must fail in a moment). None where vllm is not
    installed or EngineArgs is not found: the engine-argument check is then skipped."""
    spec = importlib.util.find_spec("vllm")
    for root in (spec.submodule_search_locations or []) if spec else []:
        source = Path(root) / "engine" / "arg_utils.py"
        if not source.is_file():
            continue
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
                names = frozenset(
                    s.target.id for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and not s.target.id.startswith("_") and "ClassVar" not in ast.unparse(s.annotation)
                )
                return names or None
    return None


def _engine_args(args: dict[str, Any]) -> dict[str, Any]:
    known = engine_arg_names()
    for key, value in args.items():
        _check_arg(key, value)
        if known is not None and key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "see EngineArgs in vllm/engine/arg_utils.py"
            raise _Problem((key,), f"unknown vLLM engine argument ({hint})")
    return args


def _server_args(args: dict[str, Any]) -> dict[str, Any]:
    scalars = (str, int, float, bool)
    for key, value in args.items():
        _check_arg(key, value)
        if not (isinstance(value, (*scalars, Mapping))
                or (isinstance(value, list) and value and all(isinstance(v, scalars) for v in value))):
            raise _Problem((key,), f"a server flag takes a scalar, a non-empty list of scalars or a mapping, "
                                   f"got {value!r}")
    return args


EngineOptions = Annotated[dict[StrictStr, Any], AfterValidator(_engine_args)]
EnvVars = Annotated[dict[StrictStr, StrictStr], BeforeValidator(_env_strings), AfterValidator(_no_suite_env)]


class Prompt(_Positional):
    id: StrictStr
    text: StrictStr
    # Long-context prompts: the text repeated and cut to this many tokens, or
    # `fill`: the card's long_prompt_tokens, or fewer where its max_model_len
    # leaves fewer beside the generated tokens.
    length: PositiveInt | Literal["fill"] | None = None


PromptList = Annotated[tuple[Prompt, ...], BeforeValidator(_keyword_items), Field(min_length=1),
                       AfterValidator(_unique_ids)]


class BadRequest(_Positional):
    id: StrictStr
    body: dict[StrictStr, Any] = Field(default_factory=dict)  # merged over a valid completion request
    raw: StrictStr | None = None  # sent as the request body verbatim instead (malformed JSON)
    overlong_prompt: StrictStr | None = None  # prompt = this text repeated max_model_len + 1 times
    # The error message must contain one (case-insensitive).
    mentions: Annotated[tuple[Annotated[StrictStr, Field(min_length=1)], ...], Field(min_length=1)]

    @model_validator(mode="after")
    def _consistent(self) -> BadRequest:
        try:
            for m in self.mentions:
                m.format_map(MENTION_FIELDS)
        except (KeyError, ValueError, IndexError) as exc:
            allowed = ", ".join("{" + k + "}" for k in MENTION_FIELDS)
            raise _Problem(("mentions",), f"only {allowed} can be filled in, got {exc!r}") from None
        if self.raw is not None and (self.body or self.overlong_prompt):
            raise _Problem(("raw",), "a raw body is sent as is: it excludes body and overlong_prompt")
        return self


class ServeSpec(_Section):
    """A card's `serve:` section:

    - args: server flags on top of the card's engine args (`key_name: value` becomes
      `--key-name value`; true/false become `--key-name` / `--no-key-name`).
    - env: environment for the server, under the card's env for the platform.
    - max_tokens, concurrency: size of the text and concurrency checks.
    - system_prompt, chat: the chat-completion check's messages.
    - bad_requests: requests that must get a 4xx whose message mentions the problem.
    - engine_log: name -> regex whose first group is a figure the engine logs at boot.
    """

    run: StrictBool  # whether the serving tests boot this card's server when it is selected
    args: Annotated[dict[StrictStr, Any], AfterValidator(_server_args)] = Field(default_factory=dict)
    env: EnvVars = Field(default_factory=dict)
    max_tokens: PositiveInt
    concurrency: PositiveInt
    system_prompt: StrictStr
    chat: PromptList
    bad_requests: Annotated[tuple[BadRequest, ...], BeforeValidator(_keyword_items), Field(min_length=1),
                            AfterValidator(_unique_ids)]
    engine_log: dict[StrictStr, re.Pattern[str]]

    @field_validator("engine_log", mode="before")
    @classmethod
    def _compile(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        patterns = {}
        for name, text in value.items():
            try:
                patterns[name] = re.compile(text)
            except (re.error, TypeError) as exc:
                raise _Problem((str(name),), f"not a regular expression: {exc}") from None
            if patterns[name].groups < 1:
                raise _Problem((str(name),), "needs a capturing group around the figure")
        return patterns


class WeightSource(_Positional):
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
            raise _Problem(("mutate" if self.mutate else "quantize",),
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


class PerfSpec(_Section):
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


# Joins a card's name and a condition's in a variant's name.
VARIANT_MARK = "+"
ConditionName = Literal["single", "batch", "prefix_cache", "chunked_prefill", "graph"]


class ConditionSpec(_Section):
    """One serving condition the card's prompts run under again, compared with
    the same reference and checks (npu_conformance/conditions.py says how each runs)."""

    run: StrictBool
    # Engine arguments over the card's: a condition with any gets an engine of its own.
    engine: EngineOptions = Field(default_factory=dict)
    # `batch`: how many requests go in one call (the prompts cycled, mixed lengths).
    batch_size: PositiveInt | None = None


class DevicePart(_Section):
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


class PlatformSettings(_Section):
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
    # The attention backends an engine may run on this platform (their get_name()):
    # evidence of another one fails the card.
    attention_backends: tuple[StrictStr, ...] = ()
    parts: dict[StrictStr, DevicePart] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _exempt_without_perf(self) -> "PlatformSettings":
        if self.perf_exempt is not None and self.perf is not None:
            raise ValueError("perf_exempt gives why the card has no perf gate: set perf: null with it")
        return self


class DiagnosisSpec(_Section):
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
            raise _Problem(("layer",), f"is required for sublayer {self.sublayer!r}, and only for a layer's sublayers")
        return self


class Expectation(_Section):
    """`fail` marks a known-buggy card: the sensitivity tests require the checks
    in `caught_by` to fail on every prompt its fault reaches (`reaches`, default
    all), every check to pass on the prompts it does not reach, the checks in
    `passes` to pass on every prompt (they do not reach the faulty path), and each
    condition in `conditions` to give its verdict."""

    verdict: Literal["pass", "fail"]
    caught_by: tuple[StrictStr, ...] = ()
    reaches: tuple[StrictStr, ...] = ()
    passes: tuple[StrictStr, ...] = ()
    # Conditions without engine arguments only: they run on the card's own engine.
    conditions: dict[ConditionName, Literal["pass", "fail"]] = Field(default_factory=dict)
    diagnosis: DiagnosisSpec | None = None

    @model_validator(mode="after")
    def _fail_names_its_checks(self) -> Expectation:
        if self.verdict == "fail" and not self.caught_by:
            raise _Problem(("caught_by",), "is required (the checks that must fail) with verdict fail")
        if both := sorted(set(self.caught_by) & set(self.passes)):
            raise _Problem(("passes",), f"{both} cannot both fail (caught_by) and pass")
        return self


class FaultSpec(_Section):
    """A known fault built into the target engine (engines.faults), for sensitivity
    cards: the final hidden states of the tokens on `path` scaled by 1 +- `scale`."""

    path: Literal["decode", "past_block", "batch"]
    scale: PositiveNumber
    # `batch`: steps holding at least this many sequences.
    min_batch: PositiveInt = 8


def _every_dtype(value: Any) -> Any:
    """A per-dtype table names each dtype a card may run in: a card's dtype must never fall through."""
    if isinstance(value, Mapping) and (missing := [d for d in get_args(Dtype) if d not in value]):
        raise _Problem((), f"needs an entry for every dtype ({', '.join(get_args(Dtype))}); missing {missing}")
    return value


def _per_dtype(kind: Any) -> Any:
    return Annotated[dict[Dtype, kind], AfterValidator(_every_dtype)]


class NoiseSpec(_Section):
    """The noise-floor rule (compare.metrics.Thresholds): a figure passes at most
    `k` (mean-type) or `k_max` (worst position) times the noise-floor reference's,
    and never has to beat the target dtype's `floor`."""

    k: PositiveNumber
    k_max: PositiveNumber
    floor: _per_dtype(PositiveNumber)
    # How the mean cosine of raw logits is judged in each target dtype.
    cosine: _per_dtype(Literal["absolute", "noise"])


class ThresholdSpec(_Section):
    """A card's `thresholds:`, checked here; the comparison gets them, resolved for
    the card's dtype, as compare.metrics.Thresholds."""

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
            raise _Problem(("cosine",), f"must be in [-1, 1], got {self.cosine}")
        return self

    def resolve(self, dtype: str) -> Thresholds:
        """The rules for a target running in `dtype`."""
        return Thresholds(
            mission_rel_err=self.mission_rel_err, cosine=self.cosine, cosine_rule=self.noise.cosine[dtype],
            tie_margin=self.tie_margin, logprob_top_k=self.logprob_top_k, logprob_floor=self.logprob_floor,
            noise_k=self.noise.k, noise_k_max=self.noise.k_max, dtype_floor=self.noise.floor[dtype],
            diagnosis_rel_l2=self.diagnosis_rel_l2[dtype])


# A prompt set's name is a file name in PROMPTS_DIR, never a path: nothing outside that folder is read.
PROMPT_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def _prompt_set(name: str) -> tuple[Prompt, ...]:
    """The prompts of npu_conformance/prompts/<name>.yaml; a problem there names that file."""
    if not PROMPT_SET_NAME.fullmatch(name):
        raise _Problem((), f"no prompt set {name!r}: a prompt set is named by its file in {PROMPTS_DIR} "
                           "(letters, digits, '_' and '-'; no path)")
    source = PROMPTS_DIR / f"{name}.yaml"
    if not source.is_file():
        known = sorted(p.stem for p in PROMPTS_DIR.glob("*.yaml"))
        raise _Problem((), f"no prompt set {name!r} (known: {', '.join(known)})")
    try:
        data = read_yaml(source, "prompt set")
    except CardError as exc:
        raise _Problem.of(exc) from None
    if not isinstance(data, Mapping) or "prompts" not in data:
        raise _Problem(("<top>",), f"a prompt set is a mapping with a 'prompts' list, got {_kind_of(data)}", source)
    extra = sorted(str(k) for k in data if k != "prompts")
    if extra:
        raise _Problem((extra[0],), "unknown field (known: prompts)", source)
    try:
        return _PROMPT_SET.validate_python(data["prompts"])
    except ValidationError as exc:
        loc, problem, _ = _first_error(exc)
        raise _Problem(("prompts", *loc), problem, source) from None


_PROMPT_SET = TypeAdapter(PromptList)


class Card(_Section):
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
            raise _Problem(("reference",), f"expected a mapping, got {_kind_of(reference)}")
        unknown = sorted(str(k) for k in reference if k not in ("dtype", "weights"))
        if unknown:
            raise _Problem(("reference", unknown[0]), "unknown field (known: dtype, weights)")
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
            raise _unknown(unknown[0], known)
        value = {k: v for k, v in value.items() if v is not None}
        kinds = [k for k in WEIGHT_KINDS if k in value]
        if len(kinds) != 1:
            raise _Problem((), f"give exactly one of {', '.join(WEIGHT_KINDS)}, got {kinds or 'none'}")
        ref = value.pop(kinds[0])
        if not isinstance(ref, str):
            raise _Problem((kinds[0],), f"expected str, got {_kind_of(ref)}")
        return {"kind": kinds[0], "ref": ref, **value}

    @field_validator("prompts", mode="before")
    @classmethod
    def _named_prompt_set(cls, value: Any) -> Any:
        return _prompt_set(value) if isinstance(value, str) else value

    @field_validator("thresholds", mode="before")
    @classmethod
    def _thresholds(cls, value: Any, info: ValidationInfo) -> Thresholds:
        spec = ThresholdSpec.model_validate(value)
        if "dtype" not in info.data:
            raise _Problem((), "are resolved for the card's dtype, which is not valid")
        return spec.resolve(info.data["dtype"])

    @field_validator("reference_dtype")
    @classmethod
    def _golden_in_float32(cls, value: str) -> str:
        if value != "float32":
            raise _Problem((), f"must be float32, got {value!r}: the golden reference runs in float32, and a "
                               "low-precision target is judged against the noise of its own dtype beside it "
                               "(the target's dtype is the card's `dtype`)")
        return value

    @field_validator("platforms", mode="before")
    @classmethod
    def _known_platforms(cls, value: Any) -> Any:
        for name in value if isinstance(value, Mapping) else ():
            if name not in PLATFORMS:
                raise _Problem((str(name),), f"unknown platform (known: {', '.join(PLATFORMS)})")
        return value

    @model_validator(mode="after")
    def _quant_path_needs_patch(self) -> Card:
        if "quant_path" in self.model_fields_set and self.patch is None:
            raise _Problem(("quant_path",), "only a card with a `patch` chooses a quantized path (auto, patch or "
                                            "kernel); this card sets no patch")
        return self

    @model_validator(mode="after")
    def _expectations_are_runnable(self) -> Card:
        if self.fault is not None and self.expect.verdict != "fail":
            raise _Problem(("fault",), "only a known-buggy card (expect.verdict: fail) is built with a fault")
        # A real model's card that declares itself buggy would leave every gate (precision,
        # perf, serving) for the sensitivity tests, which the gate's runs do not select.
        if self.expect.verdict == "fail" and self.weights.kind != "synthetic":
            raise _Problem(("expect", "verdict"), f"fail is for the suite's own buggy models (synthetic weights); "
                                                  f"this card's weights are {self.weights.kind}")
        prompt_ids = {p.id for p in self.prompts}
        if unknown := sorted(set(self.expect.reaches) - prompt_ids):
            raise _Problem(("expect", "reaches"), f"prompts {unknown} are not in the card's prompts")
        for name in self.expect.conditions:
            spec = self.conditions.get(name)
            if spec is None or spec.engine:
                raise _Problem(("expect", "conditions", name),
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
                if declared is not None and declared != (used := devices.needed(engine)):
                    raise _Problem(("platforms", *loc), f"is {declared}, and the engine's parallel sizes use {used} "
                                                        f"({', '.join(devices.PARALLEL_ARGS)})")
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


# ---- loading ----


def load_defaults(directory: Path = CATALOG_DIR) -> dict[str, Any]:
    """The catalog's _defaults.yaml, merged under each of its cards."""
    file = directory / DEFAULTS_NAME
    data = read_yaml(file)
    if not isinstance(data, dict):
        raise CardError(file, "<top>", f"the defaults are a YAML mapping, got {_kind_of(data)}")
    return data


def parse_card(data: Any, file: Path | str, defaults: Mapping[str, Any] | None = None) -> Card:
    """Validate one card's raw mapping (already read from `file`) into a Card,
    merged over `defaults` (the shipped catalog's when None)."""
    if not isinstance(data, Mapping):
        raise CardError(file, "<top>", "a card is a YAML mapping")
    merged = deep_merge(load_defaults() if defaults is None else defaults, data)
    try:
        return Card.model_validate(merged, context={"file": file})
    except ValidationError as exc:
        loc, problem, where = _first_error(exc)
        # A problem with a file of its own is in the card's prompt set.
        raise CardError(where or file, _dotted(loc), problem, "prompt set" if where else "model card") from None


def load_card(file: Path, defaults: Mapping[str, Any] | None = None) -> Card:
    card = parse_card(read_yaml(file), file, defaults)
    if card.name != file.stem:
        raise CardError(file, "name", f"must match the file name {file.stem!r}, got {card.name!r}")
    return card


def load_catalog(directory: Path = CATALOG_DIR) -> dict[str, Card]:
    """Every card in `directory`, over its _defaults.yaml (files starting with '_'
    are shared data, not cards)."""
    defaults = load_defaults(directory)
    cards = (load_card(p, defaults) for p in sorted(directory.glob("*.yaml")) if not p.name.startswith("_"))
    return {c.name: c for c in cards}


def adhoc_card(model_path: Path, reference_path: Path | None = None) -> Card:
    """A card for `--model-path`: default thresholds and prompts, architecture from config.json."""
    config_file = model_path / "config.json"
    if not config_file.is_file():
        raise CardError(model_path, "--model-path", "no config.json: not a Hugging Face checkpoint directory")
    config = read_json(config_file, "checkpoint config")
    if not isinstance(config, dict):
        raise CardError(config_file, "<top>", f"a config.json is a JSON object, got {_kind_of(config)}",
                        "checkpoint config")
    architectures = config.get("architectures") or ["unknown"]
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        raise CardError(config_file, "architectures", f"expected a list of str, got {architectures!r}",
                        "checkpoint config")
    data: dict[str, Any] = {
        "name": model_path.name,
        "description": f"ad-hoc checkpoint from --model-path {model_path}",
        "architecture": architectures[0],
        "weights": {"path": str(model_path)},
    }
    if reference_path is not None:
        data["reference"] = {"weights": {"path": str(reference_path)}}
    return parse_card(data, config_file)
