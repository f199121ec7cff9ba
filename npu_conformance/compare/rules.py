"""The rules that judge compare.metrics' figures: a target's logits against the
fp32 golden, per check a verdict with its value, limit and evidence.

A target that runs below fp32 is judged against a noise floor (msprobe's dual
benchmark): the same figures of the noise-floor reference (transformers in the
target's dtype, same weights, same positions) against the same golden. A
figure that grows with rounding passes at most `noise_k` (mean-type) or
`noise_k_max` (the worst position) times the noise floor's, never below the
dtype's floor; without a noise-floor reference (an fp32 target) the floor alone
rules, thousands of times stricter than 1%. Every check carries the target's
value, the limit, the noise floor's value and their ratio.

Figures and rules:

- top1 (tie-aware): position i matches if the golden's own log-prob of the
  target's argmax token is within the position's tie margin of the golden's
  maximum: `tie_margin` nats, or `noise_k` times the shift the noise
  floor's rounding makes among the golden's top-k there, never less than
  its median shift over the positions (bf16 moves a confident model's
  log-probs by 0.1-0.4 nats), plus one step of the target dtype's grid where
  the target's logits tie the golden's top-1 with their maximum; or where the
  noise-floor reference flips that position on its own.
- logprob relative error: for each of the golden's top-k tokens at each
  position, |lp_tgt - lp_ref| / max(|lp_ref|, floor). The floor keeps a
  confident top-1 (lp ~ 0) from turning noise into a huge ratio. The mean
  over positions and tokens is judged against the noise floor: it is the
  figure that grows with a model's confidence.
- position-local: the worst position's mean over the golden's top-k of the
  same relative error, against the noise floor's worst position. The mean
  dilutes a fault confined to a few positions (past one KV block, say); this
  one does not.
- cosine: of the raw logit vectors, never of log-probs (their shared
  log-sum-exp offset makes cosine ~ 1 even for unrelated distributions); the
  mean over positions. Absolute (the mission's > 0.9999) where `cosine_rule`
  says so (fp16, fp32); in bf16 against the noise floor on 1 - cos, with k
  and the floor squared (1 - cos grows as the square of a relative error).
- the mission's "< 1%" in the seeds' own formulations: the mean relative
  error of the full-vocabulary log-probs (seed 004), and the mean (as
  mean|dlogit| / mean|logit| per position) and median (over entries) relative
  difference of the raw logits (seed 000). Absolute, unless k times the noise
  floor's own figure is past 1% (the dtype alone cannot resolve it): then
  that is the limit, and the rule says so.
- KL: KL(P_ref || P_tgt) in nats, >= 0 (rounding negatives clipped to 0);
  top-k overlap: |topk(ref) & topk(tgt)| / k. Reported, not judged.
- greedy: the two free-running greedy continuations have the same length and
  agree; a divergence is excused where, at the first differing step d, the
  golden gives the target's token a log-prob within the tie margin of its own
  token, or the noise-floor reference flips that step too.
- decode: the target's free-running decode logits against the golden's at
  the same step, while the two contexts are equal (up to and including the
  first divergence), with the same rules (the noise floor's teacher-forced
  rows at those steps share the contexts). On an NPU decode runs other
  kernels (paged attention) than the teacher-forced prefill.
- ``compare`` bundles everything into a JSON-serialisable report with
  pass/fail checks for the teacher-forced positions (prompt and generated),
  the same of the decode path (decode_*), and greedy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npu_conformance.cards import Thresholds
from npu_conformance.compare.chunks import by_rows
from npu_conformance.compare.metrics import (figures_of, greedy_divergence_is_tie, greedy_prefix, max_abs_logprob_err,
                                             top1_match)


def _check(value: float, threshold: float, passed: bool, rule: str, noise: float | None = None) -> dict:
    check = {"value": value, "threshold": threshold, "passed": bool(passed), "rule": rule}
    if noise is not None:
        check["noise"] = noise
        check["ratio"] = value / noise if noise > 0 else None
    return check


def _noise_rule(value: float, noise: float | None, k: float, floor: float, what: str,
                floor_name: str = "dtype floor") -> dict:
    """`value <= max(k x noise, floor)`: the error may reach k times the
    noise-floor reference's own, and never has to beat the dtype's rounding."""
    limit = floor if noise is None else max(k * noise, floor)
    against = f"max({k:g} x the noise-floor reference's, {floor_name} {floor:.3g})" if noise is not None else (
        f"the {floor_name} {floor:.3g} (no noise-floor reference: the target runs in the golden's dtype)")
    return _check(value, limit, value <= limit, f"{what} <= {against}", noise)


def _mission_rule(value: float, noise: float | None, t: Thresholds, what: str) -> dict:
    """The mission's absolute limit, where the target's dtype can meet it. Where k
    times the noise-floor reference's own figure is past it (bf16 on a deep model:
    the dtype alone cannot resolve the figure at that level), that is the limit,
    and the rule says so."""
    if noise is not None and t.noise_k * noise > t.mission_rel_err:
        check = _noise_rule(value, noise, t.noise_k, t.mission_rel_err, what, "the mission's")
        check["rule"] += " (k x the dtype's own error is past the mission's figure)"
        return check
    return _check(value, t.mission_rel_err, value < t.mission_rel_err,
                  f"{what} < {t.mission_rel_err:.0%} (the mission's figure)", noise)


def tie_margins(ref: np.ndarray, noise: np.ndarray | None, t: Thresholds) -> np.ndarray:
    """Per position, how far apart (nats, in the golden's log-probs) two tokens may
    be and still count as a near-tie: the card's tie margin, or where a noise-floor
    reference is given, if larger, k times the dtype's rounding shift at that
    position (bf16 moves a confident deep model's log-probs by 0.1-0.4 nats: a
    fixed 0.1 is below what the dtype can resolve).

    The rounding shift at a position is the largest among the golden's top-k that
    the noise-floor reference makes there, but never less than its median over
    the rows given. One position's shift is a single draw of the dtype's rounding;
    the target's is another, independent draw, and where the first happens to be
    small a faithful target flips a near-tie it cannot resolve (measured, forced
    AVX2 path, bf16 Llama: flips at golden gaps of 0.14-0.16 nats where the noise
    floor's own shift was 0.056-0.059 and its median 0.11-0.14). The median over
    the rows pools many draws into the dtype's typical shift on this model."""
    margins = np.full(np.shape(ref)[0], t.tie_margin)
    if noise is None:
        return margins
    shift = by_rows(lambda r, n: max_abs_logprob_err(r, n, t.logprob_top_k), ref, noise)
    return np.maximum(margins, t.noise_k * np.maximum(shift, np.median(shift)))


def logit_figures(ref: np.ndarray, tgt: np.ndarray, t: Thresholds, noise: np.ndarray | None = None
                  ) -> tuple[dict, dict]:
    """Figures and checks of one set of aligned logit rows: (figures, {top1,
    logprob_rel_err, logprob_rel_err_position, cosine, logprob_rel_err_full,
    logit_rel_diff_mean, logit_rel_diff_median}). `noise` holds the noise-floor
    reference's rows at the same positions; its figures against `ref` are under
    figures["noise"] and beside each check."""
    # Rows stay in their stored dtype (a memory map, say): each chunk is cast to float64 on its own.
    ref, tgt = np.asarray(ref), np.asarray(tgt)
    if ref.ndim != 2 or ref.shape != tgt.shape or (noise is not None and np.shape(noise) != ref.shape):
        raise ValueError(f"expected [N, V] arrays of equal shape, got {ref.shape}, {tgt.shape} and "
                         f"{None if noise is None else np.shape(noise)}")
    if ref.shape[0] == 0:
        raise ValueError("need at least one position to compare")
    figures = figures_of(ref, tgt, t)
    n = figures_of(ref, noise, t) if noise is not None else None
    margins = tie_margins(ref, noise, t)
    match = by_rows(lambda r, g, m: top1_match(r, g, m, t.dtype_eps), ref, tgt, margins)
    if noise is not None:
        # A flip is rounding where the same dtype flips the same position on its own.
        noise_flips = np.asarray(noise).argmax(axis=-1) != np.asarray(ref).argmax(axis=-1)
        match = match | noise_flips
        n["top1_flip_positions"] = [int(i) for i in np.flatnonzero(noise_flips)]
    figures["top1_rate"] = float(match.mean())
    figures["top1_mismatch_positions"] = [int(i) for i in np.flatnonzero(~match)]

    def of(name: str) -> float | None:
        return None if n is None else n[name]

    k, floor = t.logprob_top_k, t.dtype_floor
    if t.cosine_rule == "absolute":
        cosine_check = _check(figures["cosine_mean"], t.cosine, figures["cosine_mean"] > t.cosine,
                              "mean over positions of raw-logit cosine > threshold", of("cosine_mean"))
    else:
        # 1 - cos grows as the square of a relative error: k and the floor are squared with it.
        gap = _noise_rule(1 - figures["cosine_mean"], None if n is None else 1 - n["cosine_mean"],
                          t.noise_k ** 2, floor ** 2, "1 - mean raw-logit cosine")
        cosine_check = {**gap, "value": figures["cosine_mean"], "threshold": 1 - gap["threshold"],
                        "noise": of("cosine_mean"), "rule": gap["rule"] + f" (k and floor squared; absolute "
                                                                          f"{t.cosine} reported, not judged)"}
    checks = {
        "top1": _check(figures["top1_rate"], 1.0, match.all(),
                       "every position's top-1 matches, or the golden puts both within "
                       f"{t.tie_margin} nats (or "
                       f"{t.noise_k:g} x the noise-floor reference's largest top-{k} shift there, at least its median "
                       "over the positions; one step of the target dtype's grid more where the target's logits tie "
                       "them), or the noise-floor reference flips it too"),
        "logprob_rel_err": _noise_rule(figures["logprob_rel_err_mean"], of("logprob_rel_err_mean"), t.noise_k, floor,
                                       f"mean over positions and golden top-{k} of "
                                       f"|dlogprob|/max(|logprob|, {t.logprob_floor})"),
        "logprob_rel_err_position": _noise_rule(
            figures["logprob_rel_err_position_max"], of("logprob_rel_err_position_max"), t.noise_k_max, floor,
            f"worst position's mean over golden top-{k} of the same relative error"),
        "cosine": cosine_check,
        "logprob_rel_err_full": _mission_rule(figures["logprob_rel_err_full_mean"], of("logprob_rel_err_full_mean"), t,
                                              "mean relative error of the full-vocabulary log-probs"),
        "logit_rel_diff_mean": _mission_rule(figures["logit_rel_diff_mean"], of("logit_rel_diff_mean"), t,
                                             "mean over positions of mean|dlogit|/mean|logit|"),
        "logit_rel_diff_median": _mission_rule(figures["logit_rel_diff_median"], of("logit_rel_diff_median"), t,
                                               "median over entries of |dlogit|/|logit|"),
    }
    if n is not None:
        figures["noise"] = n
    return figures, checks


def compare(
    ref_logits: np.ndarray,
    tgt_logits: np.ndarray,
    ref_tokens: Sequence[int],
    tgt_tokens: Sequence[int],
    ref_logits_generated: np.ndarray,
    tgt_logits_generated: np.ndarray,
    thresholds: Thresholds,
    first_generated: int = 0,
    noise_logits: np.ndarray | None = None,
) -> dict:
    """Full comparison report as a JSON-serialisable dict with per-check verdicts.

    ``ref_logits``/``tgt_logits`` are teacher-forced logits (row i of both saw
    the same prefix); row ``first_generated`` is the one that predicts the first
    generated token, the rows before it are prompt positions. ``ref_tokens`` is
    the reference's greedy continuation with the logits that chose each token
    (``ref_logits_generated``); ``tgt_tokens``/``tgt_logits_generated`` are the
    target's free-running decode. The decode logits are compared while both
    contexts are equal: up to and including the first divergence.
    ``noise_logits`` are the noise-floor reference's teacher-forced rows, aligned
    with ``ref_logits``: the same rows serve the decode path (same contexts).
    """
    t = thresholds
    figures, checks = logit_figures(ref_logits, tgt_logits, t, noise_logits)
    prefix = greedy_prefix(ref_tokens, tgt_tokens)
    g_len = len(ref_tokens)
    # An empty continuation has nothing to disagree on.
    g_ratio = prefix / g_len if g_len else 1.0
    # A target that stops early or runs long fails the check, not the run.
    same_len = len(tgt_tokens) == g_len
    noise_generated = None if noise_logits is None else np.asarray(noise_logits)[first_generated:]
    generated = np.asarray(ref_logits_generated)
    margins = tie_margins(generated, None if noise_generated is None else noise_generated[:generated.shape[0]], t)
    g_tie = same_len and greedy_divergence_is_tie(ref_tokens, tgt_tokens, generated, margins)
    g_noise = (same_len and not g_tie and noise_generated is not None and prefix < g_len
               and int(noise_generated[prefix].argmax()) != ref_tokens[prefix])
    checks["greedy"] = _check(
        g_ratio, 1.0, g_tie or g_noise,
        f"same length, and no divergence, or the first is a golden near-tie (tie margin {t.tie_margin} nats, or "
        f"{t.noise_k:g} x the noise-floor reference's largest shift there, at least its median over the steps) or "
        "a token the noise-floor reference flips too")
    shared = min(prefix + 1, g_len, len(tgt_tokens))
    decode = None
    if shared:
        decode, decode_checks = logit_figures(np.asarray(ref_logits_generated)[:shared],
                                              np.asarray(tgt_logits_generated)[:shared], t,
                                              None if noise_generated is None else noise_generated[:shared])
        checks.update({f"decode_{name}": check for name, check in decode_checks.items()})
    return {
        **figures,
        "prompt_positions": first_generated,
        # The top1 check's own verdict at the row that predicts the first generated token.
        "top1_first": first_generated not in figures["top1_mismatch_positions"],
        "greedy_prefix": prefix,
        "greedy_len": g_len,
        "target_greedy_len": len(tgt_tokens),
        "greedy_ratio": g_ratio,
        "greedy_divergence_is_tie": g_tie,
        "greedy_divergence_is_noise": g_noise,
        "decode": decode,
        "checks": checks,
        "passed": all(c["passed"] for c in checks.values()),
    }
