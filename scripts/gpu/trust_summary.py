"""Print what the trust step shows, from a run directory's rank records (scripts/gpu/trust.sh calls it).

Per rank and policy: the baseline, the NVML workspace delta against the contract, and the whole policy's peak
delta. Then two verdicts, each within the allocator rounding the records state:
  - equal baselines: every policy of a rank starts from the same device-used memory (the warm-up pass);
  - legacy's peak delta = its workspace + what every policy adds on top of its workspace (the data path's own
    transients), i.e. (delta - contract) is the same for legacy as for the other policies.
Exit 0 when both hold on every rank, 1 otherwise, 2 when the records cannot be read.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.core.records import MemoryMeasurement, PolicyResult, RankRecord, RecordError, read_record

MIB = 2**20


def _records(run_dir: Path) -> list[RankRecord]:
    records = []
    for path in sorted((run_dir / "ranks").glob("rank-?????.json")):
        record = read_record(path)
        if isinstance(record, RankRecord):
            records.append(record)
    return records


def _memory(policy: PolicyResult) -> MemoryMeasurement:
    """The policy's measurement (the caller kept the measured ones only)."""
    assert policy.memory is not None
    return policy.memory


def _rank_verdicts(record: RankRecord) -> list[str]:
    problems = []
    measured = [p for p in record.policies if p.memory is not None and p.status == "ok"]
    if not measured:
        return [f"rank {record.rank}: no measured policy"]
    rounding = _memory(measured[0]).allocator_rounding_bytes or 0
    print(
        f"rank {record.rank} ({record.hardware.device_name}, {record.experts_backend}, warm-up {record.warmup}, "
        f"rounding {rounding / MIB:g} MiB)"
    )
    print(
        f"  {'policy':<12} {'baseline B':>16} {'contract B':>14} {'ws delta B':>14} {'peak delta B':>14} "
        f"{'delta-contract B':>17}"
    )
    for p in measured:
        m, c = _memory(p), p.contract
        print(
            f"  {p.policy:<12} {m.baseline_bytes:>16} {c.total_bytes:>14} {m.workspace_delta_bytes:>14} "
            f"{m.delta_bytes:>14} {m.delta_bytes - c.total_bytes:>17}"
        )
    baselines = [_memory(p).baseline_bytes for p in measured]
    spread = max(baselines) - min(baselines)
    print(
        f"  baselines: spread {spread} B ({spread / MIB:.2f} MiB): "
        + ("equal within the rounding" if spread <= rounding else "NOT equal")
    )
    if spread > rounding:
        problems.append(f"rank {record.rank}: baselines differ by {spread} B > {rounding} B")
    extra = {p.policy: _memory(p).delta_bytes - p.contract.total_bytes for p in measured}
    if "legacy" in extra and len(extra) > 1:
        others = [v for k, v in extra.items() if k != "legacy"]
        off = max(abs(extra["legacy"] - v) for v in others)
        print(
            f"  legacy peak delta - its contract = {extra['legacy']} B; the others: {others} B; "
            f"largest difference {off} B: " + ("within the rounding" if off <= rounding else "NOT within")
        )
        if off > rounding:
            problems.append(f"rank {record.rank}: legacy's delta beyond its workspace differs by {off} B")
    return problems


def main(argv: list[str]) -> int:
    problems: list[str] = []
    for run_dir in map(Path, argv):
        print(f"== {run_dir}")
        try:
            records = _records(run_dir)
        except RecordError as exc:
            print(f"cannot read: {exc}")
            return 2
        if not records:
            print("no rank records")
            return 2
        for record in records:
            problems += _rank_verdicts(record)
    for problem in problems:
        print(f"FAILED: {problem}")
    print("OK" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
