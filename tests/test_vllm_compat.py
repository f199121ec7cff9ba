"""The vLLM the NPU job runs, checked where it cannot run: every vLLM name the
adapter (npu_conformance.vllm_api) and the load-time patches import exists in
the source of the vLLM that the `npu` extra pins, and takes the keywords the
suite passes it in that version (the adapter's KEYWORDS_SINCE).

The source is the pinned release's own wheel from the package index (pip
download --no-deps), its Python files kept in the cache. Attributes read on
vLLM's runtime objects (llm.llm_engine.model_config, ...) are not named by any
import: the CPU run on the oldest installable vLLM (README, "Older vLLM")
exercises those.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from npu_conformance import vllm_api

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "npu_conformance" / "patches"


def npu_pin() -> str:
    """The vLLM version the `npu` extra pins (pyproject.toml)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    pins = [m.group(1) for dep in extras["npu"] if (m := re.fullmatch(r"vllm==(\S+)", dep.strip()))]
    assert len(pins) == 1, f"the npu extra pins no single vllm==X: {extras['npu']}"
    return pins[0]


class Source:
    """A vLLM source tree (a folder holding vllm/), read with ast, never imported."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    @functools.lru_cache(maxsize=None)
    def tree(self, module: str) -> ast.Module | None:
        path = self.path(module)
        return ast.parse(path.read_text(encoding="utf-8")) if path else None

    def find(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """Where `module`'s `name` is defined: (module, its def, class or
        assignment), following imports, lazy attribute tables and submodules."""
        tree = self.tree(module)
        if tree is None or depth > 8:
            return None
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return module, node
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        found = self.find(self.absolute(module, node), alias.name, depth + 1)
                        if found:
                            return found
            # vllm/__init__.py's lazy table: {"LLM": ".entrypoints.llm:LLM", ...}
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if (isinstance(key, ast.Constant) and key.value == name and isinstance(value, ast.Constant)
                            and isinstance(value.value, str) and ":" in value.value):
                        target, _, attr = value.value.partition(":")
                        target = f"vllm{target}" if target.startswith(".") else target
                        return self.find(target, attr, depth + 1)
        # A module-level __getattr__ that answers for the name (vllm.platforms' current_platform).
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and any(
                    isinstance(c, ast.Constant) and c.value == name for c in ast.walk(node)):
                return module, node
        submodule = f"{module}.{name}"
        return (submodule, self.tree(submodule)) if self.path(submodule) else None

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if self.path(module).name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def parameters(self, module: str, node: ast.AST) -> set[str] | None:
        """The keywords a callable accepts: its parameters, or a class's __init__'s
        or its fields' (dataclasses, msgspec structs, TypedDicts) with its bases'; None: any."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.args.kwarg is not None:
                return None
            return {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
        if not isinstance(node, ast.ClassDef):
            return None
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is not None:
            return self.parameters(module, init)
        fields = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for base in node.bases:
            if isinstance(base, ast.Name) and (found := self.find(module, base.id)) and isinstance(found[1],
                                                                                                  ast.ClassDef):
                inherited = self.parameters(*found)
                if inherited is None:
                    return None
                fields |= inherited
        return fields


def patch_imports() -> dict[tuple[str, str], set[str]]:
    """(module, name) -> the keywords the patches pass it, for every vLLM name they import."""
    used: dict[tuple[str, str], set[str]] = {}
    for path in sorted(PATCHES.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        local = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
                for alias in node.names:
                    used.setdefault((node.module, alias.name), set())
                    local[alias.asname or alias.name] = (node.module, alias.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in local:
                used[local[node.func.id]] |= {k.arg for k in node.keywords if k.arg}
    return used


def problems(source: Source, version: tuple[int, ...]) -> list[str]:
    """What the adapter and the patches use that this vLLM source lacks."""
    wanted = {(module, name): vllm_api.keywords(name, version) for name, module in vllm_api.NAMES.items()}
    wanted.update({(vllm_api.SERVE_BENCHMARK, name): set() for name in ("add_cli_args", "main")})
    for key, keywords in patch_imports().items():
        wanted.setdefault(key, set()).update(keywords)
    found_problems = []
    for (module, name), keywords in sorted(wanted.items()):
        found = source.find(module, name)
        if found is None:
            found_problems.append(f"{module}.{name}: not found")
            continue
        accepted = source.parameters(*found)
        if accepted is not None and name in vllm_api.KEYWORDS_OF:
            other = vllm_api.KEYWORDS_OF[name]
            more = source.find(vllm_api.NAMES[other], other)
            accepted = None if more is None else (accepted | (source.parameters(*more) or set()))
        if accepted is not None and (missing := sorted(keywords - accepted)):
            found_problems.append(f"{module}.{name}: takes no keyword {', '.join(missing)}")
    return found_problems


@pytest.fixture(scope="module")
def pinned_source(pytestconfig: pytest.Config) -> Source:
    """The pinned NPU vLLM's Python files, from its wheel on the package index, cached."""
    version = npu_pin()
    folder = Path(pytestconfig.getoption("cache_dir")) / "vllm-source" / version
    if not (folder / "vllm" / "__init__.py").is_file():
        download = folder.with_name(f".{version}.download")
        shutil.rmtree(download, ignore_errors=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
                               "--only-binary", ":all:", "--quiet", "-d", str(download)],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            pytest.fail(f"cannot fetch vllm=={version}'s wheel from the package index (the npu extra's pin): "
                        f"{proc.stderr.strip()[-2000:]}", pytrace=False)
        [wheel] = download.glob("*.whl")
        staging = folder.with_name(f".{version}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(staging, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
        shutil.rmtree(download)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)  # whole or absent: a broken download is never read as the source
    return Source(folder)


def test_the_adapter_and_patches_fit_the_pinned_npu_vllm(pinned_source: Source) -> None:
    found = problems(pinned_source, vllm_api.parse_version(npu_pin()))
    assert not found, f"vllm=={npu_pin()} (the npu extra's pin) lacks:\n" + "\n".join(found)


def test_the_adapter_and_patches_fit_the_installed_vllm() -> None:
    """The same check on the vLLM for CPU this host runs: the checker itself reads a real tree right."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    found = problems(Source(Path(spec.origin).parents[1]), vllm_api.version())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("file, old, new, expected", [
    # A function vLLM removed.
    ("distributed/parallel_state.py", "def cleanup_dist_env_and_memory(", "def renamed_cleanup(",
     "vllm.distributed.parallel_state.cleanup_dist_env_and_memory: not found"),
    # A keyword the suite passes, gone from the struct's fields.
    ("sampling_params.py", "    ignore_eos: bool", "    renamed_ignore_eos: bool",
     "vllm.SamplingParams: takes no keyword ignore_eos"),
])
def test_a_removed_symbol_fails_the_check(pinned_source: Source, tmp_path: Path, file: str, old: str, new: str,
                                          expected: str) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(pinned_source.root, copy)
    path = copy / "vllm" / file
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{file} no longer holds {old!r}: pick another symbol for this test"
    path.write_text(text.replace(old, new), encoding="utf-8")
    assert expected in problems(Source(copy), vllm_api.parse_version(npu_pin()))


def test_a_keyword_is_passed_only_where_vllm_takes_it() -> None:
    assert "quantization" not in vllm_api.keywords("choose_scaled_mm_linear_kernel", (0, 29, 0))
    assert "quantization" in vllm_api.keywords("choose_scaled_mm_linear_kernel", (0, 30, 0))


def test_private_rpc_dir_takes_what_engines_leave_and_keeps_a_users_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(vllm_api.RPC_PATH_ENV, raising=False)
    with vllm_api.private_rpc_dir() as folder:
        assert folder and os.environ[vllm_api.RPC_PATH_ENV] == folder
        # What a signalled engine leaves: a bound unix socket's file.
        left = socket.socket(socket.AF_UNIX)
        left.bind(os.path.join(folder, "engine-core-input"))
        left.close()
        assert os.listdir(folder)
    assert not os.path.exists(folder) and vllm_api.RPC_PATH_ENV not in os.environ
    monkeypatch.setenv(vllm_api.RPC_PATH_ENV, "/users/own")
    with vllm_api.private_rpc_dir() as folder:
        assert folder is None and os.environ[vllm_api.RPC_PATH_ENV] == "/users/own"
    assert os.environ[vllm_api.RPC_PATH_ENV] == "/users/own"


def test_the_session_gives_vllm_a_private_rpc_dir() -> None:
    """fixtures.target holds one for the run (unless the user set the variable): a
    stopped server's sockets go there and with it, not into /tmp for good."""
    path = os.environ.get(vllm_api.RPC_PATH_ENV, "")
    assert os.path.isdir(path), f"{vllm_api.RPC_PATH_ENV}={path!r}"
