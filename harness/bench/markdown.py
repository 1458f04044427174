"""bench.md: a `#` header of versions and parameters, per-rank variants, ratios over ranks, CPU-side costs, and an
OK/FAILED footer. Sections with nothing measured are left out rather than printed empty."""

from __future__ import annotations

from harness.bench.records import BenchRankRecord, BenchReport

# Published figures of the EP kernels at the decode shape (128 tokens per rank, hidden 7168, top-8, FP8 dispatch,
# BF16 combine): reference rows, measured elsewhere on other machines; (kernel, hardware, dispatch us, combine us).
ANCHORS = (
    ("DeepEP low-latency", "EP8 H800", 77.0, 114.0),
    ("pplx-kernels", "EP8 H100 NVLink", 83.6, 102.3),
    ("NCCL EP LL (BF16, about)", "8xH100", 65.0, 79.0),
)


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _header(report: BenchReport) -> list[str]:
    lines = [f"# harness bench: {report.scenario_name} ({report.run_id})", ""]
    if report.num_ranks:
        lines.append(
            f"# scenario hash {report.scenario_hash}, {report.num_ranks} rank(s), experts backend "
            f"{report.experts_backend}, device {report.device_name}"
        )
    else:
        lines.append(f"# scenario hash {report.scenario_hash}; CPU-side costs only (--cpu-only): no ranks ran")
    v = report.versions
    if v is not None:
        lines.append(
            f"# harness {v.harness}, torch {v.torch}, CUDA {v.cuda}, NCCL {v.nccl}, driver {v.driver}"
            + (f", vLLM kernels {v.vllm_kernels}" if v.vllm_kernels else "")
        )
    lines.append(f"# command: {' '.join(report.command)}")
    if report.num_ranks:
        lines.append("# thresholds: " + ", ".join(f"{k} {val}" for k, val in report.thresholds.items()))
    return lines


def _per_rank(records: list[BenchRankRecord]) -> list[str]:
    rows = [
        f"| {r.rank} | {p.policy} | {s.name} | {s.median_us:.1f} | {s.min_us:.1f} | {s.max_us:.1f} | {s.num_samples} |"
        for r in records
        for p in r.policies
        for s in p.variants
    ]
    if not rows:
        return []
    return [
        "",
        "## Per rank (medians over interleaved rounds, first round dropped)",
        "",
        "| rank | policy | variant | median | min | max | samples |",
        "|---:|---|---|---:|---:|---:|---:|",
        "| | | | us | us | us | |",
        *rows,
    ]


def _tflops(low: float | None, high: float | None) -> str:
    """min..max at 4 significant digits: 1027..1041 on an H200, 0.01395..0.0162 on a CPU (not 0.0..0.0)."""
    if low is None or high is None:
        return "n/a"
    return f"{low:.4g}" if low == high else f"{low:.4g}..{high:.4g}"


def _ratios(report: BenchReport) -> list[str]:
    if not report.policies:
        return []
    lines = [
        "",
        "## Ratios (raw / harness; 1.0 = the harness adds nothing), aggregated over ranks",
        "",
        "| policy | ranks | raw experts | experts ratio (min) | comm bound ratio (min) | comm timing | "
        "raw-collective ratio (min, diagnostic) | TFLOP/s (min..max) | "
        "of FP8 peak (max) | harness busbw (min) | raw busbw (max) | max rel err |",
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        "| | | | | | | | TFLOP/s | | GB/s | GB/s | |",
    ]
    for s in report.policies:
        lines.append(
            f"| {s.policy} | {s.num_ranks_ok} | {s.experts_raw_variant or 'n/a'} | {_f(s.experts_ratio_min, '.3f')} | "
            f"{_f(s.comm_bound_ratio_min, '.3f')} | {s.comm_timing or 'n/a'} | {_f(s.comm_ratio_min, '.3f')} | "
            f"{_tflops(s.experts_tflops_min, s.experts_tflops_max)} | "
            f"{_f(s.fraction_of_fp8_peak_max, '.2%')} | {_f(s.harness_comm_busbw_gbps_min, '.1f')} | "
            f"{_f(s.raw_a2a_busbw_gbps_max, '.1f')} | {_f(s.max_rel_error, '.4f')} |"
        )
    lines += [
        "",
        f"legacy / fixed experts time: {_f(report.legacy_over_fixed_experts_time, '.3f')} "
        "(the fix changes memory, not speed: expected about 1)",
    ]
    return lines


def _mb(b: int) -> str:
    return f"{b / 1e6:.2f}"


def _yardstick(records: list[BenchRankRecord]) -> list[str]:
    rows, probes, kernels = [], [], []
    for r in records:
        for p in r.policies:
            y = p.comm_yardstick
            if y is None:
                continue
            for stage, us, idle, bound, mn, moved, local, anchor in (
                (
                    "dispatch",
                    y.dispatch_us,
                    y.idle_dispatch_us,
                    y.dispatch_bound_us,
                    y.dispatch_min_remote_bytes,
                    y.dispatch_moved_bytes,
                    y.dispatch_local_bytes,
                    y.anchor_dispatch_bytes,
                ),
                (
                    "combine",
                    y.combine_us,
                    y.idle_combine_us,
                    y.combine_bound_us,
                    y.combine_min_remote_bytes,
                    y.combine_moved_bytes,
                    y.combine_local_bytes,
                    y.anchor_combine_bytes,
                ),
            ):
                eager = next((v.median_us for v in p.variants if v.name == f"{stage}:harness"), None)
                rows.append(
                    f"| {r.rank} | {p.policy} | {stage} | {y.timing} | {us:.1f} | {_f(idle, '.1f')} | "
                    f"{_f(eager, '.1f')} | "
                    f"{_f(bound, '.1f')} | {_f(None if bound is None else bound / us, '.3f')} | {_mb(mn)} | "
                    f"{_mb(moved)} | {_mb(local)} | {_mb(anchor)} |"
                )
            probes.append(
                f"| {r.rank} | {p.policy} | {_f(y.hbm_gbps, '.0f')} | {_f(y.link_gbps, '.0f')} | "
                f"{y.remote_rows} | {y.selections} | {y.received_pairs} | {_f(y.bound_ratio, '.3f')} | "
                f"{_f(y.queued_ahead_us, '.0f')} | {y.late_samples} |"
                + (f" {p.comm_graph_error} |" if p.comm_graph_error else " |")
            )
            for k in p.kernels[:12]:
                kernels.append(
                    f"| {r.rank} | {p.policy} | {k.name[:80]} | {k.calls_per_round:g} | {k.us_per_round:.1f} |"
                )
    if not rows:
        return []
    lines = [
        "",
        "## Comm yardstick (bound = minimal remote bytes / link + local bytes / HBM; ratio = bound / measured)",
        "",
        "| rank | policy | stage | timing | measured | graph launched idle | eager | bound | ratio | "
        "min remote | moved | local | anchor (per selection) |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| | | | | us | us | us | us | | MB | MB | MB | MB |",
        *rows,
        "",
        "Measured: graph replays queued behind a GPU sleep (the GPU's time, as inside a replayed forward "
        "pass); launched idle: the same replays on an idle GPU, the graph's launch latency included; late: "
        "replays whose enqueueing outlasted the sleep.",
        "",
        "| rank | policy | HBM probe | link probe | remote rows | selections | slots received | "
        "ratio | sleep ahead | late | graph |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        "| | | GB/s | GB/s | | | | | us | | |",
        *probes,
    ]
    if kernels:
        lines += [
            "",
            "## Kernels per dispatch + combine (torch.profiler device events)",
            "",
            "| rank | policy | kernel | calls | GPU time |",
            "|---:|---|---|---:|---:|",
            "| | | | | us |",
            *kernels,
        ]
    lines += [
        "",
        "## Reference: published EP kernels at the decode shape (128 tokens per rank, K = 7168, top-8)",
        "",
        "| kernel | hardware | dispatch | combine |",
        "|---|---|---:|---:|",
        "| | | us | us |",
        *(f"| {name} | {hw} | {d:g} | {c:g} |" for name, hw, d, c in ANCHORS),
    ]
    return lines


def _cpu_costs(report: BenchReport) -> list[str]:
    if not report.cpu_costs:
        return []
    lines = [
        "",
        "## CPU-side costs (gated on CPU seconds; wall seconds and latencies shown, not gated)",
        "",
        "| what | median | clock | wall | target | |",
        "|---|---:|---|---:|---:|---|",
        "| | s | | s | s | |",
    ]
    for c in report.cpu_costs:
        verdict = (
            ("ok" if c.within_target else "OVER")
            if c.gated
            else f"not gated ({'within' if c.median_s <= c.target_s else 'over'} target)"
        )
        wall = _f(c.wall_median_s, ".3f") if c.clock == "cpu" else f"{c.median_s:.3f}"
        lines.append(f"| {c.name} | {c.median_s:.3f} | {c.clock} | {wall} | {c.target_s:.2f} | {verdict} |")
    return lines


def render_markdown(report: BenchReport, records: list[BenchRankRecord]) -> str:
    lines = [*_header(report), *_per_rank(records), *_ratios(report), *_yardstick(records), *_cpu_costs(report), ""]
    lines += [f"- FAILED: {failure}" for failure in report.failures]
    lines += ["", "OK" if report.ok else "FAILED", ""]
    return "\n".join(lines)
