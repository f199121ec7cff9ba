"""Which tokens a sensitivity card's fault perturbs (engines.faults.selected_tokens):
pure tensor logic on small arrays; the faults themselves run in real engines in
tests/test_sensitivity.py."""

import pytest
import torch

from npu_conformance.engines.faults import selected_tokens

pytestmark = pytest.mark.unit

# A mixed step: request A prefills 3 tokens (positions 0-2), B decodes one token
# at 130, C decodes at 131 (adjacent positions, separate requests), one pad row.
POSITIONS = torch.tensor([0, 1, 2, 130, 131, 0])
STARTS = torch.tensor([0, 3, 4, 5])


def test_decode_selects_single_token_requests_only() -> None:
    mask = selected_tokens("decode", POSITIONS, STARTS, block_size=128, min_batch=8)
    assert mask.tolist() == [False, False, False, True, True, False]


def test_past_block_selects_positions_beyond_the_first_block() -> None:
    mask = selected_tokens("past_block", POSITIONS, STARTS, block_size=128, min_batch=8)
    assert mask.tolist() == [False, False, False, True, True, False]
    prefill = selected_tokens("past_block", torch.arange(126, 131), torch.tensor([0, 5]), block_size=128, min_batch=8)
    assert prefill.tolist() == [False, False, True, True, True]


@pytest.mark.parametrize(("requests", "expected"), [(3, False), (7, False), (8, True), (16, True)])
def test_batch_selects_whole_steps_of_enough_requests(requests: int, expected: bool) -> None:
    starts = torch.arange(requests + 1)
    mask = selected_tokens("batch", torch.arange(requests + 2), starts, block_size=128, min_batch=8)
    assert mask.tolist() == [expected] * requests + [False, False]


def test_unknown_path_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault path 'prefill'"):
        selected_tokens("prefill", POSITIONS, STARTS, block_size=128, min_batch=8)
