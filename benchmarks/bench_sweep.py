"""Sweep benchmark (not a timed test): CPU time of `harness vllm audit --sweep` on cached releases.

    python benchmarks/bench_sweep.py [--versions 0.29.0,0.30.0] [--repeats 3] [--json]

Each release is located and parsed once (warm cache, as a CI job that already fetched it), then swept `repeats`
times; the figure is the median CPU time (user + sys, time.process_time) of one sweep. Target: 12 s of
CPU per release on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR))

from harness.sizing.vllm_source.evaluate import source_tree as _source_tree  # noqa: E402
from harness.sizing.vllm_source.sources import locate  # noqa: E402
from harness.sizing.vllm_source.sweep import sweep  # noqa: E402

TARGET_CPU_S = 12.0  # every experts class of a release (0.33.0: 46, 7 of them batched); its bound is its 60 s budget


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="0.29.0,0.30.0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args()
    rows = []
    for version in ns.versions.split(","):
        started = time.process_time()
        tree = _source_tree(locate(version=version))
        parse_s = time.process_time() - started
        timings, points = [], 0
        for _ in range(ns.repeats):
            started = time.process_time()
            result = sweep(tree)
            timings.append(time.process_time() - started)
            points = sum(len(c.outcomes) for c in result.classes)
        rows.append({"vllm_version": version, "classes": len(result.classes), "points": points,
                     "locate_and_parse_cpu_s": round(parse_s, 3), "sweep_cpu_s": round(statistics.median(timings), 3),
                     "target_cpu_s": TARGET_CPU_S})  # fmt: skip
    report = {"machine": platform.node(), "python": platform.python_version(), "results": rows}
    if ns.json:
        print(json.dumps(report))
    else:
        for row in rows:
            verdict = "meets" if row["sweep_cpu_s"] <= TARGET_CPU_S else "misses"
            print(f"vllm {row['vllm_version']}: {row['classes']} classes, {row['points']} points, sweep "
                  f"{row['sweep_cpu_s']:.2f} s CPU (parse {row['locate_and_parse_cpu_s']:.2f} s): {verdict} the "
                  f"{TARGET_CPU_S:.0f} s target")  # fmt: skip
    return 0 if all(r["sweep_cpu_s"] <= TARGET_CPU_S for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
