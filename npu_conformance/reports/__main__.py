"""`python -m npu_conformance.reports <dir> [--lang zh]`: re-render a report directory from its JSON; nothing is rerun."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from npu_conformance.report_schema import ReportFileError
from npu_conformance.reports import LANGS, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npu_conformance.reports", description=__doc__)
    parser.add_argument("report_dir", type=Path, help="a run's report directory (holds precision_report.json)")
    parser.add_argument("--lang", choices=LANGS, default="en")
    parser.add_argument("--benchmark-json", type=Path, help="pytest-benchmark JSON kept outside the report directory")
    args = parser.parse_args(argv)
    if not args.report_dir.is_dir():
        parser.error(f"{args.report_dir} is not a directory")
    try:
        paths = render(args.report_dir, args.lang, args.benchmark_json)
    except ReportFileError as exc:
        # A report of another schema version, or damaged: say which file and why, not a traceback.
        print(exc, file=sys.stderr)
        return 2
    if not paths:
        print(f"{args.report_dir}: no precision_report.json or perf_report.json with models", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
