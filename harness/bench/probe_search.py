"""Layout-search benchmark (not a timed test): `harness plan --search` at about 1,000 and about 10,000 candidates,
each in a child process of its own, in CPU time (time.process_time of the search, the release's reading included)
and peak RSS (resource.getrusage of the child).

    python -m harness.bench.probe_search [--json]

Both searches are DeepSeek-R1 on H200 with vLLM 0.33.0 (the release fetched into the cache if absent) at
--max-model-len 65536 with --allow kv-fp8: the small one over 16 GPUs, the large one over 8, 16, 24 and 32 GPUs with
--search-backends (TP, PP and DP splits of each count, EP, all2all, token budgets, EPLB, KV dtype, experts
backends). Targets: the small search at most 10 s of CPU per 1,000 candidates; the large one at most the small
one's CPU per candidate (ten times the candidates at most ten times the CPU) and at most twice its peak RSS (the
memory flat: what a candidate keeps is its record).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parents[2]
SERVE = ("vllm", "serve", "deepseek-r1", "--max-model-len", "65536")
VERSION = "0.33.0"
GPU = "H200-141GB"
GRIDS = {
    "small": {"gpu_counts": (16,), "search_backends": False},
    "large": {"gpu_counts": (8, 16, 24, 32), "search_backends": True},
}
BENCH_SEARCH_SCHEMA = 1
CPU_PER_1000_TARGET_S = 10.0
MEMORY_RATIO_TARGET = 2.0
TIMEOUT_S = 900


def _records() -> Any:  # typed records for what crosses from a child to the parent (and out with --json)
    sys.path.insert(0, str(REPO_DIR))
    from harness.core.records import Record

    class SearchBenchRun(Record):
        schema_version: int = BENCH_SEARCH_SCHEMA
        kind: str = "search-bench-run"
        grid: str
        candidates: int
        cpu_s: float
        wall_s: float
        distinct_layers: int
        peak_rss_bytes: int
        vllm_version: str = VERSION
        gpu: str = GPU
        python_version: str = platform.python_version()

    return SearchBenchRun


def child(grid: str) -> dict:
    sys.path.insert(0, str(REPO_DIR))
    from harness.sizing.deployment import device_total
    from harness.sizing.search import SearchRequest, search
    from harness.sizing.vllm_source.sources import locate

    locate(version=VERSION)  # fetched and verified before the clock starts; the search reads it
    request = SearchRequest(serve=SERVE, vllm_versions=(VERSION,), gpu=GPU, total_bytes=device_total(GPU, 0)[0],
                            allow=("kv-fp8",), **GRIDS[grid])  # type: ignore[arg-type]  # fmt: skip
    c0, t0 = time.process_time(), time.perf_counter()
    report = search(request)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    run = _records()(grid=grid, candidates=len(report.candidates), cpu_s=cpu, wall_s=wall,
                     distinct_layers=report.releases[0].distinct_layers,
                     peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # fmt: skip
    return run.model_dump(mode="json")


def measure() -> dict:
    runs = {}
    for grid in GRIDS:
        done = subprocess.run([sys.executable, "-m", "harness.bench.probe_search", "--child", grid],
                              capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO_DIR, check=False)  # fmt: skip
        if done.returncode != 0 or not done.stdout.strip():
            raise RuntimeError(f"bench_search.py --child {grid} exited {done.returncode}: {done.stderr.strip()[-400:]}")
        runs[grid] = _records().model_validate_json(done.stdout.strip().splitlines()[-1]).model_dump(mode="json")
    small, large = runs["small"], runs["large"]
    per_1000 = small["cpu_s"] * 1000 / small["candidates"]
    large_target = small["cpu_s"] * large["candidates"] / small["candidates"]
    memory_ratio = large["peak_rss_bytes"] / small["peak_rss_bytes"]
    return {
        "schema_version": BENCH_SEARCH_SCHEMA, "kind": "search-bench", "runs": runs,
        "small_cpu_per_1000_s": per_1000, "small_target_per_1000_s": CPU_PER_1000_TARGET_S,
        "large_cpu_target_s": large_target, "memory_ratio": memory_ratio, "memory_ratio_target": MEMORY_RATIO_TARGET,
        "meets_small": per_1000 <= CPU_PER_1000_TARGET_S, "meets_large": large["cpu_s"] <= large_target,
        "meets_memory": memory_ratio <= MEMORY_RATIO_TARGET,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON line")
    parser.add_argument("--child", choices=tuple(GRIDS), help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        print(json.dumps(child(ns.child)))
        return 0
    result = measure()
    if ns.json:
        print(json.dumps(result))
    else:
        for grid, run in result["runs"].items():
            print(
                f"{grid}: {run['candidates']} candidates, {run['cpu_s']:.2f} s CPU ({run['wall_s']:.2f} s wall), "
                f"{run['distinct_layers']} layer plans, peak RSS {run['peak_rss_bytes'] / 2**20:.0f} MiB"
            )
        print(f"small: {result['small_cpu_per_1000_s']:.2f} s CPU per 1000 candidates (target "
              f"{CPU_PER_1000_TARGET_S} s); large: {result['runs']['large']['cpu_s']:.2f} s (target "
              f"{result['large_cpu_target_s']:.2f} s); peak RSS x{result['memory_ratio']:.2f} (target "
              f"x{MEMORY_RATIO_TARGET})")  # fmt: skip
    return 0 if result["meets_small"] and result["meets_large"] and result["meets_memory"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
