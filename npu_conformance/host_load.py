"""A CPU load that comes and goes, for the perf gate's own tests: one process
spinning on one core, stopped and continued on a period, as a neighbour on a
shared CI runner does. Its timeline tells, for any stretch of time, how much of
it the load was on, so a test can sort its rounds by the load they ran under.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import psutil

from npu_conformance import process

# Pure Python: it holds one core and touches no shared library state. It dies
# with the thread that started it (PR_SET_PDEATHSIG, Linux), stopped or not, so
# a test process killed outright leaves no spinner behind. It says when it
# reaches the loop: before that it is an interpreter starting up, which on a
# cold page cache waits on the disk more than it runs, so a round timed as
# "load on" would run beside little load (measured: one such round per session).
SPIN = """\
import os
os.write(1, b".")
while True:
    pass
"""
# How long the process may take to reach its loop, and `switch` to take the new state.
START_WAIT_S = 30.0
SWITCH_WAIT_S = 1.0


class SwitchingLoad:
    """Context manager: a spinning process pinned to `cpu` (default: the last CPU
    this process may run on), killed with its process group on exit. Given
    `period_s`, it is on for that long, off (SIGSTOP) as long, and so on, from the
    moment it starts; without, it starts off and its owner calls `switch`."""

    def __init__(self, period_s: float | None = None, cpu: int | None = None) -> None:
        if period_s is not None and period_s <= 0:
            raise ValueError(f"a switching load needs a period > 0 s, not {period_s}")
        self.period_s = period_s
        self.cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
        # Monotonic times of each switch (the first: the start) and the state it switched to.
        self._times: list[float] = []
        self._states: list[bool] = []
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._held = False

    def __enter__(self) -> "SwitchingLoad":
        self._proc = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True,
                                      preexec_fn=process.signalled_when_dead(os.getpid(), signal.SIGKILL),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        os.sched_setaffinity(self._proc.pid, {self.cpu})
        assert self._proc.stdout is not None
        with self._proc.stdout as ready:
            if not select.select([ready], [], [], START_WAIT_S)[0] or not ready.read(1):
                self.__exit__()
                raise RuntimeError(f"the load process ({sys.executable} -c ...) did not start spinning within "
                                   f"{START_WAIT_S:g} s")
        self.switch(self.period_s is not None)
        self._start_period()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop_period()
        if self._proc is not None:
            process.signal_group(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._mark(False)

    def _start_period(self) -> None:
        if self.period_s is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, args=(self.period_s,), name="switching-load",
                                            daemon=True)
            self._thread.start()

    def _stop_period(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self, period_s: float) -> None:
        on = self._states[-1]
        while not self._stop.wait(period_s):
            on = not on
            self.switch(on)

    @contextlib.contextmanager
    def by_hand(self) -> Iterator["SwitchingLoad"]:
        """The period held: inside, the caller switches the load (a test that
        needs rounds wholly under one state, which rounds slowed past the
        period would never be); on leaving, the period goes on from there."""
        self._stop_period()
        self._held = True
        try:
            yield self
        finally:
            self._held = False
            self._start_period()

    def switch(self, on: bool) -> None:
        """Continue (on) or stop (off) the spinning process, and return once it
        has (a signal is delivered asynchronously; the timeline must not lead)."""
        assert self._proc is not None, "switch() before the load started"
        os.killpg(self._proc.pid, signal.SIGCONT if on else signal.SIGSTOP)
        proc = psutil.Process(self._proc.pid)
        deadline = time.monotonic() + SWITCH_WAIT_S
        while (proc.status() == psutil.STATUS_STOPPED) == on and time.monotonic() < deadline:
            time.sleep(0.001)
        self._mark(on)

    def _mark(self, on: bool) -> None:
        self._times.append(time.monotonic())
        self._states.append(on)

    def on_fraction(self, start: float, end: float) -> float:
        """The share of [start, end] (time.monotonic) the load was on."""
        if end <= start:
            return float(self._state_at(start))
        points = [start, *(t for t in self._times if start < t < end), end]
        on = sum(b - a for a, b in zip(points, points[1:]) if self._state_at(a))
        return on / (end - start)

    def _state_at(self, t: float) -> bool:
        i = bisect.bisect_right(self._times, t)
        return self._states[i - 1] if i else False

    @property
    def pid(self) -> int:
        assert self._proc is not None, "the load has not started"
        return self._proc.pid

    def cpu_s(self) -> float:
        """CPU seconds the spinning process has run: switched on is not running,
        for the scheduler may hold a continued process back (measured on Linux
        6.18: after a stretch of taking a whole core, it got none for seconds)."""
        assert self._proc is not None, "the load has not started"
        times = psutil.Process(self._proc.pid).cpu_times()
        return times.user + times.system

    def switches(self) -> int:
        return len(self._times)

    def describe(self) -> str:
        how = f"every {self.period_s:g} s" if self.period_s is not None and not self._held else \
            "by the test, between rounds"
        return f"one process spinning on CPU {self.cpu} of {os.cpu_count()}, switched on and off {how}"
