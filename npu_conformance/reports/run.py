"""The run a report is rendered from: its JSON files, loaded through the report
schema (npu_conformance.report_schema), one model's parts of them, and the
tokenizer that decodes its token ids."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npu_conformance.report_schema import (ModelRecord, PerfCaseRecord, PerfDocument, PerfModelRecord,
                                           PrecisionDocument, PromptRecord, ServingRecord, read)

BENCHMARK_KEYS = ("benchmarks", "machine_info")  # what marks a pytest-benchmark JSON


def load_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclass(frozen=True)
class Run:
    precision: PrecisionDocument | None
    perf: PerfDocument | None
    benchmark: dict[str, Any] | None  # pytest-benchmark's, in its own format

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
        return cls(read(directory / "precision_report.json", PrecisionDocument),
                   read(directory / "perf_report.json", PerfDocument), bench)

    def models(self) -> list[str]:
        names = dict.fromkeys(self.precision.models if self.precision else {})
        names.update(dict.fromkeys(self.perf.models if self.perf else {}))
        return list(names)

    @property
    def platform(self) -> dict[str, Any] | None:
        return (self.precision.platform if self.precision else None) or (self.perf.platform if self.perf else None)


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
    entry: ModelRecord | None  # precision_report.json's models[name]
    perf_model: PerfModelRecord | None
    perf_cases: dict[str, PerfCaseRecord]
    benchmarks: list[dict[str, Any]]

    @classmethod
    def of(cls, run: Run, name: str) -> "Model":
        cases = {k: c for k, c in run.perf.cases.items() if c.card == name} if run.perf else {}
        benchmarks = [b for b in (run.benchmark or {}).get("benchmarks", [])
                      if b.get("extra_info", {}).get("card") == name]
        return cls(name, run, run.precision.models.get(name) if run.precision else None,
                   run.perf.models.get(name) if run.perf else None, cases, benchmarks)

    @property
    def prompts(self) -> dict[str, PromptRecord]:
        return self.entry.prompts if self.entry else {}

    @property
    def serving(self) -> ServingRecord | None:
        return self.entry.serving if self.entry else None

    @property
    def checkpoint(self) -> str | None:
        return (self.entry and self.entry.checkpoint) or (self.perf_model and self.perf_model.checkpoint) or None

    @property
    def throughput_cases(self) -> list[PerfCaseRecord]:
        return sorted((c for k, c in self.perf_cases.items() if "::test_throughput[" in k),
                      key=lambda c: (c.mode, c.batch_size))

    @property
    def slowdown_cases(self) -> list[PerfCaseRecord]:
        return [c for k, c in sorted(self.perf_cases.items()) if "::test_gate_under_injected_slowdown[" in k]

    @property
    def latency_cases(self) -> list[PerfCaseRecord]:
        return [c for k, c in sorted(self.perf_cases.items()) if "::test_latency_gate[" in k]

    @property
    def platform(self) -> dict[str, Any] | None:
        return self.run.platform
