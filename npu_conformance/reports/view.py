"""The view model of one model's report.md: the run's JSON selected, computed and
formatted here, so that templates/report.md.j2 only lays it out. Numbers arrive as
the strings the report prints and verdicts as the language's words; the prose
around them (headings, labels, sentences) is the template's, from i18n/<lang>.yaml.
The precision and performance sections are made by precision_view.py and perf_view.py."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from npu_conformance.reports import perf_view, precision_view
from npu_conformance.reports.formatting import num, plain, shell
from npu_conformance.reports.run import Decoder, Model, Run

# Decoder, Model and Run live in run.py; the renderer takes them from here, with build.
__all__ = ["Decoder", "Model", "Run", "build"]

HERE = Path(__file__).parent


@lru_cache(maxsize=1)
def commands() -> dict[str, str]:
    return yaml.safe_load((HERE / "commands.yaml").read_text(encoding="utf-8"))


def build(m: Model, decoder: Decoder, files: dict[str, Path], t: dict[str, Any]) -> dict[str, Any]:
    """The template's `m`. `files` maps what was written beside report.md (results
    kinds and picture names) to paths relative to it; `t` is the language's texts."""

    def verdict(key: str) -> str:
        # Strict: a verdict the i18n files lack fails the render instead of printing its raw key.
        if key not in t["verdicts"]:
            raise KeyError(f"verdict {key!r} has no text under `verdicts` in the i18n file")
        return t["verdicts"][key]

    e, pm, serving = m.entry, m.perf_model, m.serving
    return {
        "name": m.name,
        "generated": {"precision_at": m.run.precision.generated_at if m.run.precision else None,
                      "perf_at": m.run.perf.generated_at if m.run.perf else None,
                      "platform": (m.platform or {}).get("name")},
        "summary": {
            "verdict": verdict(e.verdict or "not run"), "expected_fail": e.expect == "fail",
            "passed": sum(p.passed for p in m.prompts.values()), "total": len(m.prompts)} if e and m.prompts else None,
        "checks": precision_view.checks(m),
        "model_info": {k: v for k, v in {
            "name": m.name, "architecture": e and e.architecture, "weights": e and e.weights,
            "reference_weights": e and e.reference_weights, "checkpoint": m.checkpoint,
            "dtype": (e and e.dtype) or (pm and pm.dtype), "reference_dtype": e and e.reference_dtype,
            "max_tokens": e and e.max_tokens, "expect": e and e.expect, "card": e and e.card}.items()
            if v is not None},
        "platform": {"name": m.platform["name"], "device": m.platform["device_name"], "host": m.platform["host"],
                     "versions": m.platform.get("versions", {})} if m.platform else None,
        # Records of patches.applied(): {patch, model, dtype, tensors, bytes_before, bytes_after}.
        "patches": None if e is None or e.patches is None else [
            {"patch": p.get("patch"), "details": ", ".join(f"{k}={v}" for k, v in p.items() if k != "patch")}
            for p in e.patches],
        "evidence": precision_view.evidence(e and e.evidence, verdict),
        "engine_settings": {**pm.engine_args, **pm.engine_env} if pm else None,
        "quickstart": _quickstart(m, t["quickstart"]["example_prompt"]),
        "verification": _verification(m, verdict),
        "precision": precision_view.precision(m, e, decoder, files, verdict) if e and m.prompts else None,
        "diagnosis": precision_view.diagnosis(e and e.diagnosis, files, e is not None and e.verdict == "fail"),
        "performance": perf_view.performance(m, files, verdict),
        "serving": {
            "verdict": verdict(serving.verdict or "not run"),
            "stage_rows": [[name, s.get("load_format"), num(s.get("boot_time_s"), ".1f"),
                            ", ".join(f"{k} {plain(v)}" for k, v in s.get("engine_reported", {}).items()),
                            verdict(s.get("verdict", "ran"))] for name, s in serving.stages.items()],
            "checks": [{"name": name, "verdict": verdict(c["verdict"])}
                       for name, c in serving.checks.items()]} if serving else None,
        "accuracy": precision_view.accuracy(e and e.accuracy, verdict),
        "errors": e.errors if e else [],
        "files": [{"path": str(path), "kind": kind if kind in ("precision", "perf", "inference") else "picture"}
                  for kind, path in files.items()],
        # Said only where the texts were written, i.e. where there were prompts.
        "decoding": {"decoded": decoder.tokenizer is not None, "checkpoint": decoder.checkpoint,
                     "reason": decoder.reason} if "inference" in files else None,
    }


def _quickstart(m: Model, example_prompt: str) -> dict[str, Any]:
    c = commands()
    first = next(iter(m.prompts.values()), None)
    # Quoted for the shell: prompts may hold quotes or newlines.
    values = {"model": m.name, "prompt": shlex.quote(first.text if first else example_prompt)}
    max_tokens = m.entry.max_tokens if m.entry else None
    out = {key: c[key].format(**values) + (f" --max-tokens {max_tokens}" if max_tokens else "")
           for key in ("inference", "batch", "chat", "precision")}
    cases = m.throughput_cases
    out["perf"] = c["perf"].format(
        model=m.name, input_len=cases[0].input_len, output_len=cases[0].output_len,
        batch_sizes=",".join(str(b) for b in sorted({x.batch_size for x in cases}))) if cases \
        else c["perf_card"].format(model=m.name)
    out["suite"] = c["suite"].format(model=m.name)
    stages = m.serving.stages if m.serving else {}
    stage = stages.get("real") or next(iter(stages.values()), None)
    out["serve"] = shell(stage["command"]) if stage and stage.get("command") else None
    return out


def _verification(m: Model, verdict: Callable[[str], str]) -> list[dict[str, Any]]:
    """Rows of the matrix: item, status and evidence, the evidence as a text key of
    the `verification` texts and its values (`text` where it is the run's own words)."""
    e = m.entry
    stages = m.serving.stages if m.serving else {}

    def row(item: str, status: str, evidence: str | None, **values: Any) -> dict[str, Any]:
        return {"item": item, "status": verdict(status), "evidence": evidence, "args": values}

    def stage(item: str, evidence: str) -> dict[str, Any] | None:
        s = stages.get(item)
        return None if s is None else row(item, s.get("verdict", "ran"), evidence, boot_time_s=num(s.get("boot_time_s"), ".1f"))

    def none(item: str) -> dict[str, Any]:
        return row(item, "not verified", "no_data")

    real = stage("real", "real_evidence_serving")
    if real is None and e and e.load_time_s is not None:
        real = row("real", "passed", "real_evidence_engine", load_time_s=num(e.load_time_s, ".1f"))
    if real is None and e and e.errors:
        real = row("real", "failed", None, text=e.errors[0].splitlines()[0])
    graph = none("graph")
    if m.perf_model:
        graph = (row("graph", "not verified", "graph_eager") if m.perf_model.engine_args.get("enforce_eager")
                 else row("graph", "ran", "graph_compiled"))
    serving = none("serving")
    if m.serving:
        checks = m.serving.checks.values()
        serving = row("serving", m.serving.verdict or "not run", "serving_evidence",
                      passed=sum(c["verdict"] == "passed" for c in checks), total=len(checks))
    return [stage("dummy", "dummy_evidence") or none("dummy"), real or none("real"),
            row("text", "ran", "text_evidence", prompts=len(m.prompts), tokens=e.max_tokens if e else None)
            if m.prompts else none("text"), graph, serving]
