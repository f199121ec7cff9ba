"""The device pool (npu_conformance.device_pool) with fake device counts: shares per
xdist worker, the devices and visible-devices variable each card's engine gets,
and the wait for a device's memory."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from test_cards import GOOD, write

from npu_conformance import device_pool
from npu_conformance.cards import CardError, load_card, load_catalog
from npu_conformance.plugin import card_of_test

pytestmark = pytest.mark.unit

VARIABLE = "ASCEND_RT_VISIBLE_DEVICES"
TP = {1: "synthetic-llama", 2: "synthetic-llama-tp2"}


@pytest.mark.parametrize("spec, expected", [
    ("0-7", list(range(8))), ("0,2,4", [0, 2, 4]), ("0-3,6", [0, 1, 2, 3, 6]), ("3", [3]), (" 1 , 0 ", [0, 1]),
    ("0-1,1-2", [0, 1, 2]),
])
def test_device_lists(spec: str, expected: list[int]) -> None:
    assert device_pool.parse(spec) == expected


@pytest.mark.parametrize("spec, words", [("", "'' is not a device index"), ("a", "'a' is not"),
                                         ("3-1", "runs backwards"), ("0,,1", "'' is not"), ("-1", "'-1' is not")])
def test_bad_device_lists_say_why(spec: str, words: str) -> None:
    with pytest.raises(device_pool.DeviceError, match=words):
        device_pool.parse(spec)


def test_cards_need_their_parallel_sizes() -> None:
    catalog = load_catalog()
    assert {tp: device_pool.needed(catalog[name].engine_args("npu")) for tp, name in TP.items()} == {1: 1, 2: 2}
    assert device_pool.needed({"tensor_parallel_size": 2, "data_parallel_size": 2, "pipeline_parallel_size": 2}) == 8


@pytest.mark.parametrize("count", [1, 2, 4, 8])
@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("tp", [1, 2])
def test_each_worker_gets_its_own_devices(count: int, workers: int, tp: int) -> None:
    """With `count` fake devices and `workers` xdist workers, a TP=`tp` card on each
    worker gets devices of that worker's share only, never another's."""
    pool = list(range(count))
    if workers > count:
        with pytest.raises(device_pool.DeviceError, match=f"{workers} xdist workers for {count} devices"):
            device_pool.split(pool, workers)
        return
    shares = device_pool.split(pool, workers)
    assert len(shares) == workers and all(len(s) == count // workers for s in shares)
    assert all(set(a).isdisjoint(b) for a, b in itertools.combinations(shares, 2))
    needed = device_pool.needed(load_catalog()[TP[tp]].engine_args("npu"))
    for share in shares:
        if needed > len(share):
            with pytest.raises(device_pool.DeviceError, match=f"needs {needed} devices, and this worker has {len(share)}"):
                device_pool.place(share, needed, VARIABLE)
            continue
        placement = device_pool.place(share, needed, VARIABLE)
        assert placement.devices == tuple(share[:needed])
        assert placement.env == {VARIABLE: ",".join(map(str, share[:needed]))}


def test_shares_of_a_given_list() -> None:
    assert device_pool.split(device_pool.parse("0-7"), 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert device_pool.split([0, 2, 4], 2) == [[0], [2]]  # the rest is unused, not handed out unevenly
    assert device_pool.place([4, 5], 2, "CUDA_VISIBLE_DEVICES").env == {"CUDA_VISIBLE_DEVICES": "4,5"}


def test_a_platform_without_devices_places_nothing() -> None:
    assert device_pool.split([], 3) == [[], [], []]
    assert device_pool.place([], 2, None) == device_pool.Placement((), {})


def test_worker_index() -> None:
    assert [device_pool.worker_index(w) for w in (None, "master", "gw0", "gw7")] == [0, 0, 0, 7]


class FakeDevices:
    """Free memory per device that comes back a step at a time, on a fake clock."""

    def __init__(self, free: dict[int, list[float]]) -> None:
        self.free = free
        self.now = 0.0

    def fraction(self, device: int) -> float:
        steps = self.free[device]
        return steps[min(int(self.now), len(steps) - 1)]

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_memory_wait_returns_once_memory_is_back() -> None:
    fake = FakeDevices({0: [0.1, 0.5, 0.95], 1: [0.95]})
    waited = device_pool.wait_for_memory([0, 1], fake.fraction, 0.92, deadline_s=10, clock=lambda: fake.now,
                                     sleep=fake.sleep)
    assert waited == 2.0


def test_memory_wait_times_out_with_the_figures() -> None:
    fake = FakeDevices({0: [0.95], 1: [0.3]})
    with pytest.raises(device_pool.DeviceError) as err:
        device_pool.wait_for_memory([0, 1], fake.fraction, 0.92, deadline_s=5, clock=lambda: fake.now, sleep=fake.sleep)
    assert str(err.value) == ("device memory not back within 5 s (device 1: 30% free; the engine needs 92%): "
                              "another process holds it")
    assert fake.now == 5.0


def test_no_devices_no_wait() -> None:
    assert device_pool.wait_for_memory([], lambda d: pytest.fail("probed"), 0.92, deadline_s=0) == 0.0


def test_granite_deploys_with_tp2_on_32gb_parts() -> None:
    """Seed 000: one 64 GB card, or two 32 GB cards with TP=2; the part's runner
    and device count route it, and the base entry's perf figures do not apply."""
    granite = load_catalog()["granite-4.1-8b"]
    assert granite.on_device("npu", 64.0) is granite and granite.on_device("npu", None) is granite
    small = granite.on_device("npu", 32.0)
    assert small.part == "32gb-tp2" and small.engine_args("npu")["tensor_parallel_size"] == 2
    settings = small.platform("npu")
    assert (settings.runner, settings.devices, settings.perf) == ("linux-aarch64-a2b3-2", 2, None)
    assert device_pool.needed(small.engine_args("npu")) == settings.devices
    assert granite.platform("npu").runner == "linux-aarch64-a2b3-1" and device_pool.needed(granite.engine_args("npu")) == 1


def test_every_seed_card_says_where_it_runs() -> None:
    seeds = [c for c in load_catalog().values() if c.weights.kind in ("modelscope", "hf")]
    assert len(seeds) == 4
    for card in seeds:
        npu = card.platform("npu")
        assert npu.runner and npu.devices == device_pool.needed(card.engine_args("npu")), card.name


@pytest.mark.parametrize("platforms, field", [
    ({"npu": {"devices": 2}}, "platforms.npu.devices"),
    ({"npu": {"devices": 1, "engine": {"tensor_parallel_size": 2}}}, "platforms.npu.devices"),
    ({"npu": {"parts": {"small": {"max_memory_gb": 32, "devices": 1, "engine": {"tensor_parallel_size": 2}}}}},
     "platforms.npu.parts.small.devices"),
])
def test_a_device_count_the_engine_does_not_use_is_refused(tmp_path: Path, platforms: dict, field: str) -> None:
    with pytest.raises(CardError) as err:
        load_card(write(tmp_path, {**GOOD, "platforms": platforms}))
    assert err.value.field == field and "the engine's parallel sizes use" in str(err.value)


def test_tests_are_scheduled_by_their_card() -> None:
    """xdist's scope under -n is the card a test id names (a variant's base card),
    the longest name first, so synthetic-llama-bf16 is not synthetic-llama."""
    names = sorted(["synthetic-llama", "synthetic-llama-bf16", "synthetic-granite"], key=len, reverse=True)
    cases = {
        "tests/test_precision.py::test_top1_match[synthetic-llama-en_capital]": "synthetic-llama",
        "tests/test_precision.py::test_top1_match[synthetic-llama-bf16-en_capital]": "synthetic-llama-bf16",
        "tests/test_precision.py::test_engine_ran_what_the_card_claims[synthetic-granite]": "synthetic-granite",
        "tests/test_conditions.py::test_condition[synthetic-llama+graph-graph-en_capital]": "synthetic-llama",
        "tests/test_perf.py::test_throughput[synthetic-granite-bs4]": "synthetic-granite",
        "tests/test_device_pool.py::test_worker_index": None,
        "tests/test_device_pool.py::test_device_lists[0-7-expected0]": None,
    }
    assert {nodeid: card_of_test(nodeid, names) for nodeid in cases} == cases
