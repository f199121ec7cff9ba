"""One run's report directory -> per model `<dir>/<model>/report.md`, its pictures
and `results/*.json`. Every figure comes from the run's JSON (reports/view.py makes
the view model of it); templates/report.md.j2 lays it out in either language, and a
section whose data the run did not produce says so."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from npu_conformance.report import write_json
from npu_conformance.report_schema import dump
from npu_conformance.reports import figures, view
from npu_conformance.reports.view import Decoder, Model, Run

HERE = Path(__file__).parent
LANGS = ("en", "zh")


@lru_cache(maxsize=None)
def texts(lang: str) -> dict[str, Any]:
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r} (known: {', '.join(LANGS)})")
    return yaml.safe_load((HERE / "i18n" / f"{lang}.yaml").read_text(encoding="utf-8"))


def cell(value: Any) -> str:
    """A markdown table cell: a `|` would end the cell and a newline the row."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def row(cells: Iterable[Any]) -> str:
    """The `row` filter: one table line of escaped cells."""
    return "| " + " | ".join(cell(v) for v in cells) + " |"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    # StrictUndefined: a key the view model lacks fails the render instead of printing blank.
    # No autoescape: the output is markdown, and table cells are escaped by `row`.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters.update(row=row, code=lambda value: f"`{value}`")
    return env


def markdown(model_view: dict[str, Any], lang: str) -> str:
    """report.md of one model from its view model (view.build with the same language's texts)."""
    return environment().get_template("report.md.j2").render(m=model_view, t=texts(lang))


def write_results(m: Model, decoder: Decoder, results: Path) -> dict[str, Path]:
    """This model's parts of the run's JSON, and its prompts' texts, under `results`."""
    written = {}
    if m.entry is not None and m.run.precision is not None:
        written["precision"] = results / "precision_report.json"
        write_json(written["precision"], dump(m.run.precision.model_copy(update={"models": {m.name: m.entry}})))
    if (m.perf_model is not None or m.perf_cases) and m.run.perf is not None:
        written["perf"] = results / "perf_report.json"
        write_json(written["perf"], dump(m.run.perf.model_copy(update={
            "models": {m.name: m.perf_model} if m.perf_model else {}, "cases": m.perf_cases})))
    if m.prompts:
        written["inference"] = results / "inference_results.json"
        write_json(written["inference"], {
            "model": m.name,
            "checkpoint": decoder.checkpoint,
            "decoded": decoder.tokenizer is not None,
            "not_decoded_reason": decoder.reason,
            "results": [{"id": pid, "prompt": p.text,
                         "reference_tokens": p.reference_tokens, "target_tokens": p.target_tokens,
                         "reference_text": decoder.decode(p.reference_tokens),
                         "target_text": decoder.decode(p.target_tokens)}
                        for pid, p in m.prompts.items()],
        })
    return written


def draw_pictures(m: Model, model_dir: Path) -> dict[str, Path]:
    out = {}
    if m.prompts:
        # The mean's limit (noise-relative limits differ per prompt: the largest is drawn).
        limit = max(p.checks["logprob_rel_err"].threshold for p in m.prompts.values())
        out["logprob_error"] = figures.logprob_error(m.prompts, limit, model_dir)
        out["top1"] = figures.top1(m.prompts, model_dir)
        # Shown in the precision section, so only beside compared prompts.
        if m.entry and m.entry.diagnosis and m.entry.diagnosis.rows:
            out["diagnosis"] = figures.diagnosis(m.entry.diagnosis, model_dir)
    if m.throughput_cases:
        out["throughput"] = figures.throughput(m.throughput_cases, model_dir)
    return out


def model_view(run: Run, name: str, directory: Path, lang: str) -> dict[str, Any]:
    """Writes the model's results/*.json and pictures under `directory/name`, and
    returns the view model of its report.md, which links them."""
    m = Model.of(run, name)
    model_dir = directory / name
    model_dir.mkdir(parents=True, exist_ok=True)
    decoder = Decoder.for_checkpoint(m.checkpoint)
    written = {**write_results(m, decoder, model_dir / "results"), **draw_pictures(m, model_dir)}
    return view.build(m, decoder, {k: p.relative_to(model_dir) for k, p in written.items()}, texts(lang))


def render_model(run: Run, name: str, directory: Path, lang: str) -> Path:
    text = markdown(model_view(run, name, directory, lang), lang)
    path = directory / name / "report.md"
    path.write_text(text, encoding="utf-8")
    return path


def render(report_dir: Path, lang: str = "en", benchmark_json: Path | None = None) -> list[Path]:
    """Render every model of the run in `report_dir`; returns the report.md paths."""
    texts(lang)  # an unknown language fails before anything is written
    run = Run.load(report_dir, benchmark_json)
    return [render_model(run, name, report_dir, lang) for name in run.models()]
