"""Where a failing card first goes wrong: the target's hidden states against the
reference's, place by place in forward order (engines.taps), per position, for
one teacher-forced prefill of one prompt.

A place diverges when its worst position's relative L2 error exceeds the card's
`diagnosis_rel_l2`, and for a target below fp32 also `noise_k_max` times the
noise-floor reference's own at that place (transformers in the target's dtype;
the worst position is a max-type figure): on the deep bf16 model vLLM's own
attention output sits up to 0.13-0.23 relative L2 from fp32, 3.5x transformers'
bf16 at the same place.
The first divergent place names the layer and sublayer, and what runs between
it and the place before it (a residual add, a norm, a block). Diagnosis never
changes a verdict.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from npu_conformance.cards import Card
from npu_conformance.engines.reference import ReferenceRunner
from npu_conformance.engines.taps import SUBLAYERS
from npu_conformance.engines.target import VllmRunner

_PLACE = re.compile(r"layers\.(\d+)(?:\.(\w+))?$")
_TINY = float(np.finfo(np.float32).tiny)


class PlaceRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    place: str
    layer: int | None  # None: the embedding or the final norm
    sublayer: str  # "output": the layer's output, after its residual adds
    cosine_min: float
    rel_l2_max: float
    max_abs: float
    worst_position: int
    # The noise-floor reference's own rel_l2_max here (None for an fp32 target) and the place's limit.
    noise_rel_l2_max: float | None = None
    limit: float
    diverged: bool


class Diagnosis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str
    rel_l2_limit: float
    rows: list[PlaceRow]
    first: PlaceRow | None  # None: every place within the limit
    # What runs between the place before `first` and it.
    suspect: str | None
    # Places one side tapped and the other did not (compared where both have them).
    unmatched: list[str]
    # Why nothing could be compared, where that is so.
    problem: str | None = None
    seconds: float = 0.0  # both sides' prefill and the reference's load: the cost of diagnosing

    def summary(self) -> str:
        if self.problem:
            return f"{self.prompt}: diagnosis could not run: {self.problem}"
        if self.first is None:
            return (f"{self.prompt}: every one of {len(self.rows)} hidden states within rel L2 {self.rel_l2_limit:g} "
                    "(or the noise floor's own there), "
                    "through the final norm: the error arises after it (lm_head, logits), or on a path one "
                    "prefill does not take (decode steps, batches)")
        where = self.first.place if self.first.layer is None else f"layer {self.first.layer}"
        return (f"{self.prompt}: first divergence at {where}, {self.suspect} ({self.first.place}): "
                f"rel L2 {self.first.rel_l2_max:.3g} (limit {self.first.limit:.3g}) at position {self.first.worst_position}, "
                f"cosine {self.first.cosine_min:.6f}")


def _rel_l2(ref: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """Relative L2 error per position."""
    diff = tgt.astype(np.float64) - ref.astype(np.float64)
    return np.linalg.norm(diff, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), _TINY)


def _row(place: str, ref: np.ndarray, tgt: np.ndarray, limit: float, noise: np.ndarray | None,
         noise_k: float) -> PlaceRow:
    diff = tgt.astype(np.float64) - ref.astype(np.float64)
    ref_norm = np.linalg.norm(ref, axis=-1)
    rel = _rel_l2(ref, tgt)
    cos = np.sum(ref * tgt, axis=-1) / np.maximum(ref_norm * np.linalg.norm(tgt, axis=-1), _TINY)
    match = _PLACE.search(place)
    sublayer = (match.group(2) or "output") if match else place.rsplit(".", 1)[-1]
    noise_rel = None if noise is None else float(_rel_l2(ref, noise).max())
    limit = limit if noise_rel is None else max(limit, noise_k * noise_rel)
    return PlaceRow(place=place, layer=int(match.group(1)) if match else None, sublayer=sublayer,
                    cosine_min=float(cos.min()), rel_l2_max=float(rel.max()), max_abs=float(np.abs(diff).max()),
                    worst_position=int(rel.argmax()), noise_rel_l2_max=noise_rel, limit=limit,
                    diverged=bool(rel.max() > limit))


def compare_places(prompt: str, reference: dict[str, np.ndarray], target: dict[str, np.ndarray],
                   rel_l2_limit: float, noise: dict[str, np.ndarray] | None = None,
                   noise_k: float = 1.0) -> Diagnosis:
    """Compare the places both sides tapped, in the reference's (forward) order;
    with `noise` (the noise-floor reference's hidden states), each place's limit
    is at least `noise_k` times that reference's own error there."""
    rows = [_row(p, ref, target[p], rel_l2_limit, None if noise is None else noise.get(p), noise_k)
            for p, ref in reference.items() if p in target]
    problem = None
    if not rows:
        # Compiled code (graph mode) does not call the hooks; other architectures name their places otherwise.
        problem = (f"no hidden state tapped on both sides (reference {len(reference)}, target {len(target)}): "
                   "an architecture outside the Llama family's module names, or a target in graph mode; "
                   "diagnose the card's eager engine")
    first = next((r for r in rows if r.diverged), None)
    suspect = None
    if first is not None:
        key = "" if first.sublayer == "output" else first.sublayer
        suspect = SUBLAYERS.get(key, first.sublayer) if first.layer is not None else first.sublayer
    return Diagnosis(prompt=prompt, rel_l2_limit=rel_l2_limit, rows=rows, first=first, suspect=suspect,
                     unmatched=sorted(set(reference) ^ set(target)), problem=problem)


def diagnose(prompt: str, prompt_ids: list[int], reference_checkpoint: Path, card: Card,
             target: VllmRunner) -> Diagnosis:
    """One prefill of the prompt on both sides (and on the noise-floor reference,
    for a target below fp32), compared place by place with the card's rules."""
    start = time.perf_counter()
    states = {}
    for name, dtype in (("golden", card.reference_dtype), ("noise", card.noise_dtype)):
        if dtype is not None:
            with ReferenceRunner(reference_checkpoint, dtype, card.trust_remote_code) as reference:
                states[name] = reference.hidden_states(prompt_ids)
    found = compare_places(prompt, states["golden"], target.hidden_states(prompt_ids),
                           card.thresholds.diagnosis_rel_l2, states.get("noise"), card.thresholds.noise_k_max)
    return found.model_copy(update={"seconds": time.perf_counter() - start})
