"""The accuracy gate's pure parts: the one-sided test's arithmetic, the local
task's items, lm-eval's command line and result files, and which cards the
accuracy tests run. No engine and no lm-eval run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from npu_conformance.accuracy import gate, harness, tasks
from npu_conformance.cards import load_catalog

pytestmark = pytest.mark.unit


def test_threshold_and_detectable_drop_follow_from_n_and_variance():
    # TensorRT-LLM's settings: alpha 0.05, beta 0.2; z = 1.6449 and 0.8416.
    judged = gate.judge(0.55, 1764, 0.55, 1764, alpha=0.05, power=0.8)
    scale = math.sqrt(0.55 * 0.45) * math.sqrt(2 / 1764)
    assert judged["threshold"] == pytest.approx(0.55 - 1.6449 * scale, abs=1e-5)
    assert judged["theta"] == pytest.approx((1.6449 + 0.8416) * scale, abs=1e-5)
    # 1764 items at p = 0.55 catch a drop of about 4.2 points, and allow about 2.8.
    assert 0.041 < judged["theta"] < 0.043 and 0.027 < 0.55 - judged["threshold"] < 0.029
    assert judged["passed"]


def test_more_items_narrow_the_threshold():
    few, many = (gate.judge(0.5, n, 0.5, n, 0.05, 0.8) for n in (100, 10000))
    assert 0.5 - few["threshold"] == pytest.approx(10 * (0.5 - many["threshold"]))


def test_a_drop_past_the_threshold_fails_and_a_gain_passes():
    at = gate.judge(0.5, 1000, 0.5, 1000, 0.05, 0.8)["threshold"]
    assert gate.judge(at, 1000, 0.5, 1000, 0.05, 0.8)["passed"]
    assert not gate.judge(at - 1e-6, 1000, 0.5, 1000, 0.05, 0.8)["passed"]
    assert gate.judge(0.9, 1000, 0.5, 1000, 0.05, 0.8)["passed"]
    judged = gate.judge(0.45, 1000, 0.5, 1000, 0.05, 0.8)
    assert not judged["passed"] and "-5.00 points" in gate.describe(judged, "exact_match,x")


def test_different_items_or_a_degenerate_reference_are_refused():
    with pytest.raises(ValueError, match="same items"):
        gate.judge(0.5, 100, 0.5, 200, 0.05, 0.8)
    for reference in (0.0, 1.0):
        with pytest.raises(ValueError, match="no variance"):
            gate.judge(0.5, 100, reference, 100, 0.05, 0.8)


def test_next_word_items_come_from_the_corpus_stories():
    items = tasks.next_word_items("english.txt", 6)
    assert items[0] == {"context": "Once upon a time, there was", "answer": "a"}
    assert all(len(i["context"].split()) >= 6 and i["answer"] and i["answer"][-1] not in tasks.PUNCTUATION
               for i in items)
    # No item spans two stories: none holds the separator.
    assert not [i for i in items if "<|endoftext|>" in i["context"]]
    assert len(tasks.next_word_items("english.txt", 7)) < len(items)


def test_a_local_task_is_written_for_lm_eval_and_a_registry_task_is_not(tmp_path: Path):
    task = tasks.prepare("corpus_next_word", tmp_path)
    assert task.local and task.items == sum(1 for _ in (tmp_path / "corpus_next_word.jsonl").open())
    config = yaml.safe_load((tmp_path / "corpus_next_word.yaml").read_text())
    assert config["task"] == "corpus_next_word"
    assert config["dataset_kwargs"]["data_files"]["test"] == str(tmp_path / "corpus_next_word.jsonl")
    assert tasks.prepare("corpus_next_word", tmp_path / "again").digest == task.digest
    registry = tasks.prepare("gsm8k", tmp_path / "gsm8k")
    assert not registry.local and not (tmp_path / "gsm8k").exists() and "registry" in registry.describe()


def test_command_line_and_environment(tmp_path: Path):
    task = tasks.Task("t", tmp_path, 10, "0" * 64)
    model = harness.transformers_model(Path("/ckpt"), "float32", False)
    cmd = harness.command(model, task, tmp_path / "out", limit=5, num_fewshot=None)
    assert cmd[cmd.index("--model") + 1] == "hf" and cmd[cmd.index("--device") + 1] == "cpu"
    assert cmd[cmd.index("--include_path") + 1] == str(tmp_path) and cmd[cmd.index("--limit") + 1] == "5"
    assert "--num_fewshot" not in cmd
    env = harness.environment(model, task, tmp_path)
    assert env["HF_DATASETS_OFFLINE"] == "1" and env["HF_DATASETS_CACHE"].startswith(str(tmp_path))
    served = harness.server_model("http://127.0.0.1:1", "m", Path("/ckpt"), "key", 8, 60)
    registry = harness.environment(served, tasks.Task("gsm8k"), tmp_path)
    # A registry task's dataset comes from the hub, into the user's own datasets cache.
    assert registry[harness.API_KEY_ENV] == "key"
    assert registry.get("HF_DATASETS_CACHE") != str(tmp_path / harness.DATASETS_CACHE)
    with pytest.raises(ValueError, match="commas"):
        harness.command(harness.transformers_model(Path("/a,b"), "float32", False), task, tmp_path, None, None)


def _lm_eval_files(folder: Path, scores: list[float], filter_name: str = "first_word") -> None:
    folder.mkdir(parents=True)
    mean = sum(scores) / len(scores)
    (folder / "results_x.json").write_text(json.dumps({"results": {"t": {
        "alias": "t", f"exact_match,{filter_name}": mean, f"exact_match_stderr,{filter_name}": 0.01}}}))
    lines = [{"doc_id": i, "filter": filter_name, "exact_match": s} for i, s in enumerate(scores)]
    lines += [{"doc_id": i, "filter": "other", "exact_match": 1.0} for i in range(len(scores))]
    (folder / "samples_t_x.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / harness.RUN_FILE).write_text(json.dumps({"seconds": 1.5, "lm_eval": "0", "model": "m"}))


def test_result_files_are_read_per_filter_and_compared_item_by_item(tmp_path: Path):
    _lm_eval_files(tmp_path / "a", [1.0, 0.0, 1.0, 0.0])
    _lm_eval_files(tmp_path / "b", [1.0, 1.0, 0.0, 0.0])
    a = harness.read_result(tmp_path / "a", "t", "exact_match", "first_word")
    b = harness.read_result(tmp_path / "b", "t", "exact_match", "first_word")
    assert (a.value, a.n, a.stderr, a.items) == (0.5, 4, 0.01, {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0})
    assert harness.disagreement(a, b) == {"items": 4, "target_only": 1, "reference_only": 1}
    with pytest.raises(KeyError, match=r"reports \['exact_match,first_word'\]"):
        harness.read_result(tmp_path / "a", "t", "exact_match", "strict-match")


def test_which_cards_the_accuracy_tests_run():
    catalog = load_catalog()
    scored = {name for name, card in catalog.items() if card.gates_accuracy}
    defaults = {name for name, card in catalog.items() if card.default}
    assert defaults <= scored, "every default card is scored on its task"
    buggy = {name for name in scored if catalog[name].expect.verdict == "fail"}
    assert buggy and all(catalog[name].expect.accuracy == "fail" for name in buggy)
    # A buggy card that names no accuracy verdict is not scored on its task.
    assert not catalog["sensitivity-llama-rope-theta"].gates_accuracy
