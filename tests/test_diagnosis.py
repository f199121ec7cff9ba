"""Diagnosis (compare.diagnosis, engines.taps): a card that passes has every
hidden state within the limit, on every default card (rounding of bf16, fp16 GPTQ
and FP8 included); the comparison names the first place past it. Where it finds
each sensitivity card's bug is asserted in tests/test_sensitivity.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npu_conformance.cards import Card
from npu_conformance.compare.diagnosis import compare_places, diagnose
from npu_conformance.engines.taps import as_stream, places
from npu_conformance.engines.target import VllmRunner


@pytest.mark.harness
def test_a_passing_card_is_within_the_limit_everywhere(card: Card, reference: dict[str, Any],
                                                       reference_checkpoint: Path, target: VllmRunner) -> None:
    # The longest prompt: most positions, and past the KV block where the card has one.
    pid = max(reference, key=lambda p: len(reference[p].prompt_ids))
    found = diagnose(pid, reference[pid].prompt_ids, reference_checkpoint, card, target)
    assert found.problem is None, found.summary()
    assert len(found.rows) >= 3 and not found.unmatched, found.summary()
    assert found.first is None, found.summary() + "; per place: " + ", ".join(
        f"{r.place} {r.rel_l2_max:.2g}" for r in found.rows)
    worst = max(found.rows, key=lambda r: r.rel_l2_max)
    print(f"{card.name}: {len(found.rows)} places, worst {worst.place} rel L2 {worst.rel_l2_max:.3g}")


# --- pure code: the comparison and the taps' bookkeeping, on small arrays ------------


def _places(scale: dict[str, float]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    ref = {p: rng.standard_normal((5, 16)).astype(np.float32) for p in PLACES}
    return ref, {p: v * scale.get(p, 1.0) for p, v in ref.items()}


PLACES = places(["model", "model.embed_tokens", "model.layers", "model.layers.1", "model.layers.0",
                 "model.layers.0.mlp", "model.layers.0.self_attn", "model.layers.0.input_layernorm",
                 "model.layers.0.post_attention_layernorm", "model.layers.1.self_attn", "model.norm", "lm_head"])


@pytest.mark.unit
def test_places_are_in_forward_order() -> None:
    assert PLACES == ["model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn",
                      "model.layers.0.post_attention_layernorm", "model.layers.0.mlp", "model.layers.0",
                      "model.layers.1.self_attn", "model.layers.1", "model.norm"]


@pytest.mark.unit
@pytest.mark.parametrize("broken, layer, sublayer, suspect", [
    ("model.layers.0.post_attention_layernorm", 0, "post_attention_layernorm", "the residual add after self_attn"),
    ("model.layers.0", 0, "output", "the residual add after mlp"),
    ("model.layers.1.self_attn", 1, "self_attn", "self_attn (q/k/v"),
    ("model.embed_tokens", None, "embed_tokens", "embed_tokens"),
])
def test_the_first_place_past_the_limit_is_named(broken: str, layer: int | None, sublayer: str, suspect: str) -> None:
    # Everything from the broken place on is off by 5%, as an error carried forward is.
    ref, tgt = _places({p: 1.05 for p in PLACES[PLACES.index(broken):]})
    found = compare_places("p", ref, tgt, 0.01)
    assert (found.first.place, found.first.layer, found.first.sublayer) == (broken, layer, sublayer)
    assert found.suspect.startswith(suspect) and found.problem is None
    assert abs(found.first.rel_l2_max - 0.05) < 1e-6 and found.first.cosine_min > 0.9999  # a pure scale
    assert all(not r.diverged for r in found.rows[:PLACES.index(broken)])


@pytest.mark.unit
def test_within_the_limit_everywhere_names_no_place() -> None:
    ref, tgt = _places({p: 1.005 for p in PLACES})
    found = compare_places("p", ref, tgt, 0.01)
    assert found.first is None and found.suspect is None and "every one of 9" in found.summary()


@pytest.mark.unit
def test_nothing_in_common_says_why_diagnosis_cannot_run() -> None:
    ref, _ = _places({})
    found = compare_places("p", ref, {"transformer.h.0": ref["model.layers.0"]}, 0.01)
    assert found.rows == [] and found.first is None and "could not run" in found.summary()
    assert "transformer.h.0" in found.unmatched


@pytest.mark.unit
def test_a_vllm_layer_output_is_hidden_plus_residual() -> None:
    import torch

    hidden, residual = torch.ones(2, 3), torch.full((2, 3), 2.0)
    assert torch.equal(as_stream((hidden, residual), layer_output=True), torch.full((2, 3), 3.0))
    # transformers' attention returns (output, weights); vLLM's fused norm (normed, residual).
    assert as_stream((hidden, None), layer_output=False) is hidden
    assert as_stream((hidden, residual), layer_output=False) is hidden
