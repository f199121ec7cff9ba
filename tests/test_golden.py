"""Golden references (npu_conformance.golden): written by --save-reference or the
CLI, read by --reference-path, refused when they do not match the card, and a
precision run from one gives the verdicts and figures of the run that computed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from npu_conformance import golden
from npu_conformance.cards import load_catalog
from npu_conformance.engines.reference import ReferenceResult

ROOT = Path(__file__).resolve().parent.parent
CARD = "synthetic-llama"


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, object], dict[str, ReferenceResult]]:
    """A small golden reference of the synthetic Llama's card over a stand-in checkpoint."""
    card = load_catalog()[CARD]
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    rng = np.random.default_rng(0)
    prompts = {p.id: [1, 2, 3 + i] for i, p in enumerate(card.prompts)}
    results = {pid: ReferenceResult(ids, [7] * card.max_tokens,
                                    rng.standard_normal((len(ids) + card.max_tokens - 1, 32)).astype(np.float32))
               for pid, ids in prompts.items()}
    directory = tmp_path / "golden" / CARD
    golden.save(directory, card, checkpoint, checkpoint, prompts, results)
    return directory, golden.expected(card, checkpoint, prompts), results


@pytest.mark.unit
def test_saved_reference_reads_back_exactly(saved) -> None:
    directory, wanted, results = saved
    assert golden.is_golden(directory.parent) and golden.find(directory.parent, CARD) == directory
    assert golden.find(directory, CARD) == directory  # one card's folder works as well
    manifest, loaded = golden.load(directory, wanted)
    assert manifest.card == CARD and manifest.versions.keys() == {"torch", "transformers", "numpy"}
    assert loaded.keys() == results.keys()
    for pid, result in results.items():
        got = loaded[pid]
        assert got.prompt_ids == result.prompt_ids and got.tokens == result.tokens
        assert got.logits.dtype == np.float32 and np.array_equal(got.logits, result.logits)


@pytest.mark.unit
@pytest.mark.parametrize("change, field, words", [
    ({"checkpoint": "0" * 64}, "checkpoint", "other weights or revision"),
    ({"reference_dtype": "bfloat16"}, "reference_dtype", "is 'float32', the card's is 'bfloat16'"),
    ({"max_tokens": 99}, "max_tokens", "the card's is 99"),
    ({"trust_remote_code": True}, "trust_remote_code", "the card's is True"),
    ({"card": "other"}, "card", "the card's is 'other'"),
])
def test_manifest_that_does_not_match_the_card_is_refused(saved, change, field, words) -> None:
    directory, wanted, _ = saved
    with pytest.raises(golden.GoldenError) as err:
        golden.load(directory, {**wanted, **change})
    assert err.value.field == field and words in str(err.value)
    assert str(directory / golden.GOLDEN) in str(err.value)


@pytest.mark.unit
def test_other_prompts_are_refused(saved) -> None:
    directory, wanted, _ = saved
    prompts = dict(wanted["prompts"])
    first = next(iter(prompts))
    with pytest.raises(golden.GoldenError, match=f"field 'prompts.{first}': other token ids"):
        golden.load(directory, {**wanted, "prompts": {**prompts, first: "changed"}})
    with pytest.raises(golden.GoldenError, match="field 'prompts': has no prompt 'new'"):
        golden.load(directory, {**wanted, "prompts": {**prompts, "new": "x"}})
    del prompts[first]
    with pytest.raises(golden.GoldenError, match="has prompts the card does not"):
        golden.load(directory, {**wanted, "prompts": prompts})


@pytest.mark.unit
def test_damaged_golden_reference_is_refused(saved) -> None:
    directory, wanted, _ = saved
    arrays = directory / golden.ARRAYS
    arrays.write_bytes(arrays.read_bytes()[:-10])
    with pytest.raises(golden.GoldenError, match=r"field '<files>': the directory is damaged \(reference.npz has"):
        golden.load(directory, wanted)


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "precision",
                           "tests/test_precision.py", "--model", CARD, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800, env=dict(os.environ))


def _figures(report_dir: Path) -> dict[str, object]:
    """What a run concluded about the card: every prompt's figures and checks, and the verdict."""
    model = json.loads((report_dir / "precision_report.json").read_text())["models"][CARD]
    return {"prompts": model["prompts"], "verdict": model["verdict"], "errors": model["errors"]}


@pytest.mark.harness
def test_precision_from_golden_references_equals_the_computing_run(tmp_path: Path,
                                                                   pytestconfig: pytest.Config) -> None:
    """Run 1 computes the reference and saves it; the CLI saves it too; run 2 reads
    the CLI's copy instead of running transformers. Same verdicts, same figures."""
    cache = f"--cache-dir={pytestconfig.getoption('cache_dir')}"
    first = _pytest(cache, f"--save-reference={tmp_path / 'saved'}", f"--report-dir={tmp_path / 'computed'}")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    cli = subprocess.run([sys.executable, "-m", "npu_conformance.cli", "save-reference", "--model", CARD, cache,
                          "--out", str(tmp_path / "cli")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert cli.returncode == 0, cli.stderr[-4000:]
    with np.load(tmp_path / "saved" / CARD / golden.ARRAYS) as a, np.load(tmp_path / "cli" / CARD / golden.ARRAYS) as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)

    second = _pytest(cache, f"--reference-path={tmp_path / 'cli'}", f"--report-dir={tmp_path / 'golden'}")
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    reference = json.loads((tmp_path / "golden" / "precision_report.json").read_text())["models"][CARD]["reference"]
    assert reference["source"] == "golden" and reference["path"] == str(tmp_path / "cli" / CARD)
    computed, from_golden = _figures(tmp_path / "computed"), _figures(tmp_path / "golden")
    assert computed["verdict"] == "pass" and computed == from_golden
