"""The OpenAI server's process (npu_conformance.engines.server.ServerProcess) on a
stand-in server: a port taken before it binds, a server that exits or never gets
healthy, and a stop that ends its whole process group. No engine."""

from __future__ import annotations

import errno
import os
import socket
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from npu_conformance.engines.server import (HOST, ServerBootError, ServerProcess, free_port, group_members,
                                           others_paused, started_groups)

pytestmark = pytest.mark.unit


def _http_server(directory: Path) -> Any:
    return lambda port: [sys.executable, "-m", "http.server", "--bind", HOST, "--directory", str(directory), str(port)]


def test_port_taken_before_bind_is_retried(tmp_path: Path) -> None:
    (tmp_path / "health").write_text("ok")
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy])
        server = ServerProcess(_http_server(tmp_path), os.environ, tmp_path / "log", boot_timeout_s=30,
                               port_picker=lambda: next(ports, None) or free_port())
        with server:
            assert server.port != busy and server.healthy()
    log = (tmp_path / "log").read_text()
    assert "attempt 1 on port" in log and "attempt 2 on port" in log and os.strerror(errno.EADDRINUSE) in log


def test_server_that_exits_fails_boot_with_its_log(tmp_path: Path) -> None:
    server = ServerProcess(lambda port: [sys.executable, "-c", "import sys; print('no weights here'); sys.exit(3)"],
                           os.environ, tmp_path / "log", boot_timeout_s=30)
    with pytest.raises(ServerBootError, match="exited with code 3") as exc:
        server.start()
    assert "no weights here" in str(exc.value) and "server log tail" in str(exc.value)


def test_boot_timeout_stops_the_server(tmp_path: Path) -> None:
    server = ServerProcess(lambda port: [sys.executable, "-c", "import time; time.sleep(600)"], os.environ,
                           tmp_path / "log", boot_timeout_s=1.0)
    with pytest.raises(ServerBootError, match="not healthy within 1 s"):
        server.start()
    assert not group_members(started_groups()[-1])


def test_stop_ends_the_whole_group(tmp_path: Path) -> None:
    """A forked helper that ignores SIGTERM (a hung engine process) still goes."""
    (tmp_path / "health").write_text("ok")
    ready = tmp_path / "helper-ready"
    script = textwrap.dedent(f"""
        import pathlib, runpy, subprocess, sys, time
        helper = "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \\
                 "pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
        subprocess.Popen([sys.executable, "-c", helper])
        while not pathlib.Path({str(ready)!r}).exists():
            time.sleep(0.05)
        sys.argv = ["http.server", "--bind", {HOST!r}, "--directory", {str(tmp_path)!r}, sys.argv[1]]
        runpy.run_module("http.server", run_name="__main__")
    """)
    server = ServerProcess(lambda port: [sys.executable, "-c", script, str(port)], os.environ, tmp_path / "log",
                           boot_timeout_s=30)
    server.start()
    pgid = server.pid
    assert ready.exists() and len(group_members(pgid)) == 3  # the guard, the server and its helper
    server.stop(grace_s=1.0)
    assert not group_members(pgid)


def test_others_paused_holds_the_other_servers_and_continues_them(tmp_path: Path) -> None:
    """The timed server runs, every other is held (its guard not: it must still
    kill its group when the test process dies), and continued after; a held
    server still stops."""
    (tmp_path / "health").write_text("ok")
    timed, other, third = (ServerProcess(_http_server(tmp_path), os.environ, tmp_path / f"log{i}", boot_timeout_s=30)
                           for i in range(3))
    with timed, other, third:
        def held(server: ServerProcess, expected: bool) -> bool:
            """Whether every process of the server's group but its guard is stopped,
            waiting a while for `expected` (a signal lands when the process is next scheduled)."""
            deadline = time.monotonic() + 10
            while True:
                stopped = {m.status() for m in group_members(server.pid) if m.pid != server.pid} == {
                    psutil.STATUS_STOPPED}
                if stopped == expected or time.monotonic() > deadline:
                    return stopped
                time.sleep(0.05)

        with others_paused(timed) as groups:
            assert sorted(groups) == sorted([other.pid, third.pid])
            assert held(other, True) and held(third, True)
            assert psutil.Process(other.pid).status() != psutil.STATUS_STOPPED  # the guard
            assert timed.healthy() and not held(timed, False)
            pgid = third.pid
            third.stop(grace_s=5.0)
            assert not group_members(pgid)
        assert not held(other, False) and other.healthy()
