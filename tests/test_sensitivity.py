"""The precision checks must catch real adaptation bugs, and only where they are:
each known-buggy card (expect.verdict: fail) runs a real vLLM engine, on a mutated
checkpoint or with a fault on one path (engines.faults), against the reference
built from the correct checkpoint. The checks in its `caught_by` must fail on
every prompt the bug reaches; every check must pass where it does not reach, as
must the checks named in `passes` (the checks are independent). That rounding is
not flagged is proven by the bf16 card (synthetic-llama-bf16), which the
precision tests must pass."""

from typing import Any

import pytest

from npu_conformance.cards import Card
from npu_conformance.compare.diagnosis import Diagnosis
from npu_conformance.conditions import run_condition
from npu_conformance.engines.target import VllmRunner
from npu_conformance.report import PrecisionReport

pytestmark = pytest.mark.sensitivity

Results = dict[str, dict[str, Any]]


def _reached(card: Card, results: Results) -> list[str]:
    return list(card.expect.reaches or results)


def _figures(results: Results, prompts: list[str]) -> str:
    return "; ".join(f"{pid}: rel err {results[pid]['logprob_rel_err_mean']:.3%} (worst position "
                     f"{results[pid]['logprob_rel_err_position_max']:.3%}), cosine {results[pid]['cosine_min']:.6f}, "
                     f"top1 {results[pid]['top1_rate']:.0%}" for pid in prompts)


def test_bug_is_caught(card: Card, precision_results: Results, target: VllmRunner) -> None:
    """Every check in `caught_by` fails on every prompt the bug reaches."""
    if card.fault:
        record = target.fault_record()
        assert record["tokens"], f"{card.name}: the {card.fault.path} fault never ran: no token was on its path ({record})"
    reached = _reached(card, precision_results)
    missed = {name: passed for name in card.expect.caught_by
              if (passed := sorted(pid for pid in reached if precision_results[pid]["checks"][name]["passed"]))}
    assert not missed, (
        f"{card.name}: checks passed on prompts the bug reaches although the target is known to be wrong there "
        f"({card.weights.describe()}{f', fault {card.fault}' if card.fault else ''}): {missed}; worst figures: "
        + _figures(precision_results, reached))


def test_bug_fails_the_verdict_on_every_prompt_it_reaches(card: Card, precision_results: Results) -> None:
    """A bug in the weights or the model code shows on any input on its path, not on a lucky few."""
    passed = sorted(pid for pid in _reached(card, precision_results) if precision_results[pid]["passed"])
    assert not passed, f"{card.name}: prompts {passed} passed every precision check"


def test_checks_off_the_faulty_path_pass(card: Card, precision_results: Results) -> None:
    """Prompts the bug does not reach pass every check, and the checks in `passes`
    pass on every prompt: a check fails for its own path only."""
    reached = set(_reached(card, precision_results))
    wrong = [f"{pid}: {name} {check['value']:.6g} vs {check['threshold']:.6g}"
             for pid, result in precision_results.items() for name, check in result["checks"].items()
             if not check["passed"] and (pid not in reached or name in card.expect.passes)]
    assert not wrong, f"{card.name}: checks that the bug's path does not reach failed: " + "; ".join(wrong)


def test_conditions_give_their_verdicts(card: Card, target: VllmRunner, reference: dict[str, Any],
                                        report: PrecisionReport) -> None:
    """A condition that runs the bug's path fails; one that avoids it passes."""
    if not card.expect.conditions:
        pytest.skip(f"{card.name} expects no condition verdicts (expect.conditions)")
    wrong = []
    for name, verdict in card.expect.conditions.items():
        run = run_condition(name, card, target, reference, card.thresholds)
        report.add_condition(card, name, run)
        if run["evidence"]["problems"]:
            wrong.append(f"{name} did not take effect: {run['evidence']['problems']}")
        elif run["passed"] != (verdict == "pass"):
            failed = {pid: sorted(k for k, c in r["checks"].items() if not c["passed"]) for pid, r in run["prompts"].items()}
            wrong.append(f"{name} was expected to {verdict} and did not (failed checks per prompt: {failed})")
    assert not wrong, f"{card.name}: " + "; ".join(wrong)


def test_diagnosis_names_the_place(card: Card, diagnosis: Diagnosis | None) -> None:
    """A failing card is diagnosed on its first failing prompt, and the first
    divergent hidden state is where the card says its bug is."""
    want = card.expect.diagnosis
    if want is None:
        pytest.skip(f"{card.name} names no place for its bug (expect.diagnosis)")
    assert diagnosis is not None, f"{card.name} failed precision but was not diagnosed"
    assert diagnosis.problem is None, diagnosis.summary()
    got = diagnosis.first
    place = ("none", None) if got is None else (got.sublayer, got.layer)
    assert place == (want.sublayer, want.layer), (
        f"{card.name}: expected the first divergence at layer {want.layer} {want.sublayer}, got "
        f"{diagnosis.summary()}; per place: "
        + ", ".join(f"{r.place} {r.rel_l2_max:.2g}" for r in diagnosis.rows))
