"""The `harness` command. Every subcommand returns an exit code: 0 ok, 1 a check failed, 2 usage or error."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.errors import BadInput, HarnessError, InfrastructureError
from harness.core.exits import EXIT_FAILED, EXIT_OK
from harness.core.log import LOG_LEVEL_ENV, LogLevelError, level_from, logging_at

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from harness.launch.overrides import ScenarioOverrides


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
    from harness.scenario.sections import GPU_MEMORY_BYTES
    from harness.sizing.plan import (
        layer_expectation_failures,
        layer_notes,
        layer_versions,
        make_layer_plans,
        make_plan,
        plan_json,
        plan_summary,
        render_layer_plan,
        render_plan,
    )  # fmt: skip

    if ns.budget_gb is not None and not 0 < ns.budget_gb < 1e6:
        raise BadInput(f"--budget-gb {ns.budget_gb} is not a budget in GB; allowed: above 0, below 1e6")
    if getattr(ns, "search", False):  # `harness plan --search ... -- vllm serve ...` (harness/cli_search.py)
        from harness.cli_search import search_command
        from harness.sizing.deployment_cli import DeviceRequest, _budget

        return search_command(ns, *_budget(DeviceRequest(gpu=ns.gpu, budget_gb=ns.budget_gb)))
    from harness.cli_search import stray_search_option

    if (stray := stray_search_option(ns)) is not None:
        raise BadInput(stray)
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

        # any GPU of the deployment's table: its total as torch reports it (UnknownGpuError: one line from main)
        gpu_bytes[ns.gpu] = gpus.lookup(ns.gpu).total_bytes
    # ScenarioError, VllmSourceError (a release whose source cannot be had): one line from main.
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
    failures = layer_expectation_failures(scenario, layers)
    from harness.sizing.deployment_cli import DeviceRequest, scenario_deployments

    device = DeviceRequest(gpu=ns.gpu, budget_gb=ns.budget_gb, cache_dir=ns.cache_dir)
    deployments = (
        scenario_deployments(scenario, versions, device, budget, wheel=ns.vllm_wheel, src=ns.vllm_src)
        if layers and budget
        else ([], "")
    )  # the trees asked about
    if isinstance(deployments, int):
        return deployments
    failed_verdicts = [p for p in deployments[0] if not p.starts_every_time] if ns.fail_on_verdict else []
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
        bad = [
            f"{c.name} {', '.join(v for v in c.verdicts if v in FAILING_LAYER_VERDICTS)}"
            for c in plan.components
            if any(v in FAILING_LAYER_VERDICTS for v in c.verdicts)
        ]
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
    from rich.table import Table

    from harness.core.console import make_console
    from harness.launch.machine import local_machine
    from harness.scenario.fit import can_run, resolve_device
    from harness.scenario.schema import ScenarioError, list_scenarios, load_scenario
    from harness.scenario.sections import SCENARIOS_DIR

    machine = local_machine()
    table = Table(title=f"scenarios in {SCENARIOS_DIR}; here = {machine.description}", title_justify="left")
    table.add_column("file")
    table.add_column("here")
    table.add_column("summary")
    rows: list[dict[str, Any]] = []
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

        return run_layer_audit(
            LayerAuditRequest(
                releases=ns.releases, vllm_version=ns.vllm_version, cache_dir=ns.cache_dir, out=ns.out, json=ns.json
            )
        )
    if ns.junit is not None and not ns.sweep:
        raise BadInput("--junit goes with --sweep")
    classes = None
    if ns.classes is not None:
        classes = tuple(dict.fromkeys(n.strip() for n in ns.classes.split(",") if n.strip()))
        if not ns.sweep or ns.releases is not None:
            raise BadInput("--classes goes with --sweep of one source")
        if not classes or not all(n.isidentifier() for n in classes):
            raise BadInput(f"--classes {ns.classes}: comma-separated experts class names are allowed")
    if ns.sweep and ns.releases is not None:
        if ns.junit is not None:
            raise BadInput("--junit goes with --sweep of one source, not with --releases")
        from harness.sizing.layer_audit import resolve_releases
        from harness.sizing.vllm_source.sweep_report import SweepReleasesRequest, run_sweep_releases

        return run_sweep_releases(SweepReleasesRequest(releases=ns.releases, cache_dir=ns.cache_dir, out=ns.out,
                                                       json=ns.json), resolve_releases)  # fmt: skip
    if ns.releases is not None or ns.out is not None:
        raise BadInput("--releases and --out go with --layer or --sweep --releases")
    from harness.sizing.vllm_diff import reference_sizing
    from harness.sizing.vllm_source import AuditRequest, run_audit

    if ns.budget_s is not None and not 0 < ns.budget_s <= 86400:
        raise BadInput(f"--budget-s {ns.budget_s}: a number of CPU seconds in (0, 86400] is allowed")
    return run_audit(
        AuditRequest(
            vllm_version=ns.vllm_version,
            vllm_wheel=ns.vllm_wheel,
            vllm_src=ns.vllm_src,
            cache_dir=ns.cache_dir,
            scenario=ns.scenario,
            json=ns.json,
            sweep=ns.sweep,
            junit=ns.junit,
            budget_s=ns.budget_s,
            reference_sizing=reference_sizing if ns.sweep else None,
            classes=classes,
        )
    )


def cmd_vllm_diff(ns: argparse.Namespace) -> int:
    from harness.sizing.vllm_diff import DiffRequest, run_diff

    if ns.budget_s is not None and not 0 < ns.budget_s <= 86400:
        raise BadInput(f"--budget-s {ns.budget_s}: a number of CPU seconds in (0, 86400] is allowed")
    return run_diff(
        DiffRequest(
            base=ns.base,
            head=ns.head,
            references=ns.references,
            threshold_pct=ns.threshold,
            json=ns.json,
            junit=ns.junit,
            markdown=ns.markdown,
            cache_dir=ns.cache_dir,
            budget_s=ns.budget_s,
        )
    )


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

    return missing_vllm_input(
        [
            ("--vllm-ops-library", "ops_library", getattr(ns, "vllm_ops_library", None)),
            ("--vllm-wheel", "wheel", getattr(ns, "vllm_wheel", None)),
            ("--vllm-src", "src", getattr(ns, "vllm_src", None)),
        ]
    )


def cmd_run(ns: argparse.Namespace) -> int:
    from harness.launch.run import RunRequest, run_command

    if (missing := _missing_vllm_path(ns)) is not None:
        raise BadInput(missing)

    return run_command(
        RunRequest(
            scenario=ns.scenario,
            launcher=ns.launcher,
            address=ns.address,
            out=ns.out,
            overrides=_scenario_overrides(ns),
            cache_dir=ns.cache_dir,
            dry_run=ns.dry_run,
            resume=ns.resume,
            command=tuple(recorded_command(ns.parser, ns)),
        )
    )


def cmd_collect(ns: argparse.Namespace) -> int:
    """`harness collect RUN_DIR`: a run directory, or a matrix directory (it holds matrix.json)."""
    from harness.core.console import make_console
    from harness.report.collect import collect
    from harness.report.matrix import recollect_matrix

    run_dir: Path = ns.run_dir
    if not run_dir.is_dir():
        raise BadInput(
            f"{run_dir}: no such run directory; `harness run` writes them under results/ "
            "(or --out), each holding run.json and ranks/"
        )
    if not (run_dir / "run.json").is_file() and not (run_dir / "matrix.json").is_file():
        raise BadInput(
            f"{run_dir}: not a run or matrix directory (no run.json or matrix.json): collect writes "
            "its reports only into one; give the directory `harness run --out` wrote"
        )
    if (run_dir / "matrix.json").exists() and not (run_dir / "run.json").exists():
        result = recollect_matrix(run_dir, progress=log.info)  # MatrixError: one line from main
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

    return compare_command(
        CompareRequest(
            baseline=ns.baseline,
            current=ns.current,
            thresholds=tuple(ns.threshold),
            ignore=tuple(ns.ignore),
            gate_across_hardware=ns.gate_across_hardware,
            gate_cpu_timings=ns.gate_cpu_timings,
            allow_failed_baseline=ns.allow_failed_baseline,
            json=ns.json,
        )
    )


def cmd_status(ns: argparse.Namespace) -> int:
    """`harness status DIR`: the recorded verdict (status.json) in one line, exiting with its code (0 pass, 1
    failed checks, 2 errors); 2 when status.json is missing or unreadable, or the directory fails compare's
    verification (harness.report.compare_load.verify_directory): the same directory gives both commands one verdict.
    The CI one-liner for a Ray job, whose own exit code turns 2 into 1 (docs/launch.md)."""
    from harness.report.compare_load import verify_directory
    from harness.report.status import read_status

    directory: Path = ns.run_dir
    status = read_status(directory)  # StatusError: one line from main, exit 2
    verify_directory(directory)  # what compare checks: report.json, its siblings, this verdict, the records
    if ns.json:
        print(json.dumps(status.model_dump(mode="json")))
    else:
        print(f"{directory}: {status.status} (exit {status.exit_code}): {status.exit_reason}")
    return status.exit_code


def cmd_bench(ns: argparse.Namespace) -> int:
    from harness.bench.command import BenchRequest, bench_command
    from harness.core.files import probe_writable

    if (missing := _missing_vllm_path(ns)) is not None:
        raise BadInput(missing)

    if ns.out is not None:
        probe_writable(ns.out, need_bytes=OUTPUT_BYTES)  # before any measuring
    return bench_command(
        BenchRequest(
            scenario=ns.scenario,
            overrides=_scenario_overrides(ns),
            out=ns.out,
            json=ns.json,
            cpu_only=ns.cpu_only,
            no_cpu_costs=ns.no_cpu_costs,
            repeats=ns.repeats,
            probes=_bench_probes(ns),
            command=tuple(recorded_command(ns.parser, ns)),
        )
    )


def _bench_probes(ns: argparse.Namespace) -> tuple[str, ...] | None:
    """--repeats and --probes checked: one line naming the value and what is allowed."""
    from harness.bench.cpu_costs import MAX_REPEATS, PROBES
    from harness.core.text import shown_text

    if not 1 <= ns.repeats <= MAX_REPEATS:
        raise BadInput(f"--repeats {ns.repeats}: allowed 1 to {MAX_REPEATS}")
    if ns.probes is None:
        return None
    names = tuple(name.strip() for name in ns.probes.split(","))
    unknown = [name for name in names if name not in PROBES]
    if unknown or not names:
        raise BadInput(f"--probes: {shown_text(unknown[0] if unknown else ns.probes, 40)!r} is not a probe; "
                       f"allowed: {', '.join(PROBES)}")  # fmt: skip
    return tuple(name for name in PROBES if name in names)


def cmd_schema(ns: argparse.Namespace) -> int:
    from harness.scenario.doc import schema_markdown

    sys.stdout.write(schema_markdown())  # verbatim, so `harness schema > docs/scenario-schema.md` matches the test
    return EXIT_OK


def cmd_verify(ns: argparse.Namespace) -> int:
    """Real vLLM's startup figures (a startup here, or --log) beside the plan (harness.verify)."""
    from harness.verify.cli import VerifyRequest, verify_command

    return verify_command(VerifyRequest(
        serve=tuple(getattr(ns, "serve", None) or ()), log=ns.log, entry=ns.entry, tolerance_pct=ns.tolerance_pct,
        timeout_s=ns.timeout, python=ns.python, vllm_version=ns.vllm_version, gpu=ns.gpu, cache_dir=ns.cache_dir,
        save=ns.save, keep_log=ns.keep_log, json=ns.json))  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The command line (harness.cli_parsers), each command bound to its function here, looked up at each call."""
    from harness.cli_parsers import build_parser as build

    return build({
        "plan": cmd_plan, "scenarios": cmd_scenarios, "run": cmd_run, "collect": cmd_collect, "compare": cmd_compare,
        "status": cmd_status, "bench": cmd_bench, "schema": cmd_schema, "vllm audit": cmd_vllm_audit,
        "verify": cmd_verify, "vllm diff": cmd_vllm_diff,
    })  # fmt: skip


def _arguments_refused(argv: list[str]) -> str | None:
    """Why the command line is refused before argparse reads it (harness.scenario.limits.MAX_ARGS), or None."""
    from harness.scenario.limits import MAX_ARG_CHARS, MAX_ARGS

    if len(argv) > MAX_ARGS:
        return f"{len(argv)} command-line arguments; allowed: at most {MAX_ARGS}"
    longest = max(range(len(argv)), key=lambda i: len(argv[i]), default=None)
    if longest is not None and len(argv[longest]) > MAX_ARG_CHARS:
        from harness.scenario.limits import shown_text

        return (
            f"argument {longest + 1} ({shown_text(argv[longest], 40)}) is {len(argv[longest])} characters long; "
            f"allowed: at most {MAX_ARG_CHARS}"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if (refused := _arguments_refused(argv)) is not None:
        with logging_at(logging.INFO):
            return _report(BadInput(refused))
    serve = None
    if argv[:1] in (["plan"], ["verify"]) and "--" in argv:  # `harness plan|verify ... -- vllm serve MODEL FLAGS`
        cut = argv.index("--")
        argv, serve = argv[:cut], argv[cut + 1 :]
    ns, extras = build_parser().parse_known_args(argv)
    if serve is not None:
        ns.serve = serve
    if extras:  # refused by the subcommand's own parser, so a close option can be suggested
        ns.parser.error(f"unrecognized arguments: {' '.join(extras)}")
    try:
        level = level_from(verbose=ns.verbose, quiet=ns.quiet, env=os.environ.get(LOG_LEVEL_ENV))
    except LogLevelError as exc:
        with logging_at(logging.INFO):
            return _report(exc)
    with logging_at(level):  # and back to what it was: an in-process caller's next call starts afresh
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    if getattr(ns, "wide", False):
        from harness.core.console import show_every_column

        show_every_column()
    try:
        code = int(ns.func(ns))
        sys.stdout.flush()  # here, not at exit: a full device under stdout is one line, not a traceback
        return code
    except HarnessError as exc:  # every refusal and failure of a command: one line, its exit code
        try:
            sys.stdout.flush()  # what the command printed before it comes first
        except OSError:
            _drop_stdout()  # a closed pipe: nothing left for Python's flush at exit to fail on
        return _report(exc)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM during a launch (harness.launch.Terminated)
        signum = int(getattr(exc, "signum", 2))  # SIGINT
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))  # where the finished work is
        log.warning("interrupted" + (" (SIGTERM)" if signum != 2 else "") + notes)
        return 128 + signum
    except OSError as exc:  # the backstop: every filesystem or permission error, on every command; a closed output
        # pipe too (`| head`): the command did not finish, so its verdict is not known, and a gate must not pass
        return _os_error(exc)


def _report(exc: HarnessError) -> int:
    """The error as its one line (harness.core.log.error_line) and its exit code."""
    log.error(str(exc), extra={"details": exc.details})
    return exc.exit_code


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
    text = f"{where}{exc.strerror or exc}" + (f" ({code})" if code else "")
    return _report(InfrastructureError(" ".join(text[:4096].split())))  # a stderr that is gone drops the line
