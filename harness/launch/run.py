"""`harness run`: launch a scenario (or a matrix of them) on local processes or a Ray cluster, then report.

    RunRequest (harness.cli builds it from the command line)
    scenario file (or the default) + overrides         ──> parse_scenario (same errors as the file's own)
    --out (or results/<run-id>)                        checked: new, or an empty writable directory
    this machine (local launcher)                      can_run: ranks vs cores/GPUs, memory per rank; no torch yet
    results/<run-id>/run.json                          claimed atomically, then written first
    run_ranks()                                        the kernels resolved once, then launcher.launch():
                                                       ranks/rank-NNNNN.json as each record reaches the driver
    harness.report.collect.collect(run_dir)            report.{json,md,html}, junit.xml; its exit code

`run_ranks` is the public run API: `harness bench` launches its own rank entry through it.

Exit codes: 0 ok, 1 a check or expectation failed (from collect), 2 a usage or infrastructure error, including
any rank that died, hung or never started.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console

from harness.core.console import make_console
from harness.core.exits import EXIT_ERROR, EXIT_OK
from harness.core.killpoints import KILL_ENV, KillSpecError, kill_point, parse_kill_spec
from harness.core.records import RankRecord, RunManifest, scenario_digest, write_record
from harness.launch.contract import (
    DeviceType,
    LaunchError,
    LaunchOutcome,
    LaunchPlan,
    NamedMain,
    RankEntry,
    comm_backend_for,
)
from harness.launch.deadlines import sigterm_as_interrupt
from harness.launch.faults import FAULT_ENV, parse_fault_spec
from harness.launch.launcher import Launcher
from harness.launch.overrides import (
    ScenarioOverrides,
    default_scenario_path,
    load_with_overrides,
    override_scenario,
)
from harness.launch.progress import RunProgress
from harness.launch.rundir import (
    CLAIM_FILE,
    choose_run_dir,
    claim_run_dir,
    clear_interrupted,
    holds_matrix,
    make_run_id,
    records_ended,
    remove_temporaries,
    take_over_stale_claim,
)
from harness.launch.sink import RunSink, describe_failure
from harness.scenario.fit import Machine, can_run, resolve_device
from harness.scenario.matrix import display_path
from harness.scenario.schema import Scenario, ScenarioError, resolve_scenario_path
from harness.scenario.source import display, missing_vllm_input, read_yaml_file

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from harness.report.collect import CollectResult
    from harness.scenario.matrix import Matrix
    from harness.sizing.vllm_source.kernels import KernelsLibrary

LauncherName = Literal["local", "ray"]


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """One `harness run`: what to run, where, and the command that asked for it (recorded in run.json)."""

    scenario: str | None = None  # a file, or a name in scenarios/; None: the embedded default
    launcher: LauncherName | None = None
    address: str | None = None
    out: Path | None = None
    overrides: ScenarioOverrides = field(default_factory=ScenarioOverrides)
    cache_dir: Path | None = None
    dry_run: bool = False
    resume: bool = False  # a matrix into its --out again: finished cells kept, an interrupted one run again
    command: tuple[str, ...] = ("harness", "run")


@dataclass(frozen=True, kw_only=True)
class RanksRequest:
    """One launch of a scenario's ranks: what each runs (`main`, returning `record_model`) and where records go."""

    scenario: Scenario
    run_id: str
    run_dir: Path
    device_type: DeviceType
    main: Callable[..., Any]
    record_model: type[Any]
    policies: tuple[str, ...]
    title: str  # the progress display's title


@dataclass(frozen=True, kw_only=True)
class RanksOutcome:
    """What came back: the launch's outcome and the final records, by rank."""

    outcome: LaunchOutcome
    records: dict[int, Any]
    num_ranks: int

    @property
    def ok(self) -> bool:
        return self.outcome.ok


def local_gpu_count() -> int:
    """GPUs on this machine, from NVML (no torch import): what the default scenario and device "auto" go by."""
    from harness.launch.machine import local_machine

    return local_machine().num_gpus


def reasons_not_here(scenarios: list[Scenario], launcher_name: LauncherName) -> list[str | None]:
    """Why each scenario cannot run on this machine (None: it can), probed without torch and before any rank.

    Local launcher only: a Ray cluster's resources are known once connected, and run_scenario checks them there.
    """
    if launcher_name != "local":
        return [None] * len(scenarios)
    from harness.launch.machine import local_machine

    machine = local_machine()
    reasons = [can_run(s, device_type=resolve_device(s, machine.num_gpus), machine=machine) for s in scenarios]
    return [f"cannot run on {machine.description}: {r}" if r else None for r in reasons]


def resolve_launcher_name(request: RunRequest, scenario: Scenario | None) -> LauncherName:
    """--launcher, else Ray when an address is given (or `ray job submit` set RAY_ADDRESS), else the scenario's."""
    if request.launcher == "local" and request.address:
        raise LaunchError(f"--address {request.address} is for the Ray launcher; drop it or use --launcher ray")
    if request.launcher is not None:
        return request.launcher
    if request.address or os.environ.get("RAY_ADDRESS"):
        return "ray"
    return scenario.launch.launcher if scenario is not None else "local"


def make_launcher(name: LauncherName, *, address: str | None, num_cpus: int) -> Launcher:
    if name == "ray":
        from harness.launch.ray_launcher import RayLauncher

        return RayLauncher(address, num_cpus=num_cpus)
    from harness.launch.local import LocalLauncher

    return LocalLauncher()


def cluster_cpus_for(scenarios: list[Scenario]) -> int:
    """CPUs for a Ray cluster started here: enough bundles for the largest scenario."""
    return max(s.parallel.num_ranks * s.launch.cpus_per_rank for s in scenarios)


# ---------------------------------------------------------------------------------------------------------------
# The ranks of one scenario: the public run API


def scenario_kernels(scenario: Scenario) -> KernelsLibrary | None:
    """The vLLM ops library the scenario's ranks load (None: its backend loads none), located on the driver and
    fetched into the cache if needed, once per run. Raises VllmSourceError with one line."""
    from harness.sizing.vllm_source.kernels import needs_kernels, resolve_kernels

    return resolve_kernels(scenario.vllm) if needs_kernels(scenario) else None


def run_ranks(request: RanksRequest, *, launcher: Launcher, console: Console) -> RanksOutcome:
    """Resolve the kernels once, then launch the ranks with the progress display; records land in run_dir.

    The resolved library travels to every rank in the RankEntry (loading it is the ranks' to try: the driver may
    have no GPU). When it cannot be had no rank starts, since each would fail the same way: the cause lands in
    the records as one line per rank.
    """
    from harness.sizing.vllm_source import VllmSourceError

    scenario = request.scenario
    progress = RunProgress(
        console=console, title=request.title, num_ranks=scenario.parallel.num_ranks, num_policies=len(request.policies)
    )
    try:
        kernels = scenario_kernels(scenario)
        problem = None
    except VllmSourceError as exc:
        kernels, problem = None, f"kernels unavailable: {str(exc).splitlines()[0]}"
    if kernels is not None:
        console.print(f"kernels: {kernels.describe()} from {kernels.origin}", highlight=False, markup=False)
    entry = RankEntry(main=request.main, record_model=request.record_model, policies=request.policies, kernels=kernels)
    plan = LaunchPlan(
        scenario=scenario, run_id=request.run_id, run_dir=request.run_dir, device_type=request.device_type, entry=entry
    )
    sink = RunSink.for_plan(plan, listener=progress)
    if problem is not None:
        sink.fail_pending(problem)
        outcome = sink.outcome()
    else:
        with progress.shown(), sigterm_as_interrupt():
            outcome = launcher.launch(plan, sink)
    return RanksOutcome(
        outcome=outcome, records={r: sink.records[r] for r in sorted(sink.records)}, num_ranks=plan.num_ranks
    )


# ---------------------------------------------------------------------------------------------------------------
# One scenario, one matrix


def _write_manifest(
    scenario: Scenario,
    *,
    run_dir: Path,
    run_id: str,
    scenario_path: Path | None,
    launcher: LauncherName,
    command: list[str],
) -> None:
    """run.json, first: what was launched, by what, how."""
    from harness.core.environment import collect_versions

    run_dir.mkdir(parents=True, exist_ok=True)
    data = scenario.model_dump(mode="json")
    write_record(
        run_dir / "run.json",
        RunManifest(
            run_id=run_id,
            scenario_name=scenario.name or "",
            scenario_hash=scenario.scenario_hash,
            scenario=data,
            scenario_sha256=scenario_digest(data),
            # Relative to the repository when inside it: in a Ray job the repository is Ray's temporary working_dir,
            # deleted after the job, while "scenarios/smoke.yaml" is what the user gave and can open.
            scenario_path=display_path(scenario_path) if scenario_path is not None else None,
            num_ranks=scenario.parallel.num_ranks,
            launcher=launcher,
            command=command,
            started_at=time.time(),
            versions=collect_versions(),
        ),
    )


def run_scenario(
    scenario: Scenario,
    *,
    launcher: Launcher,
    run_dir: Path,
    run_id: str,
    scenario_path: Path | None,
    command: list[str],
    console: Console,
    on_collected: Callable[[CollectResult], None] | None = None,
    plots: bool = True,
) -> int:
    """Launch one scenario into run_dir (claimed by the caller), collect it and print the summary; return the exit
    code. `on_collected` gets what collect produced (a matrix's combined report reuses the report, and the sha256
    of the report.json written, instead of reading the records again). `plots=False`: a matrix's cell, whose
    report.html draws no figure (the matrix's page does)."""
    resources = launcher.resources()
    device_type = resolve_device(scenario, resources.num_gpus)
    # Counts as the launcher sees them (torch's GPUs, Ray's CPUs and GPUs); memory was checked before the launcher.
    machine = Machine(
        num_cpus=resources.num_cpus,
        num_gpus=resources.num_gpus,
        description=resources.description,
        shared=launcher.name == "local",
    )
    reason = can_run(scenario, device_type=device_type, machine=machine)
    if reason is not None:
        log.error(f"{scenario.name} cannot run on {resources.description}: {reason}")  # a matrix goes on
        return EXIT_ERROR

    started = time.monotonic()
    with sigterm_as_interrupt():  # SIGTERM is Ctrl-C from run.json to the last report: the launch and collect
        return _launch_and_collect(
            scenario,
            launcher=launcher,
            run_dir=run_dir,
            run_id=run_id,
            scenario_path=scenario_path,
            command=command,
            console=console,
            on_collected=on_collected,
            plots=plots,
            device_type=device_type,
            resources=resources,
            started=started,
        )


def _launch_and_collect(
    scenario: Scenario,
    *,
    launcher: Launcher,
    run_dir: Path,
    run_id: str,
    scenario_path: Path | None,
    command: list[str],
    console: Console,
    on_collected: Callable[[CollectResult], None] | None,
    plots: bool,
    device_type: DeviceType,
    resources: Any,
    started: float,
) -> int:
    from harness.report.collect import collect
    from harness.report.model import RunReport

    _write_manifest(
        scenario, run_dir=run_dir, run_id=run_id, scenario_path=scenario_path, launcher=launcher.name, command=command
    )
    kill_point("launch")
    console.print(
        f"{run_id}: {scenario.summary()}\n"
        f"{launcher.name} launcher on {resources.description}; {scenario.parallel.num_ranks} rank(s) on "
        f"{device_type} ({comm_backend_for(device_type)}); records to {run_dir}",
        highlight=False,
        markup=False,
    )
    request = RanksRequest(
        scenario=scenario,
        run_id=run_id,
        run_dir=run_dir,
        device_type=device_type,
        main=NamedMain("harness.rank.lifecycle", "rank_main"),  # imported by the ranks, not this driver
        record_model=RankRecord,
        policies=tuple(scenario.policies),
        title=f"{scenario.name}: {launcher.name} launcher",
    )
    try:
        outcome = run_ranks(request, launcher=launcher, console=console).outcome
    except KeyboardInterrupt as exc:
        # The command layer prints "harness: interrupted" once, in one line with this note of where the work is.
        exc.add_note(f"the records that arrived are in {run_dir} (`harness collect {run_dir}` reports them)")
        raise

    if outcome.error:
        log.error(outcome.error)
    for failure in outcome.failures:
        log.warning(describe_failure(failure))
    try:
        result = collect(run_dir, plots=plots)
    except KeyboardInterrupt as exc:
        # Every record is on disk: collecting again (or `--resume` for a matrix) writes the reports from them.
        exc.add_note(f"every record of the run is in {run_dir}; `harness collect {run_dir}` writes its reports")
        raise
    if on_collected is not None and isinstance(result.report, RunReport):
        on_collected(result)
    console.print(result.summary_table())
    console.print(f"results: {run_dir}  ({time.monotonic() - started:.1f} s)", highlight=False, markup=False)
    if not outcome.ok:
        return EXIT_ERROR
    return result.exit_code


def _dry_run(
    scenario: Scenario, *, launcher_name: LauncherName, request: RunRequest, run_dir: Path, console: Console
) -> None:
    from harness.sizing.plan import make_plan, plan_summary, render_plan

    rows = make_plan(scenario, cache_dir=request.cache_dir)
    console.print(render_plan(scenario, rows))
    console.print(plan_summary(rows))
    launch = scenario.launch
    if launcher_name == "ray":
        where = f"Ray cluster at {request.address or os.environ.get('RAY_ADDRESS') or 'a new local cluster'}"
        if scenario.device == "auto":
            device = "auto (cuda when the cluster has enough GPUs, else cpu; decided at launch)"
            bundle = f"{{GPU: 1, CPU: {launch.cpus_per_rank}}} or {{CPU: {launch.cpus_per_rank}}}"
        else:
            device = scenario.device
            gpu = "GPU: 1, " if device == "cuda" else ""
            bundle = f"{{{gpu}CPU: {launch.cpus_per_rank}}}"
        placement = f"{scenario.parallel.num_ranks} bundles of {bundle}, {launch.placement_strategy}"
    else:
        where = "this machine"
        device = resolve_device(scenario, local_gpu_count())
        placement = f"{scenario.parallel.num_ranks} local processes, rendezvous 127.0.0.1"
    console.print(
        f"would launch: {launcher_name} launcher on {where}; device {device}; {placement}\n"
        f"bounds: placement {launch.placement_timeout_s:g} s, collectives {launch.collective_timeout_s:g} s, "
        f"whole run {launch.rank_timeout_s:g} s; records to {run_dir}",
        highlight=False,
        markup=False,
    )


def run_command(request: RunRequest) -> int:
    """Entry of `harness run`: the exit code; ScenarioError, LaunchError and the like reach harness.cli.main."""
    return _run_command(request)


def _read_input(path: Path) -> tuple[Any, bool]:
    """The file's YAML data, read once through the bounded reader, and whether it is a matrix file."""
    data = read_yaml_file(path)
    return data, isinstance(data, dict) and "matrix" in data


def _run_command(request: RunRequest) -> int:
    parse_fault_spec(os.environ.get(FAULT_ENV))  # a malformed test hook fails here, not inside a rank
    try:
        parse_kill_spec(os.environ.get(KILL_ENV))
    except KillSpecError as exc:
        raise LaunchError(str(exc)) from None
    overrides = request.overrides.dotted()
    console = make_console()
    command = list(request.command)

    path = resolve_scenario_path(request.scenario) if request.scenario is not None else None
    scenario: Scenario | None = None
    if path is not None:
        data, is_matrix = _read_input(path)
        if is_matrix:
            from harness.scenario.matrix import matrix_from_data

            return _run_matrix(request, matrix_from_data(data, path), overrides, console=console, command=command)
        scenario = load_with_overrides(path, overrides, data=data)
    if request.resume:
        raise LaunchError("--resume goes with a matrix file and its --out (a run is run again into a new --out)")
    launcher_name = resolve_launcher_name(request, scenario)

    launcher: Launcher | None = None
    try:
        if scenario is None:
            # The default depends on GPUs: the cluster's when we join one, this machine's otherwise.
            joining = (
                launcher_name == "ray" and (request.address or os.environ.get("RAY_ADDRESS")) and not request.dry_run
            )
            if joining:
                launcher = make_launcher("ray", address=request.address, num_cpus=1)
                num_gpus = launcher.resources().num_gpus
            else:
                num_gpus = local_gpu_count()
            path = default_scenario_path(num_gpus)
            scenario = load_with_overrides(path, overrides)
            console.print(
                f"no scenario given: running {path.name} ({num_gpus} GPU(s) found)", highlight=False, markup=False
            )
        assert path is not None  # the scenario's file: given, or the default chosen above
        run_id = make_run_id(scenario.name or "run")
        start_s = scenario.launch.placement_timeout_s  # an empty claim older than this is no run still starting
        run_dir = choose_run_dir(request.out, run_id, stale_after_s=start_s)
        reason = reasons_not_here([scenario], launcher_name)[0]
        if reason is not None:
            raise LaunchError(f"{display(path)}: {reason}")
        v = scenario.vllm  # the scenario's own vLLM files, checked before a run directory or a rank exists
        missing = missing_vllm_input(
            [
                ("vllm.ops_library", "ops_library", v.ops_library),
                ("vllm.wheel", "wheel", v.wheel),
                ("vllm.src", "src", v.src),
            ]
        )
        if missing is not None:
            raise LaunchError(f"{display(path)}: {missing}")
        if request.dry_run:
            # A release policy whose source cannot be had: VllmSourceError, one line from harness.cli.main.
            _dry_run(scenario, launcher_name=launcher_name, request=request, run_dir=run_dir, console=console)
            return EXIT_OK
        # Claimed before the launcher starts (and torch is imported): a --out that cannot be made is refused now.
        claim = claim_run_dir(run_dir, run_id, exact=request.out is not None, stale_after_s=start_s)
        try:
            if launcher is None:
                launcher = make_launcher(launcher_name, address=request.address, num_cpus=cluster_cpus_for([scenario]))
            return run_scenario(
                scenario,
                launcher=launcher,
                run_dir=claim.path,
                run_id=run_id,
                scenario_path=path,
                command=command,
                console=console,
            )
        finally:
            claim.release()
    finally:
        if launcher is not None:
            launcher.close()


def _run_matrix(
    request: RunRequest, matrix: Matrix, overrides: dict[str, Any], *, console: Console, command: list[str]
) -> int:
    """Each cell into <run_dir>/<cell.name>/, one after another, past failed cells; then collect_matrix."""
    from harness.report.matrix import collect_matrix

    path = matrix.path
    cells = kernels_cells(matrix, overrides)
    scenarios = [override_scenario(c.scenario, overrides, label=f"{display(path)} cell {c.name}") for c in cells]
    run_id = make_run_id(matrix.name or path.stem)
    if request.resume and (request.out is None or not holds_matrix(request.out)):
        raise LaunchError(
            f"--resume: --out {display(request.out) if request.out else '(none)'} holds no matrix.json; "
            "give the directory of the interrupted matrix"
        )
    # --out may name this matrix's directory again: each call adds its cells (a kernels matrix, release by release).
    start_s = max((s.launch.placement_timeout_s for s in scenarios), default=60.0)
    run_dir = choose_run_dir(request.out, run_id, matrix_name=matrix.name, stale_after_s=start_s)
    launcher_name = resolve_launcher_name(request, scenarios[0] if scenarios else None)
    # A cell this machine cannot hold is reported and passed over, as a cell that fails is; none: refused.
    not_here = reasons_not_here(scenarios, launcher_name)
    if all(not_here):
        raise LaunchError(f"{display(path)}: no cell can run here; cell {cells[0].name}: {not_here[0]}")
    console.print(
        f"matrix {path.name}: {matrix.expansion().summary()} cells, into {run_dir}", highlight=False, markup=False
    )
    if request.dry_run:
        for cell, scenario in zip(cells, scenarios, strict=True):
            console.rule(f"cell {cell.name}")
            _dry_run(
                scenario, launcher_name=launcher_name, request=request, run_dir=run_dir / cell.name, console=console
            )
        return EXIT_OK
    claim = claim_run_dir(
        run_dir, run_id, exact=request.out is not None, reuse=holds_matrix(run_dir), stale_after_s=start_s
    )
    run_dir = claim.path
    # matrix.json first: a matrix that is interrupted can be collected as one, or resumed (--resume)
    from harness.scenario.matrix import write_matrix_manifest

    write_matrix_manifest(run_dir, list(matrix.cells()), matrix=matrix)
    launcher: Launcher | None = None
    try:
        launcher = make_launcher(launcher_name, address=request.address, num_cpus=cluster_cpus_for(scenarios))
        with sigterm_as_interrupt():  # between cells too (after ray.init, which sets a SIGTERM handler of its own)
            collected = _run_cells(
                cells,
                scenarios,
                not_here,
                launcher=launcher,
                run_dir=run_dir,
                run_id=run_id,
                path=path,
                command=command,
                console=console,
                resume=request.resume,
                start_s=start_s,
            )
    except KeyboardInterrupt as exc:
        exc.add_note(_resume_note(path, run_dir))
        raise
    finally:
        if launcher is not None:
            launcher.close()
        claim.release()
    # Every cell, run now (its report as collected when it finished) or earlier (collected here). SIGTERM is
    # Ctrl-C here too: an interrupted matrix collect is done again by `harness collect DIR` or `--resume`.
    try:
        with sigterm_as_interrupt():
            kill_point("matrix-collect")
            result = collect_matrix(run_dir, list(matrix.cells()), matrix=matrix, collected=collected)
    except KeyboardInterrupt as exc:
        exc.add_note(_resume_note(path, run_dir))
        raise
    console.print(result.summary_table())
    console.print(f"results: {run_dir}", highlight=False, markup=False)
    return result.exit_code


def _resume_note(path: Path, run_dir: Path) -> str:
    return f"`harness run {display(path)} --out {display(run_dir)} --resume` finishes the matrix, finished cells kept"


def cell_finished(cell_dir: Path) -> bool:
    """A cell whose run finished and was collected: no claim, its five outputs of one generation (status.json, the
    last written, among them), and that generation its records' (load.input_hash): kept as it is."""
    from harness.report.load import input_hash
    from harness.report.write import output_generations

    if (cell_dir / CLAIM_FILE).exists():
        return False
    generations = set(output_generations(cell_dir).values())
    if len(generations) != 1 or None in generations:
        return False
    generation = generations.pop()
    return generation is not None and generation.rpartition("@")[2] == input_hash(cell_dir)[:16]


def _run_cells(
    cells: list[Any],
    scenarios: list[Scenario],
    not_here: list[str | None],
    *,
    launcher: Launcher,
    run_dir: Path,
    run_id: str,
    path: Path,
    command: list[str],
    console: Console,
    resume: bool = False,
    start_s: float = 60.0,
) -> dict[str, CollectResult]:
    """The cells one after another, each claimed in the matrix directory; past a cell that fails or cannot run.

    A cell that finished (collected, its claim released) is kept. One whose records are final (records_ended: its
    launch ended, and the run was killed while it collected) is collected again, never run again. One that was
    interrupted before its records were final is run again with `resume` (what the killed run left is replaced),
    else kept and named. A claim left by a killed run is taken over first. Returns what collect produced for each
    cell that ran or was collected again, by cell name."""
    collected: dict[str, CollectResult] = {}
    for i, (cell, scenario, reason) in enumerate(zip(cells, scenarios, not_here, strict=True), start=1):
        console.rule(f"cell {i} of {len(cells)}: {cell.name}")
        cell_dir = run_dir / cell.name
        cell_run_id = f"{run_id}-{cell.name}"
        try:
            if cell_dir.is_dir() and not cell_dir.is_symlink():
                take_over_stale_claim(cell_dir, stale_after_s=start_s)
            if (cell_dir / "run.json").exists() and records_ended(cell_dir):
                if cell_finished(cell_dir):
                    console.print(
                        f"cell {cell.name}: already run in {cell_dir}; kept (remove it to run it again)",
                        highlight=False,
                        markup=False,
                    )
                    continue
                console.print(
                    f"cell {cell.name}: its records are complete; collected again (not run again)",
                    highlight=False,
                    markup=False,
                )
                code = _collect_cell_again(
                    cell_dir, cell_run_id, collected, cell.name, console=console, start_s=start_s
                )
                console.print(
                    f"cell {i} of {len(cells)} ({cell.name}): exit code {code}", highlight=False, markup=False
                )
                continue
            if (cell_dir / "run.json").exists() and not resume:
                console.print(
                    f"cell {cell.name}: interrupted in {cell_dir} (its run was stopped before the end); "
                    "kept: `--resume` runs it again",
                    highlight=False,
                    markup=False,
                )
                continue
            if reason is not None:
                raise LaunchError(reason)
            if resume and (cell_dir / "run.json").exists():
                console.print(f"cell {cell.name}: interrupted; run again (--resume)", highlight=False, markup=False)
                clear_interrupted(cell_dir, stale_after_s=start_s)
            elif cell_dir.is_dir() and not cell_dir.is_symlink():
                remove_temporaries(cell_dir)  # a run killed before its run.json: only its temporaries are left
            cell_claim = claim_run_dir(cell_dir, cell_run_id, stale_after_s=start_s)
            try:
                code = run_scenario(
                    scenario,
                    launcher=launcher,
                    run_dir=cell_claim.path,
                    run_id=cell_run_id,
                    scenario_path=path,
                    command=command,
                    console=console,
                    on_collected=functools.partial(collected.__setitem__, cell.name),
                    plots=False,
                )
            finally:
                cell_claim.release()
        except (ScenarioError, LaunchError) as exc:  # the matrix goes on with the next cell
            log.error(f"cell {cell.name}: {exc}")
            code = exc.exit_code
        console.print(f"cell {i} of {len(cells)} ({cell.name}): exit code {code}", highlight=False, markup=False)
    return collected


def _collect_cell_again(
    cell_dir: Path,
    cell_run_id: str,
    collected: dict[str, CollectResult],
    name: str,
    *,
    console: Console,
    start_s: float,
) -> int:
    """A cell whose records are final, collected again under its claim (a stray temporary of the killed collect
    is removed first); its result joins `collected`."""
    from harness.report.collect import collect
    from harness.report.model import RunReport

    remove_temporaries(cell_dir)
    claim = claim_run_dir(cell_dir, cell_run_id, reuse=True, stale_after_s=start_s)
    try:
        with sigterm_as_interrupt():
            result = collect(cell_dir, plots=False)
    finally:
        claim.release()
    if isinstance(result.report, RunReport):
        collected[name] = result
    console.print(result.summary_table())
    return result.exit_code


def kernels_cells(matrix: Any, overrides: dict[str, Any]) -> list[Any]:
    """The cells to run: all, or with --kernels X on a matrix whose axes include vllm.kernels, X's cells only.

    That lets each release of a kernels matrix run in its own call (one ops library per GPU machine) into one
    matrix directory (--out); `harness collect DIR` then reports every cell, and names the ones not run yet.
    """
    cells = list(matrix.cells())
    wanted = overrides.get("vllm", {}).get("kernels")
    if wanted is None or "vllm.kernels" not in matrix.axes:
        return cells
    chosen = [c for c in cells if c.axis_values.get("vllm.kernels") == wanted]
    if not chosen:
        values = ", ".join(str(v) for v in matrix.axes["vllm.kernels"])
        raise ScenarioError(f"{matrix.path}: --kernels {wanted}: the matrix's vllm.kernels axis has {values}")
    return chosen
