"""The rank side of both launchers: the wrapper each rank's process runs around its RankEntry's main."""

from __future__ import annotations

import gc
import importlib
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.events import RankEvent
from harness.launch.contract import RankEntry, main_module
from harness.launch.faults import FAULT_ENV, parse_fault_spec

if TYPE_CHECKING:
    from harness.rank.distributed import RankInfo
    from harness.scenario.schema import Scenario


def rank_entry(
    scenario: Scenario, info: RankInfo, run_dir: Path, emit: Callable[[dict[str, Any]], None], entry: RankEntry
) -> dict[str, Any]:
    """Run one rank inside a launcher's process and return its record as JSON data.

    `emit` carries the rank's events back to the driver as JSON data (model dumps; the driver validates them).
    It returns once the data is on its way out of this process, so a record so far survives a crash right
    after. Exceptions propagate: the launcher reports them as the rank's failure.
    """
    from harness.rank.distributed import apply_safe_env

    # The rank's code imported (with torch: a Ray actor has not imported it yet), what is alive then lives as long as
    # the rank: frozen, it is left out of the collection before every baseline and measurement
    # (harness.rank.memory.release_cached), which on a CPU rank otherwise walks about 200,000 objects, 0.1 s of CPU a
    # call and some 3 s a smoke rank. What the rank allocates from here on is collected as before.
    importlib.import_module(main_module(entry.main))
    gc.freeze()
    apply_safe_env()
    fault = parse_fault_spec(os.environ.get(FAULT_ENV))
    if fault is not None and fault.rank != info.rank:
        fault = None
    if fault is not None and fault.after == "start":
        fault.trigger()

    def progress(event: RankEvent) -> None:
        emit(event.model_dump(mode="json"))  # delivered when emit returns: no sleep before a fault
        if fault is not None and fault.matches(event):
            fault.trigger()

    return entry.main(scenario, info, run_dir, progress, kernels=entry.kernels).model_dump(mode="json")


def format_exception(exc: BaseException) -> tuple[str, str]:
    """(cause, detail) for an exception raised inside a rank."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted: Ctrl-C reached the rank", ""
    lines = traceback.format_exception_only(type(exc), exc)
    return f"error: {lines[-1].strip()}", "".join(traceback.format_exception(exc))
