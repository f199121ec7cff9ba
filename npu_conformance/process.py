"""Child processes and environment overrides, one way for the whole suite: a
process group killed as one, a child that dies with the process that started
it, and environment values set for a while and then put back."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from typing import Callable, Iterator, Mapping

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Loaded here, not in the child between fork and exec, where little is safe to do.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """`sig` to every process of group `pgid`; a group already gone is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def run_in_group(command: list[str], env: Mapping[str, str], timeout_s: float, what: str) -> tuple[int, str]:
    """Run `command` (`what`, in messages) to its end in a process group of its own: (exit status,
    stdout and stderr together). The whole group is killed at the deadline
    (TimeoutError, with the output's tail) and when the command ends, so nothing
    it forked outlives it. The output goes to a file, not a pipe: a forked
    process that keeps the pipe open would hold the reader past the command's end."""
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(command, env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        log.seek(0)
        out = log.read()
    if timed_out:
        raise TimeoutError(f"{what} ran past {timeout_s:.0f} s:\n{out[-3000:]}")
    return proc.returncode, out


def signalled_when_dead(parent: int, sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec_fn that has the kernel send the child `sig` when `parent` dies
    (Linux; None elsewhere). The signal follows the thread that forks, so a
    long-lived child is started from a thread that lives as long as the run."""
    if _LIBC is None:
        return None
    libc = _LIBC

    def arm() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(127)  # not armed, or the parent died before it was: never run unguarded

    return arm


@contextlib.contextmanager
def env_overrides(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ inside; on leaving, those keys as they were. Only
    these keys: what else the body sets (vLLM sets its own at boot) stays."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
