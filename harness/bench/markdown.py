"""bench.md: a `#` header of versions and parameters, per-rank variants, ratios over ranks, CPU-side costs, and an
OK/FAILED footer. Sections with nothing measured are left out rather than printed empty."""

from __future__ import annotations

from harness.bench.records import BenchRankRecord, BenchReport


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _header(report: BenchReport) -> list[str]:
    lines = [f"# harness bench: {report.scenario_name} ({report.run_id})", ""]
    if report.num_ranks:
        lines.append(f"# scenario hash {report.scenario_hash}, {report.num_ranks} rank(s), experts backend "
                     f"{report.experts_backend}, device {report.device_name}")
    else:
        lines.append(f"# scenario hash {report.scenario_hash}; CPU-side costs only (--cpu-only): no ranks ran")
    v = report.versions
    if v is not None:
        lines.append(f"# harness {v.harness}, torch {v.torch}, CUDA {v.cuda}, NCCL {v.nccl}, driver {v.driver}"
                     + (f", vLLM kernels {v.vllm_kernels}" if v.vllm_kernels else ""))
    lines.append(f"# command: {' '.join(report.command)}")
    if report.num_ranks:
        lines.append("# thresholds: " + ", ".join(f"{k} {val}" for k, val in report.thresholds.items()))
    return lines


def _per_rank(records: list[BenchRankRecord]) -> list[str]:
    rows = [f"| {r.rank} | {p.policy} | {s.name} | {s.median_us:.1f} | {s.min_us:.1f} | {s.max_us:.1f} | "
            f"{s.num_samples} |" for r in records for p in r.policies for s in p.variants]
    if not rows:
        return []
    return ["", "## Per rank (medians over interleaved rounds, first round dropped)", "",
            "| rank | policy | variant | median | min | max | samples |",
            "|---:|---|---|---:|---:|---:|---:|",
            "| | | | us | us | us | |", *rows]


def _ratios(report: BenchReport) -> list[str]:
    if not report.policies:
        return []
    lines = ["", "## Ratios (raw / harness; 1.0 = the harness adds nothing), aggregated over ranks", "",
             "| policy | ranks | raw experts | experts ratio (min) | comm ratio (min) | TFLOP/s (min..max) | "
             "of FP8 peak (max) | harness busbw (min) | raw busbw (max) | max rel err |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
             "| | | | | | TFLOP/s | | GB/s | GB/s | |"]
    for s in report.policies:
        lines.append(
            f"| {s.policy} | {s.num_ranks_ok} | {s.experts_raw_variant or 'n/a'} | {_f(s.experts_ratio_min, '.3f')} | "
            f"{_f(s.comm_ratio_min, '.3f')} | {_f(s.experts_tflops_min, '.1f')}..{_f(s.experts_tflops_max, '.1f')} | "
            f"{_f(s.fraction_of_fp8_peak_max, '.2%')} | {_f(s.harness_comm_busbw_gbps_min, '.1f')} | "
            f"{_f(s.raw_a2a_busbw_gbps_max, '.1f')} | {_f(s.max_rel_error, '.4f')} |")
    lines += ["", f"legacy / fixed experts time: {_f(report.legacy_over_fixed_experts_time, '.3f')} "
              "(the fix changes memory, not speed: expected about 1)"]
    return lines


def _cpu_costs(report: BenchReport) -> list[str]:
    if not report.cpu_costs:
        return []
    lines = ["", "## CPU-side costs", "", "| what | median | target | |", "|---|---:|---:|---|", "| | s | s | |"]
    for c in report.cpu_costs:
        lines.append(f"| {c.name} | {c.median_s:.3f} | {c.target_s:.2f} | {'ok' if c.within_target else 'OVER'} |")
    return lines


def render_markdown(report: BenchReport, records: list[BenchRankRecord]) -> str:
    lines = [*_header(report), *_per_rank(records), *_ratios(report), *_cpu_costs(report), ""]
    lines += [f"- FAILED: {failure}" for failure in report.failures]
    lines += ["", "OK" if report.ok else "FAILED", ""]
    return "\n".join(lines)
