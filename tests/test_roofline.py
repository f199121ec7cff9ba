"""The bandwidth roofline (npu_conformance.perf.roofline)."""

from __future__ import annotations

import pytest

from npu_conformance import perf

pytestmark = pytest.mark.unit


def test_roofline():
    assert perf.roofline_tok_s(2e9, 1000.0, 1) == pytest.approx(500.0)
    assert perf.roofline_tok_s(2e9, 1000.0, 8) == pytest.approx(4000.0)


@pytest.mark.parametrize("name, gb_s", [
    ("Ascend910B4", 800), ("Ascend910B3", 1600), ("Ascend910B2", 1600),
    ("NVIDIA H200", 4800), ("NVIDIA H20", 4000), ("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H100 PCIe", 2000),
    ("NVIDIA A100-SXM4-80GB", 2039), ("NVIDIA A100-SXM4-40GB", 1555), ("NVIDIA L4", 300), ("NVIDIA L40S", 864),
    ("NVIDIA A10G", 600), ("Tesla T4", 320), ("AMD EPYC", None), ("NVIDIA GH200 480GB", None),
])
def test_published_bandwidth(name, gb_s):
    entry = perf.published_bandwidth(name, perf.load_bandwidths()["devices"])
    assert (entry["bandwidth_gb_s"] if entry else None) == gb_s
