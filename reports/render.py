"""One run's report directory -> per model `<dir>/<model>/report.md`, its pictures
and `results/*.json`. Every figure comes from the run's JSON; a section whose data
the run did not produce says so."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from fixtures.report import write_json
from reports import figures

HERE = Path(__file__).parent
LANGS = ("en", "zh")
BENCHMARK_KEYS = ("benchmarks", "machine_info")  # what marks a pytest-benchmark JSON


@lru_cache(maxsize=None)
def texts(lang: str) -> dict[str, Any]:
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r} (known: {', '.join(LANGS)})")
    return yaml.safe_load((HERE / "i18n" / f"{lang}.yaml").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def commands() -> dict[str, str]:
    return yaml.safe_load((HERE / "commands.yaml").read_text(encoding="utf-8"))


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclass(frozen=True)
class Run:
    precision: dict[str, Any] | None
    perf: dict[str, Any] | None
    benchmark: dict[str, Any] | None

    @classmethod
    def load(cls, directory: Path, benchmark_json: Path | None = None) -> "Run":
        bench = _load(benchmark_json) if benchmark_json else None
        if bench is None:
            # pytest-benchmark's file has no fixed name: any top-level JSON shaped like one.
            for path in sorted(directory.glob("*.json")):
                data = _load(path)
                if isinstance(data, dict) and all(k in data for k in BENCHMARK_KEYS):
                    bench = data
                    break
        return cls(_load(directory / "precision_report.json"), _load(directory / "perf_report.json"), bench)

    def models(self) -> list[str]:
        names = dict.fromkeys((self.precision or {}).get("models", {}))
        names.update(dict.fromkeys((self.perf or {}).get("models", {})))
        return list(names)


# --- formatting --------------------------------------------------------------------


def _num(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    """Three significant digits: relative errors span 1e-8 .. 1e+0."""
    return "—" if value is None else f"{value * 100:.3g}%"


def _figure_value(name: str, value: Any) -> str:
    if value is None:
        return "—"
    if name == "cosine":
        return f"{value:.7f}"
    if name == "logprob_rel_err":
        return _pct(value)
    return f"{value:.1%}"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _code(command: str | list[str]) -> str:
    """A shell block; an argv list goes one `--flag value` per line, as the seeds print them."""
    if isinstance(command, str):
        return f"```sh\n{command}\n```"
    lines: list[list[str]] = [[]]
    for arg in command:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(arg)
    return "```sh\n" + " \\\n  ".join(shlex.join(line) for line in lines) + "\n```"


def _plain(value: float) -> str:
    """Engine-reported figures: integers with separators, others as they are."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


class Doc:
    """Markdown under construction, with the language's texts."""

    def __init__(self, lang: str) -> None:
        self.t = texts(lang)
        self.parts: list[str] = []

    def add(self, *blocks: str) -> None:
        self.parts.extend(blocks)

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"{'#' * level} {text}")

    def missing(self, what: str) -> None:
        self.parts.append(self.t["missing"].format(what=what))

    def verdict(self, key: str) -> str:
        return self.t["verdicts"].get(key, key)

    def text(self) -> str:
        return "\n\n".join(self.parts) + "\n"


# --- tokenizer ---------------------------------------------------------------------


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
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(checkpoint), checkpoint, None)
        except (OSError, ValueError) as exc:
            return cls(None, checkpoint, f"{type(exc).__name__}: {exc}")

    def decode(self, ids: list[int]) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(ids)

    def token(self, token_id: int) -> str:
        return repr(self.tokenizer.decode([token_id])) if self.tokenizer else str(token_id)


# --- one model ---------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
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
        return [c for k, c in self.perf_cases.items() if "::test_throughput[" in k]

    @property
    def platform(self) -> dict[str, Any] | None:
        return (self.run.precision or {}).get("platform") or (self.run.perf or {}).get("platform")


def _summary(doc: Doc, m: Model) -> None:
    t = doc.t
    doc.heading(t["sections"]["summary"])
    if not m.prompts:
        doc.add(t["summary"]["no_prompts"])
        return
    prompts = m.prompts.values()
    doc.add(t["summary"]["verdict"].format(
        verdict=doc.verdict((m.entry or {}).get("verdict", "not run")),
        passed=sum(p["passed"] for p in prompts), total=len(prompts)))
    if (m.entry or {}).get("expect") == "fail":
        doc.add(t["summary"]["expected_fail"])
    lines = []
    for name, checks in _checks(m).items():
        values = [c["value"] for c in checks]
        passed = sum(c["passed"] for c in checks)
        lo, hi = _figure_value(name, min(values)), _figure_value(name, max(values))
        lines.append("- " + t["summary"]["check"].format(
            mark="✅" if passed == len(checks) else "❌", name=t["check_names"].get(name, name),
            range=lo if lo == hi else f"{lo} – {hi}", threshold=_figure_value(name, checks[0]["threshold"]),
            passed=passed, total=len(checks)))
    doc.add("\n".join(lines))


def _checks(m: Model) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in m.prompts.values():
        for name, check in p["checks"].items():
            out.setdefault(name, []).append(check)
    return out


def _model_info(doc: Doc, m: Model) -> None:
    t = doc.t["model"]
    doc.heading(doc.t["sections"]["model"])
    e = m.entry or {}
    fields = [("name", m.name), ("architecture", e.get("architecture")), ("weights", e.get("weights")),
              ("reference_weights", e.get("reference_weights")), ("checkpoint", m.checkpoint),
              ("dtype", e.get("dtype") or (m.perf_model or {}).get("dtype")),
              ("reference_dtype", e.get("reference_dtype")), ("max_tokens", e.get("max_tokens")),
              ("expect", e.get("expect")), ("card", e.get("card"))]
    doc.add(_table(t["headers"], [[t[k], f"`{v}`" if k in ("card", "checkpoint") else v]
                                  for k, v in fields if v is not None]))


def _environment(doc: Doc, m: Model) -> None:
    t = doc.t["environment"]
    doc.heading(doc.t["sections"]["environment"])
    p = m.platform
    if p is None:
        doc.missing("platform")
        return
    rows = [[t["platform"], p["name"]], [t["device"], p["device_name"]], [t["host"], p["host"]]]
    rows += [[t["version"].format(package=k), v] for k, v in p.get("versions", {}).items()]
    doc.add(_table(t["headers"], rows))


def _adaptation(doc: Doc, m: Model) -> None:
    t = doc.t["adaptation"]
    doc.heading(doc.t["sections"]["adaptation"])
    patches = (m.entry or {}).get("patches")
    if patches is None:
        doc.add(t["no_patch_data"])
    elif not patches:
        doc.add(t["no_patches"])
    else:
        # Records of patches.applied(): {patch, model, dtype, tensors, bytes_before, bytes_after}.
        rows = [[f"`{p.get('patch')}`", ", ".join(f"{k}={v}" for k, v in p.items() if k != "patch")] for p in patches]
        doc.add(t["patches_intro"], _table(t["patch_headers"], rows))
    if m.perf_model:
        settings = {**m.perf_model.get("engine_args", {}), **m.perf_model.get("engine_env", {})}
        doc.add(t["engine_intro"], _table(t["engine_headers"], [[f"`{k}`", f"`{v}`"] for k, v in settings.items()]))


def _quickstart(doc: Doc, m: Model) -> None:
    t = doc.t["quickstart"]
    c = commands()
    doc.heading(doc.t["sections"]["quickstart"])
    first = next(iter(m.prompts.values()), None)
    # Quoted for the shell: prompts may hold quotes or newlines.
    values = {"model": m.name, "prompt": shlex.quote(first["text"] if first else t["example_prompt"])}
    max_tokens = (m.entry or {}).get("max_tokens")
    for key in ("inference", "batch", "chat", "precision"):
        doc.heading(t[key], 3)
        doc.add(_code(c[key].format(**values) + (f" --max-tokens {max_tokens}" if max_tokens else "")))
    doc.heading(t["perf"], 3)
    cases = m.throughput_cases
    if cases:
        doc.add(_code(c["perf"].format(model=m.name, input_len=cases[0]["input_len"], output_len=cases[0]["output_len"],
                                       batch_sizes=",".join(str(b) for b in sorted({x["batch_size"] for x in cases})))))
    else:
        doc.add(_code(c["perf_card"].format(model=m.name)))
    doc.heading(t["suite"], 3)
    doc.add(_code(c["suite"].format(model=m.name)))
    doc.heading(t["serve"], 3)
    stages = (m.serving or {}).get("stages", {})
    stage = stages.get("real") or next(iter(stages.values()), None)
    doc.add(_code(stage["command"]) if stage and stage.get("command") else t["no_serve"])


def _verification(doc: Doc, m: Model) -> None:
    t = doc.t["verification"]
    doc.heading(doc.t["sections"]["verification"])
    stages = (m.serving or {}).get("stages", {})
    none = ["not verified", t["no_data"]]

    def stage_row(name: str, evidence_key: str) -> list[str] | None:
        s = stages.get(name)
        if s is None:
            return None
        return [s["verdict"], t[evidence_key].format(boot_time_s=_num(s.get("boot_time_s"), ".1f"))]

    dummy = stage_row("dummy", "dummy_evidence") or none
    real = stage_row("real", "real_evidence_serving")
    if real is None and (m.entry or {}).get("load_time_s") is not None:
        real = ["passed", t["real_evidence_engine"].format(load_time_s=_num(m.entry["load_time_s"], ".1f"))]
    if real is None and (m.entry or {}).get("errors"):
        real = ["failed", m.entry["errors"][0].splitlines()[0]]
    text = none
    if m.prompts:
        text = ["ran", t["text_evidence"].format(prompts=len(m.prompts), tokens=m.entry.get("max_tokens"))]
    graph = none
    if m.perf_model:
        eager = m.perf_model.get("engine_args", {}).get("enforce_eager")
        graph = ["not verified", t["graph_eager"]] if eager else ["ran", t["graph_compiled"]]
    serving = none
    if m.serving:
        checks = m.serving.get("checks", {}).values()
        serving = [m.serving.get("verdict", "not run"), t["serving_evidence"].format(
            passed=sum(c["verdict"] == "passed" for c in checks), total=len(checks))]
    rows = [(t["dummy"], dummy), (t["real"], real or none), (t["text"], text), (t["graph"], graph),
            (t["serving"], serving)]
    doc.add(_table(t["headers"], [[label, doc.verdict(status), evidence] for label, (status, evidence) in rows]))


def _precision(doc: Doc, m: Model, decoder: Decoder, pictures: dict[str, Path]) -> None:
    t = doc.t["precision"]
    doc.heading(doc.t["sections"]["precision"])
    if not m.prompts:
        doc.missing(t["no_prompts"])
        return
    e = m.entry
    doc.heading(t["method_title"], 3)
    doc.add(t["method"].format(reference_dtype=e["reference_dtype"], dtype=e["dtype"], max_tokens=e["max_tokens"],
                               **e["thresholds"]))

    doc.heading(t["summary_title"], 3)
    rows = []
    for name, checks in _checks(m).items():
        values = [c["value"] for c in checks]
        rows.append([doc.t["check_names"].get(name, name), checks[0]["rule"], _figure_value(name, checks[0]["threshold"]),
                     _figure_value(name, min(values)), _figure_value(name, max(values)),
                     f"{sum(c['passed'] for c in checks)}/{len(checks)}"])
    doc.add(_table(t["summary_headers"], rows))

    doc.heading(t["prompts_title"], 3)
    rows, mismatches = [], []
    for pid, p in m.prompts.items():
        rows.append([pid, p["text"], f"{p['top1_rate']:.1%} / {p['top1_exact_rate']:.1%}",
                     f"{_pct(p['logprob_rel_err_max'])} / {_pct(p['logprob_rel_err_mean'])}",
                     _num(p.get("max_abs_logprob_err"), ".2e"),
                     f"{p['cosine_min']:.7f} / {p['cosine_mean']:.7f}", _num(p.get("kl_max"), ".2e"),
                     _num(p.get("top5_overlap_mean"), ".1%"), doc.verdict("pass" if p["passed"] else "fail")])
        if p.get("top1_mismatch_positions"):
            mismatches.append(f"{pid} {p['top1_mismatch_positions']}")
    doc.add(_table(t["prompts_headers"], rows))
    if mismatches:
        doc.add(t["mismatches"].format(details="; ".join(mismatches)))

    doc.heading(t["greedy_title"], 3)
    doc.add(t["greedy_intro"])
    rows = []
    for pid, p in m.prompts.items():
        check = p["checks"].get("greedy")
        rows.append([pid, t["greedy_prefix"].format(prefix=p["greedy_prefix"], length=p["greedy_len"]),
                     f"{p['greedy_ratio']:.0%}", doc.t["answer_yes"] if p["greedy_divergence_is_tie"] else doc.t["answer_no"],
                     doc.verdict("passed" if check and check["passed"] else "failed") if check else "—"])
    doc.add(_table(t["greedy_headers"], rows))

    doc.heading(t["top5_title"], 3)
    top5 = [(p, p["top5_first_position"]) for p in m.prompts.values() if "top5_first_position" in p]
    if not top5:
        doc.missing(t["top5_missing"])
    for p, table in top5:
        rows = [[rank + 1, decoder.token(r[0]), f"{r[1]:.6f}", decoder.token(g[0]), f"{g[1]:.6f}",
                 "✅" if r[0] == g[0] else "❌"]
                for rank, (r, g) in enumerate(zip(table["reference"], table["target"]))]
        doc.add(t["top5_prompt"].format(text=p["text"]), _table(t["top5_headers"], rows))

    doc.heading(t["figures_title"], 3)
    doc.add(f"![{t['logprob_figure']}]({pictures['logprob_error'].name})",
            f"![{t['top1_figure']}]({pictures['top1'].name})")


def _performance(doc: Doc, m: Model, pictures: dict[str, Path]) -> None:
    t = doc.t["performance"]
    doc.heading(doc.t["sections"]["performance"])
    if not m.perf_model and not m.perf_cases:
        doc.missing(t["no_perf"])
    if pm := m.perf_model:
        bw = pm.get("bandwidth", {})
        doc.heading(t["model_title"], 3)
        rows = [[t["load_time"], f"{_num(pm.get('load_time_s'), '.1f')} s"],
                [t["max_model_len"], pm.get("max_model_len")],
                [t["kv_tokens"], _num(pm.get("kv_cache_tokens"), ",")],
                [t["concurrency"], f"{_num(pm.get('max_concurrency'), '.1f')}x"],
                [t["tp"], pm.get("tensor_parallel_size")],
                [t["weight_bytes"], f"{_num(pm.get('decode_weight_bytes') and pm['decode_weight_bytes'] / 2**20, '.1f')} MiB"],
                [t["bandwidth_measured"], f"{_num(bw.get('measured_gb_s'), '.1f')} GB/s ({bw.get('measure_method', '—')})"],
                [t["bandwidth_published"], f"{_num(bw.get('published_gb_s'), '.1f')} GB/s ({bw.get('published') or '—'})"],
                [t["bandwidth_roofline"], f"{_num(bw.get('roofline_gb_s'), '.1f')} GB/s"],
                [t["roofline1"], f"{_num(pm.get('roofline_tok_s_batch1'), '.1f')} tok/s"]]
        doc.add(_table(t["model_headers"], rows))
    if cases := sorted(m.throughput_cases, key=lambda c: c["batch_size"]):
        doc.heading(t["throughput_title"], 3)
        first = cases[0]
        doc.add(t["throughput_intro"].format(input_len=first["input_len"], output_len=first["output_len"],
                                             rounds=first["rounds"]))
        rows = [[c["batch_size"], _num(c["output_tok_s"], ".1f"), _num(c.get("output_tok_s_median"), ".1f"),
                 _num(c.get("total_tok_s"), ".1f"), _num(c.get("ttft_ms_median"), ".1f"),
                 _num(c.get("tpot_ms_median"), ".1f"), _num(c.get("floor_tok_s"), ".1f"),
                 _num(c.get("roofline_tok_s"), ".1f"), _pct(c.get("roofline_fraction")),
                 f"{doc.verdict(c['verdict'])}: {c['message']}"] for c in cases]
        doc.add(_table(t["throughput_headers"], rows), f"![{t['figure']}]({pictures['throughput'].name})")
    fidelity = [c for k, c in m.perf_cases.items() if "ratios" in c]
    if fidelity:
        doc.heading(t["fidelity_title"], 3)
        doc.add("\n".join(f"- {doc.verdict(c['verdict'])}: {c['message']}" for c in fidelity))
    doc.heading(t["benchmark_title"], 3)
    if not m.benchmarks:
        doc.missing(t["no_benchmark"])
        return
    rows = [[b["name"], b["stats"]["rounds"], f"{b['stats']['min']:.3f}", f"{b['stats']['median']:.3f}",
             f"{b['stats']['mean']:.3f}", f"{b['stats']['stddev']:.3f}"] for b in m.benchmarks]
    doc.add(_table(t["benchmark_headers"], rows))


def _serving(doc: Doc, m: Model) -> None:
    t = doc.t["serving"]
    doc.heading(doc.t["sections"]["serving"])
    if not m.serving:
        doc.missing(t["no_serving"])
        return
    doc.add(t["verdict"].format(verdict=doc.verdict(m.serving.get("verdict", "not run"))))
    stages = m.serving.get("stages", {})
    if stages:
        rows = [[name, s.get("load_format"), _num(s.get("boot_time_s"), ".1f"),
                 ", ".join(f"{k} {_plain(v)}" for k, v in s.get("engine_reported", {}).items()), doc.verdict(s["verdict"])]
                for name, s in stages.items()]
        doc.add(_table(t["stages_headers"], rows))
    checks = m.serving.get("checks", {})
    doc.add(_table(t["checks_headers"], [[f"`{name}`", doc.verdict(c["verdict"])] for name, c in checks.items()]))


def _notes(doc: Doc, m: Model) -> None:
    t = doc.t["notes"]
    doc.heading(doc.t["sections"]["notes"])
    errors = (m.entry or {}).get("errors", [])
    if errors:
        doc.add(t["errors"], "\n".join(f"```\n{e}\n```" for e in errors))
    else:
        doc.add(t["no_errors"])
    doc.add("\n".join(f"{i}. {item}" for i, item in enumerate(t["items"], 1)))
    doc.heading(t["faq_title"], 3)
    doc.add("\n\n".join(f"**Q: {qa['q']}**  \nA: {qa['a']}" for qa in t["faq"]))


def _files(doc: Doc, written: dict[str, Path], decoder: Decoder, model_dir: Path) -> None:
    t = doc.t["files"]
    doc.heading(doc.t["sections"]["files"])
    lines = [f"- `{path.relative_to(model_dir)}`: {t.get(kind, t['picture'])}" for kind, path in written.items()]
    doc.add(t["intro"], "\n".join(lines))
    if "inference" in written:
        doc.add(t["decoded"].format(checkpoint=decoder.checkpoint) if decoder.tokenizer
                else t["not_decoded"].format(reason=decoder.reason))


# --- results/*.json ----------------------------------------------------------------


def _write_results(m: Model, decoder: Decoder, results: Path) -> dict[str, Path]:
    written = {}
    if m.entry is not None:
        written["precision"] = results / "precision_report.json"
        write_json(written["precision"], {**{k: v for k, v in m.run.precision.items() if k != "models"},
                                          "models": {m.name: m.entry}})
    if m.perf_model is not None or m.perf_cases:
        written["perf"] = results / "perf_report.json"
        write_json(written["perf"], {**{k: v for k, v in m.run.perf.items() if k not in ("models", "cases")},
                                     "models": {m.name: m.perf_model} if m.perf_model else {}, "cases": m.perf_cases})
    if m.prompts:
        written["inference"] = results / "inference_results.json"
        write_json(written["inference"], {
            "model": m.name,
            "checkpoint": decoder.checkpoint,
            "decoded": decoder.tokenizer is not None,
            "not_decoded_reason": decoder.reason,
            "results": [{"id": pid, "prompt": p["text"],
                         "reference_tokens": p["reference_tokens"], "target_tokens": p["target_tokens"],
                         "reference_text": decoder.decode(p["reference_tokens"]),
                         "target_text": decoder.decode(p["target_tokens"])}
                        for pid, p in m.prompts.items()],
        })
    return written


def _pictures(m: Model, model_dir: Path) -> dict[str, Path]:
    out = {}
    if m.prompts:
        out["logprob_error"] = figures.logprob_error(m.prompts, m.entry["thresholds"]["logprob_rel_err"], model_dir)
        out["top1"] = figures.top1(m.prompts, model_dir)
    if m.throughput_cases:
        out["throughput"] = figures.throughput(m.throughput_cases, model_dir)
    return out


def render_model(run: Run, name: str, directory: Path, lang: str) -> Path:
    m = Model.of(run, name)
    model_dir = directory / name
    model_dir.mkdir(parents=True, exist_ok=True)
    decoder = Decoder.for_checkpoint(m.checkpoint)
    written = _write_results(m, decoder, model_dir / "results")
    pictures = _pictures(m, model_dir)
    doc = Doc(lang)
    doc.add(f"# {doc.t['title'].format(model=name)}")
    doc.add(doc.t["generated"].format(
        precision_at=(run.precision or {}).get("generated_at") or doc.t["unknown"],
        perf_at=(run.perf or {}).get("generated_at") or doc.t["none"],
        platform=(m.platform or {}).get("name") or doc.t["unknown"]))
    _summary(doc, m)
    _model_info(doc, m)
    _environment(doc, m)
    _adaptation(doc, m)
    _quickstart(doc, m)
    _verification(doc, m)
    _precision(doc, m, decoder, pictures)
    _performance(doc, m, pictures)
    _serving(doc, m)
    _notes(doc, m)
    _files(doc, {**written, **pictures}, decoder, model_dir)
    path = model_dir / "report.md"
    path.write_text(doc.text(), encoding="utf-8")
    return path


def render(report_dir: Path, lang: str = "en", benchmark_json: Path | None = None) -> list[Path]:
    """Render every model of the run in `report_dir`; returns the report.md paths."""
    texts(lang)  # an unknown language fails before anything is written
    run = Run.load(report_dir, benchmark_json)
    return [render_model(run, name, report_dir, lang) for name in run.models()]
