"""Reading the suite's user-editable files (cards, prompt sets, checkpoint
configs, baselines): any that cannot be read, parsed or validated is a CardError
naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from npu_conformance.cards.errors import CardError, dotted, first_error


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
        loc, problem, _ = first_error(exc)
        raise CardError(file, dotted(loc), problem, what) from None
