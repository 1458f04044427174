"""The `harness` command. Every subcommand returns an exit code: 0 ok, 1 a check failed, 2 usage or error."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.core.exits import EXIT_ERROR, EXIT_OK


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code is already 2; keep one line, no usage spam
        self.print_usage(sys.stderr)
        print(f"harness: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def _print_error(message: str) -> int:
    print(f"harness: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def cmd_plan(ns: argparse.Namespace) -> int:
    from rich.console import Console

    from harness.sizing.plan import make_plan, plan_json, plan_summary, render_plan
    from harness.scenario.schema import ScenarioError, load_scenario

    try:
        scenario = load_scenario(ns.scenario)
        rows = make_plan(scenario, cache_dir=ns.cache_dir)
    except ScenarioError as exc:
        return _print_error(str(exc))
    except Exception as exc:  # a release policy whose source cannot be had
        from harness.sizing.vllm_source import VllmSourceError

        if isinstance(exc, VllmSourceError):
            return _print_error(str(exc))
        raise
    if ns.json:
        print(json.dumps(plan_json(scenario, rows), indent=1))
        return EXIT_OK
    console = Console(width=max(Console().width, 160))
    console.print(render_plan(scenario, rows))
    console.print(plan_summary(rows))
    if scenario.emulated:
        console.print(
            f"D={scenario.parallel.num_dispatchers} is emulated on {scenario.parallel.num_ranks} physical rank(s): "
            "each GPU's memory equals a real D-rank deployment's."
        )
    return EXIT_OK


def cmd_scenarios(ns: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harness.scenario.schema import SCENARIOS_DIR, ScenarioError, list_scenarios, load_scenario

    table = Table(title=f"scenarios in {SCENARIOS_DIR}", title_justify="left")
    table.add_column("file")
    table.add_column("summary")
    rows = []
    for path in list_scenarios():
        try:
            scenario = load_scenario(path)
            summary = f"{scenario.description or scenario.summary()}"
        except ScenarioError as exc:
            summary = f"INVALID: {exc}"
        rows.append({"file": path.name, "summary": summary})
        table.add_row(path.name, summary)
    if ns.json:
        print(json.dumps({"scenarios": rows}, indent=1))
    else:
        Console(width=max(Console().width, 140)).print(table)
    return EXIT_OK


def cmd_vllm_audit(ns: argparse.Namespace) -> int:
    from harness.sizing.vllm_source import run_audit

    return run_audit(ns)


def cmd_run(ns: argparse.Namespace) -> int:
    from harness.launch.run import run_command

    return run_command(ns)


def cmd_collect(ns: argparse.Namespace) -> int:
    """`harness collect RUN_DIR`: a run directory, or a matrix directory (it holds matrix.json)."""
    from rich.console import Console

    from harness.report.collect import collect
    from harness.report.matrix import recollect_matrix
    from harness.scenario.matrix import MatrixError

    run_dir: Path = ns.run_dir
    if not run_dir.is_dir():
        return _print_error(f"{run_dir}: no such run directory")
    if (run_dir / "matrix.json").exists() and not (run_dir / "run.json").exists():
        try:
            result = recollect_matrix(run_dir)
        except MatrixError as exc:
            return _print_error(str(exc))
    else:
        result = collect(run_dir)
    # A matrix table has five more leading columns (cell, model, D, E, T) than a run's.
    console = Console(width=max(Console().width, 220 if result.report["kind"] == "matrix" else 160))
    console.print(result.summary_table())
    for path in result.outputs:
        console.print(f"wrote {path}", style="dim")
    return result.exit_code


def cmd_compare(ns: argparse.Namespace) -> int:
    from harness.report.compare import compare_command

    return compare_command(ns)


def cmd_bench(ns: argparse.Namespace) -> int:
    from harness.bench.main import bench_command

    return bench_command(ns)


def cmd_schema(ns: argparse.Namespace) -> int:
    from harness.scenario.doc import schema_markdown

    sys.stdout.write(schema_markdown())  # verbatim, so `harness schema > docs/scenario-schema.md` matches the test
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="harness", description="EP+DP MoE workspace harness (vLLM PR #55579)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("plan", help="workspace bytes per GPU for each sizing policy")
    p.add_argument("scenario", help="scenario file or name in scenarios/")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--cache-dir", type=Path, default=None, help="vLLM release cache (release policies)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("scenarios", help="list the scenario files")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_scenarios)

    p = sub.add_parser("run", help="run a scenario (or matrix) on local processes or a Ray cluster")
    p.add_argument("scenario", nargs="?", default=None, help="default: smoke on CPU, the PR case on a GPU")
    p.add_argument("--launcher", choices=["local", "ray"], default=None, help="default: the scenario's")
    p.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else a local cluster)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default results/<run-id>)")
    p.add_argument("--experts-backend", choices=["auto", "reference", "torch-cutlass", "vllm-ops"], default=None)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    p.add_argument("--placement-strategy", choices=["PACK", "SPREAD"], default=None)
    p.add_argument("--num-ranks", type=int, default=None, help="override parallel.num_ranks")
    p.add_argument("--policies", default=None, help="comma-separated override of policies")
    p.add_argument("--vllm-version", default=None, help="vLLM release for the vllm-ops backend")
    p.add_argument("--vllm-wheel", type=Path, default=None)
    p.add_argument("--vllm-src", type=Path, default=None)
    p.add_argument("--vllm-ops-library", type=Path, default=None, help="vLLM's compiled ops library file itself")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("collect", help="turn per-rank records into report.{json,md,html} and junit.xml")
    p.add_argument("run_dir", type=Path)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("compare", help="compare a run against a baseline: 0 pass, 1 regression, 2 error")
    p.add_argument("baseline", type=Path)
    p.add_argument("current", type=Path)
    p.add_argument("--threshold", action="append", default=[], metavar="METRIC=PCT",
                   help="a metric's or group's threshold (groups: memory, error, time, throughput)")
    p.add_argument("--ignore", action="append", default=[], metavar="METRIC_OR_GROUP",
                   help="leave a metric or group out, e.g. time and throughput across different machines")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench", help="harness cost against raw kernels and raw all_to_all_single")
    p.add_argument("scenario", nargs="?", default=None, help="default: smoke on CPU, the PR case on a GPU")
    p.add_argument("--json", action="store_true", help="print the bench report as JSON")
    p.add_argument("--out", type=Path, default=None, help="directory for bench.json and bench.md")
    p.add_argument("--experts-backend", choices=["auto", "reference", "torch-cutlass", "vllm-ops"], default=None)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    p.add_argument("--num-ranks", type=int, default=None, help="override parallel.num_ranks")
    p.add_argument("--policies", default=None, help="comma-separated override of policies (legacy, fixed)")
    p.add_argument("--vllm-version", default=None)
    p.add_argument("--vllm-wheel", type=Path, default=None)
    p.add_argument("--vllm-src", type=Path, default=None)
    p.add_argument("--vllm-ops-library", type=Path, default=None)
    p.add_argument("--cpu-only", action="store_true", help="only the CPU-side costs")
    p.add_argument("--no-cpu-costs", action="store_true", help="skip the CPU-side costs")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("schema", help="print the scenario schema reference (Markdown)")
    p.set_defaults(func=cmd_schema)

    vllm = sub.add_parser("vllm", help="vLLM sources: audit a release's batched-experts sizing")
    vsub = vllm.add_subparsers(dest="vllm_command", required=True, parser_class=_Parser)
    p = vsub.add_parser("audit", help="verdict per batched-experts class: consistent or double-count")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--vllm-version", default=None)
    src.add_argument("--vllm-wheel", type=Path, default=None)
    src.add_argument("--vllm-src", type=Path, default=None)
    p.add_argument("--scenario", default=None, help="sizes to evaluate at (default: the PR case)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.set_defaults(func=cmd_vllm_audit)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return int(ns.func(ns))
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
