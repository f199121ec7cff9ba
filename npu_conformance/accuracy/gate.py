"""The accuracy gate, as TensorRT-LLM's accuracy tests decide: a one-sided test of
"the target scores no worse than the reference" at significance `alpha`. The
threshold is not hand-set: it follows from the items' count and the score's
variance, and the report states the drop the test catches with `power`.

For a score that is a mean of 0/1 items (exact match, accuracy) at reference
accuracy p, one item's standard deviation is sigma = sqrt(p (1 - p)); the
difference of two such means over n items each has standard error
sigma sqrt(2 / n). Then

    threshold = p - z(1 - alpha) sigma sqrt(2 / n)
    theta     = (z(1 - alpha) + z(power)) sigma sqrt(2 / n)

theta is the smallest drop caught with probability `power`."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

Z = NormalDist()


def judge(value: float, n: int, reference: float, reference_n: int, alpha: float, power: float) -> dict[str, Any]:
    """The verdict of a target score `value` over `n` items against `reference`
    over `reference_n`: pass when value >= threshold, with the figures that show why."""
    if n != reference_n:
        raise ValueError(f"the target was scored on {n} items and the reference on {reference_n}: the gate compares "
                         "the same items (the same task and limit on both sides)")
    if not 0 < reference < 1:
        raise ValueError(f"the reference scores {reference:g}: a task it solves always or never has no variance to "
                         "test a drop against; choose a task the model solves in part")
    sigma = math.sqrt(reference * (1 - reference))
    scale = sigma * math.sqrt(2 / n)
    z_alpha, z_power = Z.inv_cdf(1 - alpha), Z.inv_cdf(power)
    threshold = reference - z_alpha * scale
    return {"value": value, "n": n, "reference": reference, "sigma": sigma, "alpha": alpha, "power": power,
            "threshold": threshold, "theta": (z_alpha + z_power) * scale, "difference": value - reference,
            "passed": value >= threshold,
            "rule": f"value >= reference - z(1-alpha) * sqrt(p(1-p)) * sqrt(2/n), alpha {alpha:g}, n {n}"}


def describe(judged: dict[str, Any], metric: str) -> str:
    """One line: score, reference, threshold and the drop the test can catch."""
    return (f"{metric} {judged['value']:.4f} against reference {judged['reference']:.4f} "
            f"(difference {judged['difference'] * 100:+.2f} points; threshold {judged['threshold']:.4f} at alpha "
            f"{judged['alpha']:g}, n {judged['n']}; a drop of {judged['theta'] * 100:.2f} points is caught with "
            f"power {judged['power']:g})")
