"""Matrix collect benchmark (not a timed test): the CPU time of what `harness run MATRIX` does after its cells ran.

    python -m harness.bench.probe_matrix_collect [--records 1024] [--cell-ranks 16] [--cells 1024] [--repeats 3]
                                                 [--json] [--out results/bench/cpu-costs]
    (benchmarks/bench_matrix_collect.py runs the same)

Two targets, as CPU time (user + sys of this process: the 2-core machine is shared, wall time is not a measure):
    records   the same --records synthetic rank records collected as one run, and as a matrix of
              --records / --cell-ranks cells: each cell collected as it finishes (its own reports written, no
              figure on its page) and then the combined report from those cells. Target: the matrix <= 3x the run.
    cells     a --cells matrix of one rank per cell, the same path. Target: <= 60 s of CPU.
The records are built with the real pydantic models (harness.bench.synthetic) and the cells by the real matrix
expansion (harness.scenario.matrix); the collect path is harness.report.collect.collect per cell, as
harness.launch.run's run_scenario calls it, then harness.report.matrix.collect_matrix with the collected reports.
--out writes matrix-collect.json and matrix-collect.md there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.bench.synthetic import write_run
from harness.report.collect import CollectResult, collect
from harness.report.matrix import collect_matrix
from harness.report.model import RunReport
from harness.scenario.matrix import Matrix, matrix_from_data
from harness.scenario.sections import REPO_DIR

RATIO_TARGET = 3.0
CELLS_TARGET_S = 60.0
POLICIES = ["legacy", "fixed", "lower-bound"]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _powers(first: int, count: int) -> list[int]:
    return [first * 2**i for i in range(count)]


def synthetic_matrix(tmp: Path, *, num_cells: int, ranks_per_cell: int) -> Matrix:
    """A matrix of exactly `num_cells` valid cells of `ranks_per_cell` ranks: D x hidden x intermediate x T.

    D takes powers of two from the rank count (a multiple of it, as the schema asks); the other axes fill the rest,
    four or eight values each at most, so the heatmaps have a D axis and a row axis as a real matrix would."""
    sizes = [8, 4, 4, 8]  # D, K, I, T: up to 1024 cells
    counts, left = [], num_cells
    for size in sizes:
        n = next(k for k in range(min(size, left), 0, -1) if left % k == 0)
        counts.append(n)
        left //= n
    if left != 1:
        raise SystemExit(f"--cells {num_cells}: not a product of 8 x 4 x 4 x 8 axis values")
    d, k, i, t = counts
    axes: dict[str, list[Any]] = {"parallel.num_dispatchers": _powers(ranks_per_cell, d)}
    for key, first, n in (
        ("model.hidden_size", 128, k),
        ("model.intermediate_size", 64, i),
        ("parallel.max_tokens_per_rank", 16, t),
    ):
        if n > 1:
            axes[key] = _powers(first, n)
    num_experts = ranks_per_cell * 2 ** (d - 1)  # one local expert per dispatcher at the largest D
    base = {
        "name": "bench-matrix",
        "model": {"hidden_size": 128, "intermediate_size": 64, "num_experts": max(num_experts, 8), "top_k": 1},
        "parallel": {"num_dispatchers": ranks_per_cell, "num_ranks": ranks_per_cell, "max_tokens_per_rank": 16},
        "policies": POLICIES,
        "device": "cpu",
        "expect": {"outcomes": {"legacy": "fit", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
    }
    matrix = matrix_from_data({"matrix": {"name": "bench-matrix", "base": base, "axes": axes}}, tmp / "bench.yaml")
    if len(matrix.cells()) != num_cells:
        raise SystemExit(f"the synthetic matrix has {len(matrix.cells())} valid cells, not {num_cells}")
    return matrix


def collect_as_run(matrix_dir: Path, matrix: Matrix) -> tuple[float, float]:
    """CPU seconds of harness run's path after the cells ran: each cell collected as it finished, then the
    combined report from those reports; (the whole, the combined report's part)."""
    c0 = cpu_s()
    collected: dict[str, CollectResult] = {}
    for cell in matrix.cells():
        done = collect(matrix_dir / cell.name, plots=False)
        assert isinstance(done.report, RunReport)
        collected[cell.name] = done
    c1 = cpu_s()
    result = collect_matrix(matrix_dir, matrix.cells(), matrix=matrix, collected=collected)
    c2 = cpu_s()
    if result.write_error:
        raise SystemExit(result.write_error)
    return c2 - c0, c2 - c1


# The peak of this process's own memory (VmHWM): getrusage's ru_maxrss would carry the parent's peak across the
# fork and exec of the probe.
_PEAK_PROBE = """
import gc, json, sys
from pathlib import Path
from harness.report.collect import collect
import harness.report.html, harness.report.markdown

def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

gc.collect()
before = peak_kib()
collect(Path(sys.argv[1]), write=False)
print(json.dumps({"peak_kib_over_imports": peak_kib() - before}))
"""


def collect_memory(run_dir: Path, num_records: int) -> float:
    """KiB per record that collecting the run (in memory, a fresh process) adds to its peak RSS."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_DIR), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_PROBE, str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_kib_over_imports"] / num_records


def measure(tmp: Path, *, records: int, cell_ranks: int, cells: int, repeats: int) -> dict[str, Any]:
    one = synthetic_matrix(tmp / "one", num_cells=1, ranks_per_cell=records)
    split = synthetic_matrix(tmp / "split", num_cells=records // cell_ranks, ranks_per_cell=cell_ranks)
    many = synthetic_matrix(tmp / "many", num_cells=cells, ranks_per_cell=1)
    run_dir = tmp / "one-run"
    write_run(run_dir, one.cells()[0].scenario, device_kind="cpu")
    for name, matrix in (("split", split), ("many", many)):
        for cell in matrix.cells():
            write_run(tmp / name / cell.name, cell.scenario, device_kind="cpu", run_id=f"bench-{cell.name}")
    collect(run_dir)  # imports matplotlib and warms the caches, outside the figures
    samples: dict[str, list[float]] = {"one_run": [], "split": [], "many": [], "many_combined": []}
    for _ in range(repeats):
        c0 = cpu_s()
        collect(run_dir)
        samples["one_run"].append(cpu_s() - c0)
        samples["split"].append(collect_as_run(tmp / "split", split)[0])
    for _ in range(max(1, repeats if cells <= 256 else 1)):
        whole, combined = collect_as_run(tmp / "many", many)
        samples["many"].append(whole)
        samples["many_combined"].append(combined)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    memory_kib = collect_memory(run_dir, records)
    ratio = medians["split"] / medians["one_run"]
    sizes = {name: (tmp / "many" / name).stat().st_size for name in ("report.html", "report.md", "report.json")}
    return {
        "schema_version": 1,
        "benchmark": "matrix collect: the same records as one run and as a matrix; a large matrix's combined report",
        "command": f"python benchmarks/bench_matrix_collect.py --records {records} --cell-ranks {cell_ranks} "
        f"--cells {cells} --repeats {repeats}",
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        "versions": {
            "python": platform.python_version(),
            "matplotlib": metadata.version("matplotlib"),
            "pydantic": metadata.version("pydantic"),
        },
        "records": records,
        "cell_ranks": cell_ranks,
        "split_cells": records // cell_ranks,
        "cells": cells,
        "samples_cpu_s": {k: [round(x, 3) for x in v] for k, v in samples.items()},
        "one_run_cpu_s": round(medians["one_run"], 3),
        "split_cpu_s": round(medians["split"], 3),
        "ratio": round(ratio, 2),
        "ratio_target": RATIO_TARGET,
        "cells_cpu_s": round(medians["many"], 3),
        "cells_combined_cpu_s": round(medians["many_combined"], 3),
        "cells_target_s": CELLS_TARGET_S,
        "collect_kib_per_record": round(memory_kib, 1),
        "combined_sizes_bytes": sizes,
        "meets_target": ratio <= RATIO_TARGET and medians["many"] <= CELLS_TARGET_S,
    }


def markdown(r: dict[str, Any]) -> str:
    verdict = lambda ok: "meets" if ok else "does NOT meet"  # noqa: E731
    sizes = r["combined_sizes_bytes"]
    return "\n".join(
        [
            "# Matrix collect at scale",
            "",
            f"- {r['records']} records as one run: {r['one_run_cpu_s']:.2f} s CPU; as {r['split_cells']} cells of "
            f"{r['cell_ranks']}: {r['split_cpu_s']:.2f} s CPU: x{r['ratio']:.2f} (target <= x{r['ratio_target']:g}): "
            f"{verdict(r['ratio'] <= r['ratio_target'])}",
            f"- {r['cells']} cells of one rank, every cell collected and the combined report: "
            f"{r['cells_cpu_s']:.1f} s CPU, of which the combined report {r['cells_combined_cpu_s']:.1f} s "
            f"(target <= {r['cells_target_s']:g} s): "
            f"{verdict(r['cells_cpu_s'] <= r['cells_target_s'])}",
            f"- memory: collecting the {r['records']}-record run adds {r['collect_kib_per_record']:.0f} KiB a record "
            "to the peak RSS of a fresh process (records streamed: each judged, folded and dropped as it is read)",
            f"- the {r['cells']}-cell matrix's report.html {sizes['report.html'] / 2**10:.0f} KiB, report.md "
            f"{sizes['report.md'] / 2**10:.0f} KiB, report.json {sizes['report.json'] / 2**20:.1f} MiB",
            "",
            f"Machine: {r['machine']}; Python {r['versions']['python']}, matplotlib {r['versions']['matplotlib']}, "
            f"pydantic {r['versions']['pydantic']}. CPU time is user + sys of the benchmark process (getrusage), "
            "median of the repeats; the path is harness run's after its cells ran (each cell collected as it finishes, "
            "its page without figures, then the combined report from the collected cells).",
            "",
            f"Command: `{r['command']}`",
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1024)
    parser.add_argument("--cell-ranks", type=int, default=16)
    parser.add_argument("--cells", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--out", type=Path, default=None, help="write matrix-collect.json and .md here")
    parser.add_argument("--keep", type=Path, default=None, help="build the matrices here and keep them")
    ns = parser.parse_args()
    if ns.records % ns.cell_ranks:
        parser.error(f"--records {ns.records} is not a multiple of --cell-ranks {ns.cell_ranks}")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(
            ns.keep or Path(tmp), records=ns.records, cell_ranks=ns.cell_ranks, cells=ns.cells, repeats=ns.repeats
        )
    if ns.out is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "matrix-collect.json").write_text(json.dumps(result, indent=1) + "\n")
        (ns.out / "matrix-collect.md").write_text(markdown(result))
    print(json.dumps(result) if ns.json else markdown(result))
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
