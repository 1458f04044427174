"""The whole EP MoE layer's memory per GPU for one vLLM release, read from that release's source.

    [Router] -> [Quantize-Dispatch] -> [Experts] -> [Combine]        one MoE layer, one GPU of D
       expert weights        E local experts, EPLB's redundant ones included          formula
       deepep-nvl            DeepEP Buffer num_nvl_bytes (VLLM_DEEPEP_BUFFER_SIZE_MB)  all2all.py, envs.py
       deepep-workspace      DeepEP Buffer's 32 MiB workspace                          DeepEP source
       deepep-rdma           num_rdma_bytes = DeepEP's size hint, with vLLM's args     all2all.py, all2all_utils.py,
                                                                                       layer.py, DeepEP's layout
       dispatch-recv         low_latency_dispatch's (E, D*T, K) receive + scales       deepep_ll.py + DeepEP
       dispatch-quant        vLLM's fp8 copy of a bf16 receive + scales                deepep_ll.py
       workspace             the experts class's common + ws2 (its workspace_shapes)   the class, evaluated

Each component carries bytes, where they come from (the release's file and line, or a formula and its origin)
and verdicts: consistent; double-count (the token dim counts D twice, #55579); over-allocated (more than the
class's own apply() views need, #53241); under-sized (less than dispatch needs, DeepEP asserts); over-cap
(DeepEP's Buffer refuses it); unevaluated (with the reason). A budget gives fit, oom (naming the component that
crosses it) or refused (a component over a library cap). See docs/layer-memory.md.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import harness
from harness.core.contract import SizingArgs, live_set_bytes
from harness.core.records import Record
from harness.core.units import GIB, MIB
from harness.scenario.schema import Scenario
from harness.scenario.sections import LayerSpec
from harness.sizing import deepep
from harness.sizing.vllm_source.auditor import DOUBLE_COUNT, audit
from harness.sizing.vllm_source.evaluate import (
    Evaluation,
    ParsedClass,
    SourceTree,
    source_tree,
    standin_attributes,
    workspace_shapes_arguments,
)
from harness.sizing.vllm_source.interpreter import DTYPES, Activation, Builtin, StandIn, Unevaluable
from harness.sizing.vllm_source.layer_source import (
    BUFFER_ENV,
    HT_MANAGER,
    LL_MANAGER,
    Read,
    ReleaseFiles,
    SourceRef,
    apply_views,
    deepep_ll_branch,
    dispatch_call,
    env_default,
    evaluate_in,
    manager_kwargs,
    module_constant,
    moe_num_experts,
    quant_call,
    release_files,
)
from harness.sizing.vllm_source.sources import VllmSource, VllmSourceError, locate_release

LAYER_PLAN_SCHEMA = 1

CONSISTENT = "consistent"
OVER_ALLOCATED = "over-allocated"
UNDER_SIZED = "under-sized"
OVER_CAP = "over-cap"
UNEVALUATED = "unevaluated"

# (batched format?, moe_backend, quant) -> experts class; quant None matches any quantization.
EXPERTS_CLASSES: dict[tuple[bool, str, str | None], str] = {
    (True, "cutlass", None): "CutlassBatchedExpertsFp8",
    (True, "deep_gemm", None): "BatchedDeepGemmExperts",
    (True, "triton", None): "BatchedTritonExperts",
    (False, "cutlass", None): "CutlassExpertsFp8",
    (False, "deep_gemm", None): "DeepGemmExperts",
    (False, "triton", "wna16"): "TritonWNA16Experts",
    (False, "triton", None): "TritonExperts",
    (True, "marlin", None): "BatchedMarlinExperts",
    (False, "marlin", None): "MarlinExperts",
}


class LayerComponent(Record):
    """One buffer of the layer on one GPU."""

    name: str  # one of harness.scenario.schema.LAYER_COMPONENTS
    bytes: int | None  # None when unevaluated
    needed_bytes: int | None = None  # what the class's live set or dispatch needs, when known
    cap_bytes: int | None = None  # a library's limit on this buffer
    source: str  # "model_executor/.../all2all.py:327" or "formula: ... (origin)"
    verdicts: list[str]
    detail: str = ""
    facts: dict[str, int | str] = {}  # noqa: RUF012 - a pydantic field, copied per instance; the arguments and counts behind the bytes, for JSON readers


class BudgetResult(Record):
    gpu: str | None
    budget_bytes: int
    outcome: Literal["fit", "oom", "refused", "unknown"]
    breaking_component: str | None
    reason: str


class LayerPlan(Record):
    """`harness plan --vllm-version X`: the layer's per-GPU memory for one release. Plain ints are bytes."""

    schema_version: int = LAYER_PLAN_SCHEMA
    kind: Literal["layer-plan"] = "layer-plan"
    harness_version: str
    python_version: str
    scenario: str
    scenario_hash: str
    vllm_version: str | None
    vllm_source: str
    layout: dict[str, int | str]
    experts_class: str
    components: list[LayerComponent]
    total_bytes: int | None
    budget: BudgetResult | None = None

    def component(self, name: str) -> LayerComponent | None:
        return next((c for c in self.components if c.name == name), None)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The scenario's layer in the letters of docs/design.md, for one GPU."""

    T: int
    D: int
    E: int  # local physical experts (redundant ones included)
    K: int
    I: int  # per GPU (a TP-sharded model states its shard in model.intermediate_size)
    top_k: int
    num_routed_experts: int
    num_redundant_experts: int
    spec: LayerSpec
    args: SizingArgs

    @property
    def num_physical_experts(self) -> int:
        return self.E * self.D

    @property
    def batched(self) -> bool:
        return self.spec.all2all == "deepep-low-latency"

    def to_json(self) -> dict[str, int | str]:
        return {
            "T": self.T, "D": self.D, "E": self.E, "K": self.K, "I": self.I, "top_k": self.top_k,
            "num_routed_experts": self.num_routed_experts, "num_redundant_experts": self.num_redundant_experts,
            "num_physical_experts": self.num_physical_experts, "all2all": self.spec.all2all,
            "moe_backend": self.spec.moe_backend, "quant": self.spec.quant,
        }  # fmt: skip


def layout_of(scenario: Scenario) -> Layout:
    """The scenario's layer. vLLM places E = (routed + redundant) / D experts on each GPU, so E x D slots beyond
    the routed experts are EPLB's redundant ones (the schema checks a given layer.num_redundant_experts)."""
    spec = scenario.layer
    args = scenario.sizing_args()
    I = args.intermediate_size
    routed = _int(scenario.model.num_experts)
    # A declared count is the user's (the schema checked it against E x D); only an unset one is derived.
    declared = spec.num_redundant_experts
    redundant = declared if declared is not None else args.num_local_experts * args.num_dispatchers - routed
    return Layout(
        T=args.max_tokens_per_rank, D=args.num_dispatchers, E=args.num_local_experts, K=args.K, I=I,
        top_k=args.top_k, num_routed_experts=routed,
        num_redundant_experts=redundant, spec=spec, args=args,
    )  # fmt: skip


# Up to 0.10.0 the batched CUTLASS path was CutlassExpertsFp8(use_batched_format=True).
OLDER_CLASS_NAMES = {"CutlassBatchedExpertsFp8": "CutlassExpertsFp8"}


def experts_class_name(layout: Layout) -> str:
    key = (layout.batched, layout.spec.moe_backend, layout.spec.quant)
    return EXPERTS_CLASSES.get(key) or EXPERTS_CLASSES[(layout.batched, layout.spec.moe_backend, None)]


# --- the plan -------------------------------------------------------------------------------------------------------


def plan_layer(
    scenario: Scenario,
    version: str,
    *,
    cache_dir: Path | None = None,
    budget_bytes: int | None = None,
    gpu: str | None = None,
) -> LayerPlan:
    """Every component of the scenario's layer under vLLM `version` (a release, fetched into the cache)."""
    source = locate_release(version, cache_dir=cache_dir)
    return plan_layer_from(scenario, source, budget_bytes=budget_bytes, gpu=gpu)


def plan_layer_from(
    scenario: Scenario,
    source: VllmSource,
    *,
    budget_bytes: int | None = None,
    gpu: str | None = None,
    files: ReleaseFiles | None = None,
) -> LayerPlan:
    """`files`: the release's parsed files when the caller keeps them across plans (harness.sizing.search)."""
    layout = layout_of(scenario)
    files = files if files is not None else release_files(source)
    class_name = experts_class_name(layout)
    components = [weights_component(layout)]
    components += comm_components(layout, files)
    components += dispatch_components(layout, files)
    components.append(workspace_component(layout, source, class_name))
    known = [c.bytes for c in components]
    total = sum(b for b in known if b is not None) if all(b is not None for b in known) else None
    plan = LayerPlan(
        harness_version=harness.__version__,
        python_version=platform.python_version(),
        scenario=scenario.name or "",
        scenario_hash=scenario.scenario_hash,
        vllm_version=source.version,
        vllm_source=f"{source.label} ({source.origin})",
        layout=layout.to_json(),
        experts_class=class_name,
        components=components,
        total_bytes=total,
    )
    if budget_bytes is not None:
        plan = plan.model_copy(update={"budget": fit_budget(plan, budget_bytes, gpu)})
    return plan


def fit_budget(plan: LayerPlan, budget_bytes: int, gpu: str | None) -> BudgetResult:
    """refused when a component is over a library cap or under what dispatch needs; else oom at the first
    component (in allocation order) whose running total crosses the budget; else fit."""
    refused = next((c for c in plan.components if {OVER_CAP, UNDER_SIZED} & set(c.verdicts)), None)
    if refused is not None:
        if OVER_CAP in refused.verdicts:
            cap = (refused.cap_bytes or 0) / GIB
            why = f"{(refused.bytes or 0) / GIB:.2f} GiB is over the library's cap of {cap:.2f} GiB"
        else:
            why = (f"{(refused.bytes or 0) / GIB:.2f} GiB is less than dispatch needs "
                   f"({(refused.needed_bytes or 0) / GIB:.2f} GiB): DeepEP asserts at the first dispatch")  # fmt: skip
        return BudgetResult(gpu=gpu, budget_bytes=budget_bytes, outcome="refused", breaking_component=refused.name,
                            reason=why)  # fmt: skip
    running = 0
    for component in plan.components:
        if component.bytes is None:
            return BudgetResult(gpu=gpu, budget_bytes=budget_bytes, outcome="unknown",
                                breaking_component=component.name,
                                reason=f"{component.name} was not evaluated")  # fmt: skip
        running += component.bytes
        if running > budget_bytes:
            return BudgetResult(
                gpu=gpu, budget_bytes=budget_bytes, outcome="oom", breaking_component=component.name,
                reason=f"{component.name} ({component.bytes / GIB:.2f} GiB) takes the layer to {running / GIB:.2f} "
                f"GiB, over the {budget_bytes / GIB:.2f} GiB budget",
            )  # fmt: skip
    return BudgetResult(gpu=gpu, budget_bytes=budget_bytes, outcome="fit", breaking_component=None,
                        reason=f"{running / GIB:.2f} GiB of {budget_bytes / GIB:.2f} GiB")  # fmt: skip


# --- expert weights -------------------------------------------------------------------------------------------------


def weights_component(layout: Layout) -> LayerComponent:
    """w13 (E, 2I, K) and w2 (E, K, I) per local expert, redundant replicas included, plus their scales."""
    E, K, I, N = layout.E, layout.K, layout.I, 2 * layout.I
    elements = E * (N * K + K * I)
    quant = layout.spec.quant
    if quant == "fp8-per-token":
        data, scales, how = elements, E * (N + K) * 4, "fp8 + per-channel f32 scales (E, 2I) and (E, K)"
    elif quant == "fp8-block":
        scales = E * (math.ceil(N / 128) * math.ceil(K / 128) + math.ceil(K / 128) * math.ceil(I / 128)) * 4
        data, how = elements, "fp8 + 128x128 block f32 scales"
    elif quant == "wna16":
        data, scales = elements // 2, E * (K // 128 * N + I // 128 * K) * 2
        how = "int4 (2 per byte) + bf16 scales per group of 128"
    else:
        data, scales, how = elements * 2, 0, "bf16"
    return LayerComponent(
        name="expert-weights",
        bytes=data + scales,
        source=f"formula: E x (2I*K + K*I) elements, {how} (harness; vLLM allocates what the checkpoint holds)",
        verdicts=[CONSISTENT],
        detail=f"{E} local experts ({layout.num_redundant_experts} redundant over D={layout.D}), I={I} per GPU",
        facts={"num_local_experts": E, "weight_bytes": data, "scale_bytes": scales},
    )


# --- DeepEP buffers -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeepEPArgs:
    """What the release passes DeepEP's manager for this layout, read from its source."""

    handle_args: dict[str, Read]  # all_to_all_args of the low-latency branch
    max_tokens_per_rank: Read  # DeepEPLLPrepareAndFinalize(max_tokens_per_rank=...)
    use_fp8_dispatch: Read
    moe_num_experts: Read
    buffer_size_mb: Read
    hidden: int = 0  # the hidden size DeepEP sees: K rounded up to a supported size (deepep_ll_hidden)


def read_deepep_args(layout: Layout, files: ReleaseFiles) -> DeepEPArgs | str:
    """The low-latency branch's arguments evaluated on stand-ins of this layout; a reason when not found."""
    num_experts = moe_num_experts(files, num_routed_experts=layout.num_routed_experts,
                                  num_redundant_experts=layout.num_redundant_experts)  # fmt: skip
    branch = deepep_ll_branch(files)
    if branch is None:
        return "no prepare/finalize factory branch on `use_deepep_ll_kernels` that builds all_to_all_args in fused_moe/"
    hidden = deepep_ll_hidden(files, layout.K)
    moe = StandIn(
        "moe", max_num_tokens=layout.T, hidden_dim=hidden, num_experts=num_experts.value,
        num_local_experts=layout.E, experts_per_token=layout.top_k, num_logical_experts=layout.num_routed_experts,
    )  # fmt: skip
    manager = StandIn("all2all_manager", world_size=layout.D, dp_world_size=layout.D, rank=0)
    names: dict[str, object] = {"moe": moe, "all2all_manager": manager}
    handle = {k: evaluate_in(files, branch.file, e, names) for k, e in branch.handle_args.items()}
    tokens_expr = branch.prepare_finalize_args.get("max_tokens_per_rank")
    tokens = (
        evaluate_in(files, branch.file, tokens_expr, names)
        if tokens_expr is not None
        else Read.failed("DeepEPLLPrepareAndFinalize(...) has no max_tokens_per_rank keyword")
    )
    use_fp8 = _use_fp8_dispatch(layout, files, branch)
    env = env_default(files, BUFFER_ENV)
    if layout.spec.deepep_buffer_size_mb is not None:
        env = Read(value=layout.spec.deepep_buffer_size_mb, ref=None)
    return DeepEPArgs(handle, tokens, use_fp8, num_experts, env, hidden)


DEEPEP_LL_FILE = "vllm/model_executor/layers/fused_moe/prepare_finalize/deepep_ll.py"
DEEPEP_LL_CLASS = "DeepEPLLPrepareAndFinalize"


def deepep_ll_hidden(files: ReleaseFiles, hidden: int) -> int:
    """The hidden size vLLM hands DeepEP low-latency: the layer's rounded up to the smallest of the release's
    DeepEPLLPrepareAndFinalize.SUPPORTED_HIDDEN_SIZES (read with ast) that holds it (maybe_roundup_layer_hidden_size;
    e.g. 2880 -> 3072). The layer's own size where the release has no such list or none is large enough."""
    parsed = files.tree.modules.get(DEEPEP_LL_FILE)
    if parsed is None:
        return hidden
    for node in parsed.tree.body:
        if isinstance(node, ast.ClassDef) and node.name == DEEPEP_LL_CLASS:
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and
                        t.id == "SUPPORTED_HIDDEN_SIZES" for t in statement.targets)):  # fmt: skip
                    try:
                        sizes = ast.literal_eval(statement.value)
                    except ValueError:
                        return hidden
                    larger = sorted(s for s in sizes if isinstance(s, int) and s >= hidden)
                    return larger[0] if larger else hidden
    return hidden


def _use_fp8_dispatch(layout: Layout, files: ReleaseFiles, branch) -> Read:
    if branch.use_fp8_dispatch is None:
        return Read.failed("the low-latency branch assigns no use_fp8_dispatch")
    quant = layout.spec.quant
    block = [128, 128] if quant == "fp8-block" else None  # vLLM's block_shape is a list
    fp8 = "float8_e4m3fn"
    quant_config = StandIn("quant_config", quant_dtype=fp8 if quant.startswith("fp8") else None, block_shape=block,
                           is_block_quantized=block is not None)  # fmt: skip
    platform_standin = StandIn("current_platform", fp8_dtype=Builtin("fp8_dtype", lambda interpreter: fp8))
    names: dict[str, object] = {"quant_config": quant_config, "current_platform": platform_standin}
    # all2all_utils imports it only under `if has_deep_ep():`; its value is deepep_ll.py's module constant.
    try:
        names["DEEPEP_QUANT_BLOCK_SHAPE"] = module_constant(files, "deepep_ll.py", "DEEPEP_QUANT_BLOCK_SHAPE")
    except Unevaluable as error:
        return Read.failed(str(error))
    return evaluate_in(files, branch.file, branch.use_fp8_dispatch, names)


def comm_components(layout: Layout, files: ReleaseFiles) -> list[LayerComponent]:
    if layout.spec.all2all == "none":
        return []
    if layout.spec.all2all == "deepep-high-throughput":
        return _ht_components(layout, files)
    args = read_deepep_args(layout, files)
    if isinstance(args, str):
        return [_unevaluated(name, args) for name in ("deepep-nvl", "deepep-workspace", "deepep-rdma")]
    failed = [r for r in (args.moe_num_experts, args.buffer_size_mb, *args.handle_args.values()) if not r.ok]
    if failed:
        return [_unevaluated(name, failed[0].reason) for name in ("deepep-nvl", "deepep-workspace", "deepep-rdma")]

    def hint(**kwargs: object) -> int:
        return deepep.LowLatencyLayout(layout=layout.spec.deepep_layout, **kwargs).size_hint_bytes  # type: ignore[arg-type]

    run = manager_kwargs(
        files, LL_MANAGER,
        arguments={k: r.value for k, r in args.handle_args.items()},
        self_attributes={"cpu_group": None, "support_fault_tolerance": False, "num_sms": 20},
        env_values={BUFFER_ENV: args.buffer_size_mb.value, "VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL": False},
        size_hint=hint,
    )  # fmt: skip
    if run.reason:
        return [_unevaluated(name, run.reason) for name in ("deepep-nvl", "deepep-workspace", "deepep-rdma")]
    return [_nvl_component(run.kwargs.get("num_nvl_bytes"), run.kwargs.get("num_rdma_bytes"), run.ref, args),
            _deepep_workspace_component(),
            _rdma_component(layout, run, args)]  # fmt: skip


def _ht_components(layout: Layout, files: ReleaseFiles) -> list[LayerComponent]:
    env = env_default(files, BUFFER_ENV)
    if layout.spec.deepep_buffer_size_mb is not None:
        env = Read(value=layout.spec.deepep_buffer_size_mb, ref=None)
    if not env.ok:
        return [_unevaluated(name, env.reason) for name in ("deepep-nvl", "deepep-workspace", "deepep-rdma")]
    internode = layout.D > layout.spec.gpus_per_node
    run = manager_kwargs(
        files, HT_MANAGER, arguments={},
        self_attributes={"cpu_group": None, "internode": internode, "num_sms": 20},
        env_values={BUFFER_ENV: env.value, "VLLM_DEEPEP_HIGH_THROUGHPUT_FORCE_INTRA_NODE": False},
        size_hint=lambda **kwargs: 0,
    )  # fmt: skip
    if run.reason:
        return [_unevaluated(name, run.reason) for name in ("deepep-nvl", "deepep-workspace", "deepep-rdma")]
    nvl, rdma = run.kwargs.get("num_nvl_bytes"), run.kwargs.get("num_rdma_bytes")
    fake = DeepEPArgs({}, Read.failed("n/a"), Read.failed("n/a"), Read.failed("n/a"), env)
    components = [_nvl_component(nvl, rdma, run.ref, fake), _deepep_workspace_component()]
    if isinstance(rdma, int):
        verdicts = [CONSISTENT if rdma <= deepep.INT_MAX else OVER_CAP]  # normal mode: num_rdma_bytes <= INT_MAX
        components.append(LayerComponent(
            name="deepep-rdma", bytes=rdma, cap_bytes=deepep.INT_MAX, source=str(run.ref), verdicts=verdicts,
            detail=f"{'internode' if internode else 'intranode'} (D={layout.D}, {layout.spec.gpus_per_node} "
            f"GPUs per node): {BUFFER_ENV}={env.value} MiB",
        ))  # fmt: skip
    return components


def _nvl_component(nvl: object, rdma: object, where: SourceRef | None, args: DeepEPArgs) -> LayerComponent:
    if not isinstance(nvl, int) or not isinstance(rdma, int):
        return _unevaluated("deepep-nvl", f"the manager's num_nvl_bytes is {nvl!r}")
    fits = deepep.nvl_bytes_fit(nvl, num_rdma_bytes=rdma)
    env = args.buffer_size_mb
    where_set = "scenario layer.deepep_buffer_size_mb" if env.ref is None else f"default {env.ref}"
    origin = f"{BUFFER_ENV}={env.value} MiB ({where_set})"
    return LayerComponent(
        name="deepep-nvl", bytes=deepep.nvl_allocation_bytes(nvl), cap_bytes=deepep.INT_MAX if rdma else None,
        source=str(where), verdicts=[CONSISTENT if fits else OVER_CAP],
        detail=f"num_nvl_bytes = {origin}, + {deepep.NVL_METADATA_BYTES} B of DeepEP peer metadata",
        facts={"num_nvl_bytes": nvl, "buffer_size_mb": _int(env.value)},
    )  # fmt: skip


def _deepep_workspace_component() -> LayerComponent:
    return LayerComponent(
        name="deepep-workspace", bytes=deepep.WORKSPACE_BYTES, verdicts=[CONSISTENT],
        source="formula: DeepEP Buffer cudaMallocs NUM_WORKSPACE_BYTES = 32 MiB (DeepEP csrc/legacy/buffer.hpp)",
    )  # fmt: skip


def _rdma_component(layout: Layout, run, args: DeepEPArgs) -> LayerComponent:
    """num_rdma_bytes vLLM asks for, against the layout dispatch checks (DeepEP asserts total <= num_rdma_bytes)."""
    requested = run.kwargs.get("num_rdma_bytes")
    if not isinstance(requested, int) or not run.size_hint_calls:
        return _unevaluated("deepep-rdma", f"the manager's num_rdma_bytes is {requested!r}")
    asked = run.size_hint_calls[-1]
    tokens = args.max_tokens_per_rank.value if args.max_tokens_per_rank.ok else layout.T
    # Dispatch runs with the layer's global (physical) experts: every routed expert and every replica.
    needed = deepep.LowLatencyLayout(num_max_dispatch_tokens_per_rank=_int(tokens), hidden=args.hidden or layout.K,
                                     num_ranks=layout.D, num_experts=layout.num_physical_experts,
                                     layout=layout.spec.deepep_layout)  # fmt: skip
    routed_only = dataclasses.replace(needed, num_experts=layout.num_routed_experts)
    verdicts = []
    if requested < needed.total_bytes:
        verdicts.append(UNDER_SIZED)
    if not deepep.rdma_bytes_fit(requested):
        verdicts.append(OVER_CAP)
    max_tokens = deepep.max_tokens_under_cap(hidden=args.hidden or layout.K, num_ranks=layout.D,
                                             num_experts=_int(asked["num_experts"]),
                                             layout=layout.spec.deepep_layout)  # fmt: skip
    experts_ref = args.moe_num_experts.ref
    detail = (
        f"vLLM passes num_experts={asked['num_experts']} (moe.num_experts, {experts_ref}: "
        f"{experts_ref.code if experts_ref else ''}"
        f" = {layout.num_routed_experts} routed + {layout.num_redundant_experts} redundant), "
        f"T={asked['num_max_dispatch_tokens_per_rank']}, hidden={asked['hidden']}, num_ranks={asked['num_ranks']}; "
        f"dispatch needs {needed.total_bytes / GIB:.2f} GiB for {layout.num_physical_experts} experts; "
        f"DeepEP takes under 32 GiB (num_rdma_bytes/16 < INT_MAX): T <= {max_tokens} at {asked['num_experts']} experts"
        f"; the {layout.num_routed_experts} routed experts alone would take {routed_only.size_hint_bytes / GIB:.2f} GiB"
    )  # fmt: skip
    return LayerComponent(
        name="deepep-rdma", bytes=requested, needed_bytes=needed.total_bytes, cap_bytes=deepep.RDMA_CAP_BYTES,
        source=f"{run.ref} (get_low_latency_rdma_size_hint); args {args.handle_args['num_global_experts'].ref}; "
        f"formula: DeepEP LowLatencyLayout ({layout.spec.deepep_layout})",
        verdicts=verdicts or [CONSISTENT], detail=detail,
        facts={"requested_num_experts": _int(asked["num_experts"]), "needed_num_experts": layout.num_physical_experts,
               "num_max_dispatch_tokens_per_rank": _int(asked["num_max_dispatch_tokens_per_rank"]),
               "max_tokens_under_cap": max_tokens, "routed_only_bytes": routed_only.size_hint_bytes},
    )  # fmt: skip


def _int(value: object) -> int:
    """int() of a value the release's code computed (the interpreter holds plain values: int, float, str, bool)."""
    plain: Any = value
    return int(plain)


def _unevaluated(name: str, reason: str) -> LayerComponent:
    return LayerComponent(name=name, bytes=None, source="-", verdicts=[UNEVALUATED], detail=reason)


# --- the dispatch output --------------------------------------------------------------------------------------------


def dispatch_components(layout: Layout, files: ReleaseFiles) -> list[LayerComponent]:
    """DeepEP's receive tensors for one low-latency dispatch, and vLLM's fp8 copy when it dispatched bf16."""
    if not layout.batched:
        return []
    args = read_deepep_args(layout, files)
    if isinstance(args, str) or not args.max_tokens_per_rank.ok or not args.use_fp8_dispatch.ok:
        reason = args if isinstance(args, str) else (args.max_tokens_per_rank.reason or args.use_fp8_dispatch.reason)
        return [_unevaluated("dispatch-recv", reason)]
    tokens, use_fp8 = _int(args.max_tokens_per_rank.value), bool(args.use_fp8_dispatch.value)
    recv = deepep.LowLatencyRecv(num_local_experts=layout.E, num_ranks=layout.D,
                                 num_max_dispatch_tokens_per_rank=tokens, hidden=args.hidden or layout.K,
                                 use_fp8=use_fp8)  # fmt: skip
    call = dispatch_call(files)
    components = [LayerComponent(
        name="dispatch-recv", bytes=recv.total_bytes, verdicts=[CONSISTENT],
        source=f"{call} low_latency_dispatch(T={tokens}, use_fp8={use_fp8}) -> DeepEP packed_recv_x "
        f"(E, D*T, K) {'fp8 + f32 scales (E, K/128, D*T)' if use_fp8 else 'bf16'} + src_info, layout_range, count",
        detail=f"M = D*T = {recv.num_slots} slots per local expert; T from {args.max_tokens_per_rank.ref}; "
        f"use_fp8_dispatch = {args.use_fp8_dispatch.ref.code if args.use_fp8_dispatch.ref else ''}",
        facts={"num_slots": recv.num_slots, "x_bytes": recv.x_bytes, "scales_bytes": recv.scales_bytes},
    )]  # fmt: skip
    if not use_fp8 and layout.spec.quant.startswith("fp8"):
        rows = layout.E * recv.num_slots
        scale_cols = 1 if layout.spec.quant == "fp8-per-token" else layout.K // 128
        quantized = rows * layout.K + rows * scale_cols * 4
        components.append(LayerComponent(
            name="dispatch-quant", bytes=quantized, verdicts=[CONSISTENT],
            source=f"{quant_call(files)} moe_kernel_quantize_input of the bf16 receive: fp8 (E*D*T, K) + "
            f"f32 scales (E*D*T, {scale_cols})",
            detail="the experts take fp8; DeepEP dispatched bf16 (fp8 dispatch needs 128x128 block quantization)",
        ))  # fmt: skip
    return components


# --- the experts class's workspace ----------------------------------------------------------------------------------


def workspace_component(layout: Layout, source: VllmSource, class_name: str) -> LayerComponent:
    """The modular kernel's common + ws2 for the class, from its own workspace_shapes; verdict against the D/T
    probes (double count) and against the views its apply() takes (over-allocated)."""
    args = layout.args
    tree = _tree(source)
    classes = tree.class_named(class_name)
    older = OLDER_CLASS_NAMES.get(class_name) if layout.batched else None
    if not classes and older is not None and tree.class_named(older):
        class_name, classes = older, tree.class_named(older)  # the stand-in asks it for the batched format
    if not classes:
        return _unevaluated("workspace", f"{source.label} has no experts class {class_name} under fused_moe/")
    cls = classes[0]
    n, n_rule = class_n(layout, tree, cls)
    if isinstance(n, str):
        return _unevaluated("workspace", f"{class_name}.moe_problem_size: {n}")
    evaluation = evaluate_workspace(layout, tree, cls, n=n)
    if not evaluation.ok:
        return _unevaluated("workspace", f"{class_name}.workspace_shapes: {evaluation.reason}")
    dtype = args.dtype_bytes
    assert evaluation.ws13 is not None and evaluation.ws2 is not None and evaluation.out is not None  # ok: all three
    common = max(math.prod(evaluation.ws13), math.prod(evaluation.out))
    ws2 = math.prod(evaluation.ws2)
    allocated = (common + ws2) * dtype
    verdicts: list[str] = []
    detail = f"ws13 {evaluation.ws13}, ws2 {evaluation.ws2}, out {evaluation.out} ({args.workspace_dtype})"
    if layout.batched:
        audited = next((c for c in audit(source, args, class_names=(class_name,)).classes), None)
        if audited is not None and audited.verdict == DOUBLE_COUNT:
            verdicts.append(DOUBLE_COUNT)
            detail += f"; {audited.reason}"
    if n_rule:
        detail += f"; {n_rule} ({class_name}.moe_problem_size on its packed weights)"
    needed, needed_source = _needed_workspace(layout, tree, cls, evaluation, class_name, n)
    if needed is not None and allocated > needed and DOUBLE_COUNT not in verdicts:
        verdicts.append(OVER_ALLOCATED)
        detail += f"; x{allocated / needed:.2f} the live set ({(allocated - needed) / MIB:.0f} MiB over)"
    if needed is not None and needed_source:
        detail += f"; live set from {needed_source}"
    owner, method = tree.find_method(cls, "workspace_shapes") or (cls, cls.node)
    file, line = owner.file.removeprefix("vllm/"), method.lineno
    return LayerComponent(
        name="workspace", bytes=allocated, needed_bytes=needed, verdicts=verdicts or [CONSISTENT],
        source=f"{file}:{line} {class_name}.workspace_shapes(M={args.M}, N={n}, K={args.K}, topk={args.top_k})",
        detail=detail, facts={"common_bytes": common * dtype, "ws2_bytes": ws2 * dtype},
    )  # fmt: skip


def _tree(source: VllmSource) -> SourceTree:
    return source_tree(source)


def class_n(layout: Layout, tree: SourceTree, cls: ParsedClass) -> tuple[int | str, str]:
    """The N the modular kernel passes the class's workspace_shapes, and its rule: for a class whose
    moe_problem_size derives N from Marlin's packed weights, that derivation (the sweep's, N = I), or why it does
    not evaluate; for the others the layout's N (2I gated), with no rule."""
    from harness.sizing.vllm_source.sweep import BATCHED, STANDARD, problem_n

    quant = "kInt4Static/none" if layout.spec.quant == "wna16" else layout.spec.quant
    found = problem_n(tree, cls, layout.args, BATCHED if layout.batched else STANDARD, quant)
    if found is None:
        return layout.args.N, ""
    return found if isinstance(found, str) else found[0], "" if isinstance(found, str) else found[1]


def experts_attributes(layout: Layout) -> dict[str, object]:
    """The audit's stand-in self (FP8 per-token batched CUTLASS), with the layer's quantization and format."""
    attributes = standin_attributes(layout.args)
    quant = layout.spec.quant
    fp8 = DTYPES["float8_e4m3fn"]
    fields = {
        "quant_dtype": fp8 if quant.startswith("fp8") else None,
        "weight_quant_dtype": fp8 if quant.startswith("fp8") else None,
        "use_fp8_w8a8": quant.startswith("fp8"), "use_int8_w8a8": False, "use_int8_w8a16": False,
        "use_int4_w4a16": quant == "wna16", "use_mxfp4_w4a16": False, "use_nvfp4_w4a4": False,
        "ocp_mx_scheme": None, "is_quantized": quant != "bf16", "per_act_token_quant": quant == "fp8-per-token",
        "per_out_ch_quant": quant == "fp8-per-token", "block_shape": [128, 128] if quant == "fp8-block" else None,
        "is_block_quantized": quant == "fp8-block", "gemm1_clamp_limit": None,
    }  # fmt: skip
    attributes["quant_config"] = StandIn("self.quant_config", **fields)
    attributes["block_shape"] = fields["block_shape"]
    attributes["use_batched_format"] = layout.batched
    return attributes


def evaluate_workspace(layout: Layout, tree: SourceTree, cls: ParsedClass, *, n: int | None = None) -> Evaluation:
    """cls.workspace_shapes for the layer, on the experts stand-in self; arguments matched by parameter name; `n`:
    the N the modular kernel derives for the class where it is not the layout's (class_n)."""
    args = layout.args
    found = tree.find_method(cls, "workspace_shapes")
    if found is None:
        return Evaluation(None, None, None, "the class has no workspace_shapes")
    function = found[1]
    by_name = workspace_shapes_arguments(args)
    if n is not None:
        by_name["N"] = n
    parameters = [a.arg for a in (*function.args.args[1:], *function.args.kwonlyargs)]
    missing = [p for p in parameters if p not in by_name]
    if missing and len(missing) > len(function.args.defaults) + len(function.args.kw_defaults):
        return Evaluation(None, None, None, f"takes parameter {missing[0]!r}, which has no stand-in argument")
    arguments = {p: by_name[p] for p in parameters if p in by_name}
    try:
        result = tree.call_method(cls, "workspace_shapes", attributes=experts_attributes(layout), arguments=arguments)
    except Unevaluable as error:
        return Evaluation(None, None, None, f"workspace_shapes {error}")
    shapes = result[:3] if isinstance(result, tuple) and len(result) in (3, 4) else None
    if shapes is None or not all(isinstance(s, tuple) and all(type(d) is int for d in s) for s in shapes):
        return Evaluation(None, None, None, f"workspace_shapes returned {result!r:.120}, not (ws13, ws2, out)")
    return Evaluation(*shapes)


def _needed_workspace(layout: Layout, tree: SourceTree, cls, evaluation, class_name: str,
                      n: int) -> tuple[int | None, str]:  # fmt: skip
    """Bytes the class's apply() views need: max(views of workspace13, out) + max(views of workspace2)."""
    args = layout.args
    files = ReleaseFiles(tree.source, tree)
    # The letters apply() names its shapes with (from moe_problem_size and the prepare/finalize's output).
    names = {
        "activation": Activation(args.activation), "N": n, "K": args.K, "E": args.num_local_experts,
        "num_tokens": args.M, "M": args.M, "top_k_num": args.top_k, "topk": args.top_k,
        "max_num_tokens": args.M if layout.batched else args.max_tokens_per_rank,
    }  # fmt: skip
    live = apply_views(files, cls, names, experts_attributes(layout))
    out = math.prod(evaluation.out)
    has13 = any(v.buffer == "workspace13" for v in live.views)
    has2 = any(v.buffer == "workspace2" for v in live.views) or math.prod(evaluation.ws2) == 0
    if live.views and has13 and has2 and not live.unevaluated:
        needed = (max(live.needed_elements("workspace13"), out) + live.needed_elements("workspace2")) * args.dtype_bytes
        return needed, "apply()'s views: " + ", ".join(f"{v.buffer}{v.shape} {v.ref}" for v in live.views)
    if class_name == "CutlassBatchedExpertsFp8":
        return live_set_bytes(args), "the batched CUTLASS FP8 live set (harness.core.contract.live_set_bytes)"
    return None, ""


def plan_or_error(scenario: Scenario, version: str, **kwargs) -> LayerPlan | str:
    try:
        return plan_layer(scenario, version, **kwargs)
    except VllmSourceError as error:
        return str(error)


# --- what `harness run` allocates of the layer, predicted without a release (GPU hosts have no registry) -------------


@dataclass(frozen=True)
class Prediction:
    bytes: int
    source: str


def run_predictions(scenario: Scenario) -> dict[str, Prediction]:
    """The layer model's bytes for the components `harness run` allocates at this scenario's shapes: the FP8
    per-token weights, the batched dispatch output (vLLM's fp8 copy of the receive and its per-token scales, the
    harness's expert_x and expert_x_scale) and DeepEP low-latency's RDMA buffer for T, K and E x D experts."""
    spec = scenario.layer.model_copy(update={"quant": "fp8-per-token"})
    layout = layout_of(scenario.model_copy(update={"layer": spec}))
    rows = layout.E * layout.D * layout.T
    rdma = deepep.LowLatencyLayout(num_max_dispatch_tokens_per_rank=layout.T, hidden=layout.K, num_ranks=layout.D,
                                   num_experts=layout.num_physical_experts, layout=spec.deepep_layout)  # fmt: skip
    return {
        "expert-weights": Prediction(
            weights_component(layout).bytes or 0,
            "layer model: E x (2I*K + K*I) fp8 + per-channel f32 scales (E, 2I), (E, K)",
        ),
        "dispatch-quant": Prediction(
            rows * layout.K + rows * 4,
            "layer model: vLLM's fp8 copy of the batched receive (E*D*T, K) + per-token f32 scales (E*D*T, 1)",
        ),
        "deepep-rdma": Prediction(rdma.size_hint_bytes, f"DeepEP size hint: {rdma.formula()}"),
    }
