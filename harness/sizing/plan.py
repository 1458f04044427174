"""`harness plan`: the workspace each sizing policy would allocate per GPU, without running anything."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.scenario.schema import Scenario
from harness.core.contract import BUILTIN_POLICIES, SizingArgs, WorkspaceShapes, builtin_shapes, fixed_shapes, is_release_policy

GIB = 2**30


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


def plan_summary(rows: list[PlanRow]) -> str:
    return "; ".join(f"{r.shapes.policy} {format_gib(r.shapes.total_bytes)} GiB ({r.ratio_to_fixed:g}x fixed)" for r in rows)


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
        ("policy", "left"), ("ws13", "right"), ("ws2", "right"), ("out", "right"),
        ("common", "right"), ("ws2 size", "right"), ("total", "right"), ("x fixed", "right"), ("source", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_row("", "elements", "elements", "elements", "GiB", "GiB", "GiB", "", "", style="dim")
    for row in rows:
        s = row.shapes
        table.add_row(
            s.policy,
            format_shape(s.ws13),
            format_shape(s.ws2),
            format_shape(s.out),
            format_gib(s.common_bytes),
            format_gib(s.ws2_bytes),
            format_gib(s.total_bytes),
            f"{row.ratio_to_fixed:.2f}",
            s.source,
        )
    return table
