"""Precision conformance: the target engine against the CPU transformers reference,
per card and prompt, on the card's thresholds (defaults: tie-aware Top-1 match at
every position, mean logprob relative error < 1%, mean cosine of raw logits
> 0.9999, the worst position's error, greedy agreement), on the teacher-forced
prefill (prompt and generated positions) and on the decode path; see
npu_conformance/compare/metrics.py for the exact rules."""

from typing import Any

import pytest

pytestmark = pytest.mark.precision


def _figures(result: dict[str, Any]) -> str:
    keys = ("top1_rate", "logprob_rel_err_mean", "logprob_rel_err_max", "max_abs_logprob_err", "cosine_mean", "cosine_min",
            "kl_max", "greedy_prefix", "greedy_len")
    return ", ".join(f"{k}={result[k]:.6g}" for k in keys)


def _failure(result: dict[str, Any], name: str) -> str | None:
    check = result["checks"][name]
    if check["passed"]:
        return None
    return f"{name}: {check['value']:.6g} vs threshold {check['threshold']:.6g} ({check['rule']})"


def _check(precision_results: dict[str, dict[str, Any]], prompt_id: str, name: str) -> None:
    result = precision_results[prompt_id]
    failure = _failure(result, name)
    assert failure is None, f"{failure}; {_figures(result)}"


def test_top1_match(precision_results, prompt_id):
    """The target's argmax equals the reference's at every teacher-forced position (near-ties excepted)."""
    result = precision_results[prompt_id]
    assert result["top1_first"], f"first generated token differs from the reference; {_figures(result)}"
    _check(precision_results, prompt_id, "top1")


def test_logprob_error(precision_results, prompt_id):
    _check(precision_results, prompt_id, "logprob_rel_err")


def test_logits_cosine(precision_results, prompt_id):
    _check(precision_results, prompt_id, "cosine")


def test_worst_position_logprob_error(precision_results, prompt_id):
    """No single position's mean top-k error past the position-local limit: a
    fault confined to a few positions, which the mean dilutes, fails here."""
    _check(precision_results, prompt_id, "logprob_rel_err_position")


def test_decode_path(precision_results, prompt_id):
    """The decode logits (the target's own free-running steps) against the
    reference's at the same context, with the teacher-forced rules."""
    result = precision_results[prompt_id]
    names = ("decode_top1", "decode_logprob_rel_err", "decode_cosine", "decode_logprob_rel_err_position")
    failures = [f for name in names if (f := _failure(result, name))]
    assert not failures, "; ".join(failures) + f"; decode figures over {result['decode']['positions']} steps: " + (
        ", ".join(f"{k}={result['decode'][k]:.6g}" for k in ("top1_rate", "logprob_rel_err_mean",
                                                             "logprob_rel_err_position_max", "cosine_mean")))


def test_greedy_agreement(precision_results, prompt_id):
    """Free-running greedy output has the reference's length and equals it, or first diverges at a reference near-tie."""
    _check(precision_results, prompt_id, "greedy")


def test_engine_ran_what_the_card_claims(card, engine_evidence):
    """The evidence behind every figure above: vLLM's native class for the card's
    architecture, the card's dtype, an attention backend, and a quantization path
    the card allows (see npu_conformance/compare/evidence.py)."""
    verdict = engine_evidence["verdict"]
    ran = {k: engine_evidence[k] for k in ("model_class", "dtype", "attention_backends", "quantization")}
    assert verdict["passed"], f"{card.name}: " + "; ".join(verdict["problems"]) + f" (evidence: {ran})"
