"""Recorded perf baselines (npu_conformance.baselines): recording, finding, the
shipped files, and a malformed file's message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npu_conformance import baselines, perf

from perf_samples import KEY, sample_measurement

pytestmark = pytest.mark.unit


def test_record_and_find(tmp_path: Path):
    run = sample_measurement([0.04] * 3, [0.08] * 3).as_run()
    assert run.tok_s == 100.0 and run.normalized == pytest.approx(2.0) and run.calibration_tok_s == 50.0
    for _ in range(12):
        baselines.record("c", KEY, {"vllm": "1"}, run, tmp_path)
    baselines.record("c", KEY, {"vllm": "2"}, run.model_copy(update={"recorded_at": "2027"}), tmp_path)
    loaded = baselines.load("c", tmp_path)
    assert [len(e.runs) for e in loaded.entries] == [baselines.settings()["baselines"]["keep"], 1]
    assert baselines.find(loaded, KEY, {"vllm": "1"}).versions == {"vllm": "1"}
    # Versions never recorded: the newest entry for the key.
    assert baselines.find(loaded, KEY, {"vllm": "3"}).versions == {"vllm": "2"}
    assert baselines.find(loaded, KEY.model_copy(update={"batch_size": 4}), {"vllm": "1"}) is None
    assert baselines.load("absent", tmp_path).entries == ()


@pytest.mark.parametrize("text, field", [
    ('{"format": 2, "card": "c", "entries": [{"key": {}}]}', "entries[0].key.platform"),
    ('{"format": 2, "card": "c", "extra": 1}', "extra"),
    ('{"format": 2, "card": "other"}', "card"),
    # A file of the format before keys named the quantization path: told so, not misread.
    ('{"format": 1, "card": "c"}', "format"),
    ('{"format": 1,', "<json>"),
])
def test_malformed_baseline_names_file_and_field(tmp_path: Path, text: str, field: str):
    from npu_conformance.cards import CardError

    (tmp_path / "c.json").write_text(text)
    with pytest.raises(CardError, match=f"perf baseline {tmp_path / 'c.json'}: field '{re.escape(field)}'"):
        baselines.load("c", tmp_path)


def test_shipped_baselines_are_valid():
    from npu_conformance.cards import load_catalog

    catalog = load_catalog()
    for file in baselines.BASELINES_DIR.glob("*.json"):
        assert file.stem in catalog, f"{file}: no card {file.stem!r}"
        loaded = baselines.load(file.stem)
        for entry in loaded.entries:
            settings = catalog[file.stem].platform(entry.key.platform)
            if entry.key.metric == "output_tok_s":
                spec = settings.perf
                assert spec and entry.key.batch_size in spec.batch_sizes, f"{file}: {entry.key} is no perf case"
            else:
                lat = settings.latency
                assert lat and lat.run and (entry.key.batch_size, entry.key.input_len, entry.key.output_len) == (
                    lat.concurrency, lat.input_len, lat.output_len), f"{file}: {entry.key} is no latency case"


def test_a_host_reads_only_its_own_devices_baselines():
    from npu_conformance.cards import load_catalog
    from npu_conformance.platforms import Platform

    npu = Platform(name="npu", plugin="vllm_ascend", device_name="Ascend910B4", host="Linux aarch64", versions={},
                   device_count=8)
    assert npu.perf_device == "Ascend910B4"
    xeon = {"name": "cpu", "plugin": "vllm", "device_name": "Intel(R) Xeon(R) Processor", "host": "Linux x86_64",
            "versions": {}}
    avx512 = Platform(**xeon, cpu_flags=("avx2", "avx512f"))
    amx = Platform(**xeon, cpu_flags=("avx2", "avx512f", "amx_tile"))
    assert avx512.perf_device == "Intel(R) Xeon(R) Processor [avx2 avx512f]" != amx.perf_device
    card = load_catalog()["synthetic-llama"]
    spec = card.platform("cpu").perf
    shipped = baselines.load(card.name)
    # The shipped CPU baselines were recorded on an AVX-512 host without AMX: an AMX
    # (or AVX2-only) host finds none, and its cases are measured, not gated.
    assert baselines.find(shipped, perf.baseline_key(card, avx512, spec, 1, "none"), {}) is not None
    assert baselines.find(shipped, perf.baseline_key(card, amx, spec, 1, "none"), {}) is None
    assert perf.judge(sample_measurement([0.04] * 3), None, spec, "hint").verdict == "measured"
