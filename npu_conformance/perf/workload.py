"""The work of one round: random token-id prompts of exact length, decoded to an
exact length, fresh in every round of the session so prefix caching never skips
a prefill."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from npu_conformance import vllm_api

# One seed per round across the session: no two rounds share a prompt.
_prompt_seeds = itertools.count()


def synthetic_prompts(vocab_size: int, batch_size: int, input_len: int, seed: int) -> list[list[int]]:
    """`batch_size` random token-id prompts of exactly `input_len` tokens: no
    tokenizer round trip can change their length."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=(batch_size, input_len)).tolist()


def fresh_prompts(vocab_size: int, batch_size: int, input_len: int) -> list[list[int]]:
    return synthetic_prompts(vocab_size, batch_size, input_len, next(_prompt_seeds))


def exact_length_params(output_len: int) -> Any:
    return vllm_api.sampling_params(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)
