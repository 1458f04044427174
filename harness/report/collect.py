"""`harness collect`: turn one run's per-rank records into report.json, report.md, junit.xml and report.html.

    run.json + ranks/rank-NNNNN.json (+ rank-NNNNN.failed.json)
        -> load.load_run()        read inside the run directory only; every bad file becomes a Problem
        -> build.RunFold          judge every rank x policy (checks) as its record is read, aggregate, drop the
                                  record: a RunReport (harness.report.model); build.collect_report streams the two
        -> write.write_report()   report.json, report.md, junit.xml, report.html, all stamped with one generation

Collect trusts nothing a record says about itself beyond its measured facts: every verdict is made from the
numbers and the scenario's tolerances (harness.report.checks); NaN, infinities and negative sizes make a record
invalid.

Exit codes (also the report's `exit_code`):
    0  every check passed
    1  a check failed: an expectation not met, correctness out of tolerance, memory out of tolerance, unequal
       baselines
    2  errors: rank failures, unreadable, invalid or mismatched records, ranks missing against run.json, a policy
       that raised, or no records at all

Checks, per rank x policy (docs/reports.md says how to read them):
    expectation  expected outcome ("fit" | "oom") against the actual one; skipped without an expectation
    correctness  max_rel_error <= expect.max_error, no wrongly routed slot and no diverging stage (each stage of the
                 data path within expect.stage_tolerance); or, for a kernels release in expect.wrong_kernels, the
                 first diverging stage (and first wrong row) stated there; skipped when the policy OOMed
    memory       workspace delta within expect.memory_tolerance_pct of the allocated contract (common + ws2)
    baseline     the policy's memory baseline equals the rank's first policy's within the allocator's rounding,
                 so every policy was measured from the same warmed state
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.exits import EXIT_ERROR
from harness.report.build import collect_report
from harness.report.model import Report, RunReport, with_digest
from harness.report.write import ForeignOutputError, write_report
from harness.scenario.schema import Scenario


@dataclass(frozen=True, kw_only=True)
class CollectResult:
    """What `collect` produced. `report` is exactly what report.json holds."""

    run_dir: Path
    report: Report
    outputs: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()  # outputs of another generation that were rewritten
    write_error: str | None = None  # the outputs could not be written (one line); the exit code is then 2
    report_sha256: str | None = None  # "sha256:<hex>" of the report.json bytes written; None: nothing written

    @property
    def exit_code(self) -> int:
        return EXIT_ERROR if self.write_error else self.report.exit_code

    @property
    def status(self) -> str:
        return self.report.status

    def summary_table(self) -> Any:
        """A rich renderable: the header, the per-policy table with its units row, problems, and the footer."""
        from rich.console import Group
        from rich.text import Text

        from harness.report.markdown import render_summary

        summary = render_summary(self.report)
        if self.write_error is None:
            return summary
        return Group(summary, Text(f"ERROR (exit 2): {self.write_error}", style="bold red"))


def collect(
    run_dir: Path, *, write: bool = True, scenario_hint: Scenario | None = None, plots: bool = True
) -> CollectResult:
    """Aggregate one run directory's records; write the four reports into it unless `write` is False.

    Never raises for bad records; a directory that is not a run directory (no run.json: an empty directory, a
    matrix root, the parent of the runs) yields its report unwritten.
    `plots=False`: report.html without its matplotlib figures (harness.report.write.write_report).
    """
    run_dir = Path(run_dir)
    report = collect_report(run_dir, scenario_hint=scenario_hint)
    if not (write and is_run_dir(run_dir)):
        return CollectResult(run_dir=run_dir, report=report)
    return write_outputs(run_dir, report, plots=plots)


def is_run_dir(path: Path) -> bool:
    """A run directory: it holds run.json (a regular file, not a link). collect writes into nothing else."""
    manifest = Path(path) / "run.json"
    return Path(path).is_dir() and manifest.is_file() and not manifest.is_symlink()


def write_outputs(
    out_dir: Path, report: Report, *, plots: bool = True, cell_reports: Mapping[str, RunReport] | None = None
) -> CollectResult:
    """write_report, with a failure to write (a read-only directory, a directory where report.md goes, a full
    disk) turned into the result's one-line `write_error` and exit code 2 instead of an exception."""
    report = with_digest(report)
    try:
        written = write_report(out_dir, report, plots=plots, cell_reports=cell_reports)
    except ForeignOutputError as exc:
        return CollectResult(run_dir=out_dir, report=report, write_error=str(exc))
    except OSError as exc:
        where = Path(exc.filename).name if exc.filename else out_dir
        return CollectResult(
            run_dir=out_dir,
            report=report,
            write_error=f"cannot write the reports into {out_dir}: {where}: {exc.strerror}",
        )
    return CollectResult(
        run_dir=out_dir, report=report, outputs=written.paths, notes=written.notes, report_sha256=written.report_sha256
    )
