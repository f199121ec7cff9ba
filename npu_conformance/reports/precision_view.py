"""The precision parts of a report's view model: the checks over the prompts, what
the engine ran, the per-prompt comparison, where a failing prompt diverges, and
the task accuracy scored through lm-evaluation-harness."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npu_conformance.compare.diagnosis import Diagnosis
from npu_conformance.report_schema import AccuracyRecord, Check, ModelRecord
from npu_conformance.reports.formatting import figure_value, num, pct
from npu_conformance.reports.run import Decoder, Model


def evidence(ev: dict[str, Any] | None, verdict: Callable[[str], str]) -> dict[str, Any] | None:
    """What the engine ran (engines.evidence) and the card's verdict on it."""
    if not ev:
        return None
    quant = ev["quantization"]
    detail = quant.get("patch") or ", ".join(f"{k} x{n}" for k, n in {**quant.get("methods", {}),
                                                                         **quant.get("kernels", {})}.items())
    judged = ev["verdict"]
    return {
        "verdict": verdict("pass" if judged["passed"] else "fail"),
        "model_class": ev["model_class"], "native_class": ev["native_class"] or "-", "dtype": ev["dtype"],
        "parallel": f"TP {ev['tensor_parallel_size']}, {ev['ranks']} rank(s) in process(es) {ev['worker_pids']}",
        "attention": ", ".join(ev["attention_backends"]) or "-",
        "quant_path": f"{quant['path']}" + (f" ({detail})" if detail else ""), "quant_reason": quant["reason"],
        "allowed": ", ".join(judged["allowed_quant_paths"]), "problems": judged["problems"],
        "fault": None if not (f := ev.get("fault")) else
        f"{f['path']}: final hidden states x (1 ± {f['scale']:g}), {f['tokens']} tokens in {f['steps']} steps",
    }


def diagnosis(d: Diagnosis | None, files: dict[str, Path], failed: bool) -> dict[str, Any] | None:
    """Where the first failing prompt first diverges (compare.diagnosis), place by place."""
    if not d:
        return None
    first = d.first
    return {
        "prompt": d.prompt, "limit": f"{d.rel_l2_limit:g}", "problem": d.problem,
        "seconds": f"{d.seconds:.1f}", "unmatched": ", ".join(d.unmatched) or None,
        "first": None if first is None else {
            "layer": "-" if first.layer is None else first.layer, "place": first.place,
            "sublayer": first.sublayer, "rel_l2": f"{first.rel_l2_max:.3g}", "position": first.worst_position,
            "cosine": f"{first.cosine_min:.6f}"},
        "rows": [[r.place, "-" if r.layer is None else r.layer, r.sublayer, f"{r.cosine_min:.6f}",
                  f"{r.rel_l2_max:.3g}", f"{r.max_abs:.3g}", r.worst_position, "❌" if r.diverged else "✅"]
                 for r in d.rows],
        "picture": files.get("diagnosis"),
        "failed": failed,
    }


def checks(m: Model) -> list[dict[str, Any]]:
    """Each check over the prompts: its range, threshold and how many prompts passed it."""
    grouped: dict[str, list[Check]] = {}
    for p in m.prompts.values():
        for name, check in p.checks.items():
            grouped.setdefault(name, []).append(check)
    out = []
    for name, checks in grouped.items():
        values = [c.value for c in checks]
        lo, hi = figure_value(name, min(values)), figure_value(name, max(values))
        # A noise-judged limit differs per prompt: the range of it is shown.
        limits = [c.threshold for c in checks]
        low, high = figure_value(name, min(limits)), figure_value(name, max(limits))
        noise = [c.noise for c in checks if c.noise is not None]
        ratios = [c.ratio for c in checks if c.ratio is not None]
        out.append({"name": name, "rule": checks[0].rule, "threshold": low if low == high else f"{low} – {high}",
                    "min": lo, "max": hi, "range": lo if lo == hi else f"{lo} – {hi}",
                    "noise": f"{figure_value(name, min(noise))} – {figure_value(name, max(noise))}" if noise else "—",
                    "ratio": f"{max(ratios):.2f}" if ratios else "—",
                    "passed": sum(c.passed for c in checks), "total": len(checks)})
    return out


def _condition(name: str, run: dict[str, Any], verdict: Callable[[str], str]) -> dict[str, Any]:
    """One serving condition's row: its verdict, prompts passed, and what shows it took effect."""
    if "error" in run:
        return {"name": name, "verdict": verdict("error"), "prompts": "—", "evidence": run["error"].splitlines()[0]}
    prompts = run["prompts"].values()
    shown = {k: v for k, v in run["evidence"].items() if k not in ("engine_evidence", "problems")}
    return {"name": name, "verdict": verdict("pass" if run["passed"] else "fail"),
            "prompts": f"{sum(p['copies_passed'] == p['copies'] for p in prompts)}/{len(run['prompts'])}",
            "evidence": "; ".join([*(f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}" for k, v in shown.items()), *run["evidence"]["problems"]])}


def precision(m: Model, e: ModelRecord, decoder: Decoder, files: dict[str, Path], verdict: Callable[[str], str]
              ) -> dict[str, Any]:
    """The precision section of `m`, whose precision entry is `e`."""
    prompts = m.prompts.items()
    return {
        "method": {"reference_dtype": e.reference_dtype, "dtype": e.dtype, "max_tokens": e.max_tokens,
                   "noise_dtype": e.noise_dtype or "—", **e.thresholds},
        "prompt_rows": [[pid, p.text, f"{p.top1_rate:.1%} / {p.top1_exact_rate:.1%}",
                         f"{pct(p.logprob_rel_err_max)} / {pct(p.logprob_rel_err_mean)}",
                         num(p.max_abs_logprob_err, ".2e"), f"{p.cosine_min:.7f} / {p.cosine_mean:.7f}",
                         num(p.kl_max, ".2e"), num(p.top5_overlap_mean, ".1%"),
                         verdict("pass" if p.passed else "fail")] for pid, p in prompts],
        "conditions": [_condition(name, run, verdict) for name, run in (e.conditions or {}).items()],
        "mismatches": "; ".join(f"{pid} {p.top1_mismatch_positions}" for pid, p in prompts
                                if p.top1_mismatch_positions),
        "greedy": [{"id": pid, "prefix": p.greedy_prefix, "length": p.greedy_len,
                    "ratio": f"{p.greedy_ratio:.0%}", "tie": p.greedy_divergence_is_tie,
                    "verdict": verdict("passed" if p.checks["greedy"].passed else "failed")
                    if "greedy" in p.checks else "—"} for pid, p in prompts],
        "top5": [{"text": p.text, "rows": [
            {"rank": rank, "reference": decoder.token(r[0]), "reference_p": f"{r[1]:.6f}",
             "target": decoder.token(g[0]), "target_p": f"{g[1]:.6f}", "match": r[0] == g[0]}
            for rank, (r, g) in enumerate(zip(p.top5_first_position["reference"],
                                              p.top5_first_position["target"]), 1)]}
            for p in m.prompts.values() if p.top5_first_position],
        "pictures": {kind: str(files[kind]) for kind in ("logprob_error", "top1")},
    }


def accuracy(rec: AccuracyRecord | None, verdict: Callable[[str], str]) -> dict[str, Any] | None:
    """The task gate's rows (label key, value): both scores with their statistics,
    the rule and threshold, the drop it catches, and where the two sides differ."""
    if rec is None:
        return None

    def score(side: dict[str, Any] | None) -> str | None:
        if not side:
            return None
        stderr = f" ± {side['stderr']:.4f}" if side.get("stderr") is not None else ""
        return (f"{side['value']:.4f}{stderr} over {side['n']} items; "
                + (side.get("model") or side.get("source", "")) + (f", {side['seconds']} s" if "seconds" in side else ""))

    g, d = rec.gate, rec.disagreement
    rows = {"task": rec.task_source, "metric": rec.metric, "target": score(rec.target),
            "reference": score(rec.reference), "rule": g and g["rule"], "threshold": g and f"{g['threshold']:.4f}",
            "difference": g and f"{g['difference'] * 100:+.2f}",
            "theta": g and f"{g['theta'] * 100:.2f} (power {g['power']:g})",
            "disagreement": d and f"{d['target_only']} / {d['reference_only']} of {d['items']}",
            "expected": verdict(rec.expected)}
    return {"verdict": verdict(rec.verdict), "message": rec.message,
            "rows": [[key, value] for key, value in rows.items() if value is not None]}
