"""The harness's CPU-side costs, measured from the outside: plan latency, the time from starting `harness run` to
the first rank ready (local and Ray), the collector on 1024 rank records, and matrix collects (the same records as
one run and as 64 cells; a 1024-cell matrix). Each probe reports as it goes.

As `harness compare` refuses to gate CPU timings, the bench gates CPU time, not wall time: a shared machine
stretches wall time by its load, not the CPU seconds the harness spends. The plan and the collectors are gated on
their CPU seconds (time.process_time in process; resource.getrusage(RUSAGE_CHILDREN) of a child command), with the
wall seconds shown beside them. The time to the first rank ready is a latency across processes: shown against its
target, never gated."""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bench.records import CpuCost

CPU_TARGETS_S = {  # CPU seconds for the gated probes, wall seconds for the latencies
    "plan (in process)": 0.05,
    "harness plan (command)": 3.0,
    "run to first rank ready (local)": 20.0,
    "run to first rank ready (ray)": 40.0,
    "collect 1024 rank records": 2.0,
}
# CPU seconds of `harness plan` on a 1024-cell matrix with release policies; its target is twice the CPU of a
# 1-cell plan of the same releases, measured in the same probe (harness.bench.probe_plan_matrix).
PLAN_MATRIX_PROBE = "harness plan 1024-cell release matrix (CPU)"
# CPU seconds of collecting 1024 records as 64 cells of 16 (target: 3 x the same records as one run, measured in the
# same probe) and of a 1024-cell matrix's reports (target 60 s): harness.bench.probe_matrix_collect.
MATRIX_SPLIT_PROBE = "collect 1024 records as 64 cells of 16 (CPU)"
MATRIX_CELLS_PROBE = "collect a 1024-cell matrix (CPU)"
# `harness plan --search` (harness.bench.probe_search): about 1,000 candidates at most 10 s of CPU per 1,000; about
# 10,000 at most the small search's CPU per candidate, and at most twice its peak RSS (memory flat).
SEARCH_SMALL_PROBE = "layout search ~1,000 candidates (CPU per 1,000)"
SEARCH_LARGE_PROBE = "layout search ~10,000 candidates (CPU; peak RSS at most 2x the small search's)"
SUBPROCESS_TIMEOUT_S = 300.0
Progress = Callable[[str], None]
# The probes `harness bench --probes` selects from, in the order they run.
PROBES = ("plan", "plan-command", "run-local", "run-ray", "collect", "plan-matrix", "matrix-collect", "search")
MAX_REPEATS = 20


def time_call(fn: Callable[[], Any], *, repeat: int) -> tuple[list[float], list[float]]:
    """CPU seconds (this process, user + system) and wall seconds of `repeat` calls."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return cpu, wall


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _harness_s(args: list[str], *, cwd: Path, accept: tuple[int, ...] = (0, 1)) -> tuple[float, float]:
    """CPU and wall seconds a `harness ARGS` subprocess takes (its CPU: every descendant it waited for);
    RuntimeError naming the command, and its last lines, when it exits with a code not in `accept`."""
    c0, t0 = _children_cpu_s(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    if done.returncode not in accept:
        said = (done.stderr.strip() or done.stdout.strip())[-400:]  # a run's report footer is on stdout
        raise RuntimeError(f"harness {' '.join(args)} exited {done.returncode}: {said}")
    return _children_cpu_s() - c0, time.perf_counter() - t0


def _first_ready_s(run_dir: Path, command_started_at: float) -> float:
    """Seconds from starting the `harness run` command (interpreter, imports, Ray start included) to the first
    rank's ready_at."""
    from harness.core.records import RankRecord, read_record

    ready = [
        r.ready_at
        for p in sorted((run_dir / "ranks").glob("rank-*.json"))
        if isinstance(r := read_record(p), RankRecord) and r.ready_at is not None
    ]
    if not ready:
        raise RuntimeError(f"{run_dir}: no rank reported ready")
    return min(ready) - command_started_at


@dataclass(frozen=True)
class _Samples:
    clock: str  # "cpu" or "wall": what `values` are
    values: list[float]
    wall: list[float] | None = None  # the wall seconds beside CPU samples

    @property
    def gated(self) -> bool:
        return self.clock == "cpu"


def _probe(name: str, samples: _Samples, progress: Progress) -> _Samples:
    what = "CPU" if samples.clock == "cpu" else "wall"
    wall = f"; wall {statistics.median(samples.wall):.3f} s, not gated" if samples.wall else ""
    gate = "" if samples.gated else ", not gated"
    progress(
        f"{name}: {statistics.median(samples.values):.3f} s {what} (median of {len(samples.values)}, "
        f"target {CPU_TARGETS_S[name]} s{gate}){wall}"
    )
    return samples


def _run_to_ready(launcher: str, repeats: int, repo: Path, tmp: Path, progress: Progress) -> _Samples | None:
    """Seconds to the first rank ready over `repeats` runs of smoke; a run that got no rank ready (Ray placing
    nothing on a loaded machine, say) is reported and left out, and with none measured the probe is skipped:
    a latency is shown, never gated, so it cannot fail the bench."""
    name, samples = f"run to first rank ready ({launcher})", []
    for i in range(repeats):
        progress(f"{name}: harness run smoke {i + 1}/{repeats}")
        out = tmp / f"{launcher}-{i}"
        started_at = time.time()
        try:
            # A run that fails after its first rank was ready (exit 2: a rank stretched past a collective's
            # timeout on a loaded machine) still measured the latency.
            _harness_s(["run", "smoke", "--launcher", launcher, "--out", str(out)], cwd=repo, accept=(0, 1, 2))
            samples.append(_first_ready_s(out, started_at))
        except RuntimeError as exc:
            progress(f"{name}: run {i + 1} not measured: {_one_line(str(exc))}{_exit_reason(out)}")
    if not samples:
        progress(f"{name}: skipped (no run got a rank ready)")
        return None
    return _Samples("wall", samples)


def _one_line(text: str) -> str:
    return " / ".join(line.strip() for line in text.splitlines() if line.strip())[-400:]


def _exit_reason(run_dir: Path) -> str:
    """'; the run: FAILED (exit 2): ...' from the run's report.json, when it wrote one."""
    try:
        report = json.loads((run_dir / "report.json").read_text())
        return f"; the run: {report['status']} (exit {report['exit_code']}): {report['exit_reason']}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _plan_commands(repeats: int, repo: Path) -> _Samples:
    runs = [_harness_s(["plan", "deepseek-v3-dp32-pr55579", "--json"], cwd=repo) for _ in range(repeats)]
    return _Samples("cpu", [cpu for cpu, _ in runs], [wall for _, wall in runs])


def _collect_1024(repeats: int, repo: Path, progress: Progress) -> _Samples | None:
    progress("collect 1024 rank records: harness.bench.probe_collect")
    done = subprocess.run(
        [sys.executable, "-m", "harness.bench.probe_collect", "--repeats", str(repeats), "--json"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S * 2,
        cwd=repo,
        check=False,
    )
    if done.returncode not in (0, 1) or not done.stdout.strip():
        progress(f"collect 1024 rank records: skipped (probe_collect exited {done.returncode})")
        return None
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return _Samples("cpu", data["cpu_timings_s"], data["timings_s"])


def cpu_costs(
    *, repeats: int = 3, probes: tuple[str, ...] = PROBES, progress: Progress = lambda line: None
) -> list[CpuCost]:
    """The probes named (PROBES) that can run here, each repeated probe `repeats` times (the in-process plan 20
    times; Ray's run once); `progress` gets a line before and after each."""
    from harness.scenario.schema import load_scenario
    from harness.scenario.sections import REPO_DIR
    from harness.sizing.plan import make_plan

    results: dict[str, _Samples] = {}
    if "plan" in probes:
        pr = load_scenario("deepseek-v3-dp32-pr55579")
        progress("plan (in process): 20 calls")
        in_process = _Samples("cpu", *time_call(lambda: make_plan(pr), repeat=20))
        results["plan (in process)"] = _probe("plan (in process)", in_process, progress)
    if "plan-command" in probes:
        progress(f"harness plan (command): {repeats} runs")
        commands = _plan_commands(repeats, REPO_DIR)
        results["harness plan (command)"] = _probe("harness plan (command)", commands, progress)
    with tempfile.TemporaryDirectory() as tmp:
        for launcher in ("local", "ray"):
            if f"run-{launcher}" not in probes:
                continue
            name = f"run to first rank ready ({launcher})"
            samples = _run_to_ready(launcher, repeats if launcher == "local" else 1, REPO_DIR, Path(tmp), progress)
            if samples is not None:
                results[name] = _probe(name, samples, progress)
    if "collect" in probes and (collected := _collect_1024(repeats, REPO_DIR, progress)) is not None:
        results["collect 1024 rank records"] = _probe("collect 1024 rank records", collected, progress)
    plan_matrix = _plan_matrix_cost(repeats, REPO_DIR, progress) if "plan-matrix" in probes else None
    costs = [_cost(name, samples) for name, samples in results.items()]
    return (
        costs
        + ([plan_matrix] if plan_matrix is not None else [])
        + (_matrix_collect_costs(REPO_DIR, progress) if "matrix-collect" in probes else [])
        + (_search_costs(REPO_DIR, progress) if "search" in probes else [])
    )


def _cost(name: str, samples: _Samples) -> CpuCost:
    median = statistics.median(samples.values)
    return CpuCost(
        name=name,
        median_s=median,
        samples_s=samples.values,
        target_s=CPU_TARGETS_S[name],
        within_target=median <= CPU_TARGETS_S[name] or not samples.gated,
        clock=samples.clock,  # type: ignore[arg-type]
        gated=samples.gated,
        wall_median_s=statistics.median(samples.wall) if samples.wall else None,
    )


def _plan_matrix_cost(repeats: int, repo: Path, progress: Progress) -> CpuCost | None:
    """The 1024-cell plan's CPU against twice the 1-cell plan's; None when the releases are not at hand."""
    progress(f"{PLAN_MATRIX_PROBE}: harness.bench.probe_plan_matrix (warm release cache)")
    command = [sys.executable, "-m", "harness.bench.probe_plan_matrix", "--repeats", str(repeats), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S * 2, cwd=repo,
                          check=False)  # fmt: skip
    if done.returncode not in (0, 1) or not done.stdout.strip():
        progress(f"{PLAN_MATRIX_PROBE}: skipped (probe_plan_matrix exited {done.returncode})")
        return None
    report = json.loads(done.stdout.strip().splitlines()[-1])
    target = report["target_ratio"] * report["one_cell_cpu_s"]
    progress(f"{PLAN_MATRIX_PROBE}: {report['matrix_cpu_s']:.2f} s (x{report['ratio']:.2f} the 1-cell plan's "
             f"{report['one_cell_cpu_s']:.2f} s; target {target:.2f} s)")  # fmt: skip
    return CpuCost(name=PLAN_MATRIX_PROBE, median_s=report["matrix_cpu_s"],
                   samples_s=report["samples_cpu_s"][str(report["cells"])], target_s=target,
                   within_target=report["meets_target"], clock="cpu", gated=True)  # fmt: skip


def _matrix_collect_costs(repo: Path, progress: Progress) -> list[CpuCost]:
    """The matrix collect targets, from one run of harness.bench.probe_matrix_collect; none when it fails."""
    progress(f"{MATRIX_SPLIT_PROBE}, {MATRIX_CELLS_PROBE}: harness.bench.probe_matrix_collect")
    done = subprocess.run(
        [sys.executable, "-m", "harness.bench.probe_matrix_collect", "--repeats", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S * 2,
        cwd=repo,
        check=False,
    )
    if done.returncode not in (0, 1) or not done.stdout.strip():
        progress(f"matrix collect: skipped (probe_matrix_collect exited {done.returncode})")
        return []
    r = json.loads(done.stdout.strip().splitlines()[-1])
    split_target = r["ratio_target"] * r["one_run_cpu_s"]
    progress(
        f"{MATRIX_SPLIT_PROBE}: {r['split_cpu_s']:.2f} s (x{r['ratio']:.2f} the one run's {r['one_run_cpu_s']:.2f} s)"
    )
    progress(f"{MATRIX_CELLS_PROBE}: {r['cells_cpu_s']:.1f} s (target {r['cells_target_s']:g} s)")
    return [
        CpuCost(
            name=MATRIX_SPLIT_PROBE,
            median_s=r["split_cpu_s"],
            samples_s=r["samples_cpu_s"]["split"],
            target_s=split_target,
            within_target=r["split_cpu_s"] <= split_target,
            clock="cpu",
        ),
        CpuCost(
            name=MATRIX_CELLS_PROBE,
            median_s=r["cells_cpu_s"],
            samples_s=r["samples_cpu_s"]["many"],
            target_s=r["cells_target_s"],
            within_target=r["cells_cpu_s"] <= r["cells_target_s"],
            clock="cpu",
        ),
    ]


def _search_costs(repo: Path, progress: Progress) -> list[CpuCost]:
    """The layout search's targets, from one run of harness.bench.probe_search; none when the release cannot be
    had."""
    progress("layout search: harness.bench.probe_search (DeepSeek-R1 on H200, vLLM 0.33.0)")
    done = subprocess.run([sys.executable, "-m", "harness.bench.probe_search", "--json"], capture_output=True,
                          text=True, timeout=SUBPROCESS_TIMEOUT_S * 4, cwd=repo, check=False)  # fmt: skip
    if done.returncode not in (0, 1) or not done.stdout.strip():
        progress(f"layout search: skipped (bench_search.py exited {done.returncode}: {_one_line(done.stderr)})")
        return []
    r = json.loads(done.stdout.strip().splitlines()[-1])
    small, large = r["runs"]["small"], r["runs"]["large"]
    progress(
        f"{SEARCH_SMALL_PROBE}: {small['candidates']} candidates in {small['cpu_s']:.2f} s CPU = "
        f"{r['small_cpu_per_1000_s']:.2f} s per 1,000 (target {r['small_target_per_1000_s']:g} s)"
    )
    progress(f"{SEARCH_LARGE_PROBE}: {large['candidates']} candidates in {large['cpu_s']:.2f} s CPU (target "
             f"{r['large_cpu_target_s']:.2f} s); peak RSS {large['peak_rss_bytes'] / 2**20:.0f} MiB, x"
             f"{r['memory_ratio']:.2f} the small search's {small['peak_rss_bytes'] / 2**20:.0f} MiB (target "
             f"x{r['memory_ratio_target']:g})")  # fmt: skip
    return [
        CpuCost(name=SEARCH_SMALL_PROBE, median_s=r["small_cpu_per_1000_s"], samples_s=[small["cpu_s"]],
                target_s=r["small_target_per_1000_s"], within_target=r["meets_small"], clock="cpu",
                wall_median_s=small["wall_s"] * 1000 / small["candidates"]),
        CpuCost(name=SEARCH_LARGE_PROBE, median_s=large["cpu_s"], samples_s=[large["cpu_s"]],
                target_s=r["large_cpu_target_s"], within_target=r["meets_large"] and r["meets_memory"], clock="cpu",
                wall_median_s=large["wall_s"]),
    ]  # fmt: skip
