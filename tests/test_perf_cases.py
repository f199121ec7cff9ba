"""Which perf cases a card has (npu_conformance.perf.cases), and why one is skipped."""

from __future__ import annotations

import pytest

from npu_conformance import perf

pytestmark = pytest.mark.unit


def test_batch_sizes_and_skips():
    from npu_conformance.cards import PlatformSettings, load_catalog

    card = load_catalog()["granite-4.1-8b"]
    npu = card.platform("npu").perf.batch_sizes
    assert set(npu) <= set(perf.perf_batch_sizes(card))
    assert perf.skip_reason(card, "npu", npu[0]) is None
    other = perf.skip_reason(card, "npu", 3)
    assert "not in granite-4.1-8b's npu perf batch_sizes" in other.reason and not other.gap
    bare = card.model_copy(update={"platforms": {"npu": PlatformSettings()}})
    assert perf.perf_batch_sizes(bare) == [None]
    gap = perf.skip_reason(bare, "npu")
    assert gap.gap and gap.reason.startswith("granite-4.1-8b has no perf settings for platform npu")
    exempt = card.model_copy(update={"platforms": {"npu": PlatformSettings(perf_exempt="measured by another card")}})
    assert perf.skip_reason(exempt, "npu") == perf.NoCase(
        "granite-4.1-8b is exempt from the perf gate on npu: measured by another card", False)
