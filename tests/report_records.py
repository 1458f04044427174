"""The synthetic run directories the collector's tests write: harness.bench.synthetic, which `harness bench` also
collects to measure the collector."""

from harness.bench.synthetic import (
    STARTED_AT,
    contract,
    make_scenario,
    policy_result,
    rank_record,
    read_json,
    read_md,
    timings,
    unpadded_md,
    versions,
    workspace_delta_for,
    write_run,
)

__all__ = [
    "STARTED_AT",
    "contract",
    "make_scenario",
    "policy_result",
    "rank_record",
    "read_json",
    "read_md",
    "timings",
    "unpadded_md",
    "versions",
    "workspace_delta_for",
    "write_run",
]
