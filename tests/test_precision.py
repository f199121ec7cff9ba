"""Precision conformance: the target engine against the fp32 CPU transformers
golden, per card and prompt, on the teacher-forced prefill (prompt and generated
positions) and on the decode path. The mission's figures are asserted where the
target's dtype can meet them (full-vocabulary log-prob error and raw-logit
relative difference < 1%, cosine > 0.9999 for fp16/fp32); the figures that grow
with rounding (top-5 log-prob error, the worst position, bf16's cosine) against
the noise floor, the same figures of transformers in the target's dtype; Top-1
and greedy flips only where the golden has a near-tie or the noise floor flips
too. See npu_conformance/compare/metrics.py for the exact rules."""

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
    noise = f", noise floor {check['noise']:.6g}" if check.get("noise") is not None else ""
    return f"{name}: {check['value']:.6g} vs threshold {check['threshold']:.6g}{noise} ({check['rule']})"


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


def test_full_vocabulary_logprob_error(precision_results, prompt_id):
    """The mission's < 1% in seed 004's formulation: every entry of the vocabulary."""
    _check(precision_results, prompt_id, "logprob_rel_err_full")


def test_logits_relative_difference(precision_results, prompt_id):
    """The mission's < 1% in seed 000's formulation: mean and median relative difference of the raw logits."""
    result = precision_results[prompt_id]
    failures = [f for name in ("logit_rel_diff_mean", "logit_rel_diff_median") if (f := _failure(result, name))]
    assert not failures, "; ".join(failures) + f"; {_figures(result)}"


def test_worst_position_logprob_error(precision_results, prompt_id):
    """No single position's mean top-k error past the position-local limit: a
    fault confined to a few positions, which the mean dilutes, fails here."""
    _check(precision_results, prompt_id, "logprob_rel_err_position")


def test_decode_path(precision_results, prompt_id):
    """The decode logits (the target's own free-running steps) against the
    reference's at the same context, with the teacher-forced rules."""
    result = precision_results[prompt_id]
    names = [name for name in result["checks"] if name.startswith("decode_")]
    assert names, f"no decode step was compared; {_figures(result)}"
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
    the card allows (see npu_conformance/compare/evidence_rules.py)."""
    verdict = engine_evidence["verdict"]
    ran = {k: engine_evidence[k] for k in ("model_class", "dtype", "attention_backends", "quantization")}
    assert verdict["passed"], f"{card.name}: " + "; ".join(verdict["problems"]) + f" (evidence: {ran})"


def test_captured_logits_are_what_vllms_logprobs_api_returns(card, target, reference):
    """The target's logits come from the workers' recording (engines.capture), not
    from vLLM's per-entry logprobs: on the card's shortest prompt, the recorded
    rows equal bit for bit the full raw-logit vectors vLLM's own API returns for
    the same prefill and decode steps (`prompt_logprobs=-1`, `logprobs=-1`)."""
    import numpy as np

    from npu_conformance import vllm_api

    def dense(positions) -> np.ndarray:
        rows = np.full((len(positions), target.vocab_size), -np.inf, dtype=np.float32)
        for i, position in enumerate(positions):
            for token, logprob in position.items():
                if token < target.vocab_size:
                    rows[i, token] = logprob.logprob
        return rows

    prompt = min((r.full_ids for r in reference.values()), key=len)[:6]
    [api] = target.generate([prompt], vllm_api.sampling_params(temperature=0.0, max_tokens=3, ignore_eos=True,
                                                               prompt_logprobs=-1, logprobs=-1))
    [forced] = target.teacher_forced([prompt])
    [(tokens, greedy)] = target.greedy([prompt], 3)
    assert tokens == list(api.outputs[0].token_ids)
    np.testing.assert_array_equal(forced, dense(api.prompt_logprobs[1:]))
    np.testing.assert_array_equal(greedy, dense(api.outputs[0].logprobs))
