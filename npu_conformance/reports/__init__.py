"""Adaptation reports rendered from a run's JSON: `render(report_dir)` writes, per
model, `<report_dir>/<model>/report.md`, its pictures and `results/*.json`."""

from npu_conformance.reports.render import LANGS, render

__all__ = ["LANGS", "render"]
