"""Disk caches: computed once, reused, keyed by what determines the result,
atomic, and safe with several processes (pytest-xdist workers)."""

import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

from npu_conformance import cache
from npu_conformance.cards import Prompt
from npu_conformance.engines.reference import reference_results, tokenize_prompts
from npu_conformance.cache import fingerprint

pytestmark = pytest.mark.unit


def test_cached_arrays_computes_once_then_reads(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"a": np.arange(3)}

    path = tmp_path / "x.npz"
    first = cache.cached_arrays(path, compute)
    second = cache.cached_arrays(path, compute)
    assert calls == [1]
    np.testing.assert_array_equal(first["a"], second["a"])
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_corrupt_entry_is_recomputed_not_fatal(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(b"half a file")
    with pytest.warns(cache.CacheDamaged, match=f"{path} is damaged .it has no manifest"):
        assert cache.cached_arrays(path, lambda: {"a": np.ones(2)})["a"].tolist() == [1.0, 1.0]


def test_sizes_are_checked_on_every_read(tmp_path):
    """The sha256 is checked once per process; a size change is seen even after it."""
    path = tmp_path / "x.npz"
    cache.cached_arrays(path, lambda: {"a": np.arange(100)})
    cache.cached_arrays(path, lambda: pytest.fail("recomputed an intact entry"))
    stat = path.stat()
    path.write_bytes(path.read_bytes()[:-1])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same mtime as when it was hashed
    with pytest.warns(cache.CacheDamaged, match="x.npz has .* bytes, its manifest says"):
        assert cache.cached_arrays(path, lambda: {"a": np.arange(3)})["a"].tolist() == [0, 1, 2]


def test_failed_compute_leaves_nothing_behind(tmp_path):
    def boom():
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError):
        cache.cached_arrays(tmp_path / "x.npz", boom)
    assert not (tmp_path / "x.npz").exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def _worker(path: str, log: str) -> None:
    def compute():
        with open(log, "a") as f:
            f.write("computed\n")
        return {"a": np.arange(10)}

    cache.cached_arrays(Path(path), compute)


def test_parallel_processes_compute_once(tmp_path):
    path, log = tmp_path / "x.npz", tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(path), str(log))) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert log.read_text().count("computed") == 1


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A real (random-init) Llama checkpoint: the cache test needs transformers for real."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny")
    vocab = {chr(c): i for i, c in enumerate(range(97, 123))} | {"<eos>": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=27, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_reference_is_cached_and_keyed(tiny_checkpoint, tmp_path):
    prompts = tokenize_prompts(tiny_checkpoint, (Prompt("a", "abc"),), False)
    first = reference_results(tiny_checkpoint, "float32", False, prompts, 4, tmp_path)
    files = sorted((tmp_path / "reference").glob("*.npz"))
    mtimes = [f.stat().st_mtime_ns for f in files]
    again = reference_results(tiny_checkpoint, "float32", False, prompts, 4, tmp_path)
    assert [f.stat().st_mtime_ns for f in files] == mtimes, "a cache hit must not rewrite the entry"
    np.testing.assert_array_equal(first["a"].logits, again["a"].logits)
    assert len(first["a"].tokens) == 4
    assert first["a"].logits.shape == (len(prompts["a"]) + 4 - 1, 27)

    reference_results(tiny_checkpoint, "float32", False, prompts, 5, tmp_path)
    reference_results(tiny_checkpoint, "bfloat16", False, prompts, 4, tmp_path)
    assert len(list((tmp_path / "reference").glob("*.npz"))) == 3, "length and dtype must be part of the key"


def test_reference_logits_match_a_direct_forward(tiny_checkpoint, tmp_path):
    """The cached rows are the model's own logits: row j predicts token j + 1."""
    import torch
    from transformers import AutoModelForCausalLM

    prompts = tokenize_prompts(tiny_checkpoint, (Prompt("a", "hello"),), False)
    result = reference_results(tiny_checkpoint, "float32", False, prompts, 3, tmp_path)["a"]
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([result.full_ids])).logits[0].numpy()
    np.testing.assert_allclose(result.logits, logits[:-1], atol=1e-5)
    assert result.tokens == [int(logits[len(result.prompt_ids) - 1 + i].argmax()) for i in range(3)]


def test_fingerprint_sees_a_changed_tensor(tiny_checkpoint, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    assert fingerprint(copy) == fingerprint(tiny_checkpoint)
    tensors = load_file(copy / "model.safetensors")
    name = sorted(tensors)[len(tensors) // 2]
    tensors[name] = tensors[name] * 0
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(copy) != fingerprint(tiny_checkpoint)


def test_long_prompts_are_repeated_and_cut(tiny_checkpoint):
    prompts = (Prompt("plain", "abc"), Prompt("long", "abc", 10), Prompt("fill", "xy", "fill"))
    ids = tokenize_prompts(tiny_checkpoint, prompts, False, fill_tokens=7)
    assert ids["plain"] == [0, 1, 2]
    assert ids["long"] == [0, 1, 2] * 3 + [0]
    assert ids["fill"] == [23, 24] * 3 + [23]
    with pytest.raises(ValueError, match="length: fill"):
        tokenize_prompts(tiny_checkpoint, prompts[2:], False)
