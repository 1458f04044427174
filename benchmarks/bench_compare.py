"""Compare benchmark (not a timed test): `harness compare` of two collected matrices of N synthetic rank records.

    nice python benchmarks/bench_compare.py [--cells 1024] [--cell-ranks 16] [--repeats 3] [--out DIR]

Both matrices (--cells cells of --cell-ranks ranks: 16384 rank records each by default; a run holds at most 1024
ranks) are built by the real matrix expansion, their records written as a launcher would (tests/report_records.py,
the real pydantic records), and collected once as `harness run MATRIX` does (benchmarks/bench_matrix_collect.py).
Then `harness compare A B --json` runs as a command; its CPU time (user + system of the child) and its own peak
memory (VmHWM, read in the child at exit) are measured. compare parses each matrix's report.json (the cells'
summaries, no per-rank entry) and verifies it by bytes: its content digest, its siblings' generations, the sha256
of matrix.json, and per cell the sha256 of its records and of its own report.json; no record and no cell report
is parsed. Targets: <= 10 s of CPU and <= 500 MB. --out writes compare.json (CompareBench) and compare.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR))

from pydantic import BaseModel, ConfigDict  # noqa: E402

from harness.bench.probe_matrix_collect import collect_as_run, synthetic_matrix  # noqa: E402
from harness.bench.synthetic import write_run  # noqa: E402

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
    done = subprocess.run(
        [sys.executable, "-c", _COMPARE, str(baseline), str(current)],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"harness compare exited {done.returncode}: {done.stderr.strip()[-400:]}")
    peak = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("VmHWM_KIB ")]
    return wall, cpu, peak[-1] * 1024, done.returncode


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    wall_s: float
    cpu_s: float
    max_rss_bytes: int
    exit_code: int


class Machine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str
    cpu_model: str
    cpus: int | None
    load_avg_1m_before: float  # the load when the comparisons started, and when they ended (the machine is shared)
    load_avg_1m_after: float
    python: str
    pydantic: str


class CompareBench(BaseModel):
    """compare.json: what this benchmark measured, where and how it was run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = 2  # 2: the machine section and the report sizes
    benchmark: str = "harness compare of two collected matrices"
    command: str
    cells: int
    cell_ranks: int
    records_each: int
    matrix_report_json_bytes: int  # one matrix's report.json: the cells' summaries
    cell_report_json_bytes: int  # all of one matrix's cells' own report.json files together
    cpu_s_median: float
    max_rss_bytes: int
    samples: list[Sample]
    target_cpu_s: float
    target_rss_bytes: int
    meets_targets: bool
    setup_s: float
    machine: Machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(
                (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                platform.processor() or "unknown",
            )
    except OSError:
        return platform.processor() or "unknown"


def _sizes(matrix_dir: Path) -> tuple[int, int]:
    cells = sum(p.stat().st_size for p in matrix_dir.glob("*/report.json"))
    return (matrix_dir / "report.json").stat().st_size, cells


def main() -> int:
    from importlib import metadata

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
        matrix_bytes, cell_bytes = _sizes(current)
        load_before = os.getloadavg()[0]
        raw = [_compare(baseline, current) for _ in range(ns.repeats)]
        load_after = os.getloadavg()[0]
    samples = [Sample(wall_s=w, cpu_s=c, max_rss_bytes=r, exit_code=e) for w, c, r, e in raw]
    cpu = statistics.median(s.cpu_s for s in samples)
    rss = max(s.max_rss_bytes for s in samples)
    result = CompareBench(
        command=f"nice python benchmarks/bench_compare.py --cells {ns.cells} --cell-ranks {ns.cell_ranks} "
        f"--repeats {ns.repeats}" + (f" --out {ns.out}" if ns.out else ""),
        cells=ns.cells,
        cell_ranks=ns.cell_ranks,
        records_each=ns.cells * ns.cell_ranks,
        matrix_report_json_bytes=matrix_bytes,
        cell_report_json_bytes=cell_bytes,
        cpu_s_median=cpu,
        max_rss_bytes=rss,
        samples=samples,
        target_cpu_s=TARGET_CPU_S,
        target_rss_bytes=TARGET_RSS_BYTES,
        meets_targets=cpu <= TARGET_CPU_S and rss <= TARGET_RSS_BYTES,
        setup_s=setup_s,
        machine=Machine(
            node=platform.node(),
            cpu_model=_cpu_model(),
            cpus=os.cpu_count(),
            load_avg_1m_before=round(load_before, 2),
            load_avg_1m_after=round(load_after, 2),
            python=platform.python_version(),
            pydantic=metadata.version("pydantic"),
        ),
    )
    m = result.machine
    lines = [
        f"# bench_compare: harness compare of two collected matrices, {ns.cells} cells x {ns.cell_ranks} ranks "
        f"({result.records_each} rank records) each",
        "",
        f"- command: `{result.command}`",
        f"- machine: {m.node}, {m.cpus} CPUs ({m.cpu_model}), shared; load average (1 min) {m.load_avg_1m_before:.2f} "
        f"when the comparisons started, {m.load_avg_1m_after:.2f} when they ended; Python {m.python}, pydantic "
        f"{m.pydantic}",
        f"- setup (write + collect both matrices): {setup_s:.1f} s; one matrix's report.json "
        f"{matrix_bytes / 1e6:.1f} MB (the cells' summaries), its cells' own report.json files "
        f"{cell_bytes / 1e6:.1f} MB (hashed, not parsed)",
        "",
        "| sample | wall s | CPU s | max RSS MB | exit |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {i + 1} | {s.wall_s:.2f} | {s.cpu_s:.2f} | {s.max_rss_bytes / 1e6:.0f} | {s.exit_code} |"
            for i, s in enumerate(samples)
        ),
        "",
        f"{'OK' if result.meets_targets else 'FAILED'}: median {cpu:.2f} s of CPU (target {TARGET_CPU_S:g} s), "
        f"peak {rss / 1e6:.0f} MB (target {TARGET_RSS_BYTES / 1e6:.0f} MB)",
    ]
    print("\n".join(lines))
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "compare.json").write_text(result.model_dump_json(indent=1) + "\n")
        (ns.out / "compare.md").write_text("\n".join(lines) + "\n")
    return 0 if result.meets_targets else 1


if __name__ == "__main__":
    raise SystemExit(main())
