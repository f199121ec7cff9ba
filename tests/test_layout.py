"""The package's shape, checked rather than promised: the flow card -> weights ->
reference | target -> compare -> verdict -> report, no import circle, no module
reaching into another's private names, and nothing installed under a top-level
name another PyPI project owns."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "npu_conformance"
# Layers, lowest first: a module may import its own layer and those before it.
# A folder (subpackage) sits in one layer as a whole.
LAYERS = [
    ["vllm_api"],
    ["process"],
    ["merge", "platforms", "cache", "patches", "device_pool", "host_load", "contention"],
    ["cards"],
    ["synthetic", "quantize", "weights"],
    ["engines", "golden"],
    ["compare"],
    ["perf", "bench", "baselines", "serving", "report", "report_schema", "conditions", "accuracy"],
    ["reports", "plugin", "cli", "changes"],
    ["fixtures"],
]
# The most lines a module of the package may have: past it, a module holds more than one concern.
MAX_LINES = 400
# The pytest fixtures: a package of the repository, registered by conftest.py and
# never installed (outside the repo `fixtures` stays PyPI's name).
FIXTURES = "fixtures"
# The mission's other root folders stay there as documented entry points (a README
# each): their code is npu_conformance's, which vLLM and the CLI import when installed.
ROOT_FOLDERS = ("patches", "reports")


def modules() -> dict[str, Path]:
    found = {}
    for path in [*(ROOT / PACKAGE).rglob("*.py"), *(ROOT / FIXTURES).rglob("*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
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
VLLM_DOORS = ("npu_conformance/vllm_api.py", "npu_conformance/patches/", "tests/test_patches.py")


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


def test_the_folder_tree_is_the_import_tree() -> None:
    """Every folder of Python files is the package it imports as: no setuptools
    package-dir mapping, no Python file outside the package, fixtures/, tests/ and conftest.py."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "package-dir" not in pyproject["tool"]["setuptools"], "pyproject.toml maps a package to another folder"
    folders = {path.parent for path in modules().values()}
    assert not [f for f in folders if not (f / "__init__.py").is_file()], "a folder of modules is no package"
    stray = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
             if not p.relative_to(ROOT).parts[0].startswith(".")
             and p.relative_to(ROOT).parts[0] not in (PACKAGE, FIXTURES, "tests", "conftest.py")]
    assert not stray, f"Python files outside the package: {stray}"
    for name in ROOT_FOLDERS:
        assert (ROOT / name / "README.md").is_file(), f"{name}/ at the root documents where its code lives"


def test_each_folder_sits_in_one_layer() -> None:
    known = modules()
    parents = {name.rsplit(".", 1)[0] for name in known if "." in name}
    for folder in parents - {PACKAGE}:
        layers = {name: layer(name) for name in known if name == folder or name.startswith(f"{folder}.")}
        assert len(set(layers.values())) == 1, f"{folder} straddles layers: {layers}"


def test_no_module_is_over_the_line_limit() -> None:
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by concern): {long}"


def _not_importable_outside_the_repo(name: str, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode != 0 and f"No module named '{name}'" in proc.stderr, proc.stderr


def test_the_fixtures_are_not_installed(tmp_path: Path) -> None:
    """PyPI's `fixtures` in a shared environment is never shadowed by ours."""
    _not_importable_outside_the_repo(FIXTURES, tmp_path)


@pytest.mark.parametrize("name", ROOT_FOLDERS)
def test_no_top_level_name_is_installed(name: str, tmp_path: Path) -> None:
    """Outside the repo only npu_conformance.<name> exists, from its own folder:
    PyPI's `reports` in a shared environment is never shadowed by ours."""
    _not_importable_outside_the_repo(name, tmp_path)
    ours = subprocess.run([sys.executable, "-c", f"import {PACKAGE}.{name} as m; print(m.__file__)"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert ours.returncode == 0, ours.stderr
    assert Path(ours.stdout.strip()).as_posix().endswith(f"{PACKAGE}/{name}/__init__.py"), ours.stdout
