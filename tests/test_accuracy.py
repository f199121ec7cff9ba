"""Task accuracy through lm-evaluation-harness (npu_conformance.accuracy): each
card's task scored on its OpenAI-compatible server by lm-eval's local-completions
client, against the same task through lm-eval's transformers model on the CPU (or
the platform's recorded baseline), judged by a one-sided test whose threshold
follows from the items' count and the score's variance. A known-buggy card that
names an accuracy verdict must give it: the gate catches a real bug."""

from __future__ import annotations

from typing import Any

import pytest

from npu_conformance.cards import Card

pytestmark = pytest.mark.accuracy


def _evidence(record: dict[str, Any]) -> str:
    return (f"{record['task_source']}; target: {record['target']['model']}; reference: "
            f"{record['reference'].get('model') or record['reference']['source']}; "
            f"items scored differently: {record.get('disagreement', 'n/a')}")


def test_task_accuracy(card: Card, accuracy_judged: dict[str, Any]) -> None:
    """The served model scores no worse than its reference, within the test's threshold."""
    assert accuracy_judged["verdict"] == "pass", (
        f"{card.name}: {accuracy_judged['message']} ({_evidence(accuracy_judged)})")


@pytest.mark.sensitivity
def test_accuracy_catches_the_bug(card: Card, accuracy_judged: dict[str, Any]) -> None:
    """The known-buggy card's score gives the verdict its card expects (fail: the gate catches it)."""
    assert accuracy_judged["verdict"] == card.expect.accuracy, (
        f"{card.name} is known to be wrong ({card.weights.describe()}) and expects the accuracy verdict "
        f"{card.expect.accuracy}: {accuracy_judged['message']} ({_evidence(accuracy_judged)})")
