"""What a person acts on beside the policy table, shared by report.md, report.html, junit.xml and the terminal:
each OOM (the allocator's message, the stage, the bytes asked for, what the policy held before it, the budget),
the memory budget the run ran under, and the room a workspace had under it.

The message is what a user pastes into a vLLM issue ("CUDA out of memory. Tried to allocate 56.00 GiB ..."), so
it is shown whole (records keep its first 500 characters); the bytes are exact, with a human size beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.core.units import exact_bytes, human_bytes
from harness.report.model import RankEntry, RankPolicy, RunReport, ScenarioInfo

MAX_OOM_ROWS = 50  # distinct OOMs listed; identical ones on several ranks share a row

# The harness's own tensors besides the workspace: what a CPU budget counts before a workspace asks (the accountant
# enforces it on these, harness.rank.memory.Accountant), and what the workspace room is measured from.
_NOT_WORKSPACE = ("weights_bytes", "dispatch_bytes", "combine_bytes", "ballast_bytes", "comm_bytes")


@dataclass(frozen=True)
class OomEntry:
    """One distinct OOM: every rank where a policy failed the same way at the same stage."""

    ranks: tuple[int, ...]
    policy: str
    stage: str
    requested_bytes: int | None
    held_bytes: int | None  # the policy's workspace bytes allocated before the failing allocation
    free_bytes: int | None
    budget_bytes: int | None
    message: str
    snapshot_file: str | None

    def sizes_text(self) -> str:
        """E.g. 'asked for 16,777,216 B (16.0 MiB); held 16,777,216 B (16.0 MiB) before it; budget 45,000,000 B
        (42.9 MiB)'."""
        parts = [f"asked for {_both(self.requested_bytes)}"]
        if self.held_bytes:
            parts.append(f"held {_both(self.held_bytes)} of its workspace before it")
        if self.free_bytes is not None:
            parts.append(f"free {_both(self.free_bytes)}")
        parts.append(f"budget {_both(self.budget_bytes)}" if self.budget_bytes is not None else "no budget")
        return "; ".join(parts)

    def line(self) -> str:
        """The whole OOM on one line: for the terminal, junit.xml and a check's message."""
        return (
            f"{self.policy} OOM at stage {self.stage} on rank(s) {rank_list(list(self.ranks))}: "
            f"{self.sizes_text()}: {self.message}"
        )


def _both(num_bytes: int | None) -> str:
    if num_bytes is None:
        return "n/a"
    return "0 B" if num_bytes == 0 else f"{exact_bytes(num_bytes)} ({human_bytes(num_bytes)})"


def rank_list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:16])) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def held_bytes(report: RunReport, rank: RankEntry, entry: RankPolicy) -> int:
    """What an OOM'd policy held of its workspace when it failed: the record says so; for records from before the
    field, a workspace OOM measured by NVML whose `other` exceeds the rank's other policies' by its first block
    held that block (the device's peak saw it)."""
    oom = entry.oom
    if oom is None or entry.status != "oom":
        return 0
    if oom.allocated_bytes is not None:
        return oom.allocated_bytes
    summary = report.policy(entry.policy)
    first_block = summary.contract_common_bytes if summary is not None else None
    if (
        oom.stage != "workspace"
        or report.scenario.memory_method != "nvml"
        or not first_block
        or entry.breakdown is None
    ):
        return 0
    others = [
        e.breakdown.other_bytes
        for e in rank.policies
        if e.status == "ok" and e.breakdown is not None and e.policy != entry.policy
    ]
    if others and entry.breakdown.other_bytes - min(others) >= 0.9 * first_block:
        return first_block
    return 0


def oom_entries(report: RunReport) -> list[OomEntry]:
    """Every OOM of the run, identical ones (same policy, stage, bytes and message) over ranks in one entry."""
    grouped: dict[tuple, list[int]] = {}
    first: dict[tuple, OomEntry] = {}
    for rank in report.ranks:
        for e in rank.policies:
            if e.oom is None or e.status != "oom":
                continue
            o = e.oom
            # A later stage's OOM (the experts', say) had the whole workspace: "held before" does not apply.
            held = held_bytes(report, rank, e) if o.stage == "workspace" else None
            key = (e.policy, o.stage, o.requested_bytes, held, o.free_bytes, o.budget_bytes, o.message)
            grouped.setdefault(key, []).append(rank.rank)
            first.setdefault(
                key,
                OomEntry(
                    ranks=(),
                    policy=e.policy,
                    stage=o.stage,
                    requested_bytes=o.requested_bytes,
                    held_bytes=held,
                    free_bytes=o.free_bytes,
                    budget_bytes=o.budget_bytes,
                    message=o.message,
                    snapshot_file=o.snapshot_file,
                ),
            )
    out = []
    for key, ranks in grouped.items():
        entry = first[key]
        out.append(OomEntry(**{**entry.__dict__, "ranks": tuple(ranks)}))
    return out


OOM_HEADERS = ["policy", "rank(s)", "stage", "asked for", "held before", "free", "budget", "message"]


def oom_table_rows(entries: list[OomEntry]) -> list[list[str]]:
    return [
        [
            e.policy,
            rank_list(list(e.ranks)),
            e.stage,
            _both(e.requested_bytes),
            _both(e.held_bytes),
            _both(e.free_bytes),
            _both(e.budget_bytes),
            e.message,
        ]
        for e in entries[:MAX_OOM_ROWS]
    ]


def budget_line(s: ScenarioInfo, device_kind: str | None) -> str:
    """Which budget the run ran under, where it came from and what enforced it; the ballast beside it."""
    from harness.scenario.sections import GPU_MEMORY_BYTES

    if s.memory_budget_bytes is None:
        text = "memory budget: none (the device's own memory)"
    else:
        gpu = next((name for name, total in GPU_MEMORY_BYTES.items() if total == s.memory_budget_bytes), None)
        source = f"memory.budget_gpu {gpu}" if gpu else f"memory.budget_gb {s.memory_budget_bytes / 1e9:g}"
        enforced = (
            "the accountant refuses the harness's own tensors past it (CPU)"
            if device_kind == "cpu"
            else "the caching allocator's per-process memory fraction"
        )
        text = f"memory budget: {_both(s.memory_budget_bytes)} from {source}; {enforced}"
    if s.ballast_bytes:
        text += f"; ballast {_both(s.ballast_bytes)} (memory.ballast_gb) stands for weights and KV cache"
    return text


def workspace_room(report: RunReport) -> int | None:
    """The most a workspace can take before it OOMs: the budget less what is in use besides it.

    GPU (NVML): the budget less the lowest baseline in use. CPU: the accountant's budget covers the harness's own
    tensors, so the budget less the lowest of weights, dispatch, combine, comm and ballast over ranks.
    """
    budget = report.scenario.memory_budget_bytes
    if budget is None:
        return None
    if report.scenario.memory_method == "nvml":
        baselines = [p.baseline_bytes.min for p in report.policies if p.baseline_bytes is not None]
        return int(budget - min(baselines)) if baselines else None
    in_use = [
        sum(getattr(e.breakdown, f) for f in _NOT_WORKSPACE)
        for r in report.ranks
        for e in r.policies
        if e.breakdown is not None
    ]
    return int(budget - min(in_use)) if in_use else None


# ---------------------------------------------------------------------------------------------------------------
# The layer's (and a deployment's) components: the same rows in report.md, report.html and the terminal.

COMPONENT_HEADERS = [
    "kind",
    "component",
    "predicted",
    "allocated",
    "measured (device, over the step)",
    "device agrees",
    "cap",
    "verdicts",
    "expected",
    "check",
    "source",
]


def _measured(agg: Any) -> str:
    if agg is None:
        return "n/a"
    if agg.min == agg.max:
        return _both(int(agg.min))
    return f"{_both(int(agg.min))} .. {_both(int(agg.max))} over {agg.num_ranks} ranks"


def component_rows(report: RunReport) -> list[list[str]]:
    rows = []
    for c in report.components:
        agrees = "n/a" if c.within_rounding is None else ("yes" if c.within_rounding else "no")
        rows.append(
            [
                c.kind,
                c.name,
                _both(c.predicted_bytes),
                _both(c.allocated_bytes),
                _measured(c.measured_bytes),
                agrees,
                _both(c.cap_bytes) if c.cap_bytes is not None else "-",
                ", ".join(c.verdicts) or "-",
                ", ".join(c.expected_verdicts) if c.expected_verdicts is not None else "-",
                c.expectation + (f": {c.detail}" if c.detail else ""),
                c.source,
            ]
        )
    return rows


def component_lines(report: RunReport) -> list[str]:
    """The components worth a line on the terminal: a verdict other than consistent, or a judged expectation."""
    return [
        f"{c.kind} {c.name}: {_both(c.predicted_bytes)} {', '.join(c.verdicts)}; check {c.expectation}"
        + (f" ({c.detail})" if c.detail else "")
        for c in report.components
        if c.verdicts != ["consistent"] or c.expectation != "skip"
    ]


COMPONENT_NOTE = (
    "predicted = the layer model's bytes at this scenario's shapes (source); allocated = what each rank "
    "asked the allocator for; measured = the device's growth (NVML, or RSS on CPU) over the step that "
    "allocated it, which may hold more than this component; device agrees = every rank's device showed "
    "the step's bytes up to the allocator's rounding. A run judges the verdicts its own bytes decide "
    "(DeepEP's cap); the others need the release's source: `harness plan --vllm-version`."
)
