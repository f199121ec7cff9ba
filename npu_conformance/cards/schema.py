"""What every section of a card is built on: the base models (unknown keys are
typos, a loaded card is frozen), the strict scalar types and the names a card
may choose from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    AliasPath,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    model_validator,
)

from npu_conformance.cards.errors import Problem, unknown_field

Dtype = Literal["float32", "float16", "bfloat16"]
WeightKind = Literal["synthetic", "modelscope", "hf", "path"]
PlatformName = Literal["cpu", "cuda", "npu"]
WEIGHT_KINDS = get_args(WeightKind)
PLATFORMS = get_args(PlatformName)

# Strict types: YAML's `true` is not 1 and "10" is not 10; a float field takes an int.
PositiveInt = Annotated[StrictInt, Field(gt=0)]
PositiveNumber = Annotated[StrictFloat, Field(gt=0)]


class Section(BaseModel):
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
            raise unknown_field(unknown[0], known)
        # `key:` with no value reads as "not given" (a required field is then missing).
        return cls._from_yaml({k: v for k, v in data.items() if v is not None}, info)


class Positional(Section):
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
                raise Problem((i, str(bad[0])), "unknown field (field names are strings)")
    return items


def _unique_ids(items: Sequence[Any]) -> Sequence[Any]:
    """ids become test ids and report keys."""
    ids = [item.id for item in items]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise Problem((), f"duplicate ids {dup}")
    return items


def listed_by_id(kind: type[Positional]) -> Any:
    """A card's non-empty list of `kind` (prompts, bad requests), each with its own `id`."""
    return Annotated[tuple[kind, ...], BeforeValidator(_keyword_items), Field(min_length=1),
                     AfterValidator(_unique_ids)]
