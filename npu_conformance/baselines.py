"""Recorded throughput baselines, one JSON file per card in data/perf_baselines/.

An entry is what one card measured on one device: keyed by platform, device,
engine mode, quantization path and kernel, batch size and lengths, with the library versions it ran with and
its recorded runs (each run: the median of its rounds, absolute and normalized
to the host-speed calibration). The gate (perf.judge) reads the median of the
runs and their spread, the noise band. `pytest -m perf --perf-record` appends
one run per case; records from several separate sessions give the noise.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import statistics
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field

from npu_conformance.cards import CardError, read_json, validated
from npu_conformance.report import write_json

BASELINES_DIR = Path(__file__).parent / "data" / "perf_baselines"
SETTINGS_FILE = Path(__file__).parent / "data" / "perf.yaml"
# 2: keys name the quantization path and kernel (format 1 had none: the GPTQ
# baselines once measured the patch's dense layers where the kernel now runs).
FORMAT = 2
Mode = Literal["eager", "graph"]
Metric = Literal["output_tok_s", "ttft", "tpot"]


@functools.lru_cache(maxsize=1)
def settings() -> dict[str, Any]:
    return yaml.safe_load(SETTINGS_FILE.read_text(encoding="utf-8"))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Run(_Model):
    """One recorded run of a case: medians over its rounds."""

    recorded_at: str
    rounds: Annotated[int, Field(gt=0)]
    tok_s: Annotated[float, Field(gt=0)]
    # tok/s over the calibration's tok/s, per round, median; None where no calibration ran.
    normalized: Annotated[float, Field(gt=0)] | None
    calibration_tok_s: Annotated[float, Field(gt=0)] | None


class Key(_Model):
    platform: str
    device: str
    mode: Mode
    # How the quantized layers ran (perf.quant_key): none, patch:<patch>, kernel:<kernels>.
    quant: str
    # Requests at a time: the batch, or the server's concurrency for a latency.
    batch_size: Annotated[int, Field(gt=0)]
    input_len: Annotated[int, Field(gt=0)]
    output_len: Annotated[int, Field(gt=0)]
    # What the runs' tok_s is: the output tok/s of the suite's rounds, or a serving
    # latency as a rate (perf.latency.Rate: 1000 / its p50 in ms), so one rule, higher
    # is better, gates both. Absent in entries recorded before latencies were.
    metric: Metric = "output_tok_s"


class Entry(_Model):
    key: Key
    versions: dict[str, str]
    # Who recorded it: "pytest --perf-record", or a seed report's hand-measured figures.
    source: str
    runs: Annotated[tuple[Run, ...], Field(min_length=1)]

    @property
    def tok_s(self) -> float:
        return statistics.median(r.tok_s for r in self.runs)

    @property
    def normalized(self) -> float | None:
        values = [r.normalized for r in self.runs if r.normalized is not None]
        return statistics.median(values) if values else None

    @property
    def calibration_tok_s(self) -> float | None:
        values = [r.calibration_tok_s for r in self.runs if r.calibration_tok_s is not None]
        return statistics.median(values) if values else None

    def noise(self, field: Literal["tok_s", "normalized", "calibration_tok_s"]) -> float | None:
        """Half the spread of the recorded runs relative to their median: each
        run lay within +- this of it. None with too few runs to say."""
        values = [v for r in self.runs if (v := getattr(r, field)) is not None]
        if len(values) < settings()["baselines"]["min_runs_for_noise"]:
            return None
        return (max(values) - min(values)) / 2 / statistics.median(values)

    def at_host_speed(self, calibration_tok_s: float, window: float,
                      nearest: int) -> tuple["Entry | None", str | None]:
        """The runs recorded at a host speed like this run's: the `nearest` whose
        calibration lies within `window` times `calibration_tok_s` either way
        (data/perf.yaml says why), and which were taken; every run where none recorded a calibration
        (message None); None where runs did and none is that near: a baseline from
        another speed cannot gate this run."""
        speeds = [r.calibration_tok_s for r in self.runs if r.calibration_tok_s is not None]
        if not speeds:
            return self, None
        def apart(r: Run) -> float:
            return max(r.calibration_tok_s, calibration_tok_s) / min(r.calibration_tok_s, calibration_tok_s)

        # The nearest `nearest` runs on the nearest run's side of this speed only: a speed between two
        # recorded ones would mix both, and their spread, read as noise, widened the tolerance past a 1.25x
        # slowdown (two CIs, 2026-12-06: at 574 tok/s all runs in the window; at 575 the nearest three,
        # two below and one above, 7.9% noise).
        within = sorted((r for r in self.runs if r.calibration_tok_s is not None and apart(r) <= window), key=apart)
        below = bool(within) and within[0].calibration_tok_s <= calibration_tok_s
        near = tuple(r for r in within if (r.calibration_tok_s <= calibration_tok_s) == below)[:nearest]
        recorded = f"{min(speeds):.0f}-{max(speeds):.0f} tok/s"
        if near:
            return self.model_copy(update={"runs": near}), (
                f"the {len(near)} of {len(self.runs)} recorded runs nearest in host speed, on one side of this "
                f"run's and within {window:g}x of it "
                f"(calibration {calibration_tok_s:.0f} tok/s; all runs {recorded})")
        return None, (f"no recorded run at a host speed within {window:g}x of this run's (calibration "
                      f"{calibration_tok_s:.0f} tok/s, the {len(self.runs)} runs {recorded}): the normalized figure "
                      f"moves by more than the gate's slack between such speeds, so none gates this run")

    def summary(self) -> dict[str, Any]:
        """The figures the gate used, for the report."""
        return {"tok_s": self.tok_s, "tok_s_noise": self.noise("tok_s"), "normalized": self.normalized,
                "normalized_noise": self.noise("normalized"), "calibration_tok_s": self.calibration_tok_s,
                "calibration_noise": self.noise("calibration_tok_s"), "runs": len(self.runs),
                "versions": self.versions, "source": self.source,
                "recorded": [self.runs[0].recorded_at, self.runs[-1].recorded_at]}


class BaselineFile(_Model):
    format: Literal[2]
    card: str
    entries: tuple[Entry, ...] = ()


def path_for(card: str, directory: Path = BASELINES_DIR) -> Path:
    return directory / f"{card}.json"


def load(card: str, directory: Path = BASELINES_DIR) -> BaselineFile:
    """The card's baselines (none recorded: an empty file's worth); a malformed
    file is a CardError naming it and the field."""
    file = path_for(card, directory)
    if not file.exists():
        return BaselineFile(format=FORMAT, card=card)
    return _checked(card, read_json(file, "perf baseline"), file)


def load_text(card: str, text: str | None, origin: str) -> BaselineFile:
    """The card's baselines from `text` (a file's content at some commit; None: no
    such file there), each entry's source naming `origin`."""
    if text is None:
        return BaselineFile(format=FORMAT, card=card)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CardError(Path(origin), "<json>", f"not valid JSON: {exc}", "perf baseline") from None
    loaded = _checked(card, data, Path(origin))
    return loaded.model_copy(update={"entries": tuple(e.model_copy(update={"source": f"{e.source} ({origin})"})
                                                      for e in loaded.entries)})


def _checked(card: str, data: Any, file: Path) -> BaselineFile:
    loaded = validated(BaselineFile, data, file, "perf baseline")
    if loaded.card != card:
        raise CardError(file, "card", f"must be {card!r} (the file's name), got {loaded.card!r}", "perf baseline")
    return loaded


def versions_of(all_versions: dict[str, str]) -> dict[str, str]:
    """The versions a baseline is keyed by, of those the platform reports."""
    return {name: v for name in settings()["baselines"]["versions"] if (v := all_versions.get(name))}


def find(baselines: BaselineFile, key: Key, versions: dict[str, str]) -> Entry | None:
    """The entry for `key` recorded with these versions, else the one recorded
    most recently with others (an upgrade is gated against what ran before)."""
    matching = [e for e in baselines.entries if e.key == key]
    exact = [e for e in matching if e.versions == versions]
    return (exact or sorted(matching, key=lambda e: e.runs[-1].recorded_at))[-1] if matching else None


def record(card: str, key: Key, versions: dict[str, str], run: Run, directory: Path = BASELINES_DIR) -> Path:
    """Append `run` to the card's entry for `key` and these versions (a new entry
    for new versions), keeping the newest runs; written atomically under a lock."""
    file = path_for(card, directory)
    file.parent.mkdir(parents=True, exist_ok=True)
    keep = settings()["baselines"]["keep"]
    with FileLock(str(file) + ".lock"):
        current = load(card, directory)
        entries = list(current.entries)
        index = next((i for i, e in enumerate(entries) if e.key == key and e.versions == versions), None)
        if index is None:
            entries.append(Entry(key=key, versions=versions, source="pytest -m perf --perf-record", runs=(run,)))
        else:
            old = entries[index]
            entries[index] = old.model_copy(update={"runs": (*old.runs, run)[-keep:]})
        entries.sort(key=lambda e: (e.key.platform, e.key.device, e.key.metric, e.key.mode, e.key.batch_size))
        # exclude_defaults: an output tok/s entry's key stays as it was written before latencies.
        write_json(file, BaselineFile(format=FORMAT, card=card, entries=tuple(entries)).model_dump(
            mode="json", exclude_defaults=True))
    return file


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
