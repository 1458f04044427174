"""README.md and docs/*.md name only what exists: every repository path, markdown link and dotted name of the
harness package they mention is on disk or defined in its module.

Dotted names are resolved by parsing the module with `ast`, so no module is imported (torch, Ray and Triton stay
unloaded). A name counts as defined when the module binds it at top level (def, class, assignment, import) or, for
`Class.member`, when the class body does. Short forms (`lifecycle.rank_main`, `report.collect`) are tried under
every harness module of that name. Several scenario sections share a name with a module (`memory.budget_gb`,
`launch.launcher`), so a short form whose every part is a field of the scenario or record models is a key, and
exists too. A path that is missing counts when the same document writes it (`--out results/x`) or git ignores it
outside results/ (tests/artifacts/).
"""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).resolve().parent.parent
DOCS = [REPO_DIR / "README.md", *sorted((REPO_DIR / "docs").glob("*.md"))]

TOP_DIRS = ("harness", "scenarios", "results", "docs", "tests", "scripts", "benchmarks")
PACKAGES = ("core", "scenario", "sizing", "rank", "report", "launch", "bench", "cli")
# A repository path in prose or code: it starts with a top-level directory of the checkout.
_PATH = re.compile(r"(?<![\w./~$-])(?:{})/[\w./<>*{{}}…-]*".format("|".join(TOP_DIRS)))
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"(?<![\w./-])((?:harness|{})(?:\.[A-Za-z_]\w*)+)".format("|".join(PACKAGES)))
_SHORT = re.compile(r"^([a-z_]\w*)\.([A-Za-z_][\w.]*?)(?:\(\))?$")
# What a path or name that is a pattern rather than a file looks like: <run-id>, rank-NNNNN, X.Y.Z, *.json, ...
_TEMPLATE = re.compile(r"[<>*{}…]|\.\.\.|NNN|X\.Y\.Z|\bX\b|\bOUT\b|\bSTEP\b|\bNAME\b")
_OUT = re.compile(r"--out[ =]+(\S+)")
# The pydantic models whose fields docs name as dotted keys: the scenario (model.preset) and the records
# (memory.allocator_rounding_bytes, kernels.release).
FIELD_MODULES = (
    "harness/scenario/schema.py",
    "harness/scenario/sections.py",
    "harness/scenario/deployment.py",
    "harness/scenario/matrix.py",
    "harness/core/records.py",
    "harness/report/model.py",
    "harness/bench/records.py",
)
MATRIX_ROOT = "matrix"  # a matrix file's one top-level key (`matrix.name`); its fields are Matrix's
_FILE_SUFFIXES = (
    ".md",
    ".json",
    ".yaml",
    ".yml",
    ".py",
    ".xml",
    ".html",
    ".txt",
    ".so",
    ".log",
    ".toml",
    ".sh",
    ".csv",
    ".png",
    ".pickle",
    ".tgz",
    ".whl",
    ".xz",
)


@dataclass(frozen=True)
class Mention:
    kind: str  # "path", "link" or "name"
    text: str  # as resolved: a path relative to the repository, or a dotted name under harness
    line: int


def mentions(text: str, *, doc_dir: str = "") -> list[Mention]:
    """The paths, link targets and harness dotted names a markdown text names, templates left out.

    doc_dir is the document's directory relative to the repository (markdown links are relative to it).
    """
    found: list[Mention] = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _PATH.finditer(line):
            path = re.sub(r":\d+$", "", match.group(0).rstrip(".,:;)'\""))
            if not _TEMPLATE.search(path):
                found.append(Mention("path", path, number))
        for match in _LINK.finditer(line):
            target = match.group(1)
            if re.match(r"[a-z]+:", target) or _TEMPLATE.search(target):
                continue
            file, _, anchor = target.partition("#")
            resolved = str(Path(doc_dir, file)) if file else ""
            found.append(Mention("link", f"{resolved}#{anchor}" if anchor else resolved, number))
        names = {m.group(1).rstrip(".") for m in _DOTTED.finditer(line)}
        for match in _BACKTICKED.finditer(line):
            short = _SHORT.match(match.group(1).strip())
            if short and short.group(1) in _module_basenames():
                names.add(f"{short.group(1)}.{short.group(2)}")
        for name in sorted(names):
            if not name.endswith(_FILE_SUFFIXES) and not _TEMPLATE.search(name):
                found.append(Mention("name", name, number))
    return found


@cache
def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the harness package."""
    out: dict[str, Path] = {}
    for path in (REPO_DIR / "harness").rglob("*.py"):
        parts = list(path.relative_to(REPO_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@cache
def _module_basenames() -> frozenset[str]:
    return frozenset(name.rsplit(".", 1)[-1] for name in _modules())


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _bound(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of `body` that binds `name`, if any (def, class, assignment, annotation, import)."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
            (alias.asname or alias.name.split(".")[0]) == name for alias in node.names
        ):
            return node
        if isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            inner = _bound(node.body, name) or _bound(getattr(node, "orelse", []), name)
            if inner is not None:
                return inner
    return None


def _resolves(dotted: str) -> bool:
    """True when `dotted` names a harness module, or an attribute its module (or a class in it) defines."""
    modules = _modules()
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in modules:
            rest = parts[i:]
            break
    else:
        return False
    body = _tree(modules[module]).body
    for attribute in rest:
        node = _bound(body, attribute)
        if node is None:
            return False
        if not isinstance(node, ast.ClassDef):
            return attribute is rest[-1] or isinstance(node, ast.Import | ast.ImportFrom)
        body = node.body
    return True


def _candidates(name: str) -> list[str]:
    """The full names a short form may stand for: as written, under harness, or under any harness module."""
    if name.startswith("harness.") or name == "harness":
        return [name]
    first = name.split(".")[0]
    full = [f"harness.{name}"]
    full += [f"{module.rsplit('.', 1)[0]}.{name}" for module in _modules() if module.rsplit(".", 1)[-1] == first]
    return full


@cache
def _field_names() -> frozenset[str]:
    """Every annotated class attribute of FIELD_MODULES: the fields of the scenario and record models."""
    return frozenset({MATRIX_ROOT}) | frozenset(
        node.target.id
        for module in FIELD_MODULES
        for cls in ast.walk(_tree(REPO_DIR / module))
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    )


def _is_key(name: str) -> bool:
    return not name.startswith("harness.") and all(part in _field_names() for part in name.split("."))


@cache
def _ignored(path: str) -> bool:
    done = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_DIR, timeout=30, check=False)
    return done.returncode == 0


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def written_by(text: str) -> set[str]:
    """The output directories a document's commands write (`--out DIR`)."""
    return {m.group(1).rstrip("/") for m in _OUT.finditer(text)}


def missing(mention: Mention, *, written: frozenset[str] = frozenset()) -> bool:
    """True when what the mention names is not in the repository (nor written by the document's own commands)."""
    if mention.kind == "name":
        return not _is_key(mention.text) and not any(_resolves(full) for full in _candidates(mention.text))
    path, _, anchor = mention.text.partition("#")
    target = REPO_DIR / path
    if not target.exists():
        made = any(path.rstrip("/") == out or path.startswith(out + "/") for out in written)
        return not (made or (not path.startswith("results/") and _ignored(path)))
    if anchor and target.suffix == ".md":
        headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.MULTILINE)
        return anchor not in {_slug(h) for h in headings}
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_DIR)))
def test_every_path_and_name_a_doc_mentions_exists(doc: Path):
    doc_dir = str(doc.parent.relative_to(REPO_DIR))
    text = doc.read_text()
    found = mentions(text, doc_dir="" if doc_dir == "." else doc_dir)
    assert found, "the extraction found nothing: the patterns no longer match the docs"
    written = frozenset(written_by(text))
    gone = [f"{doc.name}:{m.line}: {m.kind} {m.text}" for m in found if missing(m, written=written)]
    assert not gone, "named in the docs but not in the repository:\n" + "\n".join(gone)


@pytest.mark.parametrize(
    ("text", "kind", "named"),
    [
        ("See `harness/rank/comm/unfused.py` for the kernels.", "path", "harness/rank/comm/unfused.py"),
        ("Run scenarios/no-such-case.yaml, then read docs/absent.md.", "path", "scenarios/no-such-case.yaml"),
        ("The [guide](no-such-guide.md) says so.", "link", "docs/no-such-guide.md"),
        ("The [design](design.md#no-such-section) says so.", "link", "docs/design.md#no-such-section"),
        ("`harness.core.contract.dead_bytes` computes it.", "name", "harness.core.contract.dead_bytes"),
        ("Call `lifecycle.can_run` first.", "name", "lifecycle.can_run"),
        ("`harness.core.contract.SizingArgs.P` is the letter.", "name", "harness.core.contract.SizingArgs.P"),
        ("Set `memory.budget_tb` to shrink the GPU.", "name", "memory.budget_tb"),
        ("Compare with results/baselines/gpu-nightly.", "path", "results/baselines/gpu-nightly"),
    ],
)
def test_a_made_up_path_or_name_is_caught(text: str, kind: str, named: str):
    found = [m for m in mentions(text, doc_dir="docs") if m.kind == kind and m.text == named]
    assert found, f"{named} was not extracted from {text!r}"
    assert missing(found[0])


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("`harness/rank/comm/fused.py`", "harness/rank/comm/fused.py"),
        ("[the design](design.md#the-workspace-contract)", "docs/design.md#the-workspace-contract"),
        ("`harness.core.contract.live_set_bytes`", "harness.core.contract.live_set_bytes"),
        ("`harness.core.contract.SizingArgs.M`", "harness.core.contract.SizingArgs.M"),
        ("`lifecycle.rank_main`", "lifecycle.rank_main"),
        ("report.collect recomputes every verdict", "report.collect"),
        ("`memory.budget_gb` caps the GPU", "memory.budget_gb"),
    ],
)
def test_what_exists_is_found(text: str, named: str):
    found = [m for m in mentions(text, doc_dir="docs") if m.text == named]
    assert found, f"{named} was not extracted from {text!r}"
    assert not missing(found[0])


def test_templates_and_files_are_not_names():
    text = "`results/<run-id>/`, `ranks/rank-NNNNN.json`, `report.json`, `scenarios/X.yaml`, `torch.ops.load_library`"
    assert mentions(text) == []


def test_what_a_document_writes_need_not_exist():
    text = "harness run smoke --out results/my-run\nharness compare results/baselines/cpu-smoke results/my-run\n"
    written = frozenset(written_by(text))
    paths = [m for m in mentions(text) if m.kind == "path"]
    assert [m.text for m in paths] == ["results/my-run", "results/baselines/cpu-smoke", "results/my-run"]
    assert not any(missing(m, written=written) for m in paths)
    assert all(missing(m) for m in paths if m.text == "results/my-run")
