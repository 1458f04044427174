"""One source per fact: byte units, their formatting helpers and the memory roundings are defined once, in
harness/core/, and every other module imports them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.core.rounding import BASELINE_ROUNDING_BYTES, UNRECORDED_BASELINE_ROUNDING_BYTES
from harness.core.units import GIB, KIB, MIB, TIB, UNIT_BYTES, human_bytes, next_pow2

HARNESS_DIR = Path(__file__).resolve().parent.parent / "harness"

# A module-level definition of the name (NAME = ... or def NAME): where each may appear.
DEFINED_ONCE = {
    r"^(KIB|MIB|GIB|TIB) = ": "harness/core/units.py",
    r"^def next_pow2\(": "harness/core/units.py",
    r"^def (human_bytes|exact_bytes)\(": "harness/core/units.py",
    r"^(RSS_ROUNDING_BYTES|PRE_WARMUP_RSS_ROUNDING_BYTES|CUDA_PAGE_BYTES|CUDA_SMALL_SEGMENT_BYTES) = ": (
        "harness/core/rounding.py"
    ),
}


@pytest.mark.parametrize(("pattern", "home"), DEFINED_ONCE.items())
def test_a_unit_or_rounding_is_defined_in_one_module(pattern: str, home: str) -> None:
    found = sorted(
        {
            str(path.relative_to(HARNESS_DIR.parent))
            for path in HARNESS_DIR.rglob("*.py")
            if re.search(pattern, path.read_text(), re.M)
        }
    )
    assert found == [home]


def test_the_units_and_the_helpers() -> None:
    assert (KIB, MIB, GIB, TIB) == (1024, 1024**2, 1024**3, 1024**4)
    assert UNIT_BYTES == {"B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB}
    assert [next_pow2(n) for n in (1, 2, 3, 4, 5, 17, 1024, 1025)] == [1, 2, 4, 4, 8, 32, 1024, 2048]
    assert human_bytes(56 * GIB) == "56.0 GiB" and human_bytes(2 * TIB) == "2.00 TiB" and human_bytes(512) == "512 B"


def test_the_rank_and_the_checks_share_the_roundings() -> None:
    import torch

    from harness.rank.memory import baseline_rounding_bytes
    from harness.report.checks import BASELINE_ROUNDING_BYTES as CHECKS_FALLBACK

    assert baseline_rounding_bytes(torch.device("cpu")) == BASELINE_ROUNDING_BYTES["rss"] == 4 * MIB
    assert CHECKS_FALLBACK is UNRECORDED_BASELINE_ROUNDING_BYTES
    assert UNRECORDED_BASELINE_ROUNDING_BYTES["nvml"] == BASELINE_ROUNDING_BYTES["nvml"] == 2 * MIB


def test_the_harness_imports_and_runs_nothing_from_tests_or_benchmarks() -> None:
    """`harness bench` (and every other module) stands on harness/ alone: what it measures lives in the package."""
    import ast

    repo = HARNESS_DIR.parent
    foreign = {p.stem for d in ("tests", "benchmarks") for p in (repo / d).glob("*.py")} | {"tests", "benchmarks"}
    found = []
    for path in sorted(HARNESS_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [f"{path.relative_to(repo)} imports {n}" for n in names if n.split(".")[0] in foreign]
            in_bench = path.parent.name == "bench"  # junit.xml's own "tests" attribute is not the folder
            if in_bench and isinstance(node, ast.Constant) and node.value in ("tests", "benchmarks"):
                found.append(f"{path.relative_to(repo)} names the {node.value}/ folder")
    assert not found, found
