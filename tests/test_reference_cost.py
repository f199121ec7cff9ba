"""What the noise-floor reference costs: one forward pass per prompt in the
target's dtype, against the fp32 golden's greedy continuation and its
teacher-forced pass, on the same card's checkpoint and prompts. Timed by pytest-benchmark, each round running both
passes back to back so that the host's load falls on both alike."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from npu_conformance.cards import load_catalog
from npu_conformance.engines.reference import ReferenceRunner, tokenize_prompts
from npu_conformance.synthetic import build_checkpoint

pytestmark = pytest.mark.perf

# The deep bf16 default card: the noise floor's cost grows with depth as the golden's does.
CARD = "synthetic-llama-bf16"
ROUNDS = 3


def test_noise_floor_pass_costs_no_more_than_the_golden_pass(benchmark: Any, pytestconfig: pytest.Config) -> None:
    card = load_catalog()[CARD]
    checkpoint: Path = build_checkpoint(card.weights.ref, pytestconfig.getoption("cache_dir"))
    prompts = tokenize_prompts(checkpoint, card.prompts, card.trust_remote_code, card.fill_tokens("cpu"))
    times: dict[str, list[float]] = {"golden": [], "noise": []}
    with ReferenceRunner(checkpoint, card.reference_dtype, card.trust_remote_code) as golden, \
            ReferenceRunner(checkpoint, card.noise_dtype, card.trust_remote_code) as noise:
        sequences = {pid: golden.run(ids, card.max_tokens).full_ids[:-1] for pid, ids in prompts.items()}

        def both() -> None:
            start = time.perf_counter()
            for ids in prompts.values():
                golden.run(ids, card.max_tokens)
            middle = time.perf_counter()
            for ids in sequences.values():
                noise.teacher_forced(ids)
            times["golden"].append(middle - start)
            times["noise"].append(time.perf_counter() - middle)

        benchmark.pedantic(both, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    golden_s, noise_s = statistics.median(times["golden"]), statistics.median(times["noise"])
    benchmark.extra_info.update(golden_pass_s=golden_s, noise_pass_s=noise_s, ratio=noise_s / golden_s,
                                prompts=len(prompts), positions=sum(len(s) for s in sequences.values()))
    assert noise_s <= golden_s, (
        f"{CARD}: the noise-floor pass took {noise_s:.2f} s (median of {ROUNDS}), the fp32 golden pass "
        f"{golden_s:.2f} s, over {len(prompts)} prompts")
