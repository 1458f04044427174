"""Collector benchmark (not a timed test): N synthetic rank records (1024 unless told) -> all four reports.

    python -m harness.bench.probe_collect [--num-ranks 1024] [--repeats 3] [--keep DIR]
    (benchmarks/bench_collect.py runs the same)

The records are built with the real pydantic models (harness.bench.synthetic), written as a launcher would, and
`harness.report.collect.collect` turns them into report.json, report.md, junit.xml and report.html. Target: < 2 s
of CPU for 1024 ranks on a 2-core machine, warm (after the first collect, which also pays for importing
matplotlib and is reported apart). Any rank count works: below 256 each rank holds more than one local expert.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from harness.bench.synthetic import make_scenario, write_run
from harness.report.collect import collect
from harness.report.write import REPORT_FILES

TARGET_S = 2.0
DEEPSEEK_V3_EXPERTS = 256


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-ranks", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    parser.add_argument("--json", action="store_true", help="print one JSON line with the timings instead")
    ns = parser.parse_args()

    # DeepSeek-V3 at D = P = num_ranks, none emulated: one local expert each from 256 ranks (its 256 experts), more
    # below that so that E x D still holds every expert.
    scenario = make_scenario(
        name=f"bench-collect-{ns.num_ranks}",
        model={"preset": "deepseek-v3"},
        parallel={
            "num_dispatchers": ns.num_ranks,
            "num_ranks": ns.num_ranks,
            "num_local_experts": -(-DEEPSEEK_V3_EXPERTS // ns.num_ranks),
            "max_tokens_per_rank": 256,
        },
        policies=["legacy", "fixed", "lower-bound"],
        expect={"outcomes": {"legacy": "oom", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = ns.keep or Path(tmp) / "run"
        t0 = time.perf_counter()
        overrides = {rank: {"legacy": {"status": "oom"}} for rank in range(ns.num_ranks)}
        write_run(run_dir, scenario, overrides=overrides, num_nodes=max(1, ns.num_ranks // 8))
        write_s = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (run_dir / "ranks").iterdir())

        timings, cpu_timings = [], []
        for _ in range(ns.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            result = collect(run_dir)
            timings.append(time.perf_counter() - t0)
            cpu_timings.append(time.process_time() - c0)
        sizes = {name: (run_dir / name).stat().st_size for name in REPORT_FILES}

    if ns.json:
        import json

    warm = statistics.median(timings[1:]) if len(timings) > 1 else timings[0]
    warm_cpu = statistics.median(cpu_timings[1:]) if len(cpu_timings) > 1 else cpu_timings[0]
    if ns.json:
        import json

        print(
            json.dumps(
                {"num_ranks": ns.num_ranks, "timings_s": timings, "cpu_timings_s": cpu_timings, "target_s": TARGET_S}
            )
        )
        return 0 if warm_cpu < TARGET_S else 1
    # Other jobs on a shared 2-core machine stretch wall time; the CPU time and the load show by how much.
    load = os.getloadavg()[0]
    print(
        f"# bench_collect: {ns.num_ranks} rank records ({size / 2**20:.1f} MiB), 3 policies each; "
        f"writing them took {write_s:.2f} s"
    )
    print("# outputs: " + ", ".join(f"{name} {sizes[name] / 2**20:.2f} MiB" for name in REPORT_FILES))
    print(f"# exit code of the synthetic run: {result.exit_code} ({result.report.exit_reason})")
    print(f"# {os.cpu_count()} CPUs, load average {load:.2f} while measuring")
    print(f"{'':32s} {'wall':>8s}   {'CPU':>8s}")
    print(f"{'collect (first, with imports)':32s} {timings[0]:8.3f} s {cpu_timings[0]:8.3f} s")
    print(f"{'collect (median of the rest)':32s} {warm:8.3f} s {warm_cpu:8.3f} s")
    # CPU time, not wall: other jobs on a shared machine stretch the wall time of the same work.
    verdict = "OK" if warm_cpu < TARGET_S else "FAILED"
    print(f"{verdict}: warm collect {warm_cpu:.3f} s of CPU against a target of {TARGET_S:.1f} s")
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    raise SystemExit(main())
