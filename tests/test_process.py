"""npu_conformance.process: environment overrides, process groups, children that die with their starter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from npu_conformance import process

pytestmark = pytest.mark.unit


def test_env_overrides_puts_back_only_its_own_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_CONFORMANCE_T_SET", "before")
    monkeypatch.delenv("NPU_CONFORMANCE_T_NEW", raising=False)
    monkeypatch.delenv("NPU_CONFORMANCE_T_BODY", raising=False)
    with process.env_overrides({"NPU_CONFORMANCE_T_SET": "inside", "NPU_CONFORMANCE_T_NEW": "inside"}):
        assert os.environ["NPU_CONFORMANCE_T_SET"] == os.environ["NPU_CONFORMANCE_T_NEW"] == "inside"
        os.environ["NPU_CONFORMANCE_T_BODY"] = "set by the body"  # as vLLM sets its own at boot
    assert os.environ["NPU_CONFORMANCE_T_SET"] == "before"
    assert "NPU_CONFORMANCE_T_NEW" not in os.environ
    assert os.environ.pop("NPU_CONFORMANCE_T_BODY") == "set by the body"


def test_env_overrides_puts_back_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_CONFORMANCE_T_SET", "before")
    with pytest.raises(RuntimeError), process.env_overrides({"NPU_CONFORMANCE_T_SET": "inside"}):
        raise RuntimeError("boot failed")
    assert os.environ["NPU_CONFORMANCE_T_SET"] == "before"


def test_signal_group_kills_the_group_and_a_gone_group_is_no_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    process.signal_group(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    process.signal_group(proc.pid, signal.SIGKILL)  # gone: nothing raised


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_the_process_that_started_it() -> None:
    # The starter prints its child's pid, then is killed outright: the child must not outlive it.
    starter = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, subprocess, sys, time\n"
        "from npu_conformance import process\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        "                         preexec_fn=process.signalled_when_dead(os.getpid(), signal.SIGKILL))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    child = psutil.Process(int(starter.stdout.readline()))
    starter.kill()
    starter.wait(10)
    deadline = time.monotonic() + 10
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, "the child outlived its starter"


# A parent that starts a sleeping grandchild in its group, prints its pid, then `rest`.
_FORKS = ("import subprocess, sys\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
          "print(child.pid, flush=True)\n")


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_run_in_group_returns_status_and_output_and_leaves_nothing_behind() -> None:
    code, out = process.run_in_group([sys.executable, "-c", _FORKS + "print('done'); sys.exit(3)"],
                                     dict(os.environ), 60, "the forker")
    pid, said = out.split()
    assert code == 3 and said == "done"
    assert _gone(int(pid)), "a process the command forked outlived it"


def test_run_in_group_kills_the_whole_group_at_its_deadline() -> None:
    with pytest.raises(TimeoutError, match=r"the sleeper ran past 2 s") as err:
        process.run_in_group([sys.executable, "-c", _FORKS + "import time; time.sleep(60)"], dict(os.environ), 2,
                             "the sleeper")
    pid = int(str(err.value).split()[-1])  # the output's tail: the grandchild's pid
    assert _gone(pid), "the command's group outlived its deadline"
