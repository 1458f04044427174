"""The `harness` command. Every subcommand returns an exit code: 0 ok, 1 a check failed, 2 usage or error."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.backends import COMM, EXPERTS
from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from harness.launch.overrides import ScenarioOverrides


class _Parser(argparse.ArgumentParser):
    """argparse with one-line refusals: the error, a close match where there is one, and where help is."""

    def error(self, message: str) -> None:  # argparse's own exit code is already 2
        close = _suggestion(self, message)
        pointer = f" See `{self.prog} --help`." if close else f"; see `{self.prog} --help`"
        print(f"{self.prog}: error: {message}{close}{pointer}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """"; did you mean 'run'?" for a mistyped subcommand, choice or option; "" when nothing is close."""
    import difflib
    import re

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        typed, allowed = choice.group(1), re.findall(r"'([^']*)'", choice.group(2)) or choice.group(2).split(", ")
    elif message.startswith("unrecognized arguments: "):
        typed = message.removeprefix("unrecognized arguments: ").split()[0].split("=")[0]
        allowed = [o for action in parser._actions for o in action.option_strings]
    else:
        return ""
    close = difflib.get_close_matches(typed, allowed, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _print_error(message: str) -> int:
    from harness.scenario.limits import shown_line

    print(f"harness: error: {shown_line(message)}", file=sys.stderr)
    return EXIT_ERROR


def _plan_matrix(matrix: Any, ns: argparse.Namespace) -> int:
    from harness.sizing.plan import matrix_plan_json, matrix_plan_lines, plan_matrix

    cells = plan_matrix(matrix, cache_dir=ns.cache_dir)
    if ns.json:
        print(json.dumps(matrix_plan_json(matrix, cells), indent=1))
    else:
        print("\n".join(matrix_plan_lines(matrix, cells)))
    return EXIT_OK


def cmd_plan(ns: argparse.Namespace) -> int:
    """Workspace per sizing policy; with releases (--vllm-version or vllm==X.Y.Z policies) the whole layer per
    release, a budget's fit/OOM per release, and exit 1 when the scenario's layer.expect is not met."""
    from harness.scenario.matrix import Matrix, load_input
    from harness.scenario.schema import ScenarioError
    from harness.scenario.sections import GPU_MEMORY_BYTES
    from harness.sizing.plan import (
        layer_expectation_failures, layer_notes, layer_versions, make_layer_plans, make_plan, plan_json,
        plan_summary, render_layer_plan, render_plan,
    )  # fmt: skip

    if ns.budget_gb is not None and not 0 < ns.budget_gb < 1e6:
        return _print_error(f"--budget-gb {ns.budget_gb} is not a budget in GB; allowed: above 0, below 1e6")
    if getattr(ns, "serve", None) is not None or ns.scenario is None:
        from harness.sizing.deployment_cli import PlanServeRequest, plan_serve_command

        # the deployment's GPU is checked against the GPU table (harness.sizing.gpus) there
        return plan_serve_command(PlanServeRequest(
            scenario=ns.scenario, serve=tuple(ns.serve) if getattr(ns, "serve", None) is not None else None,
            vllm_versions=tuple(ns.vllm_version or ()), gpu=ns.gpu, budget_gb=ns.budget_gb, cache_dir=ns.cache_dir,
            fail_on_verdict=ns.fail_on_verdict, json=ns.json, gpu_memory_gib=ns.gpu_memory_gib, gpu_sms=ns.gpu_sms,
            gpu_capability=ns.gpu_capability))  # fmt: skip
    gpu_bytes = dict(GPU_MEMORY_BYTES)
    if ns.gpu is not None and ns.gpu not in gpu_bytes:
        from harness.sizing import gpus

        try:  # any GPU of the deployment's table: its total as torch reports it
            gpu_bytes[ns.gpu] = gpus.lookup(ns.gpu).total_bytes
        except gpus.UnknownGpuError as error:
            return _print_error(str(error))
    try:
        loaded = load_input(ns.scenario)
        if isinstance(loaded, Matrix):
            return _plan_matrix(loaded, ns)
        scenario = loaded
        rows = make_plan(scenario, cache_dir=ns.cache_dir)
        gpu = ns.gpu or scenario.memory.budget_gpu
        budget = int(ns.budget_gb * 1e9) if ns.budget_gb else (gpu_bytes[ns.gpu] if ns.gpu else
                                                               scenario.memory.budget_bytes)  # fmt: skip
        versions = layer_versions(scenario, ns.vllm_version)
        layers = make_layer_plans(scenario, versions, cache_dir=ns.cache_dir,
                                  budget_bytes=budget, gpu=gpu if not ns.budget_gb else None,
                                  wheel=ns.vllm_wheel, src=ns.vllm_src)  # fmt: skip
    except ScenarioError as exc:
        return _print_error(str(exc))
    except Exception as exc:  # a release whose source cannot be had
        from harness.sizing.vllm_source import VllmSourceError

        if isinstance(exc, VllmSourceError):
            return _print_error(str(exc))
        raise
    failures = layer_expectation_failures(scenario, layers)
    from harness.sizing.deployment_cli import DeviceRequest, scenario_deployments

    device = DeviceRequest(gpu=ns.gpu, budget_gb=ns.budget_gb, cache_dir=ns.cache_dir)
    deployments = scenario_deployments(scenario, versions, device, budget, wheel=ns.vllm_wheel,
                                       src=ns.vllm_src) if layers and budget else ([], "")  # the trees asked about
    if isinstance(deployments, int):
        return deployments
    failed_verdicts = [p for p in deployments[0] if p.verdict.outcome != "starts"] if ns.fail_on_verdict else []
    predicted = layer_verdict_failures(layers) if ns.fail_on_verdict else []
    code = EXIT_FAILED if failures or failed_verdicts or predicted else EXIT_OK
    if ns.json:
        data = plan_json(scenario, rows)
        data["layers"] = [plan.model_dump(mode="json") for plan in layers]
        data["layer_expectation_failures"] = failures
        data["layer_verdict_failures"] = predicted
        data["deployments"] = [plan.model_dump(mode="json") for plan in deployments[0]]
        print(json.dumps(data, indent=1))
        return code
    from harness.core.console import make_console  # rich: only once the input is good, so a refusal stays quick

    console = make_console()
    console.print(render_plan(scenario, rows))
    console.print(plan_summary(rows))
    if scenario.emulated:
        console.print(
            f"D={scenario.parallel.num_dispatchers} is emulated on {scenario.parallel.num_ranks} physical rank(s): "
            "each rank's memory (a GPU's, on GPUs) equals a real D-rank deployment's."
        )
    for plan in layers:
        console.print(render_layer_plan(plan))
        for line in layer_notes(plan):
            console.print(line)
    if layers:
        console.print(f"FAILED: {'; '.join(failures)}" if failures else
                      "OK: every layer expectation of the scenario holds" if scenario.layer.expect else "")  # fmt: skip
    from harness.sizing.deployment_cli import print_deployments

    print_deployments(console, *deployments)
    if predicted:
        console.print(f"FAILED (--fail-on-verdict): {'; '.join(predicted)}")
    return code


# What `--fail-on-verdict` fails on in a layer plan: a component vLLM gets wrong, and a budget it does not fit.
FAILING_LAYER_VERDICTS = ("double-count", "under-sized", "over-cap")


def layer_verdict_failures(layers: list[Any]) -> list[str]:
    """One line per release whose layer plan predicts an OOM (its budget's outcome oom or refused) or holds a
    component verdict of FAILING_LAYER_VERDICTS."""
    out = []
    for plan in layers:
        bad = [f"{c.name} {', '.join(v for v in c.verdicts if v in FAILING_LAYER_VERDICTS)}"
               for c in plan.components if any(v in FAILING_LAYER_VERDICTS for v in c.verdicts)]
        if plan.budget is not None and plan.budget.outcome in ("oom", "refused"):
            bad.append(f"{plan.budget.outcome} on {plan.budget.gpu or human_budget(plan.budget.budget_bytes)}")
        if bad:
            out.append(f"vllm {plan.vllm_version}: {', '.join(bad)}")
    return out


def human_budget(num_bytes: int) -> str:
    from harness.core.units import human_bytes

    return f"a {human_bytes(num_bytes)} budget"


def cmd_scenarios(ns: argparse.Namespace) -> int:
    """The scenario files, each marked with whether this machine can run it, and why not (harness.scenario.fit)."""
    from harness.core.console import make_console
    from rich.table import Table

    from harness.launch.machine import local_machine
    from harness.scenario.fit import can_run, resolve_device
    from harness.scenario.schema import ScenarioError, list_scenarios, load_scenario
    from harness.scenario.sections import SCENARIOS_DIR

    machine = local_machine()
    table = Table(title=f"scenarios in {SCENARIOS_DIR}; here = {machine.description}", title_justify="left")
    table.add_column("file")
    table.add_column("here")
    table.add_column("summary")
    rows = []
    for path in list_scenarios():
        try:
            scenario = load_scenario(path)
            summary = f"{scenario.description or scenario.summary()}"
            reason = can_run(scenario, device_type=resolve_device(scenario, machine.num_gpus), machine=machine)
        except ScenarioError as exc:
            summary, reason = f"INVALID: {exc}", "invalid"
        here = "yes" if reason is None else f"no: {reason}"
        rows.append({"file": path.name, "summary": summary, "runs_here": reason is None, "why_not": reason})
        table.add_row(path.name, here, summary)
    if ns.json:
        print(json.dumps({"machine": machine.description, "scenarios": rows}, indent=1))
    else:
        make_console().print(table)
        print(f"{sum(r['runs_here'] for r in rows)} of {len(rows)} run on {machine.description}")
    return EXIT_OK


OUTPUT_BYTES = 16 * 2**20  # what bench.json/md or layer-audit.json/md take at most, with room: checked before work


def cmd_vllm_audit(ns: argparse.Namespace) -> int:
    if ns.layer:
        from harness.core.files import probe_writable
        from harness.sizing.layer_audit import LayerAuditRequest, run_layer_audit

        if ns.out is not None:
            probe_writable(ns.out, need_bytes=OUTPUT_BYTES)  # before any release is fetched or audited

        return run_layer_audit(LayerAuditRequest(releases=ns.releases, vllm_version=ns.vllm_version,
                                                 cache_dir=ns.cache_dir, out=ns.out, json=ns.json))
    if ns.junit is not None and not ns.sweep:
        return _print_error("--junit goes with --sweep")
    if ns.sweep and ns.releases is not None:
        if ns.junit is not None:
            return _print_error("--junit goes with --sweep of one source, not with --releases")
        from harness.sizing.layer_audit import resolve_releases
        from harness.sizing.vllm_source.sweep_report import SweepReleasesRequest, run_sweep_releases

        return run_sweep_releases(SweepReleasesRequest(releases=ns.releases, cache_dir=ns.cache_dir, out=ns.out,
                                                       json=ns.json), resolve_releases)  # fmt: skip
    if ns.releases is not None or ns.out is not None:
        return _print_error("--releases and --out go with --layer or --sweep --releases")
    from harness.sizing.vllm_diff import reference_sizing
    from harness.sizing.vllm_source import AuditRequest, run_audit

    if ns.budget_s is not None and not 0 < ns.budget_s <= 86400:
        return _print_error(f"--budget-s {ns.budget_s}: a number of CPU seconds in (0, 86400] is allowed")
    return run_audit(AuditRequest(vllm_version=ns.vllm_version, vllm_wheel=ns.vllm_wheel, vllm_src=ns.vllm_src,
                                  cache_dir=ns.cache_dir, scenario=ns.scenario, json=ns.json, sweep=ns.sweep,
                                  junit=ns.junit, budget_s=ns.budget_s,
                                  reference_sizing=reference_sizing if ns.sweep else None))


def cmd_vllm_diff(ns: argparse.Namespace) -> int:
    from harness.sizing.vllm_diff import DiffRequest, run_diff

    if ns.budget_s is not None and not 0 < ns.budget_s <= 86400:
        return _print_error(f"--budget-s {ns.budget_s}: a number of CPU seconds in (0, 86400] is allowed")
    return run_diff(DiffRequest(base=ns.base, head=ns.head, references=ns.references, threshold_pct=ns.threshold,
                                json=ns.json, junit=ns.junit, markdown=ns.markdown, cache_dir=ns.cache_dir,
                                budget_s=ns.budget_s))


def recorded_command(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> list[str]:
    """The subcommand as a user would type it, derived from the parsed arguments (never sys.argv): every argument
    of `parser` whose value differs from its default, in the parser's own spelling, so none can be left out.

    ["harness", "run", "smoke", "--comm", "gloo", "--dry-run"]; re-parsed, it gives the same namespace.
    """
    positionals: list[str] = []
    options: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest == argparse.SUPPRESS:
            continue
        value = getattr(ns, action.dest, action.default)
        if value == action.default:
            continue
        if not action.option_strings:
            positionals += [str(v) for v in (value if isinstance(value, list) else [value])]
            continue
        flag = max(action.option_strings, key=len)  # the long spelling
        if action.nargs == 0:  # store_true, store_false, store_const
            options.append(flag)
            continue
        for item in value if isinstance(action, argparse._AppendAction) else [value]:
            text = str(item)
            options += [f"{flag}={text}"] if text.startswith("-") else [flag, text]  # "-x" would read as a flag
    return parser.prog.split() + positionals + options


def _scenario_overrides(ns: argparse.Namespace) -> ScenarioOverrides:
    """The scenario fields the command line sets: each ScenarioOverrides field from the option of its name."""
    import dataclasses

    from harness.launch.overrides import ScenarioOverrides

    return ScenarioOverrides(**{f.name: getattr(ns, f.name, None) for f in dataclasses.fields(ScenarioOverrides)})


def _missing_vllm_path(ns: argparse.Namespace) -> str | None:
    """A --vllm-ops-library, --vllm-wheel or --vllm-src that is not there: one line, before any rank starts."""
    from harness.scenario.source import missing_vllm_input

    return missing_vllm_input([("--vllm-ops-library", "ops_library", getattr(ns, "vllm_ops_library", None)),
                               ("--vllm-wheel", "wheel", getattr(ns, "vllm_wheel", None)),
                               ("--vllm-src", "src", getattr(ns, "vllm_src", None))])


def cmd_run(ns: argparse.Namespace) -> int:
    from harness.launch.run import RunRequest, run_command

    if (missing := _missing_vllm_path(ns)) is not None:
        return _print_error(missing)

    return run_command(RunRequest(
        scenario=ns.scenario, launcher=ns.launcher, address=ns.address, out=ns.out,
        overrides=_scenario_overrides(ns), cache_dir=ns.cache_dir, dry_run=ns.dry_run, resume=ns.resume,
        command=tuple(recorded_command(ns.parser, ns)),
    ))


def cmd_collect(ns: argparse.Namespace) -> int:
    """`harness collect RUN_DIR`: a run directory, or a matrix directory (it holds matrix.json)."""
    from harness.core.console import make_console

    from harness.report.collect import collect
    from harness.report.matrix import recollect_matrix
    from harness.scenario.matrix import MatrixError

    run_dir: Path = ns.run_dir
    if not run_dir.is_dir():
        return _print_error(f"{run_dir}: no such run directory; `harness run` writes them under results/ "
                            "(or --out), each holding run.json and ranks/")
    if not (run_dir / "run.json").is_file() and not (run_dir / "matrix.json").is_file():
        return _print_error(f"{run_dir}: not a run or matrix directory (no run.json or matrix.json): collect writes "
                            "its reports only into one; give the directory `harness run --out` wrote")
    if (run_dir / "matrix.json").exists() and not (run_dir / "run.json").exists():
        try:
            result = recollect_matrix(run_dir, progress=lambda line: print(line, file=sys.stderr, flush=True))
        except MatrixError as exc:
            return _print_error(str(exc))
    else:
        result = collect(run_dir)
    console = make_console()
    console.print(result.summary_table())
    for note in result.notes:
        console.print(f"stale output: {note}", style="yellow")
    for path in result.outputs:
        console.print(f"wrote {path}", style="dim")
    return result.exit_code


def cmd_compare(ns: argparse.Namespace) -> int:
    from harness.report.compare import CompareRequest, compare_command

    return compare_command(CompareRequest(
        baseline=ns.baseline, current=ns.current, thresholds=tuple(ns.threshold), ignore=tuple(ns.ignore),
        gate_across_hardware=ns.gate_across_hardware, gate_cpu_timings=ns.gate_cpu_timings,
        allow_failed_baseline=ns.allow_failed_baseline, json=ns.json,
    ))


def cmd_status(ns: argparse.Namespace) -> int:
    """`harness status DIR`: the recorded verdict (status.json) in one line, exiting with its code (0 pass, 1
    failed checks, 2 errors); 2 when status.json is missing or unreadable, or the directory fails compare's
    verification (harness.report.compare_load.verify_directory): the same directory gives both commands one verdict.
    The CI one-liner for a Ray job, whose own exit code turns 2 into 1 (docs/launch.md)."""
    from harness.report.compare_load import verify_directory
    from harness.report.compare_metrics import CompareError
    from harness.report.status import StatusError, read_status

    directory: Path = ns.run_dir
    try:
        status = read_status(directory)
        verify_directory(directory)  # what compare checks: report.json, its siblings, this verdict, the records
    except (StatusError, CompareError) as exc:
        return _print_error(str(exc))
    if ns.json:
        print(json.dumps(status.model_dump(mode="json")))
    else:
        print(f"{directory}: {status.status} (exit {status.exit_code}): {status.exit_reason}")
    return status.exit_code


def cmd_bench(ns: argparse.Namespace) -> int:
    from harness.bench.command import BenchRequest, bench_command
    from harness.core.files import probe_writable

    if (missing := _missing_vllm_path(ns)) is not None:
        return _print_error(missing)

    if ns.out is not None:
        probe_writable(ns.out, need_bytes=OUTPUT_BYTES)  # before any measuring
    return bench_command(BenchRequest(
        scenario=ns.scenario, overrides=_scenario_overrides(ns), out=ns.out, json=ns.json, cpu_only=ns.cpu_only,
        no_cpu_costs=ns.no_cpu_costs, command=tuple(recorded_command(ns.parser, ns)),
    ))


def cmd_schema(ns: argparse.Namespace) -> int:
    from harness.scenario.doc import schema_markdown

    sys.stdout.write(schema_markdown())  # verbatim, so `harness schema > docs/scenario-schema.md` matches the test
    return EXIT_OK


_BACKEND_HELP = f"experts implementation: {EXPERTS.help_text()}; default: the scenario's experts_backend"
_COMM_HELP = f"dispatch/combine backend: {COMM.help_text()}; default: the scenario's comm"
_DEVICE_HELP = "where ranks run, overriding the scenario's device (auto: cuda when there is a GPU per rank, else cpu)"
_VERSION_HELP = "vLLM release X.Y.Z: fetched into the cache (pip download --no-deps) unless already there"
_WHEEL_HELP = "a vLLM wheel file (.whl) to read the release from, instead of downloading one"
_SRC_HELP = "a vLLM source tree (the repository root or its vllm/ directory) to read the release from"
_OPS_HELP = "vLLM's compiled ops library file itself (vllm/_C_stable_libtorch.abi3.so or vllm/_C.abi3.so)"
_KERNELS_HELP = ("the vLLM release whose compiled ops the vllm-ops backend runs (or 'installed'); with "
                 "--vllm-ops-library, the release that file is")
_CACHE_HELP = "cache of downloaded vLLM releases (default: HARNESS_CACHE_DIR, else ~/.cache/moe-harness)"
_JSON_HELP = "print one JSON object instead of tables"
_WIDE_HELP = ("on a terminal, print every column of each table (default there: the columns that fit its width); "
              "pipes and CI logs always get every column")


class _VersionAction(argparse.Action):
    """--version, computed only when asked for (git runs then, not on every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(_version_text())
        raise SystemExit(EXIT_OK)


def _version_text() -> str:
    """'harness 0.1.0 (git a810dcd)': the package version, and the commit when run from a git checkout."""
    import subprocess

    from harness import __version__

    text = f"harness {__version__}"
    root = Path(__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, timeout=10, check=False)
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return text
        if done.returncode == 0 and done.stdout.strip():
            text += f" (git {done.stdout.strip()}{', modified' if dirty.stdout.strip() else ''})"
    return text


def cmd_verify(ns: argparse.Namespace) -> int:
    """Real vLLM's startup figures (a startup here, or --log) beside the plan (harness.verify)."""
    from harness.verify.cli import VerifyRequest, verify_command

    return verify_command(VerifyRequest(
        serve=tuple(getattr(ns, "serve", None) or ()), log=ns.log, entry=ns.entry, tolerance_pct=ns.tolerance_pct,
        timeout_s=ns.timeout, python=ns.python, vllm_version=ns.vllm_version, gpu=ns.gpu, cache_dir=ns.cache_dir,
        save=ns.save, keep_log=ns.keep_log, json=ns.json))  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="harness", description="EP+DP MoE workspace harness (vLLM PR #55579)")
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="the harness's version and, in a git checkout, its commit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                help="what to do; `harness COMMAND --help` for its options")

    p = sub.add_parser("plan", help="workspace bytes per GPU for each sizing policy; with `-- vllm serve ...` the "
                       "whole deployment")
    p.add_argument("scenario", nargs="?", default=None,
                   help="scenario file or name in scenarios/; or none and `-- vllm serve MODEL FLAGS` at the end")
    p.add_argument("--fail-on-verdict", action="store_true",
                   help="exit 1 when a release's deployment does not start (oom, fails, refused), its layer does "
                        "not fit the budget (oom, refused) or a layer component is double-count, under-sized or "
                        "over-cap; default: exit 0")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP + "; for vllm==X.Y.Z policies")
    p.add_argument("--vllm-version", action="append", default=None, metavar="X.Y.Z",
                   help="also plan the whole EP MoE layer per GPU for this release (repeatable)")
    p.add_argument("--vllm-wheel", type=Path, default=None, help="also plan the layer for this vLLM wheel file")
    p.add_argument("--vllm-src", type=Path, default=None,
                   help="also plan the layer for this vLLM source tree (the repository root or its vllm/ directory)")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="fit or OOM of each release's layer on this GPU (default: the scenario's memory.budget_gpu)")
    p.add_argument("--budget-gb", type=float, default=None, help="fit or OOM against this many GB (1e9 B) instead")
    p.add_argument("--gpu-memory-gib", type=float, default=None, metavar="X",
                   help="a deployment on a GPU not in the table: the total torch reports, GiB")
    p.add_argument("--gpu-sms", type=int, default=None, metavar="N", help="with --gpu-memory-gib: its SM count")
    p.add_argument("--gpu-capability", default=None, metavar="M.m",
                   help="with --gpu-memory-gib: its compute capability (e.g. 8.9)")
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    p.set_defaults(func=cmd_plan, parser=p)

    p = sub.add_parser("verify", help="start real vLLM on dummy weights (or read its startup log, --log) and put "
                       "its startup figures beside `harness plan`'s, line by line: 0 within --tolerance-pct, 1 outside",
                       description="harness verify [OPTIONS] -- vllm serve MODEL FLAGS: MODEL a directory holding "
                       "config.json or a preset; docs/deployment-memory.md")
    p.add_argument("--log", type=Path, default=None, metavar="FILE",
                   help="compare this vLLM startup log; nothing is started (no GPU needed)")
    p.add_argument("--entry", choices=("serve", "llm"), default="serve",
                   help="start `vllm serve` (default) or the LLM class, whose defaults differ (max_num_batched_tokens "
                        "16384, max_num_seqs 1024)")
    p.add_argument("--tolerance-pct", type=float, default=1.0, metavar="P",
                   help="largest difference judged ok, in percent (totals of what vLLM printed; the profile's small "
                        "terms of the requested memory); default 1")
    p.add_argument("--timeout", type=float, default=900.0, metavar="S", help="stop vLLM after S seconds (default 900)")
    p.add_argument("--python", default=sys.executable, help="the Python whose vLLM is started (default: this one)")
    p.add_argument("--vllm-version", default=None, metavar="X.Y.Z",
                   help="the release to plan (default: the installed one, or the one the log names)")
    p.add_argument("--gpu", default=None, metavar="NAME", help="the GPU's name for the plan (default: nvidia-smi's)")
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument("--save", type=Path, default=None, metavar="FILE",
                   help="write what vLLM printed as a startup record (YAML, the format of tests/data/startup_logs)")
    p.add_argument("--keep-log", type=Path, default=None, metavar="FILE", help="write vLLM's whole startup log here")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_verify, parser=p)

    p = sub.add_parser("scenarios", help="list the scenario files")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    p.set_defaults(func=cmd_scenarios, parser=p)

    p = sub.add_parser("run", help="run a scenario (or matrix) on local processes or a Ray cluster")
    p.add_argument("scenario", nargs="?", default=None,
                   help="scenario or matrix file, or a name in scenarios/ (default: smoke on CPU, the PR case on a GPU)")
    p.add_argument("--launcher", choices=["local", "ray"], default=None,
                   help="how ranks start: local processes or Ray actors (default: ray with --address or RAY_ADDRESS, "
                        "else the scenario's)")
    p.add_argument("--address", default=None,
                   help="Ray GCS address HOST:6379 to join (default: RAY_ADDRESS, else a new local cluster)")
    p.add_argument("--out", type=Path, default=None,
                   help="run directory, must not hold a run (default results/<run-id>); absolute in a Ray job")
    p.add_argument("--experts-backend", choices=EXPERTS.choices, default=None, help=_BACKEND_HELP)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help=_DEVICE_HELP)
    p.add_argument("--comm", choices=COMM.choices, default=None, help=_COMM_HELP)
    p.add_argument("--placement-strategy", choices=["PACK", "SPREAD"], default=None,
                   help="Ray placement of the rank bundles (default: the scenario's, PACK)")
    p.add_argument("--num-ranks", type=int, default=None, help="override parallel.num_ranks")
    p.add_argument("--policies", default=None, help="comma-separated override of policies")
    p.add_argument("--kernels", default=None, metavar="X.Y.Z|installed", help=_KERNELS_HELP
                   + "; on a matrix with a vllm.kernels axis, run only that release's cells")
    p.add_argument("--vllm-version", default=None, help=_VERSION_HELP + "; its ops for the vllm-ops backend")
    p.add_argument("--vllm-wheel", type=Path, default=None, help=_WHEEL_HELP)
    p.add_argument("--vllm-src", type=Path, default=None, help=_SRC_HELP)
    p.add_argument("--vllm-ops-library", type=Path, default=None, help=_OPS_HELP)
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
    p.add_argument("--resume", action="store_true",
                   help="a matrix into its interrupted --out again: finished cells kept, the interrupted one run again")
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    p.set_defaults(func=cmd_run, parser=p)

    p = sub.add_parser("collect", help="turn per-rank records into report.{json,md,html} and junit.xml")
    p.add_argument("run_dir", type=Path,
                   help="a run directory (holds run.json and ranks/) or a matrix run directory (holds matrix.json)")
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    p.set_defaults(func=cmd_collect, parser=p)

    p = sub.add_parser("compare", help="compare a run against a baseline: 0 pass, 1 regression, 2 error")
    p.add_argument("baseline", type=Path,
                   help="the reference: a run or matrix directory or its report.json (e.g. under results/baselines/)")
    p.add_argument("current", type=Path, help="the run to judge: a run or matrix directory or its report.json")
    p.add_argument("--threshold", action="append", default=[], metavar="METRIC=PCT",
                   help="a metric's or group's threshold (groups: memory, error, time, throughput)")
    p.add_argument("--ignore", action="append", default=[], metavar="WHAT",
                   help="leave out a metric, a group (memory, error, time, throughput, coverage), policy:NAME or "
                        "cell:NAME; what the baseline has and the current run lacks is a regression unless ignored")
    p.add_argument("--gate-across-hardware", action="store_true",
                   help="gate timings, throughputs and RSS-vs-NVML memory even when the two ran on different hardware")
    p.add_argument("--gate-cpu-timings", action="store_true",
                   help="gate the timings and throughputs of two CPU runs too (shown, not gated, by default)")
    p.add_argument("--allow-failed-baseline", action="store_true",
                   help="compare against a baseline that failed its own checks (refused, exit 2, by default)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    p.set_defaults(func=cmd_compare, parser=p)

    p = sub.add_parser("status", help="a collected directory's recorded verdict; exits with it: 0 pass, 1 failed, 2 error")
    p.add_argument("run_dir", type=Path, help="a run or matrix directory that collect wrote status.json into")
    p.add_argument("--json", action="store_true", help="print status.json's content")
    p.set_defaults(func=cmd_status, parser=p)

    p = sub.add_parser("bench", help="harness cost against raw kernels and raw all_to_all_single")
    p.add_argument("scenario", nargs="?", default=None, help="default: smoke on CPU, the PR case on a GPU")
    p.add_argument("--json", action="store_true", help="print the bench report as JSON")
    p.add_argument("--out", type=Path, default=None, help="directory for bench.json and bench.md")
    p.add_argument("--experts-backend", choices=EXPERTS.choices, default=None, help=_BACKEND_HELP)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help=_DEVICE_HELP)
    p.add_argument("--comm", choices=COMM.choices, default=None, help=_COMM_HELP)
    p.add_argument("--num-ranks", type=int, default=None, help="override parallel.num_ranks")
    p.add_argument("--policies", default=None, help="comma-separated override of policies (legacy, fixed)")
    p.add_argument("--kernels", default=None, metavar="X.Y.Z|installed", help=_KERNELS_HELP)
    p.add_argument("--vllm-version", default=None, help=_VERSION_HELP + "; its ops for the vllm-ops backend")
    p.add_argument("--vllm-wheel", type=Path, default=None, help=_WHEEL_HELP)
    p.add_argument("--vllm-src", type=Path, default=None, help=_SRC_HELP)
    p.add_argument("--vllm-ops-library", type=Path, default=None, help=_OPS_HELP)
    p.add_argument("--cpu-only", action="store_true", help="only the CPU-side costs")
    p.add_argument("--no-cpu-costs", action="store_true", help="skip the CPU-side costs")
    p.set_defaults(func=cmd_bench, parser=p)

    p = sub.add_parser("schema", help="print the scenario schema reference (Markdown)")
    p.set_defaults(func=cmd_schema, parser=p)

    vllm = sub.add_parser("vllm", help="vLLM sources: audit a release's batched-experts sizing")
    vsub = vllm.add_subparsers(dest="vllm_command", required=True, parser_class=_Parser,
                               help="what to do with vLLM's sources")
    p = vsub.add_parser("audit", help="verdict per batched-experts class: consistent or double-count")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--vllm-version", default=None, help=_VERSION_HELP + " (default: the installed vLLM)")
    src.add_argument("--vllm-wheel", type=Path, default=None, help=_WHEEL_HELP)
    src.add_argument("--vllm-src", type=Path, default=None, help=_SRC_HELP)
    p.add_argument("--scenario", default=None, help="sizes to evaluate at (default: the PR case)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument("--layer", action="store_true",
                   help="the whole-layer audit: every experts class and all-to-all kind of the curated cases")
    p.add_argument("--releases", default=None, metavar="A..B|X,Y",
                   help="with --layer or --sweep: releases to audit; A..B takes every release the registry offers "
                        "between them")
    p.add_argument("--out", type=Path, default=None,
                   help="with --layer (or --sweep --releases): write layer-audit (sweep-audit).json and .md here")
    p.add_argument("--sweep", action="store_true",
                   help="every batched-experts class over a grid of D, local experts, T, (K, I), activations, "
                        "quantization, num_dispatchers unset and EPLB (docs/vllm-sources.md)")
    p.add_argument("--junit", type=Path, default=None, metavar="FILE",
                   help="with --sweep: write JUnit XML, one testcase per (class, point group)")
    p.add_argument("--budget-s", type=float, default=None, metavar="S",
                   help="CPU seconds for the whole audit or sweep (default 8 and 18: a hostile tree's bound); raise "
                        "it for a tree you trust")
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    p.set_defaults(func=cmd_vllm_audit, parser=p)
    p = vsub.add_parser("diff", help="what a change does to the MoE workspace: every experts class over the sweep "
                                     "grid and the reference deployments, BASE against HEAD (docs/vllm-ci.md)")
    p.add_argument("base", metavar="BASE", help="a release X.Y.Z, a wheel file or a source tree directory")
    p.add_argument("head", metavar="HEAD", help="a release X.Y.Z, a wheel file or a source tree directory")
    p.add_argument("--references", type=Path, default=None, metavar="FILE",
                   help="reference deployments (YAML: `vllm serve` lines and GPUs; default: "
                        "harness/defaults/reference-deployments.yaml)")
    p.add_argument("--threshold", type=float, default=1.0, metavar="PCT",
                   help="a regression is a growth (or a KV cache loss) past this percentage (default 1)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.add_argument("--junit", type=Path, default=None, metavar="FILE", help="write JUnit XML")
    p.add_argument("--markdown", type=Path, default=None, metavar="FILE", help="write the pull-request comment")
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument("--budget-s", type=float, default=None, metavar="S", help="CPU seconds for each side's sweep")
    p.set_defaults(func=cmd_vllm_diff, parser=p)
    return parser


def _arguments_refused(argv: list[str]) -> str | None:
    """Why the command line is refused before argparse reads it (harness.scenario.limits.MAX_ARGS), or None."""
    from harness.scenario.limits import MAX_ARG_CHARS, MAX_ARGS

    if len(argv) > MAX_ARGS:
        return f"{len(argv)} command-line arguments; allowed: at most {MAX_ARGS}"
    longest = max(range(len(argv)), key=lambda i: len(argv[i]), default=None)
    if longest is not None and len(argv[longest]) > MAX_ARG_CHARS:
        from harness.scenario.limits import shown_text

        return (f"argument {longest + 1} ({shown_text(argv[longest], 40)}) is {len(argv[longest])} characters long; "
                f"allowed: at most {MAX_ARG_CHARS}")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if (refused := _arguments_refused(argv)) is not None:
        return _print_error(refused)
    serve = None
    if argv[:1] in (["plan"], ["verify"]) and "--" in argv:  # `harness plan|verify ... -- vllm serve MODEL FLAGS`
        cut = argv.index("--")
        argv, serve = argv[:cut], argv[cut + 1:]
    ns, extras = build_parser().parse_known_args(argv)
    if serve is not None:
        ns.serve = serve
    if extras:  # refused by the subcommand's own parser, so a close option can be suggested
        ns.parser.error(f"unrecognized arguments: {' '.join(extras)}")
    if getattr(ns, "wide", False):
        from harness.core.console import show_every_column

        show_every_column()
    try:
        code = int(ns.func(ns))
        sys.stdout.flush()  # here, not at exit: a full device under stdout is one line, not a traceback
        return code
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM during a launch (harness.launch.Terminated)
        signum = int(getattr(exc, "signum", 2))  # SIGINT
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))  # where the finished work is
        print("harness: interrupted" + (" (SIGTERM)" if signum != 2 else "") + notes, file=sys.stderr)
        return 128 + signum
    except OSError as exc:  # the backstop: every filesystem or permission error, on every command; a closed output
        # pipe too (`| head`): the command did not finish, so its verdict is not known, and a gate must not pass
        return _os_error(exc)


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a closed pipe or a full device cannot be written, and
    Python's flush at exit would say so in a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _os_error(exc: OSError) -> int:
    """One line naming the path and the errno text, exit 2: an infrastructure error, never read as a regression.
    Results that finished before it were written by then (each output is written atomically when it is done)."""
    _drop_stdout()
    where = f"{exc.filename}: " if exc.filename else "writing the output: "
    code = errno.errorcode.get(exc.errno or -1)
    text = f"harness: error: {where}{exc.strerror or exc}" + (f" ({code})" if code else "")
    try:
        print(" ".join(text[:4096].split()), file=sys.stderr)
    except OSError:
        pass  # stderr is gone too: the exit code still says it
    return EXIT_ERROR
