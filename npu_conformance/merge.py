"""Key-by-key merge of nested YAML mappings (cards over their defaults, recipes
over their base)."""

from __future__ import annotations

import copy
from typing import Any, Mapping


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` wins; nested mappings merge key by key (so {"rope_parameters":
    {"rope_theta": ...}} keeps rope_type). Neither input is modified."""
    merged = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
