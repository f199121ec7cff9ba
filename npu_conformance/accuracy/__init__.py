"""Task accuracy through lm-evaluation-harness: the card's task (tasks), lm-eval run
against the card's server and on the CPU reference (harness), and the one-sided
test that judges the target's score against the reference's (gate). `assess`
puts them together into the card's `accuracy` record of precision_report.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu_conformance.accuracy import gate, harness
from npu_conformance.cache import cached_directory, digest
from npu_conformance.accuracy.harness import MissingHarness, Model, TaskResult
from npu_conformance.accuracy.tasks import Task, prepare
from npu_conformance.cards import AccuracyBaseline, AccuracySpec

__all__ = ["MissingHarness", "Model", "Task", "TaskResult", "assess", "gate", "harness", "prepare"]


def reference_score(model: Model, task: Task, spec: AccuracySpec, weights: str, cache_root: Path,
                    timeout_s: float) -> tuple[TaskResult, Path]:
    """The CPU reference's score on a local task, and the folder of its files,
    from the cache: the same weights (`weights`, their fingerprint), items, model
    settings and versions score the same, so one run serves every card and session."""
    key = digest(weights, model.name, {k: v for k, v in model.args.items() if k != "pretrained"}, task.name,
                 task.digest, spec.limit, spec.num_fewshot, harness.versions())
    folder = cache_root / "accuracy" / f"{task.name}-{key[:20]}"
    cached_directory(folder, lambda tmp: harness.run(model, task, tmp, timeout_s, spec.limit, spec.num_fewshot),
                     lambda path: (path / harness.RUN_FILE).is_file(), verify=True)
    return harness.read_result(folder, task.name, spec.metric, spec.filter), folder


def assess(spec: AccuracySpec, task: Task, target: Model, reference: Model | AccuracyBaseline, folder: Path,
           timeout_s: float, record: dict[str, Any], cache: tuple[str, Path] | None = None) -> dict[str, Any]:
    """Score `task` on `target`, then on `reference` (or take its recorded
    baseline), and judge. A local task's reference score comes from the cache
    where `cache` (the reference weights' fingerprint, the cache's root) is given.
    `record` (the card's report entry, with task, metric and expected verdict) is
    filled in as each part finishes, so a failure leaves what ran; the caller
    records the error."""
    run = {"timeout_s": timeout_s, "limit": spec.limit, "num_fewshot": spec.num_fewshot}
    scored = harness.evaluate(target, task, spec.metric, spec.filter, folder / "target", **run)
    record["target"] = {**scored.record(), "files": str(folder / "target")}
    if isinstance(reference, AccuracyBaseline):
        ref_value, ref_n = reference.value, reference.n
        record["reference"] = {"value": ref_value, "n": ref_n, "source": f"recorded baseline: {reference.source}"}
    else:
        if cache is not None and task.local:
            ref, files = reference_score(reference, task, spec, cache[0], cache[1], timeout_s)
        else:
            files = folder / "reference"
            ref = harness.evaluate(reference, task, spec.metric, spec.filter, files, **run)
        ref_value, ref_n = ref.value, ref.n
        record["reference"] = {**ref.record(), "files": str(files)}
        record["disagreement"] = harness.disagreement(scored, ref)
    judged = gate.judge(scored.value, scored.n, ref_value, ref_n, spec.alpha, spec.power)
    record["gate"] = judged
    record["verdict"] = "pass" if judged["passed"] else "fail"
    record["message"] = gate.describe(judged, f"{spec.metric},{spec.filter}")
    return record
