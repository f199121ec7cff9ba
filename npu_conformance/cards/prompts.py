"""A card's prompts: given inline or named as a prompt set, a file of
npu_conformance/prompts/ (a problem there names that file)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import StrictStr, TypeAdapter, ValidationError

from npu_conformance.cards.errors import CardError, Problem, first_error, kind_of
from npu_conformance.cards.files import read_yaml
from npu_conformance.cards.schema import Positional, PositiveInt, listed_by_id

# The package's data folder, beside this subpackage.
PROMPTS_DIR = Path(__file__).parent.parent / "prompts"
# A prompt set's name is a file name in PROMPTS_DIR, never a path: nothing outside that folder is read.
PROMPT_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class Prompt(Positional):
    id: StrictStr
    text: StrictStr
    # Long-context prompts: the text repeated and cut to this many tokens, or
    # `fill`: the card's long_prompt_tokens, or fewer where its max_model_len
    # leaves fewer beside the generated tokens.
    length: PositiveInt | Literal["fill"] | None = None


PromptList = listed_by_id(Prompt)
_PROMPT_SET = TypeAdapter(PromptList)


def prompt_set(name: str) -> tuple[Prompt, ...]:
    """The prompts of npu_conformance/prompts/<name>.yaml; a problem there names that file."""
    if not PROMPT_SET_NAME.fullmatch(name):
        raise Problem((), f"no prompt set {name!r}: a prompt set is named by its file in {PROMPTS_DIR} "
                          "(letters, digits, '_' and '-'; no path)")
    source = PROMPTS_DIR / f"{name}.yaml"
    if not source.is_file():
        known = sorted(p.stem for p in PROMPTS_DIR.glob("*.yaml"))
        raise Problem((), f"no prompt set {name!r} (known: {', '.join(known)})")
    try:
        data = read_yaml(source, "prompt set")
    except CardError as exc:
        raise Problem.of(exc) from None
    if not isinstance(data, Mapping) or "prompts" not in data:
        raise Problem(("<top>",), f"a prompt set is a mapping with a 'prompts' list, got {kind_of(data)}", source)
    extra = sorted(str(k) for k in data if k != "prompts")
    if extra:
        raise Problem((extra[0],), "unknown field (known: prompts)", source)
    try:
        return _PROMPT_SET.validate_python(data["prompts"])
    except ValidationError as exc:
        loc, problem, _ = first_error(exc)
        raise Problem(("prompts", *loc), problem, source) from None
