"""The precision checks must catch real adaptation bugs: each known-buggy card
(expect.verdict: fail) runs a real vLLM engine on a mutated checkpoint against
the reference built from the correct one, and the checks named in its
`caught_by` must fail. That rounding is not flagged is proven by the bf16 card
(synthetic-llama-bf16), which the precision tests must pass."""

import pytest

pytestmark = pytest.mark.sensitivity


def test_bug_is_caught(card, precision_results):
    failing = {name: sorted(pid for pid, r in precision_results.items() if not r["checks"][name]["passed"])
               for name in card.expect.caught_by}
    missed = [name for name, prompts in failing.items() if not prompts]
    assert not missed, (
        f"{card.name}: checks {missed} passed on every prompt although the target is known to be wrong "
        f"({card.weights.describe()}); worst figures: "
        + "; ".join(f"{pid}: rel err {r['logprob_rel_err_max']:.3%}, cosine {r['cosine_min']:.6f}, top1 {r['top1_rate']:.0%}"
                    for pid, r in precision_results.items())
    )


def test_bug_fails_the_verdict_on_every_prompt(card, precision_results):
    """A bug in the weights or the model code shows on any input, not on a lucky few."""
    passed = sorted(pid for pid, r in precision_results.items() if r["passed"])
    assert not passed, f"{card.name}: prompts {passed} passed every precision check"
