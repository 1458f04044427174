"""Audit a vLLM's batched-experts classes: does `workspace_shapes` count the dispatchers twice?

Verdict rule (docs/design.md). The prepare/finalize hands the experts M = T·D slots per expert, so the token
dimension of ws13 and ws2 must be M. Each class is evaluated for the scenario, then with D doubled and with T
doubled (everything else fixed), and each buffer's element count is compared:

    x2 with D, x2 with T   token dim is M      consistent     (so is a buffer that does not depend on M)
    x4 with D, x2 with T   token dim is M·D    double-count   (CutlassBatchedExpertsFp8 up to vLLM 0.29.0)
    anything else, or the call could not run               unevaluated, with the reason

Classes that size from their own attributes (`self.max_num_tokens * num_dispatchers`) see max_num_tokens = T.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import JustifyMethod

from harness.core.contract import RELEASE_POLICY_PREFIX, SizingArgs, WorkspaceShapes, fixed_shapes, legacy_shapes
from harness.core.errors import BadInput
from harness.core.exits import EXIT_OK
from harness.core.units import GIB
from harness.sizing.vllm_source.evaluate import Evaluation, ParsedClass, SourceTree, source_tree
from harness.sizing.vllm_source.sources import FUSED_MOE_DIR, VllmSource, VllmSourceError, locate, locate_release

CONSISTENT = "consistent"
DOUBLE_COUNT = "double-count"
UNEVALUATED = "unevaluated"
VERDICTS = (CONSISTENT, DOUBLE_COUNT, UNEVALUATED)

CUTLASS_BATCHED_CLASS = "CutlassBatchedExpertsFp8"
DEFAULT_SCENARIO_NAME = "deepseek-v3-dp32-pr55579.yaml"

EXIT_DOUBLE_COUNT = 1  # the audit's EXIT_FAILED: a class double-counts


@dataclass(frozen=True)
class ClassAudit:
    """One batched-experts class of one vLLM, its shapes for the sizing arguments and the verdict."""

    name: str
    file: str  # relative to the vllm/ package, e.g. model_executor/layers/fused_moe/experts/cutlass_moe.py
    verdict: str  # one of VERDICTS
    shapes: WorkspaceShapes | None
    reason: str

    @property
    def total_bytes(self) -> int | None:
        return self.shapes.total_bytes if self.shapes is not None else None

    @property
    def short_file(self) -> str:
        """The path below fused_moe/, as shown in tables."""
        return self.file.split("fused_moe/", 1)[-1]


@dataclass(frozen=True)
class AuditResult:
    """Every batched-experts class of one vLLM source, evaluated for one set of sizing arguments."""

    source: VllmSource
    args: SizingArgs
    classes: list[ClassAudit]

    @property
    def double_counts(self) -> list[ClassAudit]:
        return [c for c in self.classes if c.verdict == DOUBLE_COUNT]

    @property
    def exit_code(self) -> int:
        return EXIT_DOUBLE_COUNT if self.double_counts else EXIT_OK

    def to_json(self) -> dict:
        fixed_bytes = fixed_shapes(self.args).total_bytes
        return {
            "vllm_version": self.source.version,
            "source": self.source.to_json(),
            "sizing": _sizing_json(self.args),
            "reference_bytes": {"fixed": fixed_bytes, "legacy": legacy_shapes(self.args).total_bytes},
            "double_counts": [c.name for c in self.double_counts],
            "classes": [
                {
                    "name": c.name,
                    "file": c.file,
                    "verdict": c.verdict,
                    "total_bytes": c.total_bytes,
                    "ratio_to_fixed": c.total_bytes / fixed_bytes if c.total_bytes is not None else None,
                    "ws13": list(c.shapes.ws13) if c.shapes else None,
                    "ws2": list(c.shapes.ws2) if c.shapes else None,
                    "out": list(c.shapes.out) if c.shapes else None,
                    "reason": c.reason,
                }
                for c in self.classes
            ],
        }


AUDIT_CPU_S = 8.0  # the whole audit of a tree, however many classes it holds: a hostile tree ends within 10 s
MAX_AUDIT_CLASSES = 256  # 0.33.0 has 7 batched classes


def audit(source: VllmSource, args: SizingArgs, *, class_names: tuple[str, ...] | None = None,
          budget_s: float | None = None) -> AuditResult:  # fmt: skip
    """Evaluate every batched-experts class of source (or only those named) and give each a verdict, within a CPU
    budget for the whole audit (budget_s, default AUDIT_CPU_S): classes past it are unevaluated with that reason."""
    import time

    start, limit = time.process_time(), budget_s or AUDIT_CPU_S
    tree = _source_tree(source)
    classes = [c for c in tree.batched_classes() if class_names is None or c.name in class_names]
    audits = []
    for index, cls in enumerate(classes):
        if index >= MAX_AUDIT_CLASSES:
            audits.append(
                ClassAudit(
                    name=f"({len(classes) - index} more classes)",
                    file="-",
                    verdict=UNEVALUATED,
                    shapes=None,
                    reason=f"the cap of {MAX_AUDIT_CLASSES} classes per audit was hit",
                )
            )
            break
        if time.process_time() - start > limit:
            audits += [ClassAudit(name=c.name, file=_inside_vllm(c.file), verdict=UNEVALUATED, shapes=None,
                                  reason=f"not evaluated: the audit's time budget of {limit:g} s of CPU ran out "
                                         "(--budget-s raises it for a tree you trust)")
                       for c in classes[index:MAX_AUDIT_CLASSES]]  # fmt: skip
            break
        audits.append(_audit_class(tree, cls, args))
    for file, why in sorted(tree.unparsed.items()):
        if class_names is None and tree.may_define_batched_classes(file):
            audits.append(ClassAudit(name="(unparsed file)", file=_inside_vllm(file), verdict=UNEVALUATED,
                                     shapes=None, reason=f"could not parse the file: {why}"))  # fmt: skip
    return AuditResult(source=source, args=args, classes=audits)


def release_shapes(version: str, args: SizingArgs, *, cache_dir: Path | None = None) -> WorkspaceShapes:
    """The shapes CutlassBatchedExpertsFp8 of vLLM `version` asks for: the policy "vllm==X.Y.Z"."""
    source = locate_release(version, cache_dir=cache_dir)
    result = audit(source, args, class_names=(CUTLASS_BATCHED_CLASS,))
    if not result.classes:
        found = ", ".join(c.name for c in _source_tree(source).batched_classes()) or "none"
        raise VllmSourceError(
            f"vllm {version} has no batched class {CUTLASS_BATCHED_CLASS} under {FUSED_MOE_DIR} "
            f"(batched-experts classes found: {found})"
        )
    cutlass = result.classes[0]
    if cutlass.shapes is None or cutlass.verdict == UNEVALUATED:
        raise VllmSourceError(f"vllm {version}: {cutlass.name} in {cutlass.file} was not evaluated: {cutlass.reason}")
    return cutlass.shapes


def _source_tree(source: VllmSource) -> SourceTree:
    return source_tree(source)


def _audit_class(tree: SourceTree, cls: ParsedClass, args: SizingArgs) -> ClassAudit:
    file = _inside_vllm(cls.file)
    n = class_n(tree, cls, args)
    evaluation = tree.evaluate(cls, args, n=n)
    if evaluation.ws13 is None or evaluation.ws2 is None or evaluation.out is None:  # not ok
        return ClassAudit(name=cls.name, file=file, verdict=UNEVALUATED, shapes=None, reason=evaluation.reason)
    shapes = WorkspaceShapes(
        policy=_policy(tree.source),
        ws13=evaluation.ws13,
        ws2=evaluation.ws2,
        out=evaluation.out,
        dtype_bytes=args.dtype_bytes,
        source=f"{tree.source.label}: {cls.name} in {file}",
    )
    # Doubling D alone takes a token dim of M to 2x and one of M·D to 4x; doubling T alone takes both to 2x,
    # which tells M·D apart from anything else that grows 4x with D (M², say).
    probes = {}
    for moved, probe_args in (
        ("D", dataclasses.replace(args, num_dispatchers=2 * args.num_dispatchers)),
        ("T", dataclasses.replace(args, max_tokens_per_rank=2 * args.max_tokens_per_rank)),
    ):
        probe = tree.evaluate(cls, probe_args, n=n)
        if not probe.ok:
            reason = f"evaluated for the scenario but not with {moved} doubled: {probe.reason}"
            return ClassAudit(name=cls.name, file=file, verdict=UNEVALUATED, shapes=shapes, reason=reason)
        probes[moved] = probe
    verdict, reason = _verdict(evaluation, probes["D"], probes["T"], args)
    return ClassAudit(name=cls.name, file=file, verdict=verdict, shapes=shapes, reason=reason)


def class_n(tree: SourceTree, cls: ParsedClass, args: SizingArgs) -> int | None:
    """The N the class's own moe_problem_size derives on its own weights (sweep.py), when it differs from the
    harness's N (2I gated, I non-gated): Marlin's I. None when they agree or it does not evaluate."""
    from harness.sizing.vllm_source.sweep import PLAIN, Point, _ClassEvaluator, _weight_layout

    if _weight_layout(tree, cls) == PLAIN:
        return None  # the modular kernel's default, w1.size(1): the harness's N
    point = Point(args.num_dispatchers, "set", "E·D", "fp8-per-token", args.activation, args.hidden_size,
                  args.intermediate_size, args.num_local_experts, args.max_tokens_per_rank)  # fmt: skip
    n = _ClassEvaluator(tree, cls, (args.activation,)).n(point)
    return None if n == args.N else n


# How prod(buffer) grows when (D, T) double: the token dim each pattern stands for.
GROWTH_TOKEN_DIM: dict[tuple[float | None, float | None], str] = {
    (2, 2): "M",
    (4, 2): "M·D",
    (None, None): "none",
    (1, 1): "none",
}


def _verdict(base: Evaluation, d_doubled: Evaluation, t_doubled: Evaluation, args: SizingArgs) -> tuple[str, str]:
    M, D = args.M, args.num_dispatchers
    growth = {
        name: (
            _growth(getattr(base, name), getattr(d_doubled, name)),
            _growth(getattr(base, name), getattr(t_doubled, name)),
        )
        for name in ("ws13", "ws2")
    }
    token_dim = {name: GROWTH_TOKEN_DIM.get(factors) for name, factors in growth.items()}
    odd = {name: growth[name] for name, dim in token_dim.items() if dim is None}
    if odd:
        described = ", ".join(f"{name} {_factor(d)} with D and {_factor(t)} with T" for name, (d, t) in odd.items())
        return UNEVALUATED, f"{described} doubled; a token dim of M grows x2/x2, of M·D x4/x2"
    double = [name for name, dim in token_dim.items() if dim == "M·D"]
    if double:
        shape = getattr(base, double[0])
        rows = f" ({M * D} rows)" if M * D in shape and D > 1 else ""
        return DOUBLE_COUNT, f"token dim of {'/'.join(double)} is M·D{rows}: D is counted twice"
    single = [name for name, dim in token_dim.items() if dim == "M"]
    if not single:
        return CONSISTENT, "ws13 and ws2 do not depend on M"
    if all(M in getattr(base, name) for name in single):
        return CONSISTENT, f"token dim of {'/'.join(single)} is M = T·D ({M} rows)"
    return CONSISTENT, f"{'/'.join(single)} grow in proportion to M = T·D (rows of E·M)"


def _factor(growth: float | None) -> str:
    return "empty" if growth is None else f"x{growth:g}"


def _growth(before: tuple[int, ...], after: tuple[int, ...]) -> float | None:
    """prod(after) / prod(before); None for an empty buffer, which nothing is counted into."""
    before_elems, after_elems = math.prod(before), math.prod(after)
    if before_elems == 0 or after_elems == 0:
        return None
    return after_elems / before_elems


def _policy(source: VllmSource) -> str:
    return f"{RELEASE_POLICY_PREFIX}{source.version}" if source.version else f"vllm@{source.kind}"


def _inside_vllm(file: str) -> str:
    return file.removeprefix("vllm/")


def _sizing_json(args: SizingArgs) -> dict:
    return {
        "max_tokens_per_rank": args.max_tokens_per_rank,
        "num_dispatchers": args.num_dispatchers,
        "M": args.M,
        "num_local_experts": args.num_local_experts,
        "num_global_experts": args.num_global_experts,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "N": args.N,
        "top_k": args.top_k,
        "activation": args.activation,
        "workspace_dtype": args.workspace_dtype,
    }


# --- the CLI command `harness vllm audit` ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AuditRequest:
    """One `harness vllm audit` of one source: per class at the scenario's sizes, or with `sweep` over the grid.

    At most one of vllm_version, vllm_wheel and vllm_src; none of them: the installed vLLM.
    """

    vllm_version: str | None = None  # a release X.Y.Z, fetched into cache_dir unless already there
    vllm_wheel: Path | None = None
    vllm_src: Path | None = None
    cache_dir: Path | None = None  # None: HARNESS_CACHE_DIR, else ~/.cache/moe-harness
    scenario: str | None = None  # a file, or a name in scenarios/; None: the PR case (not with sweep)
    json: bool = False
    sweep: bool = False
    junit: Path | None = None  # with sweep: the JUnit XML file to write
    classes: tuple[str, ...] | None = None  # with sweep: only these experts classes; None: every one
    budget_s: float | None = None  # CPU seconds for the whole audit or sweep; None: the defaults
    # with sweep: the reference deployments' layer sizings on a source (harness.sizing.vllm_diff.reference_sizing,
    # handed in by the caller: the deployment model sits above this package); None: findings without their bytes
    reference_sizing: Callable[[Any], dict[str, Any]] | None = None


def run_audit(request: AuditRequest) -> int:
    """`harness vllm audit`: 0 when no class double-counts, 1 when one does, 2 on errors (one line on stderr)."""
    if request.sweep and request.scenario is not None:
        raise BadInput("--scenario does not go with --sweep (the sweep takes its own grid)")
    # VllmSourceError and _ScenarioUnavailable reach harness.cli.main: one line, exit 2.
    args = None if request.sweep else _sizing_from_scenario(request.scenario)
    source = locate(version=request.vllm_version, wheel=request.vllm_wheel, src=request.vllm_src,
                    cache_dir=request.cache_dir)  # fmt: skip
    if request.sweep:
        from harness.sizing.vllm_source.sweep_report import SweepRequest, run_sweep

        return run_sweep(
            SweepRequest(
                json=request.json,
                junit=request.junit,
                budget_s=request.budget_s,
                reference_sizing=request.reference_sizing,
                classes=request.classes,
            ),
            source,
        )
    assert args is not None  # None only with --sweep, which returned above
    result = audit(source, args, budget_s=request.budget_s)
    if request.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_audit_table(result)
    return result.exit_code


class _ScenarioUnavailable(BadInput):
    """The scenario could not be loaded; carries the loader's message."""


def _sizing_from_scenario(scenario: str | Path | None) -> SizingArgs:
    # Imported here: the scenario module pulls in pydantic and yaml, which the audit itself does not need.
    try:
        from harness.scenario.schema import ScenarioError, load_scenario
        from harness.scenario.sections import SCENARIOS_DIR
    except ImportError as error:
        raise _ScenarioUnavailable(f"cannot load scenarios: harness.scenario.schema is unavailable ({error})") from None

    # A name or a path, as the user gave it: the loader resolves names against the scenarios directory.
    name_or_path = scenario if scenario is not None else Path(SCENARIOS_DIR) / DEFAULT_SCENARIO_NAME
    try:
        return load_scenario(name_or_path).sizing_args()
    except ScenarioError as error:
        raise _ScenarioUnavailable(str(error)) from None


def print_audit_table(result: AuditResult, *, file=None) -> None:
    """The audit as a table: a header of versions and parameters, a units row, one row per class, a footer."""
    from rich.table import Table

    from harness.core.console import make_console

    out = file if file is not None else sys.stdout
    console = make_console(file=out, highlight=False)
    source, args = result.source, result.args
    fixed_bytes = fixed_shapes(args).total_bytes
    torch_pin = source.torch_requirement or "torch pin unknown"
    console.print(f"# {source.label} ({source.kind}: {source.origin}; {torch_pin})")
    console.print(
        f"# T={args.max_tokens_per_rank} D={args.num_dispatchers} M={args.M} E={args.num_local_experts} "
        f"global_E={args.num_global_experts} K={args.K} I={args.intermediate_size} N={args.N} top_k={args.top_k} "
        f"activation={args.activation} dtype={args.workspace_dtype}; fixed={fixed_bytes / GIB:.2f} GiB, "
        f"legacy={legacy_shapes(args).total_bytes / GIB:.2f} GiB"
    )
    table = Table(show_lines=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("class", "left"), ("file", "left"), ("verdict", "left"), ("ws13", "right"), ("ws2", "right"),
        ("out", "right"), ("per GPU", "right"), ("x fixed", "right"),
    )  # fmt: skip
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=True)
    table.add_row("", "", "", "elements", "elements", "elements", "GiB", "ratio", style="dim")
    for c in result.classes:
        style = {DOUBLE_COUNT: "bold red", UNEVALUATED: "yellow"}.get(c.verdict, "")
        table.add_row(
            c.name,
            c.short_file,
            c.verdict,
            _shape_text(c.shapes.ws13) if c.shapes else "-",
            _shape_text(c.shapes.ws2) if c.shapes else "-",
            _shape_text(c.shapes.out) if c.shapes else "-",
            f"{c.total_bytes / GIB:.2f}" if c.total_bytes is not None else "-",
            f"{c.total_bytes / fixed_bytes:.2f}" if c.total_bytes is not None else "-",
            style=style,
        )
    console.print(table)
    for c in result.classes:
        if c.verdict != CONSISTENT:
            console.print(f"  {c.name}: {c.reason}")
    num_classes = len(result.classes)
    num_unevaluated = sum(c.verdict == UNEVALUATED for c in result.classes)
    if result.double_counts:
        names = ", ".join(c.name for c in result.double_counts)
        console.print(
            f"FAILED: {len(result.double_counts)} of {num_classes} batched classes double-count the dispatchers "
            f"({names})"
        )
    else:
        console.print(
            f"OK: none of {num_classes} batched classes double-counts the dispatchers"
            + (f" ({num_unevaluated} not evaluated)" if num_unevaluated else "")
        )


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"
