"""Serving conditions: the card's prompts run again under one condition each
(batch 1, a batch of 16, prefix-cache hits, chunked prefill, graph mode) and
compared with the same reference and the same checks as the main run.

Each run carries the evidence that the condition took effect: requests per call,
cached tokens per request, the scheduler's token budget against the longest
sequence, the compilation mode. A condition that did not take effect is a
problem, not a pass.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from npu_conformance.cards import Card, ConditionSpec, Thresholds
from npu_conformance.compare.precision import compare, run_passes
from npu_conformance.engines.reference import ReferenceResult
from npu_conformance.engines.target import TargetResult, VllmRunner

Results = dict[str, list[TargetResult]]


def _single(runner: VllmRunner, reference: dict[str, ReferenceResult], spec: ConditionSpec, max_tokens: int
            ) -> tuple[Results, dict[str, Any]]:
    out: Results = {}
    for pid in reference:
        runner.llm.reset_prefix_cache()
        out[pid] = run_passes(runner, reference, [pid], max_tokens)
    return out, {"requests_per_call": 1}


def _batch(runner: VllmRunner, reference: dict[str, ReferenceResult], spec: ConditionSpec, max_tokens: int
           ) -> tuple[Results, dict[str, Any]]:
    size = spec.batch_size or len(reference)
    ids = list(itertools.islice(itertools.cycle(reference), max(size, len(reference))))
    runner.llm.reset_prefix_cache()
    results = run_passes(runner, reference, ids, max_tokens)
    out: Results = {}
    for pid, result in zip(ids, results):
        out.setdefault(pid, []).append(result)
    lengths = sorted({len(reference[i].prompt_ids) for i in ids})
    return out, {"requests_per_call": len(ids), "prompt_lengths": lengths}


def _prefix_cache(runner: VllmRunner, reference: dict[str, ReferenceResult], spec: ConditionSpec, max_tokens: int
                  ) -> tuple[Results, dict[str, Any]]:
    block = runner.llm.llm_engine.vllm_config.cache_config.block_size
    out: Results = {}
    cached: dict[str, int] = {}
    for pid in reference:
        runner.llm.reset_prefix_cache()
        # The first request fills the cache with the prompt's blocks; the second shares them.
        run_passes(runner, reference, [pid], max_tokens)
        out[pid] = run_passes(runner, reference, [pid], max_tokens)
        cached[pid] = out[pid][0].cached_tokens
    problems = [f"prompt {pid} ({len(reference[pid].prompt_ids)} tokens) read {n} cached tokens, "
                f"expected at least one {block}-token block" for pid, n in cached.items()
                if len(reference[pid].prompt_ids) >= block and n < block]
    if not any(len(r.prompt_ids) >= block for r in reference.values()):
        problems.append(f"no prompt is as long as one KV block ({block} tokens): nothing can hit the cache")
    return out, {"block_size": block, "cached_tokens": cached, "problems": problems}


def _engine_condition(runner: VllmRunner, reference: dict[str, ReferenceResult], spec: ConditionSpec,
                      max_tokens: int) -> tuple[Results, dict[str, Any]]:
    """A condition made of engine arguments: the main run's passes on its own engine."""
    runner.llm.reset_prefix_cache()
    ids = list(reference)
    results = run_passes(runner, reference, ids, max_tokens)
    config = runner.llm.llm_engine.vllm_config
    budget = config.scheduler_config.max_num_batched_tokens
    longest = max(len(r.full_ids) for r in reference.values())
    mode = config.compilation_config.mode
    evidence: dict[str, Any] = {
        "engine": dict(spec.engine), "max_num_batched_tokens": budget, "longest_sequence": longest,
        "chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
        "compilation_mode": getattr(mode, "name", str(mode)),
        "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
        "problems": [],
    }
    if "max_num_batched_tokens" in spec.engine and not longest > budget:
        evidence["problems"].append(f"the longest sequence ({longest} tokens) fits one {budget}-token step: "
                                    "no prefill was chunked")
    if spec.engine.get("enforce_eager") is False and evidence["compilation_mode"] in ("NONE", "0"):
        evidence["problems"].append("enforce_eager is off but vLLM compiled nothing (compilation mode NONE)")
    return {pid: [r] for pid, r in zip(ids, results)}, evidence


RUNS: dict[str, Callable[..., tuple[Results, dict[str, Any]]]] = {
    "single": _single,
    "batch": _batch,
    "prefix_cache": _prefix_cache,
    "chunked_prefill": _engine_condition,
    "graph": _engine_condition,
}


def run_condition(name: str, card: Card, runner: VllmRunner, reference: dict[str, ReferenceResult],
                  thresholds: Thresholds) -> dict[str, Any]:
    """Run condition `name` of `card` on `runner` and compare every output with the
    reference: {evidence, prompts: {id: result of the worst copy, with copies}, passed}."""
    spec = card.conditions[name]
    outputs, evidence = RUNS[name](runner, reference, spec, card.max_tokens)
    evidence.setdefault("problems", [])
    prompts = {}
    for pid, copies in outputs.items():
        results = [compare(reference[pid], copy, thresholds) for copy in copies]
        # The worst copy speaks for the prompt: any copy failing fails it.
        worst = min(results, key=lambda r: (r["passed"], -r["logprob_rel_err_mean"]))
        prompts[pid] = {**worst, "copies": len(results), "copies_passed": sum(r["passed"] for r in results)}
    passed = not evidence["problems"] and all(p["copies_passed"] == p["copies"] for p in prompts.values())
    return {"evidence": evidence, "prompts": prompts, "passed": passed}
