"""Known answers and properties of npu_conformance.compare.metrics on small arrays."""

import json
import math

import numpy as np
import pytest

from npu_conformance.compare import metrics as m

pytestmark = pytest.mark.unit


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def test_log_softmax_normalised_and_stable():
    x = np.array([[0.0, 1.0, 2.0], [1e4, 1e4 - 1.0, -1e4]])
    lp = m.log_softmax(x)
    assert np.isfinite(lp).all()
    np.testing.assert_allclose(np.exp(lp).sum(axis=-1), 1.0)
    np.testing.assert_allclose(lp[0], x[0] - math.log(np.exp(x[0]).sum()))
    np.testing.assert_allclose(lp[1, :2], [-math.log1p(math.exp(-1.0)), -1.0 - math.log1p(math.exp(-1.0))])


def test_identical_logits_are_perfect(rng):
    x = rng.normal(size=(6, 32)) * 3
    assert m.top1_match(x, x, 0.0).all()
    assert (m.logprob_rel_err(x, x, 5, 1e-3) == 0).all()
    assert (m.max_abs_logprob_err(x, x, None) == 0).all()
    np.testing.assert_allclose(m.cosine(x, x), 1.0)
    assert (m.kl_divergence(x, x) == 0).all()
    assert (m.topk_overlap(x, x, 5) == 1.0).all()


def test_shift_invariance_of_logprobs(rng):
    x = rng.normal(size=(2000, 50)) * 5
    y = x + 3.7
    assert m.logprob_rel_err(x, y, 10, 1e-3).max() < 1e-12
    assert m.max_abs_logprob_err(x, y, None).max() < 1e-12
    assert m.top1_match(x, y, 0.0).all()
    # Unclipped, about half of these rows come out at -1e-16 from rounding.
    kl = m.kl_divergence(x, y)
    assert (kl >= 0).all() and kl.max() < 1e-12


def test_cosine_of_logprobs_would_hide_unrelated_distributions(rng):
    a, b = rng.normal(size=(2, 1, 1000))
    # The shared log-sum-exp offset (~log V) dominates the log-prob vectors.
    assert m.cosine(m.log_softmax(a), m.log_softmax(b))[0] > 0.9
    assert abs(m.cosine(a, b)[0]) < 0.2


def test_cosine_known_values_and_zero_vectors():
    ref = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 0.0]])
    tgt = np.array([[0.0, 1.0], [-1.0, -1.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    np.testing.assert_allclose(m.cosine(ref, tgt), [0.0, -1.0, 1.0, 0.0, 1.0])


def test_top1_tie_rule():
    ref = np.array([[2.0, 1.99, 0.0]])
    flipped = np.array([[1.99, 2.0, 0.0]])  # target picks token 1, 0.01 nats behind in the reference
    assert m.top1_match(ref, flipped, 0.02).all()
    assert not m.top1_match(ref, flipped, 0.005).any()
    assert not m.top1_match(ref, flipped, 0.0).any()
    assert m.top1_match(ref, ref + 0.5, 0.0).all()
    far = np.array([[0.0, 0.0, 5.0]])  # token 2 is 2 nats behind
    assert not m.top1_match(ref, far, 1.9).any()
    assert m.top1_match(ref, far, 2.1).all()


def test_top1_exact_tie_in_reference_matches_at_zero_margin():
    ref = np.array([[1.0, 1.0, 0.0]])
    assert m.top1_match(ref, np.array([[0.0, 1.0, 0.5]]), 0.0).all()
    assert m.top1_match(ref, np.array([[1.0, 0.0, 0.5]]), 0.0).all()


def test_logprob_rel_err_known_answer():
    ref = np.array([[0.0, 0.0]])  # lp = -log 2 each
    tgt = np.array([[math.log(3.0), 0.0]])  # p = 3/4, 1/4
    # token 0: log(1.5)/log 2 ~ 0.585; token 1: log 2 / log 2 = 1
    np.testing.assert_allclose(m.logprob_rel_err(ref, tgt, 2, 1e-6), [[math.log(1.5) / math.log(2.0), 1.0]])
    np.testing.assert_allclose(m.max_abs_logprob_err(ref, tgt, 2), [math.log(2.0)])


def test_floor_guards_confident_top1():
    ref = np.array([[20.0] + [0.0] * 9])  # lp_top ~ -9 * e^-20 ~ -2e-8
    tgt = np.array([[19.0] + [0.0] * 9])  # lp_top ~ -5.6e-8: tiny absolute change
    abs_err = m.max_abs_logprob_err(ref, tgt, 1)[0]
    assert abs_err < 1e-7
    assert m.logprob_rel_err(ref, tgt, 1, 1.0)[0, 0] == pytest.approx(abs_err)
    assert m.logprob_rel_err(ref, tgt, 1, 1e-12)[0, 0] > 1.0  # unfloored: noise looks like a 170% error


def test_floor_irrelevant_when_logprobs_are_large():
    ref = np.array([[0.0, 0.0, 0.0, 0.0]])
    tgt = np.array([[0.1, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(m.logprob_rel_err(ref, tgt, 4, 0.5), m.logprob_rel_err(ref, tgt, 4, 1e-9))


def test_kl_known_answer_and_asymmetry():
    p = np.array([[0.0, 0.0]])
    q = np.array([[math.log(3.0), 0.0]])
    kl_pq = m.kl_divergence(p, q)[0]
    kl_qp = m.kl_divergence(q, p)[0]
    assert kl_pq == pytest.approx(0.5 * math.log(4 / 3))
    assert kl_qp == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    assert kl_pq != pytest.approx(kl_qp)


def test_kl_non_negative_on_random_pairs(rng):
    a, b = rng.normal(size=(2, 500, 20)) * 4
    kl = m.kl_divergence(a, b)
    assert (kl >= 0).all() and (kl > 0).all()


def test_topk_overlap_known_answer():
    ref = np.array([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    tgt = np.array([[5.0, 4.0, 0.0, 1.0, 2.0, 3.0]])
    np.testing.assert_allclose(m.topk_overlap(ref, tgt, 3), [2 / 3])
    np.testing.assert_allclose(m.topk_overlap(ref, tgt, 6), [1.0])
    with pytest.raises(ValueError):
        m.topk_overlap(ref, tgt, 7)


def test_shape_mismatch_rejected():
    with pytest.raises(ValueError):
        m.cosine(np.zeros((2, 3)), np.zeros((2, 4)))


def test_greedy_prefix():
    assert m.greedy_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert m.greedy_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert m.greedy_prefix([1, 2, 3], [9, 2, 3]) == 0
    assert m.greedy_prefix([], []) == 0


def _gen_logits(row1: list[float]) -> np.ndarray:
    # Row 0 would call any token a tie; only row 1 (the divergence) may be consulted.
    return np.array([[0.0] * 4, row1, [0.0] * 4])


def test_greedy_divergence_is_tie():
    ref_tokens = [0, 2, 1]
    tie_logits = _gen_logits([0.0, 0.0, 3.0, 2.99])
    far_logits = _gen_logits([0.0, 0.0, 3.0, 0.0])
    assert m.greedy_divergence_is_tie(ref_tokens, ref_tokens, far_logits, 0.0)
    assert m.greedy_divergence_is_tie(ref_tokens, [0, 3, 0], tie_logits, 0.02)
    assert not m.greedy_divergence_is_tie(ref_tokens, [0, 3, 0], tie_logits, 0.005)
    assert not m.greedy_divergence_is_tie(ref_tokens, [0, 3, 0], far_logits, 1.0)
    with pytest.raises(ValueError):
        m.greedy_divergence_is_tie(ref_tokens, [0, 2], far_logits, 1.0)


def _thresholds(**kw) -> m.Thresholds:
    base = dict(
        logprob_rel_err=0.05, cosine=0.99, tie_margin=0.02, logprob_top_k=5, logprob_floor=0.1,
        position_logprob_rel_err=0.2, diagnosis_rel_l2=0.01,
    )
    return m.Thresholds(**{**base, **kw})


@pytest.fixture
def case(rng):
    ref = rng.normal(size=(4, 16)) * 3
    tgt = ref + rng.normal(size=ref.shape) * 0.01
    ref[2, :2] = [10.0, 9.99]  # near-tie at position 2, flipped by the target
    tgt[2, :2] = [9.99, 10.0]
    tokens = [int(t) for t in ref.argmax(axis=-1)]
    return ref, tgt, tokens


def _plain(obj) -> bool:
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_plain(v) for v in obj)
    return type(obj) in (bool, int, float, str)


def test_compare_report_shape_and_serialisable(case):
    ref, tgt, tokens = case
    r = m.compare(ref, tgt, tokens, tokens, ref, tgt, _thresholds())
    json.dumps(r, allow_nan=False)
    assert _plain(r)
    assert set(r["checks"]) == {"top1", "logprob_rel_err", "cosine", "logprob_rel_err_position", "greedy",
                                "decode_top1", "decode_logprob_rel_err", "decode_cosine",
                                "decode_logprob_rel_err_position"}
    assert r["positions"] == 4 and r["top1_first"] is True
    assert r["top1_rate"] == 1.0 and r["top1_exact_rate"] == 0.75
    assert r["top1_mismatch_positions"] == []
    assert len(r["logprob_rel_err_per_position"]) == 4
    assert r["greedy_prefix"] == r["greedy_len"] == 4 and r["greedy_ratio"] == 1.0
    assert r["passed"] is True


def test_compare_verdicts_flip_at_thresholds(case):
    ref, tgt, tokens = case

    def run(**kw):
        return m.compare(ref, tgt, tokens, tokens, ref, tgt, _thresholds(**kw))

    r = run()
    rel, cos = r["logprob_rel_err_mean"], r["cosine_mean"]
    assert r["logprob_rel_err_max"] > rel and r["cosine_min"] < cos  # the worst figures are reported too
    assert run(logprob_rel_err=rel * 1.001)["checks"]["logprob_rel_err"]["passed"]
    assert not run(logprob_rel_err=rel)["checks"]["logprob_rel_err"]["passed"]
    assert run(cosine=cos - 1e-9)["checks"]["cosine"]["passed"]
    failed = run(cosine=cos)
    assert not failed["checks"]["cosine"]["passed"] and failed["passed"] is False
    no_tie = run(tie_margin=0.005)
    assert not no_tie["checks"]["top1"]["passed"] and no_tie["top1_mismatch_positions"] == [2]
    assert no_tie["checks"]["top1"]["value"] == 0.75


def test_compare_greedy_check(case):
    ref, tgt, tokens = case
    flipped = tokens[:2] + [1, tokens[3]]  # the near-tie token at position 2
    real = tokens[:2] + [int(ref[2].argmin()), tokens[3]]

    def greedy(tgt_tokens, **kw):
        r = m.compare(ref, tgt, tokens, tgt_tokens, ref, tgt, _thresholds(**kw))
        return r["checks"]["greedy"]["passed"], r["greedy_ratio"]

    assert greedy(tokens) == (True, 1.0)
    assert greedy(flipped) == (True, 0.5)  # diverges at the reference's own near-tie
    assert greedy(flipped, tie_margin=0.005) == (False, 0.5)
    assert greedy(real) == (False, 0.5)
    # A target that stops early or runs on fails the check instead of raising.
    assert greedy(tokens[:3]) == (False, 0.75)
    assert greedy(tokens + [0]) == (False, 1.0)


def test_top_probs_orders_tokens_by_probability():
    rows = m.top_probs(np.array([0.0, 2.0, 1.0, -1.0]), 2)
    assert [r[0] for r in rows] == [1, 2]
    assert rows[0][1] == pytest.approx(math.exp(2) / sum(math.exp(x) for x in (0, 2, 1, -1)))


def test_position_local_rule_catches_what_the_mean_dilutes(rng):
    """A fault at 2 of 40 positions moves the mean little and the worst position a lot."""
    ref = rng.normal(size=(40, 64)) * 3
    tgt = ref.copy()
    tgt[[30, 31]] = ref[[30, 31]] * 1.3  # e.g. a wrong RoPE past a KV block
    figures, checks = m.logit_figures(ref, tgt, _thresholds(logprob_rel_err=0.05, position_logprob_rel_err=0.05))
    assert checks["logprob_rel_err"]["passed"] and not checks["logprob_rel_err_position"]["passed"], figures
    assert figures["logprob_rel_err_worst_position"] in (30, 31)
    assert figures["logprob_rel_err_position_max"] > 5 * figures["logprob_rel_err_mean"]


def test_decode_compared_up_to_first_divergence(case):
    ref, tgt, tokens = case
    # Decode logits wrong from step 2 on, where the greedy sequences have diverged at a far-from-tie token.
    decode = ref.copy()
    decode[2:] = -ref[2:]
    other = tokens[:2] + [int(ref[2].argmin()), tokens[3]]
    r = m.compare(ref, ref, tokens, other, ref, decode, _thresholds())
    # Rows 0..2 share a context: row 2 is where the target chose the other token.
    assert r["decode"]["positions"] == 3
    assert not r["checks"]["decode_top1"]["passed"] and not r["checks"]["greedy"]["passed"]
    # Teacher-forced rows are the reference's own: that part passes.
    assert r["checks"]["top1"]["passed"] and r["checks"]["cosine"]["passed"]
    clean = m.compare(ref, ref, tokens, tokens, ref, ref, _thresholds())
    assert clean["decode"]["positions"] == 4 and clean["passed"]


def test_first_generated_row_is_the_one_after_the_prompt(case):
    ref, tgt, tokens = case
    shifted = tgt.copy()
    shifted[1] = -ref[1]  # wrong at the first generated row, with one prompt row before it
    r = m.compare(ref, shifted, tokens[1:], tokens[1:], ref[1:], ref[1:], _thresholds(), first_generated=1)
    assert r["prompt_positions"] == 1 and r["top1_first"] is False
