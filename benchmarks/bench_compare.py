"""Compare benchmark (not a timed test): `harness compare` of two collected runs of N synthetic rank records each.

    python benchmarks/bench_compare.py [--num-ranks 16384] [--repeats 3] [--out DIR]

Both runs are written as a launcher would (tests/report_records.py, the real pydantic records) and collected once;
then `harness compare A B --json` runs as a command, and its CPU time (user + system of the child) and peak memory
(the child's max RSS) are measured. compare verifies each collected report against its records (report digest,
sibling generations, the records' bytes re-hashed) and reads the verified report.json instead of collecting again.
Targets: <= 10 s of CPU and <= 500 MB at 16384 records each.
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

from report_records import make_scenario, write_run  # noqa: E402

from harness.report.collect import collect  # noqa: E402

TARGET_CPU_S = 10.0
TARGET_RSS_BYTES = 500 * 10**6
DEEPSEEK_V3_EXPERTS = 256


def _collected_run(run_dir: Path, num_ranks: int) -> None:
    scenario = make_scenario(
        name=f"bench-compare-{num_ranks}",
        model={"preset": "deepseek-v3"},
        parallel={"num_dispatchers": num_ranks, "num_ranks": num_ranks,
                  "num_local_experts": -(-DEEPSEEK_V3_EXPERTS // num_ranks), "max_tokens_per_rank": 256},
        policies=["legacy", "fixed", "lower-bound"],
        expect={"outcomes": {"legacy": "oom", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
    )
    overrides = {rank: {"legacy": {"status": "oom"}} for rank in range(num_ranks)}
    write_run(run_dir, scenario, overrides=overrides, num_nodes=max(1, num_ranks // 8))
    collect(run_dir)


def _compare(baseline: Path, current: Path) -> tuple[float, float, int, int]:
    """(wall s, CPU s, max RSS bytes, exit code) of one `harness compare` command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness", "compare", str(baseline), str(current), "--json"],
                          cwd=REPO_DIR, capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"harness compare exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return wall, cpu, after.ru_maxrss * 1024, done.returncode  # ru_maxrss is in KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-ranks", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write compare.json and compare.md here")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline, current = Path(tmp) / "baseline", Path(tmp) / "current"
        t0 = time.perf_counter()
        _collected_run(baseline, ns.num_ranks)
        _collected_run(current, ns.num_ranks)
        setup_s = time.perf_counter() - t0
        samples = [_compare(baseline, current) for _ in range(ns.repeats)]
    cpu = statistics.median(s[1] for s in samples)
    rss = max(s[2] for s in samples)
    ok = cpu <= TARGET_CPU_S and rss <= TARGET_RSS_BYTES
    result = {
        "benchmark": "harness compare of two collected runs", "num_ranks_each": ns.num_ranks,
        "cpu_s_median": cpu, "samples": [{"wall_s": w, "cpu_s": c, "max_rss_bytes": r, "exit_code": e}
                                         for w, c, r, e in samples],
        "max_rss_bytes": rss, "target_cpu_s": TARGET_CPU_S, "target_rss_bytes": TARGET_RSS_BYTES,
        "meets_targets": ok, "setup_s": setup_s, "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "command": f"python benchmarks/bench_compare.py --num-ranks {ns.num_ranks} --repeats {ns.repeats}",
    }
    lines = [
        f"# bench_compare: harness compare of two collected runs of {ns.num_ranks} rank records each",
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
