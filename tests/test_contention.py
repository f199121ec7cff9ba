"""Waits for a CPU (npu_conformance.contention), counted for this process tree only."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil
import pytest

from npu_conformance import contention

pytestmark = pytest.mark.unit


# Starts two spinning children (in a session of their own with "own"), prints their pids, and waits.
STARTER = ("import subprocess, sys, time\n"
           "procs = [subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=sys.argv[1] == 'own')\n"
           "         for _ in range(2)]\n"
           "print(*(p.pid for p in procs), flush=True)\n"
           "time.sleep(60)\n")


@pytest.mark.skipif(not contention.Contention().available, reason="this kernel keeps no per-thread schedstat")
def test_contention_counts_the_waits_of_this_process_tree_only() -> None:
    """Two spinning children on one CPU wait for each other, about half the time
    each; the same two in a session of their own are someone else's. The tree is
    a starter process's, not pytest's: late in a run pytest's own tree holds
    engine processes whose waits are theirs (a CI run measured 0.47 s/s for the
    "someone else's" case that way). The host's steal time is left out: it is
    the hypervisor's, not the tree's."""
    cpu = max(os.sched_getaffinity(0))
    for session, expected in (("same", (0.6, 2.5)), ("own", (0.0, 0.3))):
        starter = subprocess.Popen([sys.executable, "-c", STARTER, session], stdout=subprocess.PIPE, text=True)
        assert starter.stdout is not None
        spinners = [psutil.Process(int(pid)) for pid in starter.stdout.readline().split()]
        try:
            for proc in spinners:
                proc.cpu_affinity([cpu])
            time.sleep(0.2)
            watch = contention.Contention(starter.pid)
            before, steal, start = watch.waited_s(), contention.steal_s(), time.monotonic()
            time.sleep(0.6)
            waited = watch.waited_s() - (contention.steal_s() - steal)
            share = contention.share(before, waited, time.monotonic() - start)
        finally:
            for proc in [*spinners, psutil.Process(starter.pid)]:
                proc.kill()
            starter.wait()
        assert share is not None and expected[0] <= share <= expected[1], (session, share)
    assert contention.share(None, 1.0, 1.0) is None and contention.share(2.0, 1.0, 1.0) == 0.0


@pytest.mark.skipif(not contention.Contention().available, reason="this kernel keeps no per-thread schedstat")
def test_others_counts_the_cpu_the_host_ran_outside_the_trees() -> None:
    """A spinning child in the starter's session runs in the tree; the same child
    in a session of its own runs for someone else, and `Others` holds its CPU
    time (other work on the host, say a parallel test worker, only adds to it)."""
    for session in ("same", "own"):
        starter = subprocess.Popen([sys.executable, "-c", STARTER, session], stdout=subprocess.PIPE, text=True)
        assert starter.stdout is not None
        spinners = [psutil.Process(int(pid)) for pid in starter.stdout.readline().split()]
        try:
            spinners[1].kill()
            spinner, tree = spinners[0], contention.Contention(starter.pid)
            others = contention.Others([tree])

            def read() -> tuple[float, float, float]:
                ran, other = tree.ran_s(), others.ran_s()
                assert ran is not None and other is not None
                return ran, other, sum(spinner.cpu_times()[:2])

            time.sleep(0.2)
            before = read()
            time.sleep(0.6)
            ran, other, spun = (a - b for a, b in zip(read(), before))
        finally:
            for proc in [*spinners, psutil.Process(starter.pid)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            starter.wait()
        assert spun > 0.1, f"the spinner ran {spun:.2f} s of 0.6: nothing to count"
        # /proc/stat counts in clock ticks: 0.05 s of slack.
        if session == "same":
            assert ran >= spun - 0.05, (ran, spun)
        else:
            assert ran < 0.05 and other >= spun - 0.05, (ran, other, spun)
