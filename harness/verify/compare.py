"""The plan beside what vLLM printed, line by line: weights, torch peak, non-torch, CUDA graphs, KV GiB, KV tokens,
concurrency, verdict and the backends vLLM chose, each with its difference.

How a difference is judged against --tolerance-pct:
- the totals (weights, KV GiB, KV tokens, concurrency) relative to what vLLM printed;
- the small terms of the profile (torch peak, non-torch, CUDA graphs) relative to the requested memory (total x
  gpu_memory_utilization): what their error does to the KV cache. A 0.03 GiB miss of a 0.22 GiB term is 14% of
  the term and 0.02% of the KV cache;
- the verdict: the same outcome or not;
- the backends are shown, not judged (the plan does not choose the attention backend).
A line vLLM did not print is shown as such and not judged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from harness.sizing.deployment import GIB, DeploymentPlan, PlanOutcome
from harness.verify.record import StartupRecord

VERIFY_REPORT_SCHEMA = 1

Judge = Literal["total", "term", "verdict", "shown"]


@dataclass(frozen=True)
class Row:
    name: str
    logged: float | str | None
    predicted: float | str | None
    unit: str
    judge: Judge
    diff: float | None = None  # predicted - logged, in the unit
    pct: float | None = None  # the judged percentage (see the module docstring)
    within: bool | None = None  # None: not judged

    def text(self) -> str:
        def show(value: float | str | None) -> str:
            if value is None:
                return "not printed"
            if isinstance(value, str):
                return value
            return f"{value:,.0f}" if self.unit == "tokens" else f"{value:.2f}"

        diff = ""
        if self.diff is not None:
            diff = f"{self.diff:+,.0f}" if self.unit == "tokens" else f"{self.diff:+.2f}"
            diff += f" {self.unit}"
            if self.pct is not None:
                diff += f" ({self.pct:+.2f}%{' of requested' if self.judge == 'term' else ''})"
        mark = {True: "ok", False: "OUTSIDE", None: ""}[self.within]
        return f"{self.name:<14} {show(self.logged):>16} {show(self.predicted):>16} {self.unit:<7} {diff:<28} {mark}"


def _backend_family(name: str | None) -> str | None:
    return None if name is None else name.split()[0].split("_")[0].lower().replace("experts", "")


def torch_peak_gib(plan: DeploymentPlan) -> float:
    """The plan's torch peak as vLLM prints it: the held-once buffers and the profile's own peak."""
    return (plan.group_bytes("held-once") + plan.group_bytes("profile-peak")) / GIB


def taken_outcome(plan: DeploymentPlan, torch_peak_logged: float | None) -> PlanOutcome | None:
    """Which of the plan's other outcomes (DeploymentPlan.other_outcomes) the startup took, read from the torch peak
    vLLM printed: the one whose peak is nearest it, where nearer than the plan's own; None: the plan's own."""
    if torch_peak_logged is None or not plan.other_outcomes:
        return None
    own = torch_peak_gib(plan)

    def miss(extra: int) -> float:
        return abs(own + extra / GIB - torch_peak_logged)

    best = min(plan.other_outcomes, key=lambda o: miss(o.torch_peak_extra_bytes))
    return best if miss(best.torch_peak_extra_bytes) < miss(0) else None


def compare(record: StartupRecord, plan: DeploymentPlan, tolerance_pct: float) -> list[Row]:
    f = record.figures
    requested = (f.requested_gib * GIB) if f.requested_gib else plan.requested_bytes
    rows: list[Row] = []

    def total(name: str, logged: float | None, predicted: float, unit: str = "GiB") -> None:
        if logged is None:
            rows.append(Row(name, None, predicted, unit, "total"))
            return
        diff = predicted - logged
        pct = 100 * diff / logged if logged else (0.0 if diff == 0 else 100.0)
        rows.append(Row(name, logged, predicted, unit, "total", diff, pct, abs(pct) <= tolerance_pct))

    def term(name: str, logged: float | None, predicted: float) -> None:
        if logged is None:
            rows.append(Row(name, None, predicted, "GiB", "term"))
            return
        diff = predicted - logged
        pct = 100 * diff * GIB / requested
        rows.append(Row(name, logged, predicted, "GiB", "term", diff, pct, abs(pct) <= tolerance_pct))

    weights = plan.group_bytes("weights") / GIB
    taken = taken_outcome(plan, f.torch_peak_increase_gib)
    peak = torch_peak_gib(plan) + (taken.torch_peak_extra_bytes / GIB if taken is not None else 0.0)
    non_kv, kv_tokens, concurrency, verdict = plan.non_kv_bytes, plan.kv_tokens, plan.concurrency, plan.verdict
    if taken is not None:
        non_kv, kv_tokens, concurrency, verdict = taken.non_kv_bytes, taken.kv_tokens, taken.concurrency, \
            taken.verdict  # fmt: skip
    graphs = plan.group_bytes("cuda-graphs") / GIB
    total("weights", f.model_loading_gib, weights)
    term("torch peak", f.torch_peak_increase_gib, peak)
    term("non-torch", f.non_torch_increase_gib, plan.group_bytes("non-torch") / GIB)
    graphs_logged = f.cuda_graph_estimate_gib
    if graphs_logged is None and f.available_kv_cache_gib is not None and f.non_kv_gib is not None:
        graphs_logged = 0.0  # the profiler ran and printed no estimate: none was made (eager, or a runner without one)
    term("CUDA graphs", graphs_logged, graphs)
    total("KV GiB", f.available_kv_cache_gib, (plan.requested_bytes - non_kv) / GIB)
    total("KV tokens", f.kv_cache_tokens, kv_tokens, "tokens")
    total("concurrency", f.max_concurrency, concurrency, "x")
    logged_verdict = "starts" if record.status == "ready" or f.kv_cache_tokens else "fails"
    rows.append(Row("verdict", logged_verdict, verdict.outcome, "", "verdict",
                    within=logged_verdict == verdict.outcome))  # fmt: skip
    if plan.other_outcomes:
        rows.append(Row("outcome", "(by torch peak)", taken.name if taken is not None else
                        "the plan's own", "", "shown"))  # fmt: skip
    b = record.backends
    if b is not None:
        if b.attention:
            rows.append(Row("attention", b.attention, "(not chosen by the plan)", "", "shown"))
        moe_logged = " ".join(x for x in (b.moe, b.moe_experts) if x) or None
        if moe_logged or plan.line("moe-workspace") is not None:
            predicted = str(plan.setting("moe_backend"))
            same = _backend_family(b.moe) == _backend_family(predicted) if b.moe else None
            rows.append(Row("MoE backend", moe_logged, predicted + ("" if same is None else " (same family)" if same
                                                                    else " (differs)"), "", "shown"))  # fmt: skip
    return rows


def header() -> str:
    return f"{'line':<14} {'vLLM printed':>16} {'plan':>16} {'unit':<7} {'plan - vLLM':<28} verdict"


def outside(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.within is False]


class VerifyRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    logged: float | str | None
    predicted: float | str | None
    unit: str
    judge: Judge
    diff: float | None = None
    pct: float | None = None
    within: bool | None = None


class VerifyReport(BaseModel):
    """`harness verify --json`: what vLLM printed, the plan, and each line beside the other."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = VERIFY_REPORT_SCHEMA
    kind: Literal["verify-report"] = "verify-report"
    tolerance_pct: float
    within: bool
    record: StartupRecord
    plan: DeploymentPlan
    rows: list[VerifyRow]


def report(record: StartupRecord, plan: DeploymentPlan, rows: list[Row], tolerance_pct: float) -> VerifyReport:
    return VerifyReport(tolerance_pct=tolerance_pct, within=not outside(rows), record=record, plan=plan,
                        rows=[VerifyRow(**asdict(r)) for r in rows])  # fmt: skip
