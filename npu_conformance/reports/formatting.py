"""How the report prints numbers and commands: a missing figure is a dash, and
each kind of figure has its own precision."""

from __future__ import annotations

import shlex
from typing import Any


def num(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def pct(value: float | None) -> str:
    """Three significant digits: relative errors span 1e-8 .. 1e+0."""
    return "—" if value is None else f"{value * 100:.3g}%"


def figure_value(name: str, value: Any) -> str:
    if value is None:
        return "—"
    # The decode path's checks are the teacher-forced ones, on other logits.
    name = name.removeprefix("decode_")
    if name == "cosine":
        return f"{value:.7f}"
    if name in ("logprob_rel_err", "logprob_rel_err_position", "logprob_rel_err_full", "logit_rel_diff_mean",
                "logit_rel_diff_median"):
        return pct(value)
    return f"{value:.1%}"


def plain(value: float) -> str:
    """Engine-reported figures: integers with separators, others as they are."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def shell(command: str | list[str]) -> str:
    """An argv list goes one `--flag value` per line, as the seeds print them."""
    if isinstance(command, str):
        return command
    lines: list[list[str]] = [[]]
    for arg in command:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(arg)
    return " \\\n  ".join(shlex.join(line) for line in lines)
