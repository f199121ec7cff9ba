"""The report's pictures, drawn from the run's JSON figures with matplotlib (Agg:
no display on CI machines)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import yaml  # noqa: E402

from npu_conformance.compare.diagnosis import Diagnosis  # noqa: E402
from npu_conformance.report_schema import PerfCaseRecord, PromptRecord  # noqa: E402

LABELS_FILE = Path(__file__).parent / "figures.yaml"


@lru_cache(maxsize=1)
def labels() -> dict[str, Any]:
    return yaml.safe_load(LABELS_FILE.read_text(encoding="utf-8"))


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=labels()["dpi"])
    plt.close(fig)
    return path


def _figure() -> tuple[Any, Any]:
    return plt.subplots(figsize=labels()["size_in"])


def throughput(cases: list[PerfCaseRecord], directory: Path) -> Path:
    """Output tok/s per batch size and engine mode, with the recorded baseline and the roofline where the cases carry them."""
    lab = labels()["throughput"]
    fig, ax = _figure()
    batches = sorted({c.batch_size for c in cases})
    for mode in sorted({c.mode for c in cases}):
        mine = sorted((c for c in cases if c.mode == mode), key=lambda c: c.batch_size)
        ax.plot([c.batch_size for c in mine], [c.output_tok_s for c in mine], "o-",
                label=lab["measured"].format(mode=mode))
        base = [(c.batch_size, c.baseline["tok_s"]) for c in mine if c.baseline]
        if base:
            ax.plot(*zip(*base), "v--", label=lab["baseline"].format(mode=mode))
    roofs = sorted({(c.batch_size, c.roofline_tok_s) for c in cases if c.roofline_tok_s is not None})
    if roofs:
        ax.plot(*zip(*roofs), "^-.", color="tab:gray", label=lab["roofline"])
    # Measured figures and the roofline can differ by orders of magnitude on CPU.
    ax.set_yscale("log")
    ax.set_xticks(batches)
    ax.set(title=lab["title"], xlabel=lab["x"], ylabel=lab["y"])
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, directory / lab["file"])


def logprob_error(prompts: dict[str, PromptRecord], threshold: float, directory: Path) -> Path:
    """One line per prompt over the generated positions, and the card's threshold."""
    lab = labels()["logprob_error"]
    fig, ax = _figure()
    values = [v for p in prompts.values() for v in p.logprob_rel_err_per_position]
    # A log axis cannot show exact zeros (bit-identical positions): draw them at the smallest error seen.
    floor = min((v for v in values if v > 0), default=threshold) / 10
    for pid, p in prompts.items():
        series = p.logprob_rel_err_per_position
        ax.plot(range(len(series)), [max(v, floor) for v in series], ".-", label=pid, linewidth=1)
    ax.axhline(threshold, color="tab:red", linestyle="--", label=f"{lab['threshold']} {threshold:g}")
    ax.set_yscale("log")
    ax.set(title=lab["title"], xlabel=lab["x"], ylabel=lab["y"])
    ax.legend(fontsize="small", ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, directory / lab["file"])


def top1(prompts: dict[str, PromptRecord], directory: Path) -> Path:
    """Tie-aware and exact Top-1 rates side by side per prompt."""
    lab = labels()["top1"]
    ids = list(prompts)
    x = range(len(ids))
    width = 0.4
    fig, ax = _figure()
    ax.bar([i - width / 2 for i in x], [prompts[p].top1_rate for p in ids], width, label=lab["tie_aware"])
    ax.bar([i + width / 2 for i in x], [prompts[p].top1_exact_rate for p in ids], width, label=lab["exact"])
    ax.set_xticks(list(x), ids, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set(title=lab["title"], xlabel=lab["x"], ylabel=lab["y"])
    ax.legend(loc="lower right")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, directory / lab["file"])


def diagnosis(d: Diagnosis, directory: Path) -> Path:
    """Relative L2 error of each tapped hidden state in forward order, the limit,
    and the first divergent place marked."""
    lab = labels()["diagnosis"]
    fig, ax = _figure()
    rows = d.rows
    floor = min((r.rel_l2_max for r in rows if r.rel_l2_max > 0), default=d.rel_l2_limit) / 10
    ax.plot(range(len(rows)), [max(r.rel_l2_max, floor) for r in rows], "o-", label=lab["rel_l2"])
    ax.axhline(d.rel_l2_limit, color="tab:red", linestyle="--", label=f"{lab['limit']} {d.rel_l2_limit:g}")
    if d.first is not None:
        i = next(i for i, r in enumerate(rows) if r.place == d.first.place)
        ax.axvline(i, color="tab:orange", linestyle=":", label=f"{lab['first']}: {rows[i].place}")
    ax.set_xticks(range(len(rows)), [r.place.removeprefix("model.") for r in rows], rotation=60, ha="right",
                  fontsize="x-small")
    ax.set_yscale("log")
    ax.set(title=lab["title"].format(prompt=d.prompt), ylabel=lab["y"])
    ax.legend(fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, directory / lab["file"])
