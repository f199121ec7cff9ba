"""The download path (npu_conformance.weights) with the real pinned clients,
modelscope and huggingface_hub, against a loopback hub (tests/fakehub.py): a
download is verified before it is published, a pinned revision is honoured, a
missing one is named, an interrupted or corrupted download never leaves a
checkpoint behind, a hub that does not answer costs seconds, --offline asks no
hub, and a ModelScope card falls back to the same ref on the HF hub."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from modelscope_hub.config import set_default_config
from safetensors.numpy import save

from fakehub import BlackHole, FakeHub
from npu_conformance.cache import MANIFEST
from npu_conformance.cards import CATALOG_DIR, DEFAULTS_NAME, WeightSource
from npu_conformance.synthetic import build_checkpoint
from npu_conformance.weights import DOWNLOAD_RECORD, WeightsUnavailable, hub_answers, resolve

pytestmark = pytest.mark.hub

ROOT = Path(__file__).resolve().parent.parent
REF = "org/name"
SLUG = "org--name"
# The hub each card kind is downloaded from first, and that hub's default branch.
DEFAULT_BRANCH = {"modelscope": "master", "hf": "main"}


def checkpoint(tag: str) -> dict[str, bytes]:
    """A small checkpoint whose bytes depend on `tag` (256 KiB of weights)."""
    seed = int(hashlib.sha256(tag.encode()).hexdigest()[:8], 16)
    weights = np.random.default_rng(seed).standard_normal((256, 256)).astype(np.float32)
    return {"config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "tag": tag}).encode(),
            "model.safetensors": save({"w": weights}),
            "tokenizer_config.json": b"{}"}


def contents(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir() if p.name not in (DOWNLOAD_RECORD, MANIFEST)}


def leftovers(cache: Path) -> list[Path]:
    """Temporary download directories still on disk."""
    return sorted(cache.glob("downloads/*/*/.*.tmp-*"))


def closed_port_url() -> str:
    """An endpoint that refuses connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(autouse=True)
def fresh_clients(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test asks its own hubs: the once-per-run probe forgotten, the
    ModelScope client's process-wide config (its lock files) under tmp_path."""
    hub_answers.cache_clear()
    monkeypatch.delenv("MODELSCOPE_DOMAIN", raising=False)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope-cache"))
    set_default_config(None)
    yield
    hub_answers.cache_clear()
    set_default_config(None)


def point_at(monkeypatch: pytest.MonkeyPatch, modelscope: str, hf: str) -> None:
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", modelscope)
    monkeypatch.setenv("HF_ENDPOINT", hf)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """One loopback server as both hubs."""
    with FakeHub() as hub:
        point_at(monkeypatch, hub.url, hub.url)
        yield hub


@pytest.mark.parametrize("kind", ["modelscope", "hf"])
def test_download_is_verified_published_and_reused(hub: FakeHub, kind: str, tmp_path: Path) -> None:
    files = checkpoint("v1")
    snapshot = hub.add(REF, files, DEFAULT_BRANCH[kind])
    cache = tmp_path / "cache"

    path = resolve(WeightSource(kind, REF), cache, None, False)

    assert path == cache / "downloads" / kind / SLUG / "default"
    assert contents(path) == files  # the HF client's .cache/ bookkeeping is gone too
    record = json.loads((path / DOWNLOAD_RECORD).read_text())
    assert record["hub"] == kind and {f["name"] for f in record["files"]} == set(files)
    if kind == "hf":  # files are asked by the listed commit, not the moving branch
        assert record["commit"] == snapshot.commit
        assert all(snapshot.commit in r.path for r in hub.downloads())
    assert not leftovers(cache)
    asked = len(hub.requests)
    assert resolve(WeightSource(kind, REF), cache, None, False) == path
    assert len(hub.requests) == asked, "a published download is used from disk"


@pytest.mark.parametrize("kind", ["modelscope", "hf"])
def test_pinned_revision_is_honoured(hub: FakeHub, kind: str, tmp_path: Path) -> None:
    hub.add(REF, checkpoint("v1"), DEFAULT_BRANCH[kind])
    hub.add(REF, checkpoint("v2"), "v2")
    cache = tmp_path / "cache"

    pinned = resolve(WeightSource(kind, REF, revision="v2"), cache, None, False)
    default = resolve(WeightSource(kind, REF), cache, None, False)

    assert pinned == cache / "downloads" / kind / SLUG / "v2"
    assert contents(pinned) == checkpoint("v2") and contents(default) == checkpoint("v1")


@pytest.mark.parametrize("kind", ["modelscope", "hf"])
def test_missing_revision_names_the_ref_and_revision(hub: FakeHub, kind: str, tmp_path: Path) -> None:
    hub.add(REF, checkpoint("v1"), "master", "main")

    with pytest.raises(WeightsUnavailable) as caught:
        resolve(WeightSource(kind, REF, revision="v9"), tmp_path / "cache", None, False)

    message = str(caught.value)
    assert f"{kind}:{REF}@v9" in message and "no revision 'v9' of org/name" in message
    assert ("ModelScope" in message) == (kind == "modelscope")  # a ModelScope card tried the HF hub too
    assert "Hugging Face hub" in message
    assert not list((tmp_path / "cache").glob("downloads/*/*/v9"))


@pytest.mark.parametrize("kind", ["modelscope", "hf"])
def test_dropped_connection_is_retried_to_a_verified_checkpoint(hub: FakeHub, kind: str, tmp_path: Path) -> None:
    hub.add(REF, checkpoint("v1"), DEFAULT_BRANCH[kind])
    hub.drop_once.add("model.safetensors")

    path = resolve(WeightSource(kind, REF), tmp_path / "cache", None, False)

    assert not hub.drop_once, "the fault fired"
    assert len([r for r in hub.downloads() if "model.safetensors" in r.path]) == 2
    assert contents(path) == checkpoint("v1") and not leftovers(tmp_path / "cache")


@pytest.mark.parametrize("kind", ["modelscope", "hf"])
def test_a_killed_download_leaves_nothing_a_later_run_uses(hub: FakeHub, kind: str, tmp_path: Path) -> None:
    """What a run killed mid-download leaves (its temp dir; an unverified copy
    from before downloads were published by rename) is cleared, not loaded."""
    hub.add(REF, checkpoint("v1"), DEFAULT_BRANCH[kind])
    cache = tmp_path / "cache"
    final = cache / "downloads" / kind / SLUG / "default"
    for half in (final, final.parent / ".default.tmp-killed"):
        half.mkdir(parents=True)
        (half / "config.json").write_bytes(checkpoint("v1")["config.json"])
        (half / "model.safetensors").write_bytes(checkpoint("v1")["model.safetensors"][:1000])

    path = resolve(WeightSource(kind, REF), cache, None, False)

    assert path == final and contents(path) == checkpoint("v1")
    assert not leftovers(cache)


def test_sha256_mismatch_is_reported_and_nothing_published(hub: FakeHub, tmp_path: Path) -> None:
    hub.add(REF, checkpoint("v1"), "master", "main")
    hub.corrupt.add("model.safetensors")
    cache = tmp_path / "cache"

    with pytest.raises(WeightsUnavailable) as caught:
        resolve(WeightSource("modelscope", REF), cache, None, False)

    modelscope, hf = str(caught.value).split("Hugging Face hub (")
    assert "Hash mismatch for model.safetensors" in modelscope  # the ModelScope client checks the listed sha256
    assert "model.safetensors: sha256 mismatch" in hf  # the suite checks the HF hub's lfs sha256
    assert not list(cache.glob("downloads/*/*/default")) and not leftovers(cache)
    hub.corrupt.clear()
    assert contents(resolve(WeightSource("modelscope", REF), cache, None, False)) == checkpoint("v1")


def test_silent_hub_is_detected_within_seconds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with BlackHole() as hole:
        point_at(monkeypatch, hole.url, closed_port_url())
        start = time.monotonic()
        with pytest.raises(WeightsUnavailable) as caught:
            resolve(WeightSource("modelscope", REF), tmp_path / "cache", None, False)
        elapsed = time.monotonic() - start
        assert hole.connections >= 1
        # Decided once per run: the next card does not wait again.
        again = time.monotonic()
        with pytest.raises(WeightsUnavailable):
            resolve(WeightSource("modelscope", "org/other"), tmp_path / "cache", None, False)
        assert time.monotonic() - again < 2

    message = str(caught.value)
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert f"ModelScope ({hole.url}): did not answer within 5 s" in message
    assert "Hugging Face hub (" in message and "unreachable" in message
    assert "modelscope download --model org/name --local_dir DIR" in message and "--weights-dir=PARENT" in message


def test_offline_never_touches_the_hub(hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub.add(REF, checkpoint("v1"), "master")
    cache = tmp_path / "cache"
    downloaded = resolve(WeightSource("modelscope", REF), cache, None, False)
    with BlackHole() as hole:
        point_at(monkeypatch, hole.url, hole.url)

        assert resolve(WeightSource("modelscope", REF), cache, None, True) == downloaded
        with pytest.raises(WeightsUnavailable, match="is not on disk and the run is offline"):
            resolve(WeightSource("modelscope", "org/other"), cache, None, True)

        assert hole.connections == 0


@pytest.mark.parametrize(("revision", "hf_revision"), [("master", "main"), ("v2", "v2")])
def test_modelscope_card_falls_back_to_the_same_ref_on_hf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          revision: str, hf_revision: str) -> None:
    """ModelScope's default branch is the HF hub's default branch; a pin stays the pin."""
    with FakeHub() as modelscope, FakeHub() as hf:
        hf.add(REF, checkpoint(hf_revision), hf_revision)
        point_at(monkeypatch, modelscope.url, hf.url)

        path = resolve(WeightSource("modelscope", REF, revision=revision), tmp_path / "cache", None, False)

        assert modelscope.requests, "ModelScope was asked first"
        assert path == tmp_path / "cache" / "downloads" / "hf" / SLUG / ("default" if revision == "master" else "v2")
        assert contents(path) == checkpoint(hf_revision)
        asked = len(hf.requests) + len(modelscope.requests)
        assert resolve(WeightSource("modelscope", REF, revision=revision), tmp_path / "cache", None, False) == path
        assert len(hf.requests) + len(modelscope.requests) == asked


def test_precision_run_downloads_its_card_through_the_hub(pytestconfig: pytest.Config, tmp_path: Path) -> None:
    """One real precision run (one vLLM engine) of a card whose weights come from
    the loopback ModelScope: the synthetic Llama's files at a pinned revision,
    against the reference of the synthetic Llama itself."""
    llama = build_checkpoint("llama", pytestconfig.getoption("cache_dir"))
    cache = tmp_path / "cache"
    # The reference's synthetic Llama as already built, so the run does not train it
    # again, and the session's reference results, so it does not recompute them: the
    # download path is under test here, not the reference.
    shutil.copytree(llama, cache / "synthetic" / llama.name)
    shared_references = pytestconfig.getoption("cache_dir") / "reference"
    shared_references.mkdir(parents=True, exist_ok=True)
    (cache / "reference").symlink_to(shared_references, target_is_directory=True)
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.copy(CATALOG_DIR / DEFAULTS_NAME, catalog)
    card = {"name": "hub-llama", "description": "the synthetic Llama, downloaded from the loopback hub",
            "architecture": "LlamaForCausalLM", "weights": {"modelscope": "org/hub-llama", "revision": "v1"},
            "reference": {"weights": {"synthetic": "llama"}}}
    (catalog / "hub-llama.yaml").write_text(yaml.safe_dump(card), encoding="utf-8")

    with FakeHub() as hub:
        hub.add("org/hub-llama", llama, "v1")
        env = {**os.environ, "MODELSCOPE_ENDPOINT": hub.url, "HF_ENDPOINT": hub.url,
               "MODELSCOPE_CACHE": str(tmp_path / "modelscope-cache"), "HF_HOME": str(tmp_path / "hf-home")}
        env.pop("NPU_CONFORMANCE_OFFLINE", None)
        proc = subprocess.run(
            # The card's precision checks; its serving conditions (one engine each) are not the download's.
            [sys.executable, "-m", "pytest", "tests/test_precision.py", "-m", "precision", f"--catalog={catalog}",
             "--model", "hub-llama",
             "-p", "no:cacheprovider", f"--cache-dir={cache}", f"--report-dir={tmp_path / 'results'}", "-q", "-rs"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)

    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "weights unavailable" not in output and "PASS hub-llama" in proc.stdout, proc.stdout[-3000:]
    downloaded = cache / "downloads" / "modelscope" / "org--hub-llama" / "v1"
    assert json.loads((downloaded / DOWNLOAD_RECORD).read_text())["endpoint"] == hub.url
    assert [r for r in hub.downloads() if "model.safetensors" in r.path]
