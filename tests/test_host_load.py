"""The switching CPU load (npu_conformance.host_load) the load self-test and
--perf-load run under."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from npu_conformance.host_load import SwitchingLoad

pytestmark = pytest.mark.unit


def test_switching_load_stops_and_continues_one_spinning_process() -> None:
    import psutil

    with SwitchingLoad() as load:
        proc = psutil.Process(load.pid)
        assert proc.status() == psutil.STATUS_STOPPED and proc.cpu_affinity() == [load.cpu]
        before = time.monotonic()
        load.switch(True)
        time.sleep(0.3)
        assert proc.status() == psutil.STATUS_RUNNING and proc.cpu_times().user > 0.1
        middle = time.monotonic()
        load.switch(False)
        time.sleep(0.3)
        assert proc.status() == psutil.STATUS_STOPPED
        after = time.monotonic()
        assert load.on_fraction(before, middle) == pytest.approx(1.0, abs=0.02)
        assert load.on_fraction(middle + 0.01, after) == 0.0
        assert load.on_fraction(before, after) == pytest.approx(0.5, abs=0.1)
        assert "switched on and off by the test" in load.describe()
    assert not psutil.pid_exists(proc.pid) or proc.status() == psutil.STATUS_ZOMBIE
    with SwitchingLoad(period_s=0.2) as timed:
        time.sleep(0.9)
    assert timed.switches() >= 5 and "every 0.2 s" in timed.describe()
    with pytest.raises(ValueError, match="period > 0"):
        SwitchingLoad(period_s=0)


def test_switching_load_held_by_hand_and_gone_with_its_starter() -> None:
    import psutil

    with SwitchingLoad(period_s=0.1) as load:
        with load.by_hand():
            load.switch(False)
            held = load.switches()
            time.sleep(0.4)
            assert load.switches() == held and "by the test" in load.describe()
        time.sleep(0.4)
        assert load.switches() >= held + 2 and "every 0.1 s" in load.describe()
    # A starter killed outright (no cleanup runs) takes its spinner with it, stopped or not.
    starter = subprocess.Popen([sys.executable, "-c", "import time\nfrom npu_conformance.host_load import "
                                "SwitchingLoad\nwith SwitchingLoad() as load:\n    print(load.pid, flush=True)\n"
                                "    time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        spinner = psutil.Process(int(starter.stdout.readline()))
        assert spinner.status() == psutil.STATUS_STOPPED
    finally:
        starter.kill()
        starter.wait()
    spinner.wait(timeout=5)
