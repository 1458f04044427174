"""Getting ranks running and their records back: launchers, and the driver of `harness run`.

Owns:
    contract     the launch contract: LaunchPlan, RankEntry (what a rank runs, with the kernels the driver
                 resolved), ClusterResources, LaunchOutcome, LaunchError
    launcher     the Launcher protocol (resources, launch, close) both launchers follow
    sink         RunSink: the driver side, validating events and writing records and failures as they arrive
    deadlines    RankWatch (the bounds of every wait), exit_cause, SIGTERM handled as Ctrl-C
    faults       HARNESS_INJECT_FAULT, the test hook that makes one rank die, hang or stop at a given point
    rank_side    rank_entry: the wrapper each rank's process runs around its RankEntry's main
    local        the local launcher (a fork server that has imported torch; a process per rank)
    ray_launcher the Ray launcher (a placement group, one actor per rank)
    machine      this machine's CPUs, GPUs and memory, probed without torch
    rundir       run ids and run directories, claimed atomically
    overrides    the scenario a command names, with the command line's overrides applied
    progress     RunProgress: the live table (or one line per event) while ranks run
    run          the driver: typed requests (RunRequest) -> launch -> collect; `run_ranks`, the public run API
                 `harness bench` launches through

Launchers only build RankInfos; the rank entry is handed to them (RankEntry), so they import neither
harness.rank's lifecycle nor harness.bench. Nothing here takes an argparse.Namespace: harness.cli parses the
command line and builds the requests.

May import: harness.core, harness.scenario, harness.sizing, harness.rank, harness.report.

    harness run ──> Launcher.launch(LaunchPlan, RunSink)
                      local  a process per rank from a fork server; events and records come back over a pipe per rank
                      ray    one placement-group bundle and one actor per rank; events through a progress actor,
                             final records as Ray objects
                    in every rank: rank_entry() -> the RankEntry's main(scenario, RankInfo, run_dir, progress,
                                   kernels=...)
                    on the driver: RunSink validates every event (harness.core.events), writes the record so far
                    after each policy (PolicyDone) and the final record the moment they arrive, both to
                    ranks/rank-NNNNN.json, and a RankFailure (ranks/rank-NNNNN.failed.json) naming the finished
                    and lost policies for each rank that died, hung, raised or never started

`harness.rank.distributed.init_rank` is the one rendezvous (docs/design.md).

Bounds (scenario.launch): the placement and the actors' start within `placement_timeout_s`; once one rank has
ended the others get `collective_timeout_s` more; nothing runs past `rank_timeout_s` from the launch (deadlines).
SIGTERM to the driver is handled as Ctrl-C is (`sigterm_as_interrupt`): records so far kept, ranks stopped,
nothing left.
"""

from harness.launch.contract import ClusterResources, DeviceType, LaunchError, LaunchOutcome, LaunchPlan, RankEntry
from harness.launch.deadlines import POLL_INTERVAL_S, RankWatch, Terminated, exit_cause, sigterm_as_interrupt
from harness.launch.faults import FAULT_ENV, FaultSpec, parse_fault_spec
from harness.launch.launcher import Launcher
from harness.launch.rank_side import format_exception, rank_entry
from harness.launch.sink import RunSink, describe_failure

__all__ = [
    "FAULT_ENV",
    "POLL_INTERVAL_S",
    "ClusterResources",
    "DeviceType",
    "FaultSpec",
    "LaunchError",
    "LaunchOutcome",
    "LaunchPlan",
    "Launcher",
    "RankEntry",
    "RankWatch",
    "RunSink",
    "Terminated",
    "describe_failure",
    "exit_cause",
    "format_exception",
    "parse_fault_spec",
    "rank_entry",
    "sigterm_as_interrupt",
]
