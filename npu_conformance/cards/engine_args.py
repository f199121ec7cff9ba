"""Engine arguments, server flags and environment a card gives, checked before any
model is touched: names are vLLM's EngineArgs fields (read from its source), and
the suite's own flags and key are refused."""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, StrictStr

from npu_conformance.cards.errors import Problem

# Engine arguments and server flags the suite sets from the card's own fields or per
# boot, refused in every section a card gives engine arguments or server flags in:
# the server binds 127.0.0.1 with a key of the suite's, and only the card's
# top-level trust_remote_code may run a checkpoint's code.
SUITE_FLAGS = ("model", "host", "port", "dtype", "trust_remote_code", "load_format", "api_key")
# The server's key, which the suite sets per boot (serving.new_server).
SUITE_ENV = ("VLLM_API_KEY",)
# Argument names as EngineArgs spells them; serving writes them as --kebab-case.
ARG_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _env_strings(value: Any) -> Any:
    if isinstance(value, Mapping):
        bad = [k for k, v in value.items() if not isinstance(v, str)]
        if bad:
            raise Problem((str(bad[0]),), "environment values must be strings (quote them in YAML)")
    return value


def _no_suite_env(value: dict[str, str]) -> dict[str, str]:
    if owned := sorted(set(value) & set(SUITE_ENV)):
        raise Problem((owned[0],), "is set by the suite (the server's key, new per boot)")
    return value


def _suite_flag(key: str) -> Problem:
    return Problem((key,), f"is set by the suite ({', '.join(SUITE_FLAGS)} come from the card's own fields, "
                           "the stage and the boot)")


def _check_arg(key: str, value: Any) -> None:
    """What every engine argument and server flag must be: a snake_case name that is
    not the suite's, and no value that reads as a flag on a command line."""
    if not ARG_NAME.fullmatch(key):
        raise Problem((key,), "an argument name is snake_case (lower-case letters, digits and '_'; the server "
                              "gets it as --kebab-case)")
    if key in SUITE_FLAGS:
        raise _suite_flag(key)
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and item.startswith("-"):
            raise Problem((key,), f"a value starting with '-' reads as a flag on the server's command line, "
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
            raise Problem((key,), f"unknown vLLM engine argument ({hint})")
    return args


def _server_args(args: dict[str, Any]) -> dict[str, Any]:
    scalars = (str, int, float, bool)
    for key, value in args.items():
        _check_arg(key, value)
        if not (isinstance(value, (*scalars, Mapping))
                or (isinstance(value, list) and value and all(isinstance(v, scalars) for v in value))):
            raise Problem((key,), f"a server flag takes a scalar, a non-empty list of scalars or a mapping, "
                                  f"got {value!r}")
    return args


EngineOptions = Annotated[dict[StrictStr, Any], AfterValidator(_engine_args)]
ServerFlags = Annotated[dict[StrictStr, Any], AfterValidator(_server_args)]
EnvVars = Annotated[dict[StrictStr, StrictStr], BeforeValidator(_env_strings), AfterValidator(_no_suite_env)]
