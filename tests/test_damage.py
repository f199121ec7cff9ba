"""Damaged caches: a truncated or bit-flipped entry, or a build killed half way,
is reported by path and rebuilt by the next run, never used or fatal.

A "next run" is a fresh interpreter: within one process an entry is hashed once,
so bit rot is a later run's to find (sizes are checked on every read)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fakehub import FakeHub

from npu_conformance import cache, synthetic
from npu_conformance.quantize import quantized_checkpoint

pytestmark = pytest.mark.robustness

ROOT = Path(__file__).resolve().parent.parent
MUTATE = {"zero": ["lm_head."]}  # a cheap rebuild through the same synthetic cache path
QUANTIZE = {"method": "gptq", "bits": 8, "group_size": 64}


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    """One bit in the middle: for a checkpoint a weight, which loads without error."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x10]))


DAMAGE = [truncate, flip]  # truncated: the size is wrong; flipped: only the sha256 is


def next_run(code: str) -> str:
    """Run `code` in a fresh interpreter and return what it wrote to stderr."""
    proc = subprocess.run([sys.executable, "-W", "always", "-c", f"from pathlib import Path\n{code}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def assert_reported(stderr: str, entry: Path, name: str) -> None:
    assert "CacheDamaged" in stderr and f"cache entry {entry} is damaged ({name}" in stderr, stderr


def assert_clean_hit(get: Callable[[], object]) -> None:
    """`get()` finds its entry intact: no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", cache.CacheDamaged)
        get()


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    """A private cache holding a copy of the suite's llama build (built once per run)."""
    root = tmp_path_factory.mktemp("cache")
    shared = synthetic.build_checkpoint("llama", pytestconfig.getoption("cache_dir"))
    shutil.copytree(shared, root / "synthetic" / shared.name)
    return root


ARRAYS = "{'logits': np.arange(4096, dtype=np.float32).reshape(64, 64), 'tokens': np.arange(7)}"


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_reference_npz_is_rebuilt(damage, tmp_path: Path) -> None:
    path = tmp_path / "reference" / "entry.npz"
    path.parent.mkdir()
    code = f"import numpy as np\nfrom npu_conformance import cache\ncache.cached_arrays(Path({str(path)!r}), lambda: {ARRAYS})"
    next_run(code)
    damage(path)
    assert_reported(next_run(code), path, "entry.npz")
    expected = eval(ARRAYS)
    got = cache.cached_arrays(path, lambda: pytest.fail("recomputed a rebuilt entry"))
    assert got.keys() == expected.keys() and all(np.array_equal(got[k], v) for k, v in expected.items())


def _assert_rebuilt(damage, entry: Path, next_run_code: str, again) -> None:
    """Damage the entry's weights; the next run reports and rebuilds them byte for byte."""
    original = (entry / "model.safetensors").read_bytes()
    damage(entry / "model.safetensors")
    assert_reported(next_run(next_run_code), entry, "model.safetensors")
    assert (entry / "model.safetensors").read_bytes() == original
    assert_clean_hit(again)


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_synthetic_checkpoint_is_rebuilt(damage, private_cache: Path) -> None:
    mutant = synthetic.build_checkpoint("llama", private_cache, mutate=MUTATE)
    _assert_rebuilt(damage, mutant, f"from npu_conformance import synthetic\n"
                    f"synthetic.build_checkpoint('llama', Path({str(private_cache)!r}), mutate={MUTATE!r})",
                    lambda: synthetic.build_checkpoint("llama", private_cache, mutate=MUTATE))


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_quantized_checkpoint_is_rebuilt(damage, private_cache: Path) -> None:
    base = synthetic.build_checkpoint("llama", private_cache)
    target = quantized_checkpoint(base, private_cache, QUANTIZE)
    _assert_rebuilt(damage, target, f"from npu_conformance.quantize import quantized_checkpoint\n"
                    f"quantized_checkpoint(Path({str(base)!r}), Path({str(private_cache)!r}), {QUANTIZE!r})",
                    lambda: quantized_checkpoint(base, private_cache, QUANTIZE))


def test_build_killed_half_way_is_cleared_by_the_next(tmp_path: Path) -> None:
    final = tmp_path / "entry"
    code = (f"import time\nfrom npu_conformance import cache\n"
            f"def build(tmp):\n    (tmp / 'weights.bin').write_bytes(b'half')\n    time.sleep(120)\n"
            f"cache.cached_directory(Path({str(final)!r}), build, lambda p: p.is_dir(), verify=True)")
    proc = subprocess.Popen([sys.executable, "-c", f"from pathlib import Path\n{code}"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".entry.tmp-*/weights.bin")):
            assert time.monotonic() < deadline and proc.poll() is None, "the build never started"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert not final.exists()

    def build(tmp: Path) -> None:
        (tmp / "weights.bin").write_bytes(b"whole")

    assert cache.cached_directory(final, build, lambda p: p.is_dir(), verify=True) == final
    assert not list(tmp_path.glob(".entry.tmp-*")), "the killed build's temp directory is left"
    assert (final / "weights.bin").read_bytes() == b"whole"
    assert_clean_hit(lambda: cache.cached_directory(final, pytest.fail, lambda p: p.is_dir(), verify=True))


def test_temp_file_of_a_killed_writer_is_cleared(tmp_path: Path) -> None:
    path = tmp_path / "entry.npz"
    leftover = tmp_path / ".entry.npz.k1ll3d.tmp"
    leftover.write_bytes(b"half an npz")
    cache.cached_arrays(path, lambda: {"a": np.ones(3)})
    assert not leftover.exists()


def test_entry_failing_its_validity_check_is_reported_and_rebuilt(private_cache: Path) -> None:
    """A synthetic build whose build.json went missing (its validity check fails,
    whatever the manifest says) is named and rebuilt, not silently replaced."""
    entry = synthetic.build_checkpoint("llama", private_cache, mutate=MUTATE)
    (entry / "build.json").unlink()
    stderr = next_run(f"from npu_conformance import synthetic\n"
                      f"synthetic.build_checkpoint('llama', Path({str(private_cache)!r}), mutate={MUTATE!r})")
    assert_reported(stderr, entry, "it is incomplete: it fails its own validity check")
    assert (entry / "build.json").is_file()
    assert_clean_hit(lambda: synthetic.build_checkpoint("llama", private_cache, mutate=MUTATE))


DOWNLOAD = "from npu_conformance.cards import WeightSource\nfrom npu_conformance.weights import resolve\n"


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_download_is_refused_offline_and_downloaded_again(damage, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A published download whose weights are damaged later is never loaded:
    offline it is refused by path, online it is reported and downloaded again."""
    files = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}',
             "model.safetensors": np.random.default_rng(0).bytes(1 << 16), "tokenizer_config.json": b"{}"}
    cache_root = tmp_path / "cache"
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope"))
    with FakeHub() as hub:
        hub.add("org/name", files, "master")
        for variable in ("MODELSCOPE_ENDPOINT", "HF_ENDPOINT"):
            monkeypatch.setenv(variable, hub.url)
        get = f"{DOWNLOAD}print(resolve(WeightSource('modelscope', 'org/name'), Path({str(cache_root)!r}), None, %s))"
        next_run(get % False)
        entry = cache_root / "downloads" / "modelscope" / "org--name" / "default"
        damage(entry / "model.safetensors")
        offline = subprocess.run([sys.executable, "-c", f"from pathlib import Path\n{get % True}"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
        assert offline.returncode != 0 and "WeightsUnavailable" in offline.stderr, offline.stderr
        assert f"{entry} is damaged (model.safetensors" in offline.stderr, offline.stderr
        assert_reported(next_run(get % False), entry, "model.safetensors")
        assert (entry / "model.safetensors").read_bytes() == files["model.safetensors"]
