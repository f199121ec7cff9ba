"""lm-evaluation-harness run as users run it: its own command line, in a process
group of its own (process.run_in_group) with a deadline, against the card's
OpenAI-compatible server (lm-eval's local-completions client) or on the CPU
through its transformers model (`hf`). The result is read from the files lm-eval
writes: the task's score, its standard error and every item's score."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from npu_conformance import process
from npu_conformance.accuracy.tasks import Task

DIST = "lm_eval"
# The environment variable lm-eval's OpenAI-style clients read the server's key from.
API_KEY_ENV = "OPENAI_API_KEY"
# Attempts per request: a keep-alive connection the server closes as the client
# reuses it reads as "Server disconnected" (seen once in 1764 requests), and one
# request that fails ends lm-eval's whole run.
RETRIES = 3
# Items the transformers model scores per forward pass on the CPU.
HF_BATCH = 16
# A local task's dataset cache, under the run's folder while it runs and removed after.
DATASETS_CACHE = "datasets-cache"
# What `run` writes beside lm-eval's own files.
RUN_FILE = "run.json"


class MissingHarness(RuntimeError):
    """lm-eval is not installed in this environment."""


def versions() -> dict[str, str]:
    """What decides a transformers-side score besides the weights and the task."""
    return {"lm_eval": version(), **{d: importlib.metadata.version(d) for d in ("transformers", "torch")}}


def version() -> str:
    if importlib.util.find_spec(DIST) is None:
        raise MissingHarness("lm-evaluation-harness is not installed here: install the suite's accuracy extra "
                             "(pip install -c constraints-cpu.txt -e '.[accuracy]'; `make setup` does)")
    return importlib.metadata.version("lm_eval")


@dataclass(frozen=True)
class Model:
    """An lm-eval model class and its --model_args, and what it runs, in words."""

    name: str
    args: dict[str, Any]
    describe: str
    batch_size: int = 1
    device: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def server_model(base_url: str, served_name: str, tokenizer: Path, api_key: str | None, concurrency: int,
                 timeout_s: float) -> Model:
    """lm-eval's local-completions client on the server's /v1/completions, sending
    text (the server tokenizes as its clients' requests are tokenized)."""
    args = {"base_url": f"{base_url}/v1/completions", "model": served_name, "tokenizer_backend": "huggingface",
            "tokenizer": str(tokenizer), "tokenized_requests": False, "num_concurrent": concurrency,
            "max_retries": RETRIES, "timeout": int(timeout_s)}
    return Model("local-completions", args, f"lm-eval local-completions on {base_url}/v1/completions "
                                            f"({concurrency} requests in flight)", env={API_KEY_ENV: api_key or ""})


def transformers_model(checkpoint: Path, dtype: str, trust_remote_code: bool) -> Model:
    """lm-eval's transformers model (`hf`) on the CPU."""
    args = {"pretrained": str(checkpoint), "dtype": dtype, "trust_remote_code": trust_remote_code}
    return Model("hf", args, f"lm-eval hf (transformers) on cpu, {dtype}", HF_BATCH, "cpu")


@dataclass(frozen=True)
class TaskResult:
    """One lm-eval run's score on the task, and each item's (by lm-eval's doc_id)."""

    task: str
    metric: str
    filter: str
    value: float
    stderr: float | None
    n: int
    items: dict[int, float]
    model: str
    seconds: float
    lm_eval: str

    def record(self) -> dict[str, Any]:
        return {"value": self.value, "stderr": self.stderr, "n": self.n, "model": self.model,
                "seconds": self.seconds, "lm_eval": self.lm_eval}


def command(model: Model, task: Task, output: Path, limit: int | None, num_fewshot: int | None) -> list[str]:
    args = ",".join(f"{k}={v}" for k, v in model.args.items())
    if any("," in str(v) for v in model.args.values()):
        raise ValueError(f"lm-eval splits --model_args at commas, and one of them holds one: {model.args}")
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model.name, "--model_args", args,
           "--tasks", task.name, "--batch_size", str(model.batch_size), "--output_path", str(output), "--log_samples"]
    if model.device is not None:
        cmd += ["--device", model.device]
    if task.include_path is not None:
        cmd += ["--include_path", str(task.include_path)]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if num_fewshot is not None:
        cmd += ["--num_fewshot", str(num_fewshot)]
    return cmd


def environment(model: Model, task: Task, output: Path) -> dict[str, str]:
    env = {**os.environ, **model.env, "TOKENIZERS_PARALLELISM": "false",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    if task.local:
        # A local task reads its items from disk: no hub, and its dataset cache beside the run's files.
        env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(output / DATASETS_CACHE))
    return env


def run(model: Model, task: Task, output: Path, timeout_s: float, limit: int | None = None,
        num_fewshot: int | None = None) -> None:
    """Run lm-eval on `task` with `model`; its files, its log and RUN_FILE (how long
    it took, which lm-eval) go into `output`."""
    release = version()
    output.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    returncode, out = process.run_in_group(command(model, task, output, limit, num_fewshot),
                                           environment(model, task, output), timeout_s, f"lm-eval ({model.name})")
    seconds = time.monotonic() - started
    shutil.rmtree(output / DATASETS_CACHE, ignore_errors=True)
    # lm-eval files its results under a folder named after the model's path: up here, flat.
    for folder in [p for p in output.iterdir() if p.is_dir()]:
        for path in folder.rglob("*.json*"):
            path.replace(output / path.name)
        shutil.rmtree(folder)
    (output / "lm_eval.log").write_text(out, encoding="utf-8")
    if returncode:
        raise RuntimeError(f"lm-eval ({model.describe}) exited {returncode}; log {output / 'lm_eval.log'}:\n"
                           f"{out[-3000:]}")
    (output / RUN_FILE).write_text(json.dumps({"seconds": round(seconds, 1), "lm_eval": release,
                                               "model": model.describe}), encoding="utf-8")


def evaluate(model: Model, task: Task, metric: str, filter_name: str, output: Path, timeout_s: float,
             limit: int | None = None, num_fewshot: int | None = None) -> TaskResult:
    """Run lm-eval (see `run`) and read its score."""
    run(model, task, output, timeout_s, limit, num_fewshot)
    return read_result(output, task.name, metric, filter_name)


def newest(output: Path, pattern: str) -> Path:
    found = sorted(output.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"lm-eval wrote no {pattern} under {output}")
    return found[-1]


def read_result(output: Path, task: str, metric: str, filter_name: str) -> TaskResult:
    """The score `<metric>,<filter>` of `task` from the files `run` left under `output`."""
    ran = json.loads((output / RUN_FILE).read_text(encoding="utf-8"))
    results = json.loads(newest(output, "results_*.json").read_text(encoding="utf-8"))
    scores: Mapping[str, Any] = results["results"].get(task, {})
    key = f"{metric},{filter_name}"
    if key not in scores:
        known = sorted(k for k in scores if "_stderr" not in k and k != "alias")
        raise KeyError(f"lm-eval reports no {key!r} for task {task}; it reports {known} (the card's accuracy.metric "
                       "and accuracy.filter)")
    items = {}
    for line in newest(output, f"samples_{task}_*.jsonl").read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        if sample.get("filter", filter_name) == filter_name:
            items[int(sample["doc_id"])] = float(sample[metric])
    stderr = scores.get(f"{metric}_stderr,{filter_name}")
    return TaskResult(task, metric, filter_name, float(scores[key]),
                      float(stderr) if isinstance(stderr, (int, float)) else None, len(items), items, ran["model"],
                      ran["seconds"], ran["lm_eval"])


def disagreement(target: TaskResult, reference: TaskResult) -> dict[str, int]:
    """Items the two sides score differently: where only the target scores, and where only the reference does."""
    shared = target.items.keys() & reference.items.keys()
    return {"items": len(shared),
            "target_only": sum(target.items[i] > reference.items[i] for i in shared),
            "reference_only": sum(reference.items[i] > target.items[i] for i in shared)}
