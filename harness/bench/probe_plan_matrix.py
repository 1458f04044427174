"""Plan-at-matrix-scale benchmark (not a timed test): `harness plan` of a 1024-cell matrix with release policies
against a 1-cell plan of the same releases, in CPU time (user + sys of the child process, resource.getrusage).

    python -m harness.bench.probe_plan_matrix [--cells 1024] [--repeats 3] [--out results/bench/cpu-costs]
    (benchmarks/bench_plan_matrix.py runs the same)

Both matrices are DeepSeek-V3 (E=16, D=32) with policies vllm==0.29.0 and vllm==0.30.0 from the warm cache; the
1024 cells vary T over 1..1024. Target: the 1024-cell plan at most 2x the CPU time of the 1-cell plan (each
release located, verified and parsed once per process, shared by the policy and layer paths).
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
from pathlib import Path

from harness.scenario.sections import REPO_DIR

TARGET_RATIO = 2.0
POLICIES = ("vllm==0.29.0", "vllm==0.30.0")


def matrix_yaml(cells: int) -> str:
    tokens = ", ".join(str(t) for t in range(1, cells + 1))
    return f"""matrix:
  name: plan-bench-{cells}
  base_file: {REPO_DIR / "scenarios" / "deepseek-v3-dp32-pr55579.yaml"}
  axes:
    parallel.max_tokens_per_rank: [{tokens}]
    policies: [{json.dumps(list(POLICIES))}]
  overrides:
    - set:
        expect.outcomes: {{}}
"""


def child_cpu_s(args: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(REPO_DIR)}
    completed = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env,
                               cwd=REPO_DIR, check=False)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode not in (0, 1):
        raise SystemExit(f"harness {' '.join(args)} failed ({completed.returncode}): {completed.stderr[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write plan-matrix.json and plan-matrix.md here")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line instead")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        samples: dict[int, list[float]] = {}
        for cells in (1, ns.cells):
            path = Path(tmp) / f"matrix-{cells}.yaml"
            path.write_text(matrix_yaml(cells))
            samples[cells] = [child_cpu_s(["plan", str(path), "--json"]) for _ in range(ns.repeats)]
        figures = {cells: statistics.median(values) for cells, values in samples.items()}
    ratio = figures[ns.cells] / figures[1]
    report = {
        "schema_version": 1,
        "benchmark": "harness plan of a matrix with release policies",
        "command": f"python benchmarks/bench_plan_matrix.py --cells {ns.cells} --repeats {ns.repeats}",
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "processor": platform.processor() or None},
        "versions": {"python": platform.python_version(), "releases": list(POLICIES)},
        "one_cell_cpu_s": round(figures[1], 3),
        "cells": ns.cells,
        "matrix_cpu_s": round(figures[ns.cells], 3),
        "samples_cpu_s": {str(cells): [round(v, 3) for v in values] for cells, values in samples.items()},
        "ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
    }
    line = (
        f"harness plan: 1 cell {figures[1]:.2f} s CPU, {ns.cells} cells {figures[ns.cells]:.2f} s CPU: "
        f"x{ratio:.2f} (target <= x{TARGET_RATIO:g}): {'meets' if report['meets_target'] else 'misses'}"
    )
    print(json.dumps(report) if ns.json else line)
    if ns.out is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "plan-matrix.json").write_text(json.dumps(report, indent=1) + "\n")
        (ns.out / "plan-matrix.md").write_text(
            f"# harness plan at matrix scale\n\n{line}\n\nMachine: {report['machine']}; Python "
            f"{report['versions']['python']}; releases {', '.join(POLICIES)} from a warm cache. CPU time is user + "
            f"sys of the `harness plan MATRIX --json` process, median of {ns.repeats}.\n\nCommand: "
            f"`{report['command']} --out results/bench/cpu-costs`\n"
        )
    return 0 if report["meets_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
