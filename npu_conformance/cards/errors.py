"""What a bad user file is reported as: CardError, naming the file and the dotted
field, and the translation of pydantic's errors into the suite's own messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails


class CardError(ValueError):
    """A user-supplied file that cannot be used (a card, a prompt set, a prompt file,
    a checkpoint's config.json); the message names the file and the field."""

    def __init__(self, file: Path | str, field_path: str, problem: str, what: str = "model card") -> None:
        super().__init__(f"{what} {file}: field '{field_path}': {problem}")
        self.file = str(file)
        self.field = field_path
        self.problem = problem


class Problem(ValueError):
    """Raised by the models' validators. `path` continues the location pydantic
    reports (a key of a mapping, the field a cross-field rule is about); with
    `file`, the problem is in that file (a prompt set) at `path` from its top."""

    def __init__(self, path: tuple[str | int, ...], problem: str, file: Path | None = None) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem
        self.file = file

    @classmethod
    def of(cls, exc: CardError) -> Problem:
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


def kind_of(value: Any) -> str:
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
        return f"expected {_EXPECTED[kind]}, got {kind_of(value)}"
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


def first_error(exc: ValidationError) -> tuple[tuple[str | int, ...], str, Path | None]:
    """The first error as (location, problem, file it lies in when not the card)."""
    err = exc.errors(include_url=False)[0]
    # '[key]' marks a bad mapping key; the key itself is already in the location.
    loc = tuple(part for part in err["loc"] if part != "[key]")
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, Problem):
        return (cause.path if cause.file else loc + cause.path), cause.problem, cause.file
    return loc, _describe(err), None


def dotted(loc: Sequence[str | int]) -> str:
    """('prompts', 1, 'id') -> 'prompts[1].id'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top>"


def unknown_field(key: Any, known: Iterable[str]) -> Problem:
    """An unknown key of a mapping, with the keys it may have."""
    return Problem((str(key),), f"unknown field (known: {', '.join(sorted(known))})")
