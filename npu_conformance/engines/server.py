"""An HTTP server under test as a child process: free port, health wait, log file,
and a teardown that ends its whole process group.

Nothing here knows about vLLM or pytest: the caller gives the command line for a
port. The server runs in a session of its own (start_new_session), so one
killpg reaches the engine processes it forks. Every started server is kept in a
registry that atexit and SIGTERM/SIGHUP handlers empty, so an interrupted run
leaves no server holding memory or a port. A SIGKILL of this process runs no
handler: on Linux the server's guard (_GUARD) then kills the group.
A server started with an `identity` check is healthy only once that check says
the answering server is the one started (not another on the same port).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import FrameType, TracebackType
from typing import Callable, Iterator, Mapping, Sequence

import httpx
import psutil

from npu_conformance import process

HOST = "127.0.0.1"
HEALTH_PATH = "/health"
# A port that is free when picked can be taken before the server binds it
# (another xdist worker's server): that start is retried on a new port.
BIND_ATTEMPTS = 3
POLL_S = 0.5
TERM_GRACE_S = 15.0


# One client for every health poll (a new one per poll rebuilds its TLS context);
# trust_env=False so no proxy from the environment is asked for 127.0.0.1.
_HEALTH_CLIENT = httpx.Client(timeout=5.0, trust_env=False)


# The leader of a server's process group and the server's parent: it waits for
# the server and exits as it does. The group's SIGTERM (stop) is the server's to
# act on. SIGUSR1, which the kernel sends the guard when the process that started
# it dies (PR_SET_PDEATHSIG, armed before exec), kills the whole group: a signal
# to the server alone would leave its engine processes running.
_GUARD = """
import os, signal, subprocess, sys
signal.signal(signal.SIGUSR1, lambda *_: os.killpg(0, signal.SIGKILL))
signal.signal(signal.SIGTERM, lambda *_: None)
code = subprocess.Popen(sys.argv[1:]).wait()
sys.exit(code if code >= 0 else 128 - code)
"""


class ServerBootError(RuntimeError):
    """The server exited, or was not healthy in time; the message carries its log tail."""


def free_port(host: str = HOST) -> int:
    """A port the kernel considers free now (bind to 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group `pgid`."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return members


class ServerProcess:
    """One server process; use as a context manager (start on enter, stop on exit)."""

    def __init__(
        self,
        command: Callable[[int], Sequence[str]],
        env: Mapping[str, str],
        log_path: Path,
        boot_timeout_s: float,
        port_picker: Callable[[], int] = free_port,
        api_key: str | None = None,
        identity: Callable[["ServerProcess"], str | None] | None = None,
    ) -> None:
        """`api_key`: the bearer token the server was started to require (clients
        send it); `identity`: None if the server answering on the port is this
        one, else why not (asked once /health answers)."""
        self.command = command
        self.env = dict(env)
        self.log_path = log_path
        self.boot_timeout_s = boot_timeout_s
        self.port_picker = port_picker
        self.api_key = api_key
        self.identity = identity
        self.port: int | None = None
        self.argv: list[str] = []
        self.boot_time_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process group: its leader, the guard (_GUARD)."""
        return self._proc.pid if self._proc else None

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn and wait for a healthy answer; raise ServerBootError (log tail included) otherwise."""
        if self._proc is not None:
            raise RuntimeError(f"server pid {self._proc.pid} is already running")
        _install_signal_handlers()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")
        start = time.perf_counter()
        for attempt in range(1, BIND_ATTEMPTS + 1):
            self.port = self.port_picker()
            self.argv = [str(a) for a in self.command(self.port)]
            offset = self._spawn(attempt)
            try:
                self._wait_healthy(start)
            except ServerBootError:
                self.stop()
                if attempt < BIND_ATTEMPTS and self._bind_failed(offset):
                    continue
                raise
            self.boot_time_s = time.perf_counter() - start
            return

    def _spawn(self, attempt: int) -> int:
        """Start one attempt, appending to the log; returns where its output begins."""
        with open(self.log_path, "ab") as log:
            log.write(f"--- attempt {attempt} on port {self.port}: {' '.join(self.argv)}\n".encode())
            log.flush()
            offset = log.tell()
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _GUARD, *self.argv], env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=process.signalled_when_dead(os.getpid(), signal.SIGUSR1),
            )
        _LIVE[self._proc.pid] = self
        _STARTED.append(self._proc.pid)
        return offset

    def _wait_healthy(self, start: float) -> None:
        deadline = start + self.boot_timeout_s
        stranger = None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise ServerBootError(self.describe(f"exited with code {code} before it was healthy"))
            if self.healthy():
                # Another server on this port answers /health as well; ours then
                # fails to bind and exits (retried above), or the wait times out.
                stranger = self.identity(self) if self.identity else None
                if stranger is None:
                    return
            if time.perf_counter() > deadline:
                why = f"; the server answering is not the one started: {stranger}" if stranger else ""
                raise ServerBootError(self.describe(f"not healthy within {self.boot_timeout_s:.0f} s{why}"))
            time.sleep(POLL_S)

    def _bind_failed(self, offset: int) -> bool:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return os.strerror(errno.EADDRINUSE).lower() in log.read().decode(errors="replace").lower()

    def healthy(self) -> bool:
        try:
            return _HEALTH_CLIENT.get(self.base_url + HEALTH_PATH).status_code == 200
        except httpx.HTTPError:
            return False

    def problem(self) -> str | None:
        """None if the server is up and healthy, else what is wrong (with the log tail)."""
        if self._proc is None:
            return self.describe("was never started or has been stopped")
        code = self._proc.poll()
        if code is not None:
            return self.describe(f"has exited with code {code}")
        if not self.healthy():
            return self.describe(f"does not answer {HEALTH_PATH} with 200")
        return None

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.log_path, "rb") as log:
                return b"".join(deque(log, maxlen=lines)).decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"

    def describe(self, what: str) -> str:
        return (
            f"server pid {self.pid} on {self.base_url} {what}\ncommand: {' '.join(self.argv)}\n"
            f"--- server log tail ({self.log_path}) ---\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM the process group, SIGKILL it after `grace_s`, and wait until it is empty."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        pgid = proc.pid  # start_new_session made the guard its group's leader
        process.signal_group(pgid, signal.SIGTERM)
        process.signal_group(pgid, signal.SIGCONT)  # a held server (others_paused) acts on it
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.signal_group(pgid, signal.SIGKILL)
            proc.wait()
        _LIVE.pop(proc.pid, None)
        # Engine processes forked by the server outlive it for a moment, or hang.
        deadline = time.monotonic() + grace_s
        while members := group_members(pgid):
            if time.monotonic() > deadline + grace_s:
                raise RuntimeError(f"server group {pgid} survives SIGKILL: {[p.pid for p in members]}")
            if time.monotonic() > deadline:
                process.signal_group(pgid, signal.SIGKILL)
            time.sleep(0.1)


def started_groups() -> list[int]:
    """Process groups of every server this process started (each server leads its own)."""
    return list(_STARTED)


@contextlib.contextmanager
def others_paused(keep: ServerProcess) -> Iterator[list[int]]:
    """Every other live server this process started held (SIGSTOP) while the
    block runs, and continued after; yields their groups. An idle server still
    polls: beside the serving latency rounds on 2 cores, the card's Stage B server
    ran 0.06 CPU s per s, and the normalized TPOT read 9-14% under the runs
    without it. The guard is not held, so it still kills its group when this
    process dies (a held process takes SIGKILL), and stop() continues a held group."""
    groups = [pgid for pgid, server in _LIVE.items() if server is not keep]
    for pgid in groups:
        for member in group_members(pgid):
            if member.pid != pgid:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.suspend()
    try:
        yield groups
    finally:
        for pgid in groups:
            process.signal_group(pgid, signal.SIGCONT)


def stop_all(grace_s: float = TERM_GRACE_S) -> None:
    for server in list(_LIVE.values()):
        server.stop(grace_s)


_LIVE: dict[int, ServerProcess] = {}
_STARTED: list[int] = []
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_handlers_installed = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Stop the servers, then die of the same signal as the default action would.
    stop_all(grace_s=5.0)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    """Once, from the main thread, and only where nobody else handles the signal."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in _HANDLED_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_signal)
    _handlers_installed = True


atexit.register(stop_all, 5.0)
