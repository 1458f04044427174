"""`harness run`: launch a scenario (or a matrix of them) on local processes or a Ray cluster, then report.

    scenario file (or the default) + CLI overrides ──> parse_scenario (same errors as the file's own)
    --out (or results/<run-id>)                        checked: new, or an empty writable directory
    this machine (local launcher)                      can_run: ranks vs cores/GPUs, memory per rank; no torch yet
    results/<run-id>/run.json                          claimed atomically, then written first
    launcher.launch()                                  ranks/rank-NNNNN.json as each record reaches the driver
    harness.report.collect.collect(run_dir)                   report.{json,md,html}, junit.xml; its exit code

Exit codes: 0 ok, 1 a check or expectation failed (from collect), 2 a usage or infrastructure error, including
any rank that died, hung or never started.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from harness.core.console import make_console
from harness.core.exits import EXIT_ERROR, EXIT_OK
from harness.core.events import Done, Event, Failed, Placed, Placing, PolicyDone, PolicyStarted, Ready, RecordWritten
from harness.launch import (
    FAULT_ENV, LaunchError, Launcher, LaunchPlan, RankEntry, RunSink, describe_failure, parse_fault_spec,
    sigterm_as_interrupt,
)
from harness.launch.rundir import choose_run_dir, claim_run_dir, holds_matrix, make_run_id
from harness.core.records import RankRecord, RunManifest, write_record
from harness.scenario.dotted import DottedKeyError, set_dotted
from harness.scenario.fit import Machine, can_run, resolve_device
from harness.scenario.schema import SCENARIOS_DIR, Scenario, ScenarioError, parse_scenario, resolve_scenario_path
from harness.scenario.source import display, read_yaml_file

if TYPE_CHECKING:
    from harness.scenario.matrix import Matrix

PACKAGED_DEFAULTS_DIR = Path(__file__).resolve().parents[1] / "defaults"  # package data, for non-editable installs


def _embedded(name: str) -> Path:
    """A default scenario: the repository's scenarios/ when there is one, else the copy packaged with harness."""
    in_repo = SCENARIOS_DIR / name
    return in_repo if in_repo.exists() else PACKAGED_DEFAULTS_DIR / name


DEFAULT_CPU_SCENARIO = _embedded("smoke.yaml")
DEFAULT_GPU_SCENARIO = _embedded("deepseek-v3-dp32-pr55579.yaml")

LauncherName = Literal["local", "ray"]


# ---------------------------------------------------------------------------------------------------------------
# Scenario selection and command-line overrides


def scenario_overrides(ns: argparse.Namespace) -> dict[str, Any]:
    """The scenario fields the command line sets, as dotted keys: {"parallel.num_ranks": 8, ...}.

    --launcher is not among them: it picks how ranks start, not what they measure, so a scenario keeps its hash
    (and stays comparable) whichever launcher ran it; run.json and launch.json record the launcher.
    """
    overrides: dict[str, Any] = {}
    if ns.experts_backend is not None:
        overrides["experts_backend"] = ns.experts_backend
    if ns.device is not None:
        overrides["device"] = ns.device
    if getattr(ns, "comm", None) is not None:
        overrides["comm"] = ns.comm
    if getattr(ns, "placement_strategy", None) is not None:
        overrides["launch.placement_strategy"] = ns.placement_strategy
    if ns.num_ranks is not None:
        overrides["parallel.num_ranks"] = ns.num_ranks
    if ns.policies is not None:
        overrides["policies"] = [p.strip() for p in ns.policies.split(",") if p.strip()]
    # vllm.* holds at most one source, so a source given here replaces the scenario's (--kernels X.Y.Z with
    # --vllm-ops-library names a file and its release together).
    vllm = {key: str(getattr(ns, flag)) for flag, key in (
        ("kernels", "kernels"), ("vllm_version", "version"), ("vllm_wheel", "wheel"), ("vllm_src", "src"),
        ("vllm_ops_library", "ops_library")) if getattr(ns, flag, None) is not None}
    if vllm:
        overrides["vllm"] = vllm
    return overrides


def _flag(key: str) -> str:
    return {
        "experts_backend": "--experts-backend", "comm": "--comm", "device": "--device",
        "launch.placement_strategy": "--placement-strategy", "parallel.num_ranks": "--num-ranks",
        "policies": "--policies", "vllm": "--kernels/--vllm-*",
    }[key]


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], *, path: Path | str, name: str | None) -> Scenario:
    """Set dotted keys in raw scenario data and validate it again, so a bad override reads like a bad file."""
    data = dict(data)  # set_dotted copies what it sets; the caller's top level stays as it was
    for dotted, value in overrides.items():
        try:
            set_dotted(data, dotted, value)
        except DottedKeyError as exc:
            raise ScenarioError(f"{display(path)}: {exc}; cannot apply {_flag(dotted)}") from None
    if "policies" in overrides:
        # --policies narrows the run: expectations about policies left out no longer apply.
        outcomes = data.get("expect", {}).get("outcomes")
        if isinstance(outcomes, dict):
            data["expect"]["outcomes"] = {k: v for k, v in outcomes.items() if k in overrides["policies"]}
    if name is not None:
        data.setdefault("name", name)
    label = f"{path} (with {', '.join(f'{_flag(k)}' for k in overrides)})" if overrides else path
    return parse_scenario(data, path=label)


def load_with_overrides(path: Path, overrides: dict[str, Any], *, data: Any = None) -> Scenario:
    """The scenario file (already read: `data`) with the command line's overrides; the file's own errors first."""
    data = read_yaml_file(path) if data is None else data
    scenario = parse_scenario(data, path=path)
    if not overrides:
        return scenario
    return apply_overrides(data, overrides, path=path, name=scenario.name)


def override_scenario(scenario: Scenario, overrides: dict[str, Any], *, label: str) -> Scenario:
    """Overrides applied to an already-validated scenario (a matrix cell)."""
    if not overrides:
        return scenario
    return apply_overrides(scenario.model_dump(mode="json"), overrides, path=label, name=scenario.name)


def default_scenario_path(num_gpus: int) -> Path:
    """The embedded default: the PR case on a machine or cluster with a GPU, the CPU smoke scenario otherwise."""
    return DEFAULT_GPU_SCENARIO if num_gpus >= 1 else DEFAULT_CPU_SCENARIO


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


def command_line(ns: argparse.Namespace) -> list[str]:
    """The `harness run` command as a user would type it, for run.json."""
    argv = ["harness", "run"]
    if ns.scenario is not None:
        argv.append(str(ns.scenario))
    for name in ("launcher", "address", "out", "experts_backend", "device", "placement_strategy", "num_ranks",
                 "policies", "kernels", "vllm_version", "vllm_wheel", "vllm_src", "vllm_ops_library", "cache_dir"):
        value = getattr(ns, name, None)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    if getattr(ns, "dry_run", False):
        argv.append("--dry-run")
    return argv


def resolve_launcher_name(ns: argparse.Namespace, scenario: Scenario | None) -> LauncherName:
    """--launcher, else Ray when an address is given (or `ray job submit` set RAY_ADDRESS), else the scenario's."""
    if ns.launcher == "local" and ns.address:
        raise LaunchError(f"--address {ns.address} is for the Ray launcher; drop it or use --launcher ray")
    if ns.launcher is not None:
        return ns.launcher
    if ns.address or os.environ.get("RAY_ADDRESS"):
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
# Progress display


@dataclass
class _RankState:
    node: str = ""
    status: str = "starting"
    num_policies_done: int = 0
    up: bool = False
    failed: bool = False


@dataclass
class RunProgress:
    """Ranks up N/P and the policy each rank is measuring: a live table on a terminal, one line per event in logs."""

    console: Console
    title: str
    num_ranks: int
    num_policies: int
    ranks: dict[int, _RankState] = field(default_factory=dict)
    note: str = ""
    _live: Live | None = None

    def __post_init__(self) -> None:
        self.ranks = {r: _RankState() for r in range(self.num_ranks)}

    @property
    def num_up(self) -> int:
        return sum(s.up for s in self.ranks.values())

    @contextmanager
    def shown(self) -> Iterator[RunProgress]:
        if self.console.is_terminal:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()
        try:
            yield self
        finally:
            if self._live is not None:
                self._live.update(self.render())
                self._live.stop()
                self._live = None

    def __call__(self, event: Event) -> None:
        line = self._apply(event)
        if self._live is not None:
            self._live.update(self.render())
        elif line:
            self.console.print(line, highlight=False, markup=False)

    def _apply(self, event: Event) -> str:
        if isinstance(event, Placing):
            self.note = f"placing {event.num_bundles} bundles of {event.bundle}"
            return self.note
        state = self.ranks.get(event.rank)
        if state is None:
            return ""
        rank = event.rank
        if isinstance(event, Placed):
            state.node, state.status = event.node, "placed"
            return f"rank {rank}: placed on {state.node} (pid {event.pid})"
        if isinstance(event, Ready):
            state.up, state.status = True, "ready"
            return f"rank {rank}: ready ({self.num_up}/{self.num_ranks} up)"
        if isinstance(event, PolicyStarted):
            state.status = f"measuring {event.policy}"
            return f"rank {rank}: measuring {event.policy} ({state.num_policies_done + 1}/{self.num_policies})"
        if isinstance(event, PolicyDone):
            state.num_policies_done += 1
            state.status = f"{event.policy}: {event.status}"
            return f"rank {rank}: {event.policy} {event.status}; record so far written"
        if isinstance(event, Done):
            state.status, state.num_policies_done = "done", self.num_policies
            return f"rank {rank}: done"
        if isinstance(event, RecordWritten):
            state.status = "record written"
            return f"rank {rank}: record written"
        if isinstance(event, Failed):
            state.failed, state.status = True, f"FAILED: {event.cause}"
            return f"rank {rank}: FAILED: {event.cause}"
        return ""

    def render(self) -> Table:
        title = Text(f"{self.title}\nranks up {self.num_up}/{self.num_ranks}  {self.note}")
        table = Table(title=title, title_justify="left")
        table.add_column("rank", justify="right")
        table.add_column("node")
        table.add_column("policies", justify="right")
        table.add_column("status")
        for rank, state in self.ranks.items():
            style = "red" if state.failed else ("green" if state.status in ("done", "record written") else None)
            table.add_row(str(rank), Text(state.node), f"{state.num_policies_done}/{self.num_policies}",
                          Text(state.status), style=style)  # Text: causes may hold "[...]", which is not markup
        return table


# ---------------------------------------------------------------------------------------------------------------
# One scenario, one matrix


def _console() -> Console:
    return make_console()


def _error(message: str) -> int:
    print(f"harness: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _write_manifest(scenario: Scenario, *, run_dir: Path, run_id: str, scenario_path: Path | None,
                    launcher: LauncherName, command: list[str]) -> None:
    """run.json, first: what was launched, by what, how."""
    from harness.core.environment import collect_versions

    run_dir.mkdir(parents=True, exist_ok=True)
    write_record(run_dir / "run.json", RunManifest(
        run_id=run_id, scenario_name=scenario.name or "", scenario_hash=scenario.scenario_hash,
        scenario=scenario.model_dump(mode="json"),
        scenario_path=str(scenario_path) if scenario_path is not None else None,
        num_ranks=scenario.parallel.num_ranks, launcher=launcher, command=command, started_at=time.time(),
        versions=collect_versions(),
    ))


def run_scenario(
    scenario: Scenario,
    *,
    launcher: Launcher,
    run_dir: Path,
    run_id: str,
    scenario_path: Path | None,
    command: list[str],
    console: Console,
) -> int:
    """Launch one scenario into run_dir (claimed by the caller), collect it and print the summary; return the exit
    code."""
    from harness.report.collect import collect
    from harness.rank.lifecycle import rank_main

    resources = launcher.resources()
    device_type = resolve_device(scenario, resources.num_gpus)
    # Counts as the launcher sees them (torch's GPUs, Ray's CPUs and GPUs); memory was checked before the launcher.
    machine = Machine(num_cpus=resources.num_cpus, num_gpus=resources.num_gpus, description=resources.description,
                      shared=launcher.name == "local")
    reason = can_run(scenario, device_type=device_type, machine=machine)
    if reason is not None:
        return _error(f"{scenario.name} cannot run on {resources.description}: {reason}")

    started = time.monotonic()
    _write_manifest(scenario, run_dir=run_dir, run_id=run_id, scenario_path=scenario_path, launcher=launcher.name,
                    command=command)
    plan = LaunchPlan(scenario=scenario, run_id=run_id, run_dir=run_dir, device_type=device_type,
                      entry=RankEntry(main=rank_main, record_model=RankRecord, policies=tuple(scenario.policies)))
    console.print(
        f"{run_id}: {scenario.summary()}\n"
        f"{launcher.name} launcher on {resources.description}; {plan.num_ranks} rank(s) on {device_type} "
        f"({plan.comm_backend}); records to {run_dir}",
        highlight=False, markup=False,
    )
    progress = RunProgress(
        console=console, title=f"{scenario.name}: {launcher.name} launcher", num_ranks=plan.num_ranks,
        num_policies=len(scenario.policies),
    )
    sink = RunSink.for_plan(plan, listener=progress)
    kernels_problem = kernels_on_driver(scenario, console)
    try:
        if kernels_problem is not None:
            # No rank starts: each would fail the same way. The cause lands in the records as one line per rank.
            sink.fail_pending(kernels_problem)
            outcome = sink.outcome()
        else:
            with progress.shown(), sigterm_as_interrupt():
                outcome = launcher.launch(plan, sink)
    except KeyboardInterrupt:
        # The command layer prints "harness: interrupted" once; this line says where the finished work is.
        print(f"harness: the records that arrived are in {run_dir} (`harness collect {run_dir}` reports them)",
              file=sys.stderr)
        raise

    if outcome.error:
        print(f"harness: error: {outcome.error}", file=sys.stderr)
    for failure in outcome.failures:
        print(f"harness: {describe_failure(failure)}", file=sys.stderr)
    result = collect(run_dir)
    console.print(result.summary_table())
    console.print(f"results: {run_dir}  ({time.monotonic() - started:.1f} s)", highlight=False, markup=False)
    if not outcome.ok:
        return EXIT_ERROR
    return result.exit_code


def kernels_on_driver(scenario: Scenario, console: Console) -> str | None:
    """Locate (fetching into the cache if needed) the vLLM ops library the ranks will load, before they start.

    Returns why the kernels cannot be had, in one line, or None. The ranks resolve the same library from the
    cache and record its sha256; loading it is theirs to try (the driver may have no GPU).
    """
    from harness.sizing.vllm_source import VllmSourceError
    from harness.sizing.vllm_source.kernels import needs_kernels, resolve_kernels

    if not needs_kernels(scenario):
        return None
    try:
        kernels = resolve_kernels(scenario.vllm)
    except VllmSourceError as exc:
        return f"kernels unavailable: {str(exc).splitlines()[0]}"
    console.print(f"kernels: {kernels.describe()} from {kernels.origin}", highlight=False, markup=False)
    return None


def _dry_run(scenario: Scenario, *, launcher_name: LauncherName, ns: argparse.Namespace, run_dir: Path,
             console: Console) -> None:
    from harness.sizing.plan import make_plan, plan_summary, render_plan

    rows = make_plan(scenario, cache_dir=ns.cache_dir)
    console.print(render_plan(scenario, rows))
    console.print(plan_summary(rows))
    launch = scenario.launch
    if launcher_name == "ray":
        where = f"Ray cluster at {ns.address or os.environ.get('RAY_ADDRESS') or 'a new local cluster'}"
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
        placement = f"{scenario.parallel.num_ranks} spawned processes, rendezvous 127.0.0.1"
    console.print(
        f"would launch: {launcher_name} launcher on {where}; device {device}; {placement}\n"
        f"bounds: placement {launch.placement_timeout_s:g} s, collectives {launch.collective_timeout_s:g} s, "
        f"whole run {launch.rank_timeout_s:g} s; records to {run_dir}",
        highlight=False, markup=False,
    )


def run_command(ns: argparse.Namespace) -> int:
    """Entry of `harness run`."""
    try:
        return _run_command(ns)
    except (ScenarioError, LaunchError) as exc:
        return _error(str(exc))


def _read_input(path: Path) -> tuple[Any, bool]:
    """The file's YAML data, read once through the bounded reader, and whether it is a matrix file."""
    data = read_yaml_file(path)
    return data, isinstance(data, dict) and "matrix" in data


def _run_command(ns: argparse.Namespace) -> int:
    parse_fault_spec(os.environ.get(FAULT_ENV))  # a malformed test hook fails here, not inside a rank
    if ns.num_ranks is not None and ns.num_ranks < 1:
        raise ScenarioError(f"--num-ranks {ns.num_ranks}: must be at least 1")
    overrides = scenario_overrides(ns)
    console = _console()
    command = command_line(ns)

    path = resolve_scenario_path(ns.scenario) if ns.scenario is not None else None
    scenario: Scenario | None = None
    if path is not None:
        data, is_matrix = _read_input(path)
        if is_matrix:
            from harness.scenario.matrix import matrix_from_data

            return _run_matrix(ns, matrix_from_data(data, path), overrides, console=console, command=command)
        scenario = load_with_overrides(path, overrides, data=data)
    launcher_name = resolve_launcher_name(ns, scenario)

    launcher: Launcher | None = None
    try:
        if scenario is None:
            # The default depends on GPUs: the cluster's when we join one, this machine's otherwise.
            joining = launcher_name == "ray" and (ns.address or os.environ.get("RAY_ADDRESS")) and not ns.dry_run
            if joining:
                launcher = make_launcher("ray", address=ns.address, num_cpus=1)
                num_gpus = launcher.resources().num_gpus
            else:
                num_gpus = local_gpu_count()
            path = default_scenario_path(num_gpus)
            scenario = load_with_overrides(path, overrides)
            console.print(f"no scenario given: running {path.name} ({num_gpus} GPU(s) found)", highlight=False, markup=False)
        run_id = make_run_id(scenario.name or "run")
        run_dir = choose_run_dir(ns.out, run_id)
        reason = reasons_not_here([scenario], launcher_name)[0]
        if reason is not None:
            raise LaunchError(f"{display(path)}: {reason}")
        if ns.dry_run:
            try:
                _dry_run(scenario, launcher_name=launcher_name, ns=ns, run_dir=run_dir, console=console)
            except Exception as exc:
                from harness.sizing.vllm_source import VllmSourceError

                if isinstance(exc, VllmSourceError):  # a release policy whose source cannot be had
                    return _error(str(exc))
                raise
            return EXIT_OK
        # Claimed before the launcher starts (and torch is imported): a --out that cannot be made is refused now.
        claim = claim_run_dir(run_dir, run_id, exact=ns.out is not None)
        try:
            if launcher is None:
                launcher = make_launcher(launcher_name, address=ns.address, num_cpus=cluster_cpus_for([scenario]))
            return run_scenario(
                scenario, launcher=launcher, run_dir=claim.path, run_id=run_id, scenario_path=path,
                command=command, console=console,
            )
        finally:
            claim.release()
    finally:
        if launcher is not None:
            launcher.close()


def _run_matrix(ns: argparse.Namespace, matrix: Matrix, overrides: dict[str, Any], *, console: Console,
                command: list[str]) -> int:
    """Each cell into <run_dir>/<cell.name>/, one after another, past failed cells; then collect_matrix."""
    from harness.report.matrix import collect_matrix

    path = matrix.path
    cells = kernels_cells(matrix, overrides)
    scenarios = [override_scenario(c.scenario, overrides, label=f"{display(path)} cell {c.name}") for c in cells]
    run_id = make_run_id(matrix.name or path.stem)
    # --out may name this matrix's directory again: each call adds its cells (a kernels matrix, release by release).
    run_dir = choose_run_dir(ns.out, run_id, matrix_name=matrix.name)
    launcher_name = resolve_launcher_name(ns, scenarios[0] if scenarios else None)
    # A cell this machine cannot hold is reported and passed over, as a cell that fails is; none: refused.
    not_here = reasons_not_here(scenarios, launcher_name)
    if all(not_here):
        raise LaunchError(f"{display(path)}: no cell can run here; cell {cells[0].name}: {not_here[0]}")
    console.print(f"matrix {path.name}: {matrix.expansion().summary()} cells, into {run_dir}", highlight=False,
                  markup=False)
    if ns.dry_run:
        for cell, scenario in zip(cells, scenarios):
            console.rule(f"cell {cell.name}")
            _dry_run(scenario, launcher_name=launcher_name, ns=ns, run_dir=run_dir / cell.name, console=console)
        return EXIT_OK
    claim = claim_run_dir(run_dir, run_id, exact=ns.out is not None, reuse=holds_matrix(run_dir))
    run_dir = claim.path
    launcher: Launcher | None = None
    try:
        launcher = make_launcher(launcher_name, address=ns.address, num_cpus=cluster_cpus_for(scenarios))
        _run_cells(cells, scenarios, not_here, launcher=launcher, run_dir=run_dir, run_id=run_id, path=path,
                   command=command, console=console)
    finally:
        if launcher is not None:
            launcher.close()
        claim.release()
    result = collect_matrix(run_dir, list(matrix.cells()), matrix=matrix)  # every cell, run now or earlier
    console.print(result.summary_table())
    console.print(f"results: {run_dir}", highlight=False, markup=False)
    return result.exit_code


def _run_cells(cells: list[Any], scenarios: list[Scenario], not_here: list[str | None], *, launcher: Launcher,
               run_dir: Path, run_id: str, path: Path, command: list[str], console: Console) -> None:
    """The cells one after another, each claimed in the matrix directory; past a cell that fails or cannot run."""
    for cell, scenario, reason in zip(cells, scenarios, not_here):
        console.rule(f"cell {cell.name}")
        if (run_dir / cell.name / "run.json").exists():
            console.print(f"cell {cell.name}: already run in {run_dir / cell.name}; kept (remove it to run it "
                          "again)", highlight=False, markup=False)
            continue
        try:
            if reason is not None:
                raise LaunchError(reason)
            cell_claim = claim_run_dir(run_dir / cell.name, f"{run_id}-{cell.name}")
            try:
                code = run_scenario(
                    scenario, launcher=launcher, run_dir=cell_claim.path, run_id=f"{run_id}-{cell.name}",
                    scenario_path=path, command=command, console=console,
                )
            finally:
                cell_claim.release()
        except (ScenarioError, LaunchError) as exc:
            code = _error(f"cell {cell.name}: {exc}")
        console.print(f"cell {cell.name}: exit code {code}", highlight=False, markup=False)


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
