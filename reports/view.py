"""The view model of one model's report.md: the run's JSON selected, computed and
formatted here, so that templates/report.md.j2 only lays it out. Numbers arrive as
the strings the report prints and verdicts as the language's words; the prose
around them (headings, labels, sentences) is the template's, from i18n/<lang>.yaml."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
BENCHMARK_KEYS = ("benchmarks", "machine_info")  # what marks a pytest-benchmark JSON


@lru_cache(maxsize=1)
def commands() -> dict[str, str]:
    return yaml.safe_load((HERE / "commands.yaml").read_text(encoding="utf-8"))


def load_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclass(frozen=True)
class Run:
    precision: dict[str, Any] | None
    perf: dict[str, Any] | None
    benchmark: dict[str, Any] | None

    @classmethod
    def load(cls, directory: Path, benchmark_json: Path | None = None) -> "Run":
        bench = load_json(benchmark_json) if benchmark_json else None
        if bench is None:
            # pytest-benchmark's file has no fixed name: any top-level JSON shaped like one.
            for path in sorted(directory.glob("*.json")):
                data = load_json(path)
                if isinstance(data, dict) and all(k in data for k in BENCHMARK_KEYS):
                    bench = data
                    break
        return cls(load_json(directory / "precision_report.json"), load_json(directory / "perf_report.json"), bench)

    def models(self) -> list[str]:
        names = dict.fromkeys((self.precision or {}).get("models", {}))
        names.update(dict.fromkeys((self.perf or {}).get("models", {})))
        return list(names)


@dataclass(frozen=True)
class Decoder:
    tokenizer: Any
    checkpoint: str | None
    reason: str | None  # why ids stay undecoded

    @classmethod
    def for_checkpoint(cls, checkpoint: str | None) -> "Decoder":
        if checkpoint is None:
            return cls(None, None, "the report names no checkpoint")
        if not Path(checkpoint).is_dir():
            return cls(None, checkpoint, f"checkpoint {checkpoint} is not on this machine")
        from transformers import AutoTokenizer  # only when there is something to decode: it is slow to import

        try:
            return cls(AutoTokenizer.from_pretrained(checkpoint), checkpoint, None)
        except (OSError, ValueError) as exc:
            return cls(None, checkpoint, f"{type(exc).__name__}: {exc}")

    def decode(self, ids: list[int]) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(ids)

    def token(self, token_id: int) -> str:
        return repr(self.tokenizer.decode([token_id])) if self.tokenizer else str(token_id)


@dataclass(frozen=True)
class Model:
    """One model's parts of the run's three JSON files."""

    name: str
    run: Run
    entry: dict[str, Any] | None  # precision_report.json's models[name]
    perf_model: dict[str, Any] | None
    perf_cases: dict[str, dict[str, Any]]
    benchmarks: list[dict[str, Any]]

    @classmethod
    def of(cls, run: Run, name: str) -> "Model":
        perf = run.perf or {}
        cases = {k: c for k, c in perf.get("cases", {}).items() if c.get("card") == name}
        benchmarks = [b for b in (run.benchmark or {}).get("benchmarks", [])
                      if b.get("extra_info", {}).get("card") == name]
        return cls(name, run, (run.precision or {}).get("models", {}).get(name),
                   perf.get("models", {}).get(name), cases, benchmarks)

    @property
    def prompts(self) -> dict[str, dict[str, Any]]:
        return (self.entry or {}).get("prompts", {})

    @property
    def serving(self) -> dict[str, Any] | None:
        return (self.entry or {}).get("serving")

    @property
    def checkpoint(self) -> str | None:
        return (self.entry or {}).get("checkpoint") or (self.perf_model or {}).get("checkpoint")

    @property
    def throughput_cases(self) -> list[dict[str, Any]]:
        return sorted((c for k, c in self.perf_cases.items() if "::test_throughput[" in k),
                      key=lambda c: (c.get("mode", "eager"), c["batch_size"]))

    @property
    def slowdown_cases(self) -> list[dict[str, Any]]:
        return [c for k, c in sorted(self.perf_cases.items()) if "::test_gate_under_injected_slowdown[" in k]

    @property
    def platform(self) -> dict[str, Any] | None:
        return (self.run.precision or {}).get("platform") or (self.run.perf or {}).get("platform")


# --- formatting --------------------------------------------------------------------


def _num(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    """Three significant digits: relative errors span 1e-8 .. 1e+0."""
    return "—" if value is None else f"{value * 100:.3g}%"


def _figure_value(name: str, value: Any) -> str:
    if value is None:
        return "—"
    # The decode path's checks are the teacher-forced ones, on other logits.
    name = name.removeprefix("decode_")
    if name == "cosine":
        return f"{value:.7f}"
    if name in ("logprob_rel_err", "logprob_rel_err_position", "logprob_rel_err_full", "logit_rel_diff_mean",
                "logit_rel_diff_median"):
        return _pct(value)
    return f"{value:.1%}"


def _plain(value: float) -> str:
    """Engine-reported figures: integers with separators, others as they are."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def _shell(command: str | list[str]) -> str:
    """An argv list goes one `--flag value` per line, as the seeds print them."""
    if isinstance(command, str):
        return command
    lines: list[list[str]] = [[]]
    for arg in command:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(arg)
    return " \\\n  ".join(shlex.join(line) for line in lines)


# --- the view ----------------------------------------------------------------------


def _evidence(ev: dict[str, Any] | None, verdict: Any) -> dict[str, Any] | None:
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


def _diagnosis(d: dict[str, Any] | None, files: dict[str, Path], failed: bool) -> dict[str, Any] | None:
    """Where the first failing prompt first diverges (compare.diagnosis), place by place."""
    if not d:
        return None
    first = d["first"]
    return {
        "prompt": d["prompt"], "limit": f"{d['rel_l2_limit']:g}", "problem": d["problem"],
        "seconds": f"{d['seconds']:.1f}", "unmatched": ", ".join(d["unmatched"]) or None,
        "first": None if first is None else {
            "layer": "-" if first["layer"] is None else first["layer"], "place": first["place"],
            "sublayer": first["sublayer"], "rel_l2": f"{first['rel_l2_max']:.3g}", "position": first["worst_position"],
            "cosine": f"{first['cosine_min']:.6f}"},
        "rows": [[r["place"], "-" if r["layer"] is None else r["layer"], r["sublayer"], f"{r['cosine_min']:.6f}",
                  f"{r['rel_l2_max']:.3g}", f"{r['max_abs']:.3g}", r["worst_position"], "❌" if r["diverged"] else "✅"]
                 for r in d["rows"]],
        "picture": files.get("diagnosis"),
        "failed": failed,
    }


def build(m: Model, decoder: Decoder, files: dict[str, Path], t: dict[str, Any]) -> dict[str, Any]:
    """The template's `m`. `files` maps what was written beside report.md (results
    kinds and picture names) to paths relative to it; `t` is the language's texts."""

    def verdict(key: str) -> str:
        # Strict: a verdict the i18n files lack fails the render instead of printing its raw key.
        if key not in t["verdicts"]:
            raise KeyError(f"verdict {key!r} has no text under `verdicts` in the i18n file")
        return t["verdicts"][key]

    e = m.entry or {}
    return {
        "name": m.name,
        "generated": {"precision_at": (m.run.precision or {}).get("generated_at"),
                      "perf_at": (m.run.perf or {}).get("generated_at"), "platform": (m.platform or {}).get("name")},
        "summary": {
            "verdict": verdict(e.get("verdict", "not run")), "expected_fail": e.get("expect") == "fail",
            "passed": sum(p["passed"] for p in m.prompts.values()), "total": len(m.prompts)} if m.prompts else None,
        "checks": _checks(m),
        "model_info": {k: v for k, v in {
            "name": m.name, "architecture": e.get("architecture"), "weights": e.get("weights"),
            "reference_weights": e.get("reference_weights"), "checkpoint": m.checkpoint,
            "dtype": e.get("dtype") or (m.perf_model or {}).get("dtype"), "reference_dtype": e.get("reference_dtype"),
            "max_tokens": e.get("max_tokens"), "expect": e.get("expect"), "card": e.get("card")}.items()
            if v is not None},
        "platform": {"name": m.platform["name"], "device": m.platform["device_name"], "host": m.platform["host"],
                     "versions": m.platform.get("versions", {})} if m.platform else None,
        # Records of patches.applied(): {patch, model, dtype, tensors, bytes_before, bytes_after}.
        "patches": None if e.get("patches") is None else [
            {"patch": p.get("patch"), "details": ", ".join(f"{k}={v}" for k, v in p.items() if k != "patch")}
            for p in e["patches"]],
        "evidence": _evidence(e.get("evidence"), verdict),
        "engine_settings": {**m.perf_model.get("engine_args", {}), **m.perf_model.get("engine_env", {})}
        if m.perf_model else None,
        "quickstart": _quickstart(m, t["quickstart"]["example_prompt"]),
        "verification": _verification(m, verdict),
        "precision": _precision(m, decoder, files, verdict) if m.prompts else None,
        "diagnosis": _diagnosis(e.get("diagnosis"), files, e.get("verdict") == "fail"),
        "performance": _performance(m, files, verdict),
        "serving": {
            "verdict": verdict(m.serving.get("verdict", "not run")),
            "stage_rows": [[name, s.get("load_format"), _num(s.get("boot_time_s"), ".1f"),
                            ", ".join(f"{k} {_plain(v)}" for k, v in s.get("engine_reported", {}).items()),
                            verdict(s["verdict"])] for name, s in m.serving.get("stages", {}).items()],
            "checks": [{"name": name, "verdict": verdict(c["verdict"])}
                       for name, c in m.serving.get("checks", {}).items()]} if m.serving else None,
        "errors": e.get("errors", []),
        "files": [{"path": str(path), "kind": kind if kind in ("precision", "perf", "inference") else "picture"}
                  for kind, path in files.items()],
        # Said only where the texts were written, i.e. where there were prompts.
        "decoding": {"decoded": decoder.tokenizer is not None, "checkpoint": decoder.checkpoint,
                     "reason": decoder.reason} if "inference" in files else None,
    }


def _checks(m: Model) -> list[dict[str, Any]]:
    """Each check over the prompts: its range, threshold and how many prompts passed it."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for p in m.prompts.values():
        for name, check in p["checks"].items():
            grouped.setdefault(name, []).append(check)
    out = []
    for name, checks in grouped.items():
        values = [c["value"] for c in checks]
        lo, hi = _figure_value(name, min(values)), _figure_value(name, max(values))
        # A noise-judged limit differs per prompt: the range of it is shown.
        limits = [c["threshold"] for c in checks]
        low, high = _figure_value(name, min(limits)), _figure_value(name, max(limits))
        noise = [c["noise"] for c in checks if c.get("noise") is not None]
        ratios = [c["ratio"] for c in checks if c.get("ratio") is not None]
        out.append({"name": name, "rule": checks[0]["rule"], "threshold": low if low == high else f"{low} – {high}",
                    "min": lo, "max": hi, "range": lo if lo == hi else f"{lo} – {hi}",
                    "noise": f"{_figure_value(name, min(noise))} – {_figure_value(name, max(noise))}" if noise else "—",
                    "ratio": f"{max(ratios):.2f}" if ratios else "—",
                    "passed": sum(c["passed"] for c in checks), "total": len(checks)})
    return out


def _quickstart(m: Model, example_prompt: str) -> dict[str, Any]:
    c = commands()
    first = next(iter(m.prompts.values()), None)
    # Quoted for the shell: prompts may hold quotes or newlines.
    values = {"model": m.name, "prompt": shlex.quote(first["text"] if first else example_prompt)}
    max_tokens = (m.entry or {}).get("max_tokens")
    out = {key: c[key].format(**values) + (f" --max-tokens {max_tokens}" if max_tokens else "")
           for key in ("inference", "batch", "chat", "precision")}
    cases = m.throughput_cases
    out["perf"] = c["perf"].format(
        model=m.name, input_len=cases[0]["input_len"], output_len=cases[0]["output_len"],
        batch_sizes=",".join(str(b) for b in sorted({x["batch_size"] for x in cases}))) if cases \
        else c["perf_card"].format(model=m.name)
    out["suite"] = c["suite"].format(model=m.name)
    stages = (m.serving or {}).get("stages", {})
    stage = stages.get("real") or next(iter(stages.values()), None)
    out["serve"] = _shell(stage["command"]) if stage and stage.get("command") else None
    return out


def _verification(m: Model, verdict: Callable[[str], str]) -> list[dict[str, Any]]:
    """Rows of the matrix: item, status and evidence, the evidence as a text key of
    the `verification` texts and its values (`text` where it is the run's own words)."""
    e = m.entry or {}
    stages = (m.serving or {}).get("stages", {})

    def row(item: str, status: str, evidence: str | None, **values: Any) -> dict[str, Any]:
        return {"item": item, "status": verdict(status), "evidence": evidence, "args": values}

    def stage(item: str, evidence: str) -> dict[str, Any] | None:
        s = stages.get(item)
        return None if s is None else row(item, s["verdict"], evidence, boot_time_s=_num(s.get("boot_time_s"), ".1f"))

    def none(item: str) -> dict[str, Any]:
        return row(item, "not verified", "no_data")

    real = stage("real", "real_evidence_serving")
    if real is None and e.get("load_time_s") is not None:
        real = row("real", "passed", "real_evidence_engine", load_time_s=_num(e["load_time_s"], ".1f"))
    if real is None and e.get("errors"):
        real = row("real", "failed", None, text=e["errors"][0].splitlines()[0])
    graph = none("graph")
    if m.perf_model:
        graph = (row("graph", "not verified", "graph_eager") if m.perf_model.get("engine_args", {}).get("enforce_eager")
                 else row("graph", "ran", "graph_compiled"))
    serving = none("serving")
    if m.serving:
        checks = m.serving.get("checks", {}).values()
        serving = row("serving", m.serving.get("verdict", "not run"), "serving_evidence",
                      passed=sum(c["verdict"] == "passed" for c in checks), total=len(checks))
    return [stage("dummy", "dummy_evidence") or none("dummy"), real or none("real"),
            row("text", "ran", "text_evidence", prompts=len(m.prompts), tokens=e.get("max_tokens"))
            if m.prompts else none("text"), graph, serving]


def _condition(name: str, run: dict[str, Any], verdict: Callable[[str], str]) -> dict[str, Any]:
    """One serving condition's row: its verdict, prompts passed, and what shows it took effect."""
    if "error" in run:
        return {"name": name, "verdict": verdict("error"), "prompts": "—", "evidence": run["error"].splitlines()[0]}
    prompts = run["prompts"].values()
    shown = {k: v for k, v in run["evidence"].items() if k not in ("engine_evidence", "problems")}
    return {"name": name, "verdict": verdict("pass" if run["passed"] else "fail"),
            "prompts": f"{sum(p['copies_passed'] == p['copies'] for p in prompts)}/{len(run['prompts'])}",
            "evidence": "; ".join([*(f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}" for k, v in shown.items()), *run["evidence"]["problems"]])}


def _precision(m: Model, decoder: Decoder, files: dict[str, Path], verdict: Callable[[str], str]) -> dict[str, Any]:
    e = m.entry or {}
    prompts = m.prompts.items()
    return {
        "method": {"reference_dtype": e["reference_dtype"], "dtype": e["dtype"], "max_tokens": e["max_tokens"],
                   "noise_dtype": e.get("noise_dtype") or "—", **e["thresholds"]},
        "prompt_rows": [[pid, p["text"], f"{p['top1_rate']:.1%} / {p['top1_exact_rate']:.1%}",
                         f"{_pct(p['logprob_rel_err_max'])} / {_pct(p['logprob_rel_err_mean'])}",
                         _num(p.get("max_abs_logprob_err"), ".2e"), f"{p['cosine_min']:.7f} / {p['cosine_mean']:.7f}",
                         _num(p.get("kl_max"), ".2e"), _num(p.get("top5_overlap_mean"), ".1%"),
                         verdict("pass" if p["passed"] else "fail")] for pid, p in prompts],
        "conditions": [_condition(name, run, verdict) for name, run in e.get("conditions", {}).items()],
        "mismatches": "; ".join(f"{pid} {p['top1_mismatch_positions']}" for pid, p in prompts
                                if p.get("top1_mismatch_positions")),
        "greedy": [{"id": pid, "prefix": p["greedy_prefix"], "length": p["greedy_len"],
                    "ratio": f"{p['greedy_ratio']:.0%}", "tie": p["greedy_divergence_is_tie"],
                    "verdict": verdict("passed" if p["checks"]["greedy"]["passed"] else "failed")
                    if p["checks"].get("greedy") else "—"} for pid, p in prompts],
        "top5": [{"text": p["text"], "rows": [
            {"rank": rank, "reference": decoder.token(r[0]), "reference_p": f"{r[1]:.6f}",
             "target": decoder.token(g[0]), "target_p": f"{g[1]:.6f}", "match": r[0] == g[0]}
            for rank, (r, g) in enumerate(zip(p["top5_first_position"]["reference"],
                                              p["top5_first_position"]["target"]), 1)]}
            for p in m.prompts.values() if "top5_first_position" in p],
        "pictures": {kind: str(files[kind]) for kind in ("logprob_error", "top1")},
    }


def _gate_cells(c: dict[str, Any]) -> list[str]:
    """Baseline +- noise, normalized ratio against the baseline's, host speed and tolerance of one perf case."""
    gate = c.get("gate") or {}
    base, norm, host = c.get("baseline") or {}, gate.get("normalized") or {}, gate.get("host") or {}

    def band(value: float | None, noise: float | None, spec: str) -> str:
        return "—" if value is None else f"{value:{spec}}" + (f" ± {noise:.1%}" if noise is not None else "")

    return [band(base.get("tok_s"), base.get("tok_s_noise"), ".1f"),
            "—" if not norm else f"{norm['measured']:.3f} / {band(norm['baseline'], norm.get('noise'), '.3f')}",
            _num(host.get("speed"), ".2f"),
            _pct((norm or gate.get("absolute") or {}).get("tolerance"))]


def _performance(m: Model, files: dict[str, Path], verdict: Callable[[str], str]) -> dict[str, Any]:
    pm, cases = m.perf_model, m.throughput_cases
    bw = (pm or {}).get("bandwidth", {})
    return {
        "has_data": bool(pm or m.perf_cases),
        "engine": None if not pm else {
            "load_time_s": _num(pm.get("load_time_s"), ".1f"), "max_model_len": pm.get("max_model_len"),
            "kv_cache_tokens": _num(pm.get("kv_cache_tokens"), ","),
            "max_concurrency": _num(pm.get("max_concurrency"), ".1f"),
            "tensor_parallel_size": pm.get("tensor_parallel_size"),
            "weight_mib": _num(pm.get("decode_weight_bytes") and pm["decode_weight_bytes"] / 2**20, ".1f"),
            "measured_gb_s": _num(bw.get("measured_gb_s"), ".1f"), "measure_method": bw.get("measure_method", "—"),
            "published_gb_s": _num(bw.get("published_gb_s"), ".1f"), "published": bw.get("published") or "—",
            "roofline_gb_s": _num(bw.get("roofline_gb_s"), ".1f"),
            "roofline_tok_s_batch1": _num(pm.get("roofline_tok_s_batch1"), ".1f")},
        "throughput": None if not cases else {
            "input_len": cases[0]["input_len"], "output_len": cases[0]["output_len"], "rounds": cases[0]["rounds"],
            "calibration": cases[0].get("calibration", "—"),
            "picture": str(files["throughput"]),
            "rows": [[c.get("mode", "eager"), c["batch_size"], _num(c["output_tok_s"], ".1f"),
                      _num(c.get("output_tok_s_best"), ".1f"), _num(c.get("total_tok_s"), ".1f"),
                      _num(c.get("ttft_ms_median"), ".1f"), _num(c.get("tpot_ms_median"), ".1f"),
                      *_gate_cells(c), _num(c.get("roofline_tok_s"), ".1f"), _pct(c.get("roofline_fraction")),
                      f"{verdict(c['verdict'])}: {c['message']}"] for c in cases]},
        "slowdown": [[c.get("injected", {}).get("factor"), _num(c.get("injected", {}).get("achieved_slowdown"), ".2f"),
                      _num(c["output_tok_s"], ".1f"), *_gate_cells(c), c.get("expected_verdict", "—"),
                      f"{verdict(c['verdict'])}: {c['message']}"] for c in m.slowdown_cases],
        "fidelity": [{"verdict": verdict(c["verdict"]), "message": c["message"]}
                     for c in m.perf_cases.values() if "ratios" in c],
        "load": [{"verdict": verdict(c["verdict"]), "message": c["message"]}
                 for c in m.perf_cases.values() if "detector" in c],
        "benchmarks": [[b["name"], b["stats"]["rounds"],
                        *(f"{b['stats'][k]:.3f}" for k in ("min", "median", "mean", "stddev"))] for b in m.benchmarks],
    }
