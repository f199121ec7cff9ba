"""The package's shape, checked rather than promised: the flow card -> weights ->
reference | target -> compare -> verdict -> report, no import circle, no module
reaching into another's private names, and nothing installed under a top-level
name another PyPI project owns."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "npu_conformance"
# Where each subpackage's files are (setuptools package-dir in pyproject.toml).
FOLDERS = {PACKAGE: ROOT / PACKAGE, f"{PACKAGE}.fixtures": ROOT / "fixtures",
           f"{PACKAGE}.patches": ROOT / "patches", f"{PACKAGE}.reports": ROOT / "reports"}
# Layers, lowest first: a module may import its own layer and those before it.
LAYERS = [
    ["vllm_api"],
    ["merge", "platform", "cache", "patches", "devices", "host_load", "contention"],
    ["compare.metrics"],
    ["cards"],
    ["synthetic", "quantize", "weights"],
    ["engines", "golden"],
    ["compare"],
    ["perf", "bench", "baselines", "serving", "report", "conditions"],
    ["reports", "plugin", "cli", "changes"],
    ["fixtures"],
]


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if not any(name.startswith(f"{other}.") or name == other
                       for other in FOLDERS if other != package and other.startswith(f"{package}.")):
                found[name] = path
    return found


def layer(module: str) -> int:
    rest = module.removeprefix(f"{PACKAGE}.")
    matches = [(len(prefix), i) for i, names in enumerate(LAYERS) for prefix in names
               if rest == prefix or rest.startswith(f"{prefix}.")]
    assert matches, f"{module} is in no layer of {__name__}.LAYERS"
    return max(matches)[1]


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) of every import of the package in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            out.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith(PACKAGE)]
    return out


def resolve(module: str, name: str, known: dict[str, Path]) -> str:
    """`from module import name`: the submodule if `name` is one, else `module`."""
    return f"{module}.{name}" if f"{module}.{name}" in known else module


def test_every_module_is_in_a_layer_and_imports_only_below() -> None:
    known = modules()
    wrong = []
    for name, path in known.items():
        for module, names, line in imports(path):
            for target in {resolve(module, n, known) for n in names} or {module}:
                if target in known and layer(target) > layer(name):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} ({name}, layer {layer(name)}) imports "
                                 f"{target} (layer {layer(target)})")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle() -> None:
    known = modules()
    graph = {name: {t for module, names, _ in imports(path)
                    for t in ({resolve(module, n, known) for n in names} or {module}) if t in known and t != name}
             for name, path in known.items()}
    # A package's __init__ importing its own submodules is how packages work, not a circle.
    graph = {n: {t for t in ts if not n.startswith(f"{t}.")} for n, ts in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*trail[trail.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_no_private_name_crosses_a_module() -> None:
    known = modules()
    wrong = []
    for name, path in [*known.items(), *((f"tests.{p.stem}", p) for p in (ROOT / "tests").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and node.module and node.module.startswith(PACKAGE) for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name.startswith("_")]
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and isinstance(node.value, ast.Name) and node.value.id in aliases):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {node.value.id}.{node.attr}")
    assert not wrong, "\n".join(wrong)


# Where vLLM may be imported: the adapter (each name with its version's module),
# the patches (vLLM's own hooks, checked against the NPU pin by test_vllm_compat),
# and the tests of the patches.
VLLM_DOORS = ("npu_conformance/vllm_api.py", "patches/", "tests/test_patches.py")


def test_vllm_is_imported_only_through_the_adapter() -> None:
    files = [*modules().values(), *(ROOT / "tests").glob("*.py"), ROOT / "conftest.py"]
    wrong = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(VLLM_DOORS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{rel}:{node.lineno} imports {n}" for n in names if n == "vllm" or n.startswith("vllm.")]
    assert not wrong, "import vLLM through npu_conformance.vllm_api:\n" + "\n".join(wrong)


@pytest.mark.parametrize("name", ["fixtures", "patches", "reports"])
def test_no_top_level_name_is_installed(name: str, tmp_path: Path) -> None:
    """Outside the repo only npu_conformance.<name> exists: PyPI's `fixtures` or
    `reports` in a shared environment is never shadowed by ours."""
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0 and f"No module named '{name}'" in proc.stderr, proc.stderr
    ours = subprocess.run([sys.executable, "-c", f"import {PACKAGE}.{name}"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert ours.returncode == 0, ours.stderr
