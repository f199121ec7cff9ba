"""How long a process tree waited for a CPU it wanted: the perf gate's sign
that a round shared the host with something else.

Linux counts, per thread, the time it was runnable but not running
(/proc/<pid>/task/<tid>/schedstat, second field, ns), and per host the time the
hypervisor gave a virtual CPU to someone else (/proc/stat, `steal`). Their sum
over a stretch of time, per second of it, is the stretch's wait share: near 0
with the host to itself, and about 1 with a CPU-bound neighbour on one of two
cores (measured: see data/perf.yaml). Normalizing by a calibration run does not
cancel such a neighbour (a round whose threads meet at barriers slows far more
than the calibration does), so the gate leaves those rounds out instead.

Where the measured trees fill the cores themselves (a server and its client),
they wait for each other as much as for a neighbour; there the sign is the
neighbour's own CPU time: the host's busy time less the trees' (`Others`).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Contention:
    """The waits of `root` (default: this process) and its descendants in the
    same session; a process that started a session of its own (a server, a load
    generator) is someone else's. `available` is False where the kernel keeps no
    per-thread schedstat: every share is then None, and no round is left out."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self.available = (PROC / str(self.root) / "schedstat").exists()

    def waited_s(self) -> float | None:
        """Seconds waited so far: run delay summed over the tree's live threads,
        plus the host's steal time."""
        if not self.available:
            return None
        return self._run_delay_ns() / 1e9 + steal_s()

    def ran_s(self) -> float | None:
        """CPU seconds the tree's live threads have run so far."""
        return self._schedstat_ns(0) / 1e9 if self.available else None

    def _run_delay_ns(self) -> int:
        return self._schedstat_ns(1)

    def _schedstat_ns(self, field: int) -> int:
        try:
            root = psutil.Process(self.root)
            session = os.getsid(self.root)
            tree = [root, *root.children(recursive=True)]
        except (psutil.Error, ProcessLookupError):
            return 0
        total = 0
        for proc in tree:
            try:
                if proc.pid != self.root and os.getsid(proc.pid) != session:
                    continue
                tasks = PROC / str(proc.pid) / "task"
                for tid in os.listdir(tasks):
                    total += int((tasks / tid / "schedstat").read_text().split()[field])
            except (OSError, IndexError, ValueError):
                continue  # a thread or process that ended meanwhile
        return total


class Others:
    """CPU seconds the host ran for anything but the `trees` so far: its busy
    time (/proc/stat, all CPUs, steal included) less what their threads ran.
    None where a tree's schedstat or /proc/stat is missing."""

    def __init__(self, trees: list[Contention]) -> None:
        self.trees = trees

    def ran_s(self) -> float | None:
        ran = [tree.ran_s() for tree in self.trees]
        busy = host_busy_s()
        return None if busy is None or None in ran else busy - sum(r for r in ran if r is not None)


def host_busy_s() -> float | None:
    """CPU seconds the host's CPUs were busy so far, all CPUs (user, nice, system,
    irq, softirq, steal: not idle or iowait)."""
    try:
        fields = [int(f) for f in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (sum(fields[0:3]) + sum(fields[5:8])) / CLOCK_TICKS
    except (OSError, ValueError):
        return None


def steal_s() -> float:
    """The host's steal time so far, all CPUs (0 where /proc/stat has no such column)."""
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def share(waited_before: float | None, waited_after: float | None, seconds: float) -> float | None:
    """Seconds waited per second of a stretch (None where unmeasured). A thread
    that ended within the stretch takes its count along: never below 0."""
    if waited_before is None or waited_after is None or seconds <= 0:
        return None
    return max(0.0, waited_after - waited_before) / seconds
