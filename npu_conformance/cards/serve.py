"""A card's `serve:` section: how its OpenAI-compatible server is booted and
checked, and the bad requests it must refuse."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictStr, field_validator, model_validator

from npu_conformance.cards.engine_args import EnvVars, ServerFlags
from npu_conformance.cards.errors import Problem
from npu_conformance.cards.prompts import PromptList
from npu_conformance.cards.schema import Positional, PositiveInt, Section, listed_by_id

# What a bad request's `mentions` may refer to, filled in from the running server.
MENTION_FIELDS = {"model": "", "max_model_len": 0}


class BadRequest(Positional):
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
            raise Problem(("mentions",), f"only {allowed} can be filled in, got {exc!r}") from None
        if self.raw is not None and (self.body or self.overlong_prompt):
            raise Problem(("raw",), "a raw body is sent as is: it excludes body and overlong_prompt")
        return self


class ServeSpec(Section):
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
    args: ServerFlags = Field(default_factory=dict)
    env: EnvVars = Field(default_factory=dict)
    max_tokens: PositiveInt
    concurrency: PositiveInt
    system_prompt: StrictStr
    chat: PromptList
    bad_requests: listed_by_id(BadRequest)
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
                raise Problem((str(name),), f"not a regular expression: {exc}") from None
            if patterns[name].groups < 1:
                raise Problem((str(name),), "needs a capturing group around the figure")
        return patterns
