"""The package layout: no import circles between modules, and every package imports only the layers below it.

The import graph is built with `ast` from every `import` and `from ... import` in harness/, at any depth (inside
functions too), so a lazy import cannot hide a circle. `if TYPE_CHECKING:` blocks are included as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "harness"

# What each package may import (its own modules always). Each package's __init__ docstring says the same.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "scenario": {"core"},
    "sizing": {"core", "scenario"},
    "rank": {"core", "scenario", "sizing"},
    "report": {"core", "scenario", "sizing"},
    "launch": {"core", "scenario", "sizing", "rank", "report"},
    "bench": {"core", "scenario", "sizing", "rank", "launch", "report"},
    "verify": {"core", "scenario", "sizing"},
}
TOP_MODULES = {"cli", "cli_parsers", "cli_search", "__main__", "__init__"}  # the command layer may import anything
# harness/_version.py is written by setuptools-scm at install (the version alone, imports nothing); not a layer
GENERATED = {"_version"}


def module_name(path: Path, root: Path = HARNESS) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in HARNESS.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                # the longest known module the target names: `from harness.x import f` depends on harness.x
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "harness":
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_find_cycle_detects_a_circle():
    # the checker itself can fail: a three-module circle is found and named in order
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _package(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) == 2 and parts[1] in GENERATED:
        return None
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] not in TOP_MODULES) else None


def test_packages_import_only_the_layers_below():
    graph = import_graph()
    wrong = []
    for module, targets in graph.items():
        package = _package(module)
        if package is None:
            continue
        assert package in ALLOWED, f"{module}: package {package!r} is not in the layer table of this test"
        for target in targets:
            other = _package(target)
            if other is None and target.split(".")[-1] in TOP_MODULES:
                wrong.append(f"{module} imports the command layer {target}")
            elif other is not None and other != package and other not in ALLOWED[package]:
                wrong.append(f"{module} ({package}) imports {target} ({other})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_says_what_it_owns_and_may_import(package):
    doc = ast.get_docstring(ast.parse((HARNESS / package / "__init__.py").read_text()))
    assert doc and "May import" in doc, f"harness/{package}/__init__.py must say what it may import"
    allowed = ALLOWED[package]
    said = doc[doc.index("May import") :]
    for other in allowed:
        assert f"harness.{other}" in said, f"harness/{package}/__init__.py does not list harness.{other}"


# argparse belongs to the command layer: library entry points take typed requests (RunRequest, BenchRequest,
# AuditRequest, CompareRequest, ...) that harness/cli.py builds from the parsed arguments. serve_args parses
# vLLM's own `vllm serve` command line (a DeploymentSpec), not the harness's.
# The CPU-cost probes `harness bench` runs as processes of their own are scripts too (python -m harness.bench.probe_*).
ARGPARSE_ALLOWED = {"harness.cli", "harness.cli_parsers", "harness.cli_search", "harness.sizing.serve_args",
                    "harness.bench.probe_collect",
                    "harness.bench.probe_matrix_collect", "harness.bench.probe_plan_matrix",
                    "harness.bench.probe_search"}  # fmt: skip


def argparse_users(root: Path) -> list[str]:
    """Modules under `root` (named as module_name does) that import argparse or name it, at any depth."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [node.id] if isinstance(node, ast.Name) else [])  # fmt: skip
            if any(name.split(".")[0] == "argparse" for name in names):
                found.append(module_name(path, root))
                break
    return found


def test_only_the_command_layer_imports_argparse():
    wrong = [m for m in argparse_users(HARNESS) if m not in ARGPARSE_ALLOWED]
    assert not wrong, "import argparse outside harness/cli.py (take a typed request instead): " + ", ".join(wrong)


def test_argparse_users_finds_each_spelling(tmp_path):
    # the checker itself can fail: a plain import, a from-import and a lazy import inside a function are found
    package = tmp_path / "harness"
    package.mkdir()
    (package / "plain.py").write_text("import argparse\n")
    (package / "from_import.py").write_text("from argparse import Namespace\n")
    (package / "lazy.py").write_text("def f():\n    import argparse as ap\n    return ap\n")
    (package / "clean.py").write_text('"""takes no argparse.Namespace"""\nimport json\n')
    assert argparse_users(package) == ["harness.from_import", "harness.lazy", "harness.plain"]


def test_the_parser_is_built_without_the_models_it_dispatches_to():
    # Every command builds the whole parser first, so whatever building it imports, every invocation pays for (a
    # refusal of bad input included): it takes option choices from light modules, not the deployment model or torch.
    import subprocess
    import sys

    code = (
        "import sys; from harness.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'harness.sizing.deployment', 'harness.sizing.search') if m in sys.modules))"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_a_local_run_s_driver_does_without_torch_and_says_what_torch_says():
    # A driver builds its ranks' infos, probes the machine and writes run.json's versions without importing torch
    # (about 2 s of CPU that only the ranks need); the versions it writes are the ones torch itself gives.
    import subprocess
    import sys

    code = (
        "import sys, json; from harness.launch.local import LocalLauncher; from harness.launch.run import run_ranks; "
        "from harness.rank.distributed import RankInfo, free_port; from harness.core.environment import "
        "collect_versions; LocalLauncher().resources(); RankInfo(rank=0, world_size=1, master_addr='127.0.0.1', "
        "master_port=free_port(), comm_backend='gloo', device_type='cpu'); v = collect_versions(); "
        "imported = 'torch' in sys.modules; import torch; "
        "print(json.dumps([imported, v.torch == torch.__version__, v.cuda == torch.version.cuda]))"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[false, true, true]"


@pytest.mark.parametrize(
    ("text", "cuda"),
    [
        (
            "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n",
            "13.0",
        ),
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n", None),
        ("__version__ = '2.1.0'\ncuda = '12.1'\n", "12.1"),
        ("cuda = compute()\n", None),
        ("this is not python (\n", None),
    ],
)
def test_the_cuda_build_is_read_from_torch_s_version_file(tmp_path, text, cuda):
    from harness.core.environment import cuda_of_version_file

    (tmp_path / "version.py").write_text(text)
    assert cuda_of_version_file(tmp_path / "version.py") == cuda
    assert cuda_of_version_file(tmp_path / "missing.py") is None
