"""Known answers and properties of npu_conformance.compare.metrics on small arrays."""

import json
import math

import numpy as np
import pytest

from npu_conformance.cards import Thresholds
from npu_conformance.compare import chunks, rules
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


def test_top1_a_tie_in_the_target_gets_one_grid_step_more_and_a_preference_does_not() -> None:
    bf16 = 2.0 ** -7  # grid step 0.25 at logits of 32-64
    ref = np.array([[32.0, 32.5, 0.0]])  # the golden's top-1 is token 1, half a nat ahead of token 0
    tied = np.array([[32.25, 32.25, 0.0]])  # argmax breaks the tie by id: token 0
    assert m.top1_match(ref, tied, 0.3, bf16).all()  # 0.3 + 0.25 covers the 0.5-nat gap
    assert not m.top1_match(ref, tied, 0.2, bf16).any()  # 0.2 + 0.25 does not
    assert not m.top1_match(ref, tied, 0.3).any()  # no grid: no extra step
    preferred = np.array([[32.5, 32.25, 0.0]])  # one step of preference: rounding never reverses an order
    assert not m.top1_match(ref, preferred, 0.3, bf16).any()


def test_top1_a_target_of_one_value_everywhere_fails() -> None:
    # A broken target (an inverted scale) ties every token: the tie is no excuse past the golden's gap.
    ref = np.array([[0.0, 5.0, 0.0], [4.0, 0.0, 3.0]])
    flat = np.zeros_like(ref)
    assert m.top1_match(ref, flat, 0.1, 2.0 ** -7).tolist() == [False, True]


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


def _thresholds(**kw) -> Thresholds:
    base = dict(
        mission_rel_err=0.05, cosine=0.99, cosine_rule="absolute", tie_margin=0.02, logprob_top_k=5,
        logprob_floor=0.1, noise_k=2.0, noise_k_max=3.0, dtype_floor=0.05, dtype_eps=0.0, diagnosis_rel_l2=0.01,
    )
    return Thresholds(**{**base, **kw})


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
    r = rules.compare(ref, tgt, tokens, tokens, ref, tgt, _thresholds())
    json.dumps(r, allow_nan=False)
    assert _plain(r)
    path = {"top1", "logprob_rel_err", "cosine", "logprob_rel_err_position", "logprob_rel_err_full",
            "logit_rel_diff_mean", "logit_rel_diff_median"}
    assert set(r["checks"]) == path | {"greedy"} | {f"decode_{name}" for name in path}
    assert r["positions"] == 4 and r["top1_first"] is True
    assert r["top1_rate"] == 1.0 and r["top1_exact_rate"] == 0.75
    assert r["top1_mismatch_positions"] == []
    assert len(r["logprob_rel_err_per_position"]) == 4
    assert r["greedy_prefix"] == r["greedy_len"] == 4 and r["greedy_ratio"] == 1.0
    assert r["passed"] is True


def test_compare_verdicts_flip_at_thresholds(case):
    ref, tgt, tokens = case

    def run(**kw):
        return rules.compare(ref, tgt, tokens, tokens, ref, tgt, _thresholds(**kw))

    r = run()
    rel, cos = r["logprob_rel_err_mean"], r["cosine_mean"]
    assert r["logprob_rel_err_max"] > rel and r["cosine_min"] < cos  # the worst figures are reported too
    assert run(dtype_floor=rel * 1.001)["checks"]["logprob_rel_err"]["passed"]
    assert not run(dtype_floor=rel * 0.999)["checks"]["logprob_rel_err"]["passed"]
    full = r["logprob_rel_err_full_mean"]
    assert run(mission_rel_err=full * 1.001)["checks"]["logprob_rel_err_full"]["passed"]
    assert not run(mission_rel_err=full)["checks"]["logprob_rel_err_full"]["passed"]
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
        r = rules.compare(ref, tgt, tokens, tgt_tokens, ref, tgt, _thresholds(**kw))
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
    figures, checks = rules.logit_figures(ref, tgt, _thresholds(dtype_floor=0.05))
    assert checks["logprob_rel_err"]["passed"] and not checks["logprob_rel_err_position"]["passed"], figures
    assert figures["logprob_rel_err_worst_position"] in (30, 31)
    assert figures["logprob_rel_err_position_max"] > 5 * figures["logprob_rel_err_mean"]


def test_decode_compared_up_to_first_divergence(case):
    ref, tgt, tokens = case
    # Decode logits wrong from step 2 on, where the greedy sequences have diverged at a far-from-tie token.
    decode = ref.copy()
    decode[2:] = -ref[2:]
    other = tokens[:2] + [int(ref[2].argmin()), tokens[3]]
    r = rules.compare(ref, ref, tokens, other, ref, decode, _thresholds())
    # Rows 0..2 share a context: row 2 is where the target chose the other token.
    assert r["decode"]["positions"] == 3
    assert not r["checks"]["decode_top1"]["passed"] and not r["checks"]["greedy"]["passed"]
    # Teacher-forced rows are the reference's own: that part passes.
    assert r["checks"]["top1"]["passed"] and r["checks"]["cosine"]["passed"]
    clean = rules.compare(ref, ref, tokens, tokens, ref, ref, _thresholds())
    assert clean["decode"]["positions"] == 4 and clean["passed"]


def test_first_generated_row_is_the_one_after_the_prompt(case):
    ref, tgt, tokens = case
    shifted = tgt.copy()
    shifted[1] = -ref[1]  # wrong at the first generated row, with one prompt row before it
    r = rules.compare(ref, shifted, tokens[1:], tokens[1:], ref[1:], ref[1:], _thresholds(), first_generated=1)
    assert r["prompt_positions"] == 1 and r["top1_first"] is False


def _noisy(rng, scale: float, ref: np.ndarray) -> np.ndarray:
    return ref + rng.normal(size=ref.shape) * scale


def test_noise_floor_rule_judges_the_target_against_its_dtypes_own_error(rng):
    """target <= max(k x noise, floor): an error 1.5x the noise floor's passes at
    k=2 and fails at k=1.2; without a noise-floor reference the floor alone rules."""
    ref = rng.normal(size=(64, 128)) * 3
    noise = _noisy(rng, 0.02, ref)
    tgt = _noisy(rng, 0.03, ref)
    t = _thresholds(dtype_floor=1e-6, mission_rel_err=0.5)
    figures, checks = rules.logit_figures(ref, tgt, t, noise)
    check = checks["logprob_rel_err"]
    assert check["noise"] == figures["noise"]["logprob_rel_err_mean"]
    assert 1.2 < check["ratio"] < 2.0 and check["passed"] and check["threshold"] == 2.0 * check["noise"]
    assert not rules.logit_figures(ref, tgt, _thresholds(dtype_floor=1e-6, noise_k=1.2), noise)[1]["logprob_rel_err"]["passed"]
    # The floor: a target within the dtype's rounding passes whatever the noise.
    assert rules.logit_figures(ref, tgt, _thresholds(dtype_floor=1.0, noise_k=0.1), noise)[1]["logprob_rel_err"]["passed"]
    alone = rules.logit_figures(ref, tgt, t)[1]["logprob_rel_err"]
    assert not alone["passed"] and alone["threshold"] == 1e-6 and "noise" not in alone


def test_bf16_cosine_is_judged_on_the_squared_scale(rng):
    """1 - cos grows as the square of a relative error: k and the floor are squared for it."""
    ref = rng.normal(size=(64, 128)) * 3
    noise, tgt = _noisy(rng, 0.02, ref), _noisy(rng, 0.03, ref)
    t = _thresholds(cosine_rule="noise", dtype_floor=1e-6, cosine=0.999999999)
    check = rules.logit_figures(ref, tgt, t, noise)[1]["cosine"]
    gap_ratio = (1 - check["value"]) / (1 - check["noise"])
    assert 2.0 < gap_ratio < 4.0 and check["passed"], check  # 1.5x the error, 2.25x the gap, under k^2 = 4
    assert not rules.logit_figures(ref, tgt, _thresholds(cosine_rule="noise", dtype_floor=1e-6, noise_k=1.2),
                               noise)[1]["cosine"]["passed"]
    # The absolute rule ignores the noise: this target misses 0.999999999.
    assert not rules.logit_figures(ref, tgt, _thresholds(cosine=0.999999999), noise)[1]["cosine"]["passed"]


def test_top1_flip_is_excused_where_the_noise_floor_flips_too(case):
    ref, tgt, tokens = case
    t = _thresholds(tie_margin=0.0)
    assert not rules.logit_figures(ref, tgt, t)[1]["top1"]["passed"]  # position 2 flips, no tie margin
    figures, checks = rules.logit_figures(ref, tgt, t, tgt)  # the noise floor flips the same position
    assert checks["top1"]["passed"] and figures["noise"]["top1_flip_positions"] == [2]
    greedy = rules.compare(ref, ref, tokens, tokens[:2] + [1, tokens[3]], ref, ref, t, noise_logits=tgt)
    assert greedy["checks"]["greedy"]["passed"]
    assert greedy["greedy_divergence_is_tie"] or greedy["greedy_divergence_is_noise"]
    assert not rules.compare(ref, ref, tokens, tokens[:2] + [1, tokens[3]], ref, ref, t, noise_logits=ref
                         )["checks"]["greedy"]["passed"]


def test_mission_figure_falls_back_to_the_noise_only_where_the_dtype_misses_it(rng):
    ref = rng.normal(size=(32, 64)) * 3
    noise, tgt = _noisy(rng, 0.2, ref), _noisy(rng, 0.25, ref)
    held = rules.logit_figures(ref, tgt, _thresholds(mission_rel_err=0.5), noise)[1]["logit_rel_diff_mean"]
    assert held["threshold"] == 0.5 and held["passed"] and "mission" in held["rule"]
    missed = rules.logit_figures(ref, tgt, _thresholds(mission_rel_err=0.001), noise)[1]["logit_rel_diff_mean"]
    assert missed["passed"] and missed["threshold"] == 2.0 * missed["noise"] and "dtype's own error" in missed["rule"]


def test_logit_relative_difference_is_robust_to_logits_near_zero():
    ref = np.array([[4.0, -2.0, 1e-9, 3.0]])
    tgt = ref + np.array([[0.04, -0.02, 0.01, 0.03]])
    per_position, median = m.logit_rel_diff(ref, tgt)
    assert per_position[0] == pytest.approx(0.1 / (9.0 + 1e-9) * 1.0, rel=1e-6)
    assert median == pytest.approx(0.01)


def test_near_tie_is_measured_against_the_dtypes_own_shift(rng):
    """A flip between tokens 0.3 nats apart is rounding where the noise floor itself
    moves the log-probs there by about 0.2 (k=2), and a real error where it moves them by 0.01."""
    ref = rng.normal(size=(3, 32))
    ref[:, 0], ref[:, 1] = 10.0, 9.7  # golden gap 0.3 nats between tokens 0 and 1
    tgt = ref.copy()
    tgt[:, 1] = 10.1  # the target prefers token 1
    t = _thresholds(tie_margin=0.1)
    assert not rules.logit_figures(ref, tgt, t)[1]["top1"]["passed"]
    shifted = ref.copy()
    shifted[:, 0] -= 0.4  # moves the two log-probs by about 0.2 each, no flip
    shift = m.max_abs_logprob_err(ref, shifted, 5)
    np.testing.assert_allclose(rules.tie_margins(ref, shifted, t), 2 * np.maximum(shift, np.median(shift)))
    assert rules.logit_figures(ref, tgt, t, shifted)[1]["top1"]["passed"]
    slight = ref.copy()
    slight[:, 0] -= 0.01
    assert not rules.logit_figures(ref, tgt, t, slight)[1]["top1"]["passed"]


def test_near_tie_margin_pools_the_noise_floors_shift_over_positions(rng):
    """One position's noise shift is a single draw: where it happens to be small, the
    margin is k x the median shift over the positions, and a flip at a gap below that
    is rounding. A flip past k x the median stays a failure."""
    ref = rng.normal(size=(5, 32))
    ref[:, 0], ref[:, 1] = 10.0, 9.7  # golden gap 0.3 nats at every position
    noise = ref.copy()
    noise[:, 0] -= 0.4  # a typical shift of about 0.2 nats ...
    noise[2, 0] = ref[2, 0] - 0.02  # ... and one small draw at position 2
    shift = m.max_abs_logprob_err(ref, noise, 5)
    t = _thresholds(tie_margin=0.1)
    margins = rules.tie_margins(ref, noise, t)
    assert margins[2] == pytest.approx(2 * np.median(shift)) and margins[2] > 2 * shift[2]
    np.testing.assert_allclose(np.delete(margins, 2), 2 * np.delete(shift, 2), rtol=1e-3)
    tgt = ref.copy()
    tgt[2, 1] = 10.1  # the target flips position 2 only
    assert rules.logit_figures(ref, tgt, t, noise)[1]["top1"]["passed"]
    far = ref.copy()
    far[2, 5] = 20.0  # a token the golden puts ~10 nats below its top-1
    assert not rules.logit_figures(ref, far, t, noise)[1]["top1"]["passed"]


def test_figures_chunk_by_chunk_equal_the_whole_array(rng, monkeypatch):
    """Bounded memory changes no figure: rows compared a few at a time give the
    whole-array figures (to float64 summation order)."""
    ref = rng.normal(size=(37, 50)) * 3
    tgt = ref + rng.normal(size=ref.shape) * 0.05
    noise = ref + rng.normal(size=ref.shape) * 0.03
    ref[5, 7] = 0.0  # an entry whose relative difference is infinite
    t = _thresholds(cosine_rule="noise")
    whole = rules.logit_figures(ref, tgt, t, noise)
    monkeypatch.setattr(chunks, "CHUNK_ENTRIES", 3 * 50)
    sizes = []
    chunks.by_rows(lambda r: sizes.append(len(r)) or r[:, 0], ref)
    assert sorted(sizes) == [1] + [3] * 12
    chunked = rules.logit_figures(ref.astype(np.float64), tgt, t, noise)
    assert chunked[1].keys() == whole[1].keys()
    for name, check in whole[1].items():
        assert chunked[1][name]["passed"] == check["passed"]
        assert chunked[1][name]["value"] == pytest.approx(check["value"], rel=1e-12, abs=1e-15), name
    for name, value in whole[0].items():
        if isinstance(value, float):
            assert chunked[0][name] == pytest.approx(value, rel=1e-12, abs=1e-15), name


@pytest.mark.parametrize("shape", [(9, 7), (10, 7), (1, 5)])
def test_median_of_entries_is_exact_in_chunks(rng, monkeypatch, shape):
    a = rng.normal(size=shape)
    b = a + rng.normal(size=shape) * 0.1
    a[0, 0] = 0.0
    whole = float(np.median(m.logit_entries(a, b)))
    monkeypatch.setattr(chunks, "CHUNK_ENTRIES", 2 * shape[1])
    assert chunks.median_of_entries(m.logit_entries, a, b) == whole


def test_median_of_entries_brackets_a_sampled_median_exactly(rng, monkeypatch):
    """Past 2^20 entries the median is bracketed from a strided sample: still exact."""
    a = rng.normal(size=(1100, 1001))
    b = a + rng.standard_cauchy(size=a.shape) * 0.01
    whole = float(np.median(m.logit_entries(a, b)))
    monkeypatch.setattr(chunks, "CHUNK_ENTRIES", 64 * 1001)
    assert chunks.median_of_entries(m.logit_entries, a, b) == whole
