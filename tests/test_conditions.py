"""Precision under serving conditions: the card's prompts again at batch 1, in a
batch of 16 of mixed lengths, on prefix-cache hits, with chunked prefill and in
graph mode (the card's `conditions:`), each against the same reference with the
same checks; each run must also show that its condition took effect."""

from typing import Any

import pytest

pytestmark = pytest.mark.precision


def test_condition_matches_reference(condition_case: tuple[str, str, str], condition_result: dict[str, Any]) -> None:
    _, name, prompt_id = condition_case
    problems = condition_result["evidence"]["problems"]
    assert not problems, f"condition {name} did not take effect: " + "; ".join(problems)
    result = condition_result["prompts"][prompt_id]
    failed = {k: f"{c['value']:.6g} vs {c['threshold']:.6g}" for k, c in result["checks"].items() if not c["passed"]}
    assert not failed, (f"under {name}, {result['copies'] - result['copies_passed']} of {result['copies']} "
                        f"copies of {prompt_id} failed: {failed} (rules: "
                        + "; ".join(result["checks"][k]["rule"] for k in failed) + ")")
