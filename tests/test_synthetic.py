"""Builder logic of npu_conformance/synthetic/, on one real build of the llama recipe."""

from __future__ import annotations

import copy
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from npu_conformance import synthetic
from npu_conformance.merge import deep_merge

pytestmark = pytest.mark.unit  # no engine; the real llama build, shared with the precision run


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def llama(cache: Path, pytestconfig: pytest.Config) -> Path:
    """The real llama build from the suite's cache (built there once for the whole
    run), copied into a private cache so these tests' mutants stay out of it."""
    shared = synthetic.build_checkpoint("llama", pytestconfig.getoption("cache_dir"))
    private = cache / "synthetic" / shared.name
    shutil.copytree(shared, private)
    return private


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text(encoding="utf-8"))


def test_layout_loads_with_transformers(llama: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    assert llama.parent.name == "synthetic"
    assert llama.name.startswith("llama-") and len(llama.name) == len("llama-") + 16
    for name in synthetic.CHECKPOINT_FILES + ("build.json",):
        assert (llama / name).is_file(), name
    config = AutoConfig.from_pretrained(llama)
    assert config.architectures == ["LlamaForCausalLM"]
    assert _config(llama)["dtype"] == "float32"

    tokenizer = AutoTokenizer.from_pretrained(llama)
    assert len(tokenizer) == config.vocab_size
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.bos_token is None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "你好"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n"
    code = "def fibonacci(n):\n    return n  # 斐波那契"
    assert tokenizer.decode(tokenizer(code)["input_ids"]) == code  # byte-level: lossless

    record = json.loads((llama / "build.json").read_text(encoding="utf-8"))
    assert record["recipe"] == "llama"
    assert record["final_loss"] < record["initial_loss"] - 2  # it did learn


def test_reuse_does_not_rebuild(llama: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("rebuilt a valid cached checkpoint")

    monkeypatch.setattr(synthetic, "build_base", fail)
    assert synthetic.build_checkpoint("llama", cache) == llama
    assert synthetic.build_checkpoint("llama", cache, mutate={}) == llama


def test_mutate_config_deep_merges(llama: Path, cache: Path) -> None:
    mutate = {"config": {"rope_parameters": {"rope_theta": 1.0e6}, "rms_norm_eps": 1.0e-3}}
    mutant = synthetic.build_checkpoint("llama", cache, mutate=mutate)
    assert mutant != llama and mutant.parent == llama.parent
    base, changed = _config(llama), _config(mutant)
    assert changed["rope_parameters"] == {**base["rope_parameters"], "rope_theta": 1.0e6}
    assert changed["rms_norm_eps"] == 1.0e-3
    assert {k: v for k, v in changed.items() if k not in mutate["config"]} == {
        k: v for k, v in base.items() if k not in mutate["config"]
    }
    assert (mutant / "model.safetensors").read_bytes() == (llama / "model.safetensors").read_bytes()
    record = json.loads((mutant / "build.json").read_text(encoding="utf-8"))
    assert record["base"] == llama.name and record["mutate"] == mutate


def test_mutate_zero_prefixes(llama: Path, cache: Path) -> None:
    mutant = synthetic.build_checkpoint("llama", cache, mutate={"zero": ["model.layers.1.", "lm_head."]})
    base, changed = load_file(llama / "model.safetensors"), load_file(mutant / "model.safetensors")
    assert base.keys() == changed.keys()
    zeroed = [n for n in base if n.startswith(("model.layers.1.", "lm_head."))]
    assert len(zeroed) > 2
    for name in base:
        if name in zeroed:
            assert not changed[name].any() and base[name].any(), name
        else:
            assert torch.equal(changed[name], base[name]), name
    assert _config(mutant) == _config(llama)


def test_zero_prefix_matching_nothing_fails(llama: Path, cache: Path) -> None:
    with pytest.raises(ValueError, match="model.layer.1."):
        synthetic.build_checkpoint("llama", cache, mutate={"zero": ["model.layer.1."]})
    assert not list(llama.parent.glob(".llama-*.tmp-*"))  # the failed build left nothing


def test_bad_mutate_specs_fail_before_building(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'scale'"):
        synthetic.build_checkpoint("llama", tmp_path, mutate={"zero": ["lm_head."], "scale": 2})
    with pytest.raises(ValueError, match="list of tensor-name prefixes"):
        synthetic.build_checkpoint("llama", tmp_path, mutate={"zero": "lm_head."})
    with pytest.raises(ValueError, match="mapping"):
        synthetic.build_checkpoint("llama", tmp_path, mutate={"config": [("a", 1)]})
    with pytest.raises(ValueError, match="unknown recipe 'gpt9'"):
        synthetic.build_checkpoint("gpt9", tmp_path)
    assert not any(tmp_path.iterdir())


def test_cache_key_follows_mutate(llama: Path, cache: Path) -> None:
    a = synthetic.build_checkpoint("llama", cache, mutate={"zero": ["model.layers.0.", "lm_head."]})
    b = synthetic.build_checkpoint("llama", cache, mutate={"zero": ["lm_head.", "model.layers.0."]})
    c = synthetic.build_checkpoint("llama", cache, mutate={"zero": ["lm_head."]})
    d = synthetic.build_checkpoint("llama", cache, mutate={"config": {"rms_norm_eps": 1.0e-3}})
    assert a == b  # prefix order does not matter
    assert len({llama, a, c, d}) == 4


def testbase_key_follows_recipe_and_corpus() -> None:
    spec = synthetic.load_recipes()
    key = synthetic.base_key("llama", spec)
    assert synthetic.base_key("llama", copy.deepcopy(spec)) == key
    for path, value in [(("recipes", "llama", "train", "steps"), 1), (("tokenizer", "eos_token"), "</s>")]:
        changed = copy.deepcopy(spec)
        node = changed
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
        assert synthetic.base_key("llama", changed) != key, path
    fewer_files = {**spec, "corpus": spec["corpus"][:-1]}
    assert synthetic.base_key("llama", fewer_files) != key
    assert synthetic.base_key("granite", spec) != key


def test_invalid_dir_is_rebuilt(llama: Path, cache: Path) -> None:
    mutate = {"config": {"rms_norm_eps": 1.0e-4}}
    mutant = synthetic.build_checkpoint("llama", cache, mutate=mutate)
    (mutant / "tokenizer.json").unlink()  # e.g. a user cleaning up by hand
    assert synthetic.build_checkpoint("llama", cache, mutate=mutate) == mutant
    assert (mutant / "tokenizer.json").read_bytes() == (llama / "tokenizer.json").read_bytes()


def test_concurrent_builders_build_once(llama: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # flock locks belong to open file descriptions, so threads contend like processes.
    calls = []
    real = synthetic.build_mutant

    def counting(*args: object) -> None:
        calls.append(args)
        real(*args)

    monkeypatch.setattr(synthetic, "build_mutant", counting)
    mutate = {"zero": ["model.norm."]}
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(synthetic.build_checkpoint("llama", cache, mutate)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 4
    assert not list(llama.parent.glob(".llama-*.tmp-*"))


def test_deep_merge() -> None:
    base = {"a": {"b": 1, "c": {"d": 2}}, "e": [1], "f": 3}
    merged = deep_merge(base, {"a": {"c": {"d": 5, "x": 6}}, "e": [2], "f": {"g": 1}})
    assert merged == {"a": {"b": 1, "c": {"d": 5, "x": 6}}, "e": [2], "f": {"g": 1}}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "e": [1], "f": 3}  # not modified


def test_every_recipe_has_an_architecture_and_config() -> None:
    import transformers

    spec = synthetic.load_recipes()
    assert set(synthetic.available_recipes()) >= {"llama", "granite", "qwen2", "qwen3"}
    for name, entry in spec["recipes"].items():
        config = getattr(transformers, entry["architecture"]).config_class(**entry["config"])
        assert config.vocab_size == entry["config"]["vocab_size"], name
        assert config.head_dim == 64, name


@pytest.mark.unit
def test_quantized_cards_have_real_checkpoint_shapes() -> None:
    """Every synthetic quantized card's linear layers are whole blocks (FP8) or
    whole groups (GPTQ), as real checkpoints are: vLLM's own loaders (the kernel
    path, e.g. with AMX) refuse partial blocks that the patch would tolerate."""
    from npu_conformance.cards import load_catalog
    from npu_conformance.quantize import normalise_spec

    recipes = synthetic.load_recipes()["recipes"]
    checked = []
    for card in load_catalog().values():
        for source in (card.weights, card.reference_weights):
            if source is None or source.kind != "synthetic" or not source.quantize:
                continue
            spec = normalise_spec({k: v for k, v in source.quantize.items() if k != "fake"})
            config = recipes[source.ref]["config"]
            dims = {"hidden_size": config["hidden_size"], "intermediate_size": config["intermediate_size"]}
            unit = spec["block_size"][0] if spec["method"] == "fp8_block" else spec["group_size"]
            bad = {k: v for k, v in dims.items() if v % unit}
            assert not bad, f"{card.name}: {bad} not multiples of the {spec['method']} unit {unit}"
            checked.append(card.name)
    assert {"synthetic-qwen3-fp8", "synthetic-qwen2-gptq"} <= set(checked)


def test_mutate_scale_changes_one_tensor(llama: Path, cache: Path) -> None:
    name = "model.layers.1.post_attention_layernorm.weight"
    mutant = synthetic.build_checkpoint("llama", cache, mutate={"scale": {name: 1.05}})
    base, changed = load_file(llama / "model.safetensors"), load_file(mutant / "model.safetensors")
    for key in base:
        if key == name:
            torch.testing.assert_close(changed[key], base[key] * 1.05)
        else:
            assert torch.equal(changed[key], base[key]), key
    with pytest.raises(ValueError, match="no tensor"):
        synthetic.build_checkpoint("llama", cache, mutate={"scale": {"model.layers.9.mlp.weight": 1.1}})
    with pytest.raises(ValueError, match="numeric factors"):
        synthetic.build_checkpoint("llama", cache, mutate={"scale": {name: "1.1"}})


def _confident_cards() -> list[tuple[str, object]]:
    """The default cards whose embedded model's recipe declares the confidence it must reach."""
    from npu_conformance.cards import load_catalog

    recipes = synthetic.load_recipes()["recipes"]
    return [(name, card) for name, card in load_catalog().items()
            if card.default and card.weights.kind == "synthetic" and "confidence" in recipes[card.weights.ref]]


def test_deep_models_are_as_confident_as_real_checkpoints(pytestconfig: pytest.Config) -> None:
    """The bf16 and FP8 default cards run on models of 8 or more layers that put
    real checkpoints' confidence on the default prompts, long ones included: the
    fp32 golden's mean top-1 probability over every compared position, and the
    share of positions above 0.9 (the same cached reference the precision run uses)."""
    from npu_conformance.compare.metrics import by_rows, log_softmax
    from npu_conformance.engines.reference import reference_results, tokenize_prompts

    cards = _confident_cards()
    assert {"synthetic-llama-bf16", "synthetic-qwen3-fp8"} <= {name for name, _ in cards}
    cache_dir = pytestconfig.getoption("cache_dir")
    recipes = synthetic.load_recipes()["recipes"]
    for name, card in cards:
        recipe = recipes[card.weights.ref]
        assert recipe["config"]["num_hidden_layers"] >= 8, name
        checkpoint = synthetic.build_checkpoint(card.weights.ref, cache_dir, mutate=card.weights.mutate)
        prompts = tokenize_prompts(checkpoint, card.prompts, False, card.fill_tokens("cpu"))
        golden = reference_results(checkpoint, card.reference_dtype, False, prompts, card.max_tokens, cache_dir)
        # Chunk by chunk of rows: the 152k-vocabulary card's long prompt is 1.26 GB of logits.
        top1 = np.concatenate([by_rows(lambda rows: np.exp(log_softmax(rows).max(axis=-1)), r.logits)
                               for r in golden.values()])
        want = recipe["confidence"]
        assert top1.mean() >= want["mean_top1"] and (top1 > 0.9).mean() >= want["share_above_0.9"], (
            f"{name} ({card.weights.ref}): mean top-1 probability {top1.mean():.3f} (wanted >= {want['mean_top1']}), "
            f"share above 0.9 {(top1 > 0.9).mean():.2f} (wanted >= {want['share_above_0.9']}) over {top1.size} positions")
