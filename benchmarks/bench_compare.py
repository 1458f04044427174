"""Compare benchmark (not a timed test): `harness compare` of two collected matrices of N synthetic rank records.

    python benchmarks/bench_compare.py [--cells 1024] [--cell-ranks 16] [--repeats 3] [--out DIR]

Both matrices (--cells cells of --cell-ranks ranks: 16384 rank records each by default; a run holds at most 1024
ranks) are built by the real matrix expansion, their records written as a launcher would (tests/report_records.py,
the real pydantic records), and collected once as `harness run MATRIX` does (benchmarks/bench_matrix_collect.py).
Then `harness compare A B --json` runs as a command; its CPU time (user + system of the child) and its own peak
memory (VmHWM, read in the child at exit) are measured. compare verifies each collected report against its records
(report digest, sibling generations, the records' bytes re-hashed) and reads the verified report.json instead of
collecting again. Targets: <= 10 s of CPU and <= 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(REPO_DIR / "tests"))

sys.path.insert(0, str(REPO_DIR / "benchmarks"))

from bench_matrix_collect import collect_as_run, synthetic_matrix  # noqa: E402
from report_records import write_run  # noqa: E402

TARGET_CPU_S = 10.0
TARGET_RSS_BYTES = 500 * 10**6


def _collected_matrix(tmp: Path, name: str, *, cells: int, cell_ranks: int) -> Path:
    matrix = synthetic_matrix(tmp / f"{name}-spec", num_cells=cells, ranks_per_cell=cell_ranks)
    for cell in matrix.cells():
        write_run(tmp / name / cell.name, cell.scenario, device_kind="cpu", run_id=f"{name}-{cell.name}")
    collect_as_run(tmp / name, matrix)
    return tmp / name


# The child's own peak (VmHWM) at exit: getrusage's ru_maxrss of children can carry the parent's peak across fork.
_COMPARE = """
import atexit, runpy, sys
def _peak():
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(f"VmHWM_KIB {kib}", file=sys.stderr)
atexit.register(_peak)
sys.argv = ["harness", "compare", *sys.argv[1:], "--json"]
runpy.run_module("harness", run_name="__main__")
"""


def _compare(baseline: Path, current: Path) -> tuple[float, float, int, int]:
    """(wall s, CPU s, peak RSS bytes, exit code) of one `harness compare` command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _COMPARE, str(baseline), str(current)], cwd=REPO_DIR,
                          capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"harness compare exited {done.returncode}: {done.stderr.strip()[-400:]}")
    peak = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("VmHWM_KIB ")]
    return wall, cpu, peak[-1] * 1024, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1024)
    parser.add_argument("--cell-ranks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write compare.json and compare.md here")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        baseline = _collected_matrix(Path(tmp), "baseline", cells=ns.cells, cell_ranks=ns.cell_ranks)
        current = _collected_matrix(Path(tmp), "current", cells=ns.cells, cell_ranks=ns.cell_ranks)
        setup_s = time.perf_counter() - t0
        samples = [_compare(baseline, current) for _ in range(ns.repeats)]
    cpu = statistics.median(s[1] for s in samples)
    rss = max(s[2] for s in samples)
    ok = cpu <= TARGET_CPU_S and rss <= TARGET_RSS_BYTES
    result = {
        "schema_version": 1, "benchmark": "harness compare of two collected matrices",
        "cells": ns.cells, "cell_ranks": ns.cell_ranks, "records_each": ns.cells * ns.cell_ranks,
        "cpu_s_median": cpu, "samples": [{"wall_s": w, "cpu_s": c, "max_rss_bytes": r, "exit_code": e}
                                         for w, c, r, e in samples],
        "max_rss_bytes": rss, "target_cpu_s": TARGET_CPU_S, "target_rss_bytes": TARGET_RSS_BYTES,
        "meets_targets": ok, "setup_s": setup_s, "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "command": f"python benchmarks/bench_compare.py --cells {ns.cells} --cell-ranks {ns.cell_ranks} "
                   f"--repeats {ns.repeats}",
    }
    lines = [
        f"# bench_compare: harness compare of two collected matrices, {ns.cells} cells x {ns.cell_ranks} ranks "
        f"({ns.cells * ns.cell_ranks} rank records) each",
        f"# {os.cpu_count()} CPUs, load average {result['load_average']:.2f}; setup (write + collect both) "
        f"{setup_s:.1f} s",
        "", "| sample | wall s | CPU s | max RSS MB | exit |", "|---:|---:|---:|---:|---:|",
        *(f"| {i + 1} | {w:.2f} | {c:.2f} | {r / 1e6:.0f} | {e} |" for i, (w, c, r, e) in enumerate(samples)),
        "", f"{'OK' if ok else 'FAILED'}: median {cpu:.2f} s of CPU (target {TARGET_CPU_S:g} s), peak "
        f"{rss / 1e6:.0f} MB (target {TARGET_RSS_BYTES / 1e6:.0f} MB)",
    ]
    print("\n".join(lines))
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
        (ns.out / "compare.md").write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
