"""The report schema (npu_conformance.report_schema): what its writers and the
xdist merge refuse, and how the renderer meets a report of another version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from npu_conformance.cards import load_catalog
from npu_conformance.perf import PerfReport
from npu_conformance.report import PrecisionReport
from npu_conformance.report_schema import SCHEMA_VERSION, PrecisionDocument, ReportFileError, read
from npu_conformance.reports.__main__ import main as render_main

pytestmark = pytest.mark.unit

CARD = "synthetic-llama"
CHECK = {"value": 1.0, "threshold": 1.0, "passed": True, "rule": "every position's top-1 matches"}


def _report() -> PrecisionReport:
    report = PrecisionReport()
    report.add_prompt(load_catalog()[CARD], "p", "text", {"passed": True, "checks": {"top1": CHECK}, "kl_max": 0})
    return report


def test_a_written_report_reads_back_with_the_keys_its_writer_gave(tmp_path: Path) -> None:
    path = _report().write(tmp_path, None)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema_version"] == SCHEMA_VERSION
    prompt = data["models"][CARD]["prompts"]["p"]
    # No default added (no `noise` on a check without one), and an int figure stays an int.
    assert prompt["checks"]["top1"] == CHECK and prompt["kl_max"] == 0 and isinstance(prompt["kl_max"], int)
    doc = read(path, PrecisionDocument)
    assert doc.models[CARD].prompts["p"].checks["top1"].passed and doc.models[CARD].verdict == "fail"


def test_a_misspelt_field_fails_the_writer_and_keeps_the_figures(tmp_path: Path) -> None:
    report = _report()
    report.model(load_catalog()[CARD])["load_time"] = 3.5
    with pytest.raises(ReportFileError, match=r"load_time[\s\S]*precision_report\.unchecked\.json"):
        report.write(tmp_path, None)
    assert not (tmp_path / "precision_report.json").exists()
    kept = json.loads((tmp_path / "precision_report.unchecked.json").read_text(encoding="utf-8"))
    assert kept["models"][CARD]["load_time"] == 3.5


def test_an_xdist_worker_entry_outside_the_schema_is_refused_naming_the_card() -> None:
    entry = _report().models[CARD]
    with pytest.raises(ReportFileError, match=f"worker's entry for {CARD}[\\s\\S]*verdict"):
        PrecisionReport().merge({CARD: {**entry, "verdict": "passed"}})
    merged = PrecisionReport()
    merged.merge({CARD: entry})
    assert merged.models[CARD]["prompts"]["p"]["checks"]["top1"] == CHECK


def test_a_perf_case_outside_the_schema_fails_its_own_test() -> None:
    report = PerfReport()
    with pytest.raises(ReportFileError, match=r"test_throughput\[x-bs1\][\s\S]*verdict"):
        report.add_case("tests/test_perf.py::test_throughput[x-bs1]", {"card": "x", "batch_size": 1}, "passed")
    report.add_case("tests/test_perf.py::test_throughput[x-bs1]", {"card": "x", "batch_size": 1}, "measured")
    assert report.cases["tests/test_perf.py::test_throughput[x-bs1]"]["verdict"] == "measured"


def _write(directory: Path, data: dict[str, Any]) -> None:
    (directory / "precision_report.json").write_text(json.dumps(data), encoding="utf-8")


def test_a_report_from_before_the_schema_version_still_reads(tmp_path: Path) -> None:
    data = json.loads(_report().write(tmp_path, None).read_text(encoding="utf-8"))
    del data["schema_version"]
    _write(tmp_path, data)
    assert read(tmp_path / "precision_report.json", PrecisionDocument).schema_version == 1


def test_a_report_of_a_newer_version_fails_the_render_with_its_version(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(_report().write(tmp_path, None).read_text(encoding="utf-8"))
    _write(tmp_path, {**data, "schema_version": SCHEMA_VERSION + 1})
    assert render_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"report schema version {SCHEMA_VERSION + 1}; this suite reads versions 1-{SCHEMA_VERSION}" in err
    assert "precision_report.json" in err and "Traceback" not in err
    assert not (tmp_path / CARD).exists()


def test_a_damaged_report_names_its_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(_report().write(tmp_path, None).read_text(encoding="utf-8"))
    data["models"][CARD]["prompts"]["p"]["checks"]["top1"]["passed"] = "maybe"
    _write(tmp_path, data)
    assert render_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "precision_report.json" in err and "checks.top1.passed" in err
