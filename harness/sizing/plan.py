"""`harness plan`: the workspace each sizing policy would allocate per GPU, without running anything.

It takes a scenario or a matrix file (every valid cell planned, the skipped ones listed with their reason). The
input is validated first (harness.scenario: bounded reading, strict types, size limits), so every number here is
a bounded exact int; nothing is allocated and torch is never imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.contract import (
    BUILTIN_POLICIES,
    SizingArgs,
    WorkspaceShapes,
    builtin_shapes,
    fixed_shapes,
    is_release_policy,
)
from harness.core.units import GIB, MIB
from harness.scenario.matrix import Matrix
from harness.scenario.schema import Scenario


def policy_shapes(policy: str, args: SizingArgs, *, cache_dir: Path | None = None) -> WorkspaceShapes:
    """Shapes for a builtin policy or a release policy `vllm==X.Y.Z` (read from that release's own code)."""
    if is_release_policy(policy):
        from harness.sizing.vllm_source import release_shapes

        return release_shapes(policy.removeprefix("vllm=="), args, cache_dir=cache_dir)
    return builtin_shapes(policy, args)


@dataclass(frozen=True, kw_only=True)
class PlanRow:
    shapes: WorkspaceShapes
    fixed_total_bytes: int

    @property
    def ratio_to_fixed(self) -> float:
        return self.shapes.total_bytes / self.fixed_total_bytes

    def to_json(self) -> dict[str, Any]:
        s = self.shapes
        return {
            "name": s.policy,
            "source": s.source,
            "ws13_shape": list(s.ws13),
            "ws2_shape": list(s.ws2),
            "out_shape": list(s.out),
            "common_bytes": s.common_bytes,
            "ws13_bytes": s.ws13_bytes,
            "ws2_bytes": s.ws2_bytes,
            "out_bytes": s.out_bytes,
            "total_bytes": s.total_bytes,
            "total_gib": s.total_bytes / GIB,
            "ratio_to_fixed": self.ratio_to_fixed,
        }


def plan_policies(scenario: Scenario) -> list[str]:
    """The builtin rows always, then the scenario's release policies."""
    names = list(BUILTIN_POLICIES)
    names += [p for p in scenario.policies if p not in names]
    return names


def make_plan(scenario: Scenario, *, cache_dir: Path | None = None) -> list[PlanRow]:
    args = scenario.sizing_args()
    fixed_total = fixed_shapes(args).total_bytes
    return [
        PlanRow(shapes=policy_shapes(p, args, cache_dir=cache_dir), fixed_total_bytes=fixed_total)
        for p in plan_policies(scenario)
    ]


def plan_json(scenario: Scenario, rows: list[PlanRow]) -> dict[str, Any]:
    args = scenario.sizing_args()
    return {
        "scenario": scenario.name,
        "scenario_hash": scenario.scenario_hash,
        "sizing": {
            "T": args.max_tokens_per_rank,
            "D": args.num_dispatchers,
            "M": args.M,
            "E": args.num_local_experts,
            "K": args.K,
            "I": args.intermediate_size,
            "N": args.N,
            "top_k": args.top_k,
            "activation": args.activation,
            "workspace_dtype": args.workspace_dtype,
        },
        "emulated": scenario.emulated,
        "policies": [row.to_json() for row in rows],
    }


def format_shape(shape: tuple[int, ...] | list[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def format_gib(num_bytes: int) -> str:
    """GiB with up to four significant digits after the point: 3.5, 112, 0.0002441."""
    gib = num_bytes / GIB
    return f"{gib:.4g}"


def size_unit(largest_bytes: int) -> tuple[str, int]:
    """The unit a plan shows its sizes in: GiB from 1 GiB up, MiB below (a CPU smoke plan reads 8 MiB, not 0.007812)."""
    return ("GiB", GIB) if largest_bytes >= GIB else ("MiB", MIB)


def format_size(num_bytes: int, unit_bytes: int) -> str:
    """Up to four significant digits in the given unit: 3.5, 112, 0.5."""
    return f"{num_bytes / unit_bytes:.4g}"


def plan_summary(rows: list[PlanRow]) -> str:
    parts = []
    for r in rows:
        unit, unit_bytes = size_unit(r.shapes.total_bytes)
        parts.append(
            f"{r.shapes.policy} {format_size(r.shapes.total_bytes, unit_bytes)} {unit} ({r.ratio_to_fixed:g}x fixed)"
        )
    return "; ".join(parts)


def render_plan(scenario: Scenario, rows: list[PlanRow]) -> Any:
    from rich.table import Table

    args = scenario.sizing_args()
    title = (
        f"{scenario.name}: workspace per GPU\n"
        f"T={args.max_tokens_per_rank} D={args.num_dispatchers} M={args.M} E={args.num_local_experts} "
        f"K={args.K} I={args.intermediate_size} N={args.N} top_k={args.top_k} {args.workspace_dtype}"
    )
    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("policy", "left"),
        ("ws13", "right"),
        ("ws2", "right"),
        ("out", "right"),
        ("common", "right"),
        ("ws2 size", "right"),
        ("total", "right"),
        ("x fixed", "right"),
        ("source", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    unit, unit_bytes = size_unit(max((row.shapes.total_bytes for row in rows), default=0))
    table.add_row("", "elements", "elements", "elements", unit, unit, unit, "", "", style="dim")
    for row in rows:
        s = row.shapes
        table.add_row(
            s.policy,
            format_shape(s.ws13),
            format_shape(s.ws2),
            format_shape(s.out),
            format_size(s.common_bytes, unit_bytes),
            format_size(s.ws2_bytes, unit_bytes),
            format_size(s.total_bytes, unit_bytes),
            f"{row.ratio_to_fixed:.2f}",
            s.source,
        )
    return table


# --- the whole layer per release (harness.sizing.layer) -------------------------------------------------------------


def layer_versions(scenario: Scenario, versions: list[str] | None) -> list[str]:
    """The releases to plan the layer for: --vllm-version's, then the scenario's vllm==X.Y.Z policies."""
    named = list(versions or [])
    named += [p.removeprefix("vllm==") for p in scenario.policies if is_release_policy(p)]
    return list(dict.fromkeys(named))


def make_layer_plans(
    scenario: Scenario,
    versions: list[str],
    *,
    cache_dir: Path | None = None,
    budget_bytes: int | None = None,
    gpu: str | None = None,
    wheel: Path | None = None,
    src: Path | None = None,
) -> list[Any]:
    """One LayerPlan per release, then one for a wheel file and one for a source tree when given; raises
    VllmSourceError when one cannot be had."""
    from harness.sizing.layer import plan_layer, plan_layer_from
    from harness.sizing.vllm_source.sources import locate

    plans = [
        plan_layer(scenario, version, cache_dir=cache_dir, budget_bytes=budget_bytes, gpu=gpu) for version in versions
    ]
    if wheel is not None:
        plans.append(
            plan_layer_from(scenario, locate(wheel=wheel, cache_dir=cache_dir), budget_bytes=budget_bytes, gpu=gpu)
        )
    if src is not None:
        plans.append(plan_layer_from(scenario, locate(src=src), budget_bytes=budget_bytes, gpu=gpu))
    return plans


def layer_expectation_failures(scenario: Scenario, plans: list[Any]) -> list[str]:
    """What the scenario's layer.expect says a release's components must show, and they do not."""
    failures = []
    for plan in plans:
        expected = scenario.layer.expect.get(plan.vllm_version or "", {})
        for name, verdicts in expected.items():
            component = plan.component(name)
            found = component.verdicts if component is not None else ["(no such component)"]
            if sorted(found) != sorted(verdicts):
                failures.append(
                    f"vllm {plan.vllm_version} {name}: expected {', '.join(verdicts)}, found {', '.join(found)}"
                )
    return failures


def render_layer_plan(plan: Any) -> Any:
    """A table of the layer's components for one release: bytes, GiB, verdicts and source, one row each."""
    from rich.table import Table

    layout = plan.layout
    title = (
        f"{plan.scenario}: EP MoE layer per GPU, {plan.vllm_source}\n"
        f"T={layout['T']} D={layout['D']} E={layout['E']} K={layout['K']} I={layout['I']} top_k={layout['top_k']} "
        f"experts {layout['num_routed_experts']} routed + {layout['num_redundant_experts']} redundant; "
        f"{layout['all2all']}, {layout['moe_backend']} ({plan.experts_class}), {layout['quant']}"
    )
    table = Table(title=title, title_justify="left")
    for name, justify in (("component", "left"), ("bytes", "right"), ("GiB", "right"), ("needed GiB", "right"),
                          ("verdict", "left"), ("source", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_row("", "B", "GiB", "GiB", "", "file:line or formula", style="dim")
    for c in plan.components:
        style = "" if c.verdicts == ["consistent"] else "bold red" if "unevaluated" not in c.verdicts else "yellow"
        table.add_row(
            c.name, "-" if c.bytes is None else str(c.bytes), "-" if c.bytes is None else format_gib(c.bytes),
            "" if c.needed_bytes is None else format_gib(c.needed_bytes), ", ".join(c.verdicts), c.source,
            style=style,
        )  # fmt: skip
    total = plan.total_bytes
    table.add_row("total", "-" if total is None else str(total), "-" if total is None else format_gib(total),
                  "", "", "sum of the components", style="bold")  # fmt: skip
    return table


def layer_notes(plan: Any) -> list[str]:
    """One line per component that is not plainly consistent (its detail), and the budget's outcome."""
    lines = [f"  {c.name}: {c.detail}" for c in plan.components if c.verdicts != ["consistent"] and c.detail]
    if plan.budget is not None:
        b = plan.budget
        gpu = b.gpu or f"{b.budget_bytes / GIB:.2f} GiB"
        if b.outcome == "fit":
            # One MoE layer's buffers against the whole GPU says nothing about the deployment: never "FIT".
            lines.append(
                f"{gpu}, this MoE layer alone (not the deployment): {b.reason}; the deployment's verdict "
                "needs the model's every layer and the KV cache (docs/deployment-memory.md)"
            )
        else:
            lines.append(f"{gpu}: {b.outcome.upper()}" + (f" ({b.breaking_component}): " if b.breaking_component
                                                          else ": ") + b.reason)  # fmt: skip
    return lines


# --- matrix files: every valid cell --------------------------------------------------------------------------------


def plan_matrix(matrix: Matrix, *, cache_dir: Path | None = None) -> list[tuple[str, Scenario, list[PlanRow]]]:
    """(cell name, scenario, rows) for every valid cell of a matrix, in axis order."""
    return [(c.name, c.scenario, make_plan(c.scenario, cache_dir=cache_dir)) for c in matrix.cells()]


def matrix_plan_json(matrix: Matrix, cells: list[tuple[str, Scenario, list[PlanRow]]]) -> dict[str, Any]:
    return {
        "matrix": matrix.name,
        "num_combinations": matrix.expansion().num_combinations,
        "cells": [{"cell": name, **plan_json(scenario, rows)} for name, scenario, rows in cells],
        "skipped": [{"cell": s.name, "reason": s.reason} for s in matrix.skipped()],
    }


def matrix_plan_lines(matrix: Matrix, cells: list[tuple[str, Scenario, list[PlanRow]]]) -> list[str]:
    """One line per cell: its layout and each policy's workspace; then the skipped combinations."""
    lines = [
        f"matrix {matrix.name} ({matrix.path.name}): {matrix.expansion().summary()} cells; "
        f"`harness run {matrix.path}` runs them all"
    ]
    for name, scenario, rows in cells:
        lines.append(f"cell {name}: {scenario.summary()}\n    {plan_summary(rows)}")
    lines += [f"skipped {s.name}: {s.reason}" for s in matrix.skipped()]
    return lines
