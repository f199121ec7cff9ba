"""Loading cards: the catalog's folder of cards, each merged over its
_defaults.yaml (nested mappings merge key by key), and the ad-hoc card of
`--model-path`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from npu_conformance.cards.card import Card
from npu_conformance.cards.errors import CardError, dotted, first_error, kind_of
from npu_conformance.cards.files import read_json, read_yaml
from npu_conformance.merge import deep_merge

# The package's data folder, beside this subpackage.
CATALOG_DIR = Path(__file__).parent.parent / "catalog"
DEFAULTS_NAME = "_defaults.yaml"


def load_defaults(directory: Path = CATALOG_DIR) -> dict[str, Any]:
    """The catalog's _defaults.yaml, merged under each of its cards."""
    file = directory / DEFAULTS_NAME
    data = read_yaml(file)
    if not isinstance(data, dict):
        raise CardError(file, "<top>", f"the defaults are a YAML mapping, got {kind_of(data)}")
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
        loc, problem, where = first_error(exc)
        # A problem with a file of its own is in the card's prompt set.
        raise CardError(where or file, dotted(loc), problem, "prompt set" if where else "model card") from None


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
        raise CardError(config_file, "<top>", f"a config.json is a JSON object, got {kind_of(config)}",
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
