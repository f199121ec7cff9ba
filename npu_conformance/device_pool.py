"""The device pool: which accelerators each pytest-xdist worker's engines may use.

`--devices=0-7` (default: every device the platform reports) is split into
contiguous, equal shares, one per worker, so two workers' engines never share a
device. A card takes the first devices of its worker's share, as many as its
engine's parallel sizes multiply to; a card needing more than a share holds is
skipped with the figures. The worker's engine sees only its devices through the
platform's visible-devices variable (vLLM's `device_control_env_var`: e.g.
ASCEND_RT_VISIBLE_DEVICES on Ascend, CUDA_VISIBLE_DEVICES on CUDA). A platform
with no devices to hand out (CPU) has an empty pool and sets nothing.

Before an engine boots on devices another engine used, the worker waits, with a
deadline, until their free memory is back (as vllm-ascend's CI waits between
models): vLLM sizes its KV cache from the memory free at boot.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The engine arguments whose product is the number of devices an engine uses.
PARALLEL_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class DeviceError(ValueError):
    """A device list, split or wait that cannot be honoured; the message says why, with the figures."""


def parse(spec: str) -> list[int]:
    """`0-7`, `0,2,4` or `0-3,6` -> sorted distinct device indices."""
    devices: set[int] = set()
    for part in spec.split(","):
        match = _RANGE.fullmatch(part.strip())
        if not match:
            raise DeviceError(f"--devices={spec}: {part.strip()!r} is not a device index or a range such as 0-7")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise DeviceError(f"--devices={spec}: the range {part.strip()} runs backwards")
        devices.update(range(first, last + 1))
    return sorted(devices)


def split(devices: Sequence[int], workers: int) -> list[list[int]]:
    """Equal contiguous shares of `devices`, one per worker (the rest unused): an
    empty pool gives every worker an empty share."""
    if not devices:
        return [[] for _ in range(workers)]
    if workers > len(devices):
        raise DeviceError(f"{workers} xdist workers for {len(devices)} devices {list(devices)}: "
                          "run with -n at most the number of devices, or give more with --devices")
    size = len(devices) // workers
    return [list(devices[i * size:(i + 1) * size]) for i in range(workers)]


def needed(engine_args: Mapping[str, Any]) -> int:
    """How many devices an engine with these arguments uses."""
    return math.prod(int(engine_args.get(name) or 1) for name in PARALLEL_ARGS)


def worker_index(worker_id: str | None) -> int:
    """The xdist worker's index ("gw3" -> 3); 0 when not under xdist."""
    if not worker_id or worker_id == "master":
        return 0
    return int(worker_id.removeprefix("gw"))


@dataclass(frozen=True)
class Placement:
    """The devices one card's engine gets on one worker, and how it is told."""

    devices: tuple[int, ...]
    env: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "env": self.env}


def place(share: Sequence[int], count: int, variable: str | None) -> Placement:
    """The first `count` devices of the worker's `share`. An empty share (a
    platform without a pool) places nothing and sets no variable."""
    if not share:
        return Placement((), {})
    if count > len(share):
        raise DeviceError(f"needs {count} devices, and this worker has {len(share)} ({list(share)}): run with fewer "
                          "xdist workers or more --devices")
    chosen = tuple(share[:count])
    return Placement(chosen, {variable: ",".join(map(str, chosen))} if variable else {})


def wait_for_memory(devices: Sequence[int], free_fraction: Callable[[int], float], wanted: float,
                    deadline_s: float, poll_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until every device in `devices` has at least `wanted` of its memory
    free (`free_fraction(device)`); return the seconds waited, or raise
    DeviceError naming the devices and figures once `deadline_s` has passed."""
    if not devices:
        return 0.0
    start = clock()
    while True:
        short = {d: f for d in devices if (f := free_fraction(d)) < wanted}
        if not short:
            return clock() - start
        if clock() - start >= deadline_s:
            figures = ", ".join(f"device {d}: {f:.0%} free" for d, f in sorted(short.items()))
            raise DeviceError(f"device memory not back within {deadline_s:.0f} s ({figures}; the engine needs "
                              f"{wanted:.0%}): another process holds it")
        sleep(poll_s)
