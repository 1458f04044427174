"""`harness plan` for a deployment: from `-- vllm serve MODEL FLAGS` or a scenario (its model preset, its layout,
its `deployment:` section), per release: the DeploymentPlan, its table, and what one release buys over another.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.scenario.deployment import DeploymentSpec
from harness.scenario.schema import Scenario, parse_scenario
from harness.scenario.sections import LayerSpec
from harness.sizing.deployment import GIB, DeploymentPlan, Resolved, plan_deployment, resolve, sharding_of
from harness.sizing.deployment_weights import experts_intermediate
from harness.sizing.gpus import Gpu
from harness.sizing.model_config import ModelFacts, check_parallel, load_model

LAYER_CACHE = 64  # distinct MoE layer plans a ReleaseReads keeps (least recently used dropped first)


class ReleaseReads:
    """One release as the search reads it: its parsed files (with each source read kept, layer_source.per_release)
    and one layer plan per distinct MoE layer scenario."""

    def __init__(self, source: Any) -> None:
        from harness.sizing.vllm_source.layer_source import release_files

        self.source = source
        self.files = release_files(source)
        self._layers: dict[str, Any] = {}  # least recently used first
        self.planned = 0

    def layer_plan(self, layer: Scenario) -> Any:
        from harness.sizing.layer import plan_layer_from

        key = layer.model_dump_json()
        plan = self._layers.pop(key, None)
        if plan is None:
            plan = plan_layer_from(layer, self.source, files=self.files)
            self.planned += 1
            if len(self._layers) >= LAYER_CACHE:
                del self._layers[next(iter(self._layers))]  # the least recently used
        self._layers[key] = plan
        return plan

    @property
    def distinct_layers(self) -> int:
        return self.planned


LAYER_ALL2ALL = {"deepep_low_latency": "deepep-low-latency", "deepep_high_throughput": "deepep-high-throughput"}


def layer_scenario(facts: ModelFacts, r: Resolved, base: Scenario | None = None) -> Scenario | None:
    """The MoE layer at the deployment's layout, for harness.sizing.layer (None for a dense model). Under EP:
    D = TP x DP ranks, E local experts, T = max_num_batched_tokens (FusedMoEConfig.max_num_tokens); without EP (or
    with the all-gather backend) the standard experts format: no DeepEP buffers, M = T x DP gathered tokens."""
    if not facts.is_moe:
        return None
    all2all = LAYER_ALL2ALL.get(r.all2all, "none") if r.ep else "none"
    # I per GPU as FusedMoE allocates it (the MXFP4 method pads it: gpt-oss at TP 8 holds 384 of 2880 / 8 = 360)
    I = experts_intermediate(facts, sharding_of(facts, r))
    D, E = (r.ep_size, r.local_experts) if r.ep else (r.dp, facts.num_routed_experts)
    scheme = facts.quant.scheme if facts.quant is not None else ""
    quant = ("fp8-block" if facts.weight_block_size else "fp8-per-token") if facts.quant_method == "fp8" else \
        "wna16" if scheme in ("wna16", "awq", "gptq") and r.moe_backend in ("triton", "marlin") else "bf16"  # fmt: skip
    base_layer = base.layer if base is not None else LayerSpec()
    layer = {**base_layer.model_dump(), "all2all": all2all, "moe_backend": r.moe_backend, "quant": quant,
             "num_redundant_experts": max(0, E * D - facts.num_routed_experts), "expect": {}}  # fmt: skip
    data = {
        "name": (base.name if base is not None else None) or "deployment",
        "model": {"hidden_size": facts.hidden_size, "intermediate_size": I, "num_experts": facts.num_routed_experts,
                  "top_k": facts.top_k},
        "parallel": {"num_dispatchers": D, "num_ranks": D if D <= 1024 else 1, "num_local_experts": E,
                     "max_tokens_per_rank": r.moe_max_num_tokens or r.max_num_batched_tokens},
        "layer": layer,
    }  # fmt: skip
    return parse_scenario(data, path="deployment")


def scenario_deployment(scenario: Scenario) -> tuple[str, DeploymentSpec]:
    """The scenario's deployment: its `deployment:` section over what its layout says (EP over D dispatchers with
    E local experts, T tokens per step, its layer's all-to-all)."""
    spec = scenario.deployment or DeploymentSpec()
    model = spec.model or scenario.model.preset
    if model is None:
        raise ValueError("the scenario names no model preset; give deployment.model (a preset or a config directory)")
    tp = spec.tensor_parallel_size
    all2all = {"deepep-low-latency": "deepep_low_latency", "deepep-high-throughput": "deepep_high_throughput"}.get(
        scenario.layer.all2all, "allgather_reducescatter"
    )
    filled = spec.model_copy(update={
        "model": model,
        "data_parallel_size": spec.data_parallel_size or max(1, scenario.parallel.num_dispatchers // tp),
        "enable_expert_parallel": True if spec.enable_expert_parallel is None else spec.enable_expert_parallel,
        "all2all_backend": spec.all2all_backend or all2all,
        "moe_backend": spec.moe_backend or scenario.layer.moe_backend,
        "max_num_batched_tokens": spec.max_num_batched_tokens or scenario.parallel.max_tokens_per_rank,
    })  # fmt: skip
    return model, filled


def plan_release(facts: ModelFacts, spec: DeploymentSpec, version: str, *, gpu: str | Gpu | None, total_bytes: int,
                 cache_dir: Path | None = None, base: Scenario | None = None,
                 local_experts: int | None = None, origin: str = "flag") -> DeploymentPlan:  # fmt: skip
    """One release's plan; raises VllmSourceError when the release cannot be had."""
    from harness.sizing.vllm_source.sources import locate

    source = locate(version=version, cache_dir=cache_dir)
    return plan_source(facts, spec, source, gpu=gpu, total_bytes=total_bytes, base=base, local_experts=local_experts,
                       origin=origin)  # fmt: skip


def plan_source(facts: ModelFacts, spec: DeploymentSpec, source, *, gpu: str | Gpu | None, total_bytes: int,
                base: Scenario | None = None, local_experts: int | None = None, origin: str = "flag",
                version: str | None = None, cudagraph_estimate: bool | None = None,
                reads: ReleaseReads | None = None) -> DeploymentPlan:  # fmt: skip
    """The plan from a VllmSource (its defaults and its MoE layer), or from none: a dense model needs no release
    (defaults from the documented table, for `version`). `reads`: the release's parsed files and layer plans kept
    across calls (a layout search plans many candidates of one release; harness.sizing.search)."""
    files = layer_plan = None
    if source is not None:
        from harness.sizing.layer import plan_layer_from
        from harness.sizing.vllm_source.layer_source import release_files

        files = reads.files if reads is not None else release_files(source)
        version = source.version
    r = resolve(facts, spec, files, version, gpu_bytes=total_bytes, gpu=gpu, local_experts=local_experts,
                origin=origin, cudagraph_estimate=cudagraph_estimate)  # fmt: skip
    layer = layer_scenario(facts, r, base)
    if layer is not None:
        if source is None:
            raise ValueError(f"{facts.name} is an MoE model: its layer's workspace is read from a release")
        layer_plan = reads.layer_plan(layer) if reads is not None else plan_layer_from(layer, source)
    return plan_deployment(facts, r, layer_plan, version=version, gpu=gpu, total_bytes=total_bytes)


def plan_serve(model: str, spec: DeploymentSpec, versions: list[str], *, gpu: str | Gpu | None, total_bytes: int,
               cache_dir: Path | None = None) -> list[DeploymentPlan]:  # fmt: skip
    facts = load_model(model, dtype=spec.dtype, quantization=spec.quantization)
    check_parallel(facts, spec.tensor_parallel_size)
    return [plan_release(facts, spec, v, gpu=gpu, total_bytes=total_bytes, cache_dir=cache_dir) for v in versions]


def plan_serve_line(serve: list[str], versions: list[str], *, gpu: str | Gpu | None, total_bytes: int,
                    cache_dir: Path | None = None) -> tuple[list[DeploymentPlan], list[str]]:  # fmt: skip
    """Each release's plan of one `vllm serve` line, the line read with that release's own flags
    (harness.sizing.release_flags); and the flags listed as changing no GPU memory. Raises ServeArgsError for a
    flag or value the release does not take, VllmSourceError, ModelConfigError."""
    from harness.sizing.release_flags import read_flags
    from harness.sizing.serve_args import read_serve
    from harness.sizing.vllm_source.sources import locate

    plans, ignored = [], []
    for version in versions:
        source = locate(version=version, cache_dir=cache_dir)
        parsed = read_serve(serve, read_flags(source.root, source.version))
        estimate = parsed.env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
        facts = load_model(parsed.model, dtype=parsed.spec.dtype, quantization=parsed.spec.quantization)
        check_parallel(facts, parsed.spec.tensor_parallel_size)
        plans.append(
            plan_source(
                facts,
                parsed.spec,
                source,
                gpu=gpu,
                total_bytes=total_bytes,
                cudagraph_estimate=None if estimate is None else estimate.strip() not in ("0", ""),
            )
        )
        ignored += [flag for flag in parsed.ignored if flag not in ignored]
    return plans, ignored


def plan_scenario(scenario: Scenario, versions: list[str], *, gpu: str | Gpu | None, total_bytes: int,
                  cache_dir: Path | None = None, sources: Sequence[Any] = ()) -> list[DeploymentPlan]:  # fmt: skip
    """One plan per release version, then one per VllmSource given (a --vllm-wheel, a --vllm-src tree): each sized
    from what it was asked about, never from a cached release of the same version number."""
    model, spec = scenario_deployment(scenario)
    facts = load_model(model, dtype=spec.dtype, quantization=spec.quantization)
    check_parallel(facts, spec.tensor_parallel_size)
    local = scenario.num_local_experts if spec.enable_expert_parallel and spec.num_redundant_experts is None else None
    plans = [plan_release(facts, spec, v, gpu=gpu, total_bytes=total_bytes, cache_dir=cache_dir, base=scenario,
                          local_experts=local, origin="scenario") for v in versions]  # fmt: skip
    return plans + [plan_source(facts, spec, source, gpu=gpu, total_bytes=total_bytes, base=scenario,
                                local_experts=local, origin="scenario") for source in sources]  # fmt: skip


# --- output ---------------------------------------------------------------------------------------------------------


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f}"


def render_deployment(plan: DeploymentPlan) -> Any:
    from rich.table import Table

    s = {x.name: x.value for x in plan.settings}
    title = (f"{plan.model}: the deployment per GPU, vLLM {plan.vllm_version}, {plan.gpu or 'budget'} "
             f"({_gib(plan.total_bytes)} GiB)\nTP={s['tensor_parallel_size']} "
             f"{'PP=' + str(s['pipeline_parallel_size']) + ' ' if s.get('pipeline_parallel_size', 1) != 1 else ''}"
             f"DP={s['data_parallel_size']} "
             f"EP={'on' if s['enable_expert_parallel'] else 'off'} all2all={s['all2all_backend']} "
             f"max_num_batched_tokens={s['max_num_batched_tokens']} max_num_seqs={s['max_num_seqs']} "
             f"max_model_len={s['max_model_len']} gpu_memory_utilization={s['gpu_memory_utilization']}")  # fmt: skip
    table = Table(title=title, title_justify="left")
    for name, justify in (("group", "left"), ("component", "left"), ("bytes", "right"), ("GiB", "right"),
                          ("kind", "left"), ("source", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for line in plan.lines:
        if line.group == "kv-cache":
            table.add_row("", f"requested (total x {s['gpu_memory_utilization']})", str(plan.requested_bytes),
                          _gib(plan.requested_bytes), "exact", "v1/worker/gpu_worker.py: requested_memory",
                          style="bold")  # fmt: skip
            table.add_row("", "before the KV cache", str(plan.non_kv_bytes), _gib(plan.non_kv_bytes), "",
                          "sum of the lines above", style="bold")  # fmt: skip
        style = "yellow" if line.kind == "estimate" else ""
        table.add_row(line.group, line.name, str(line.bytes), _gib(line.bytes), line.kind, line.source, style=style)
    return table


def deployment_notes(plan: DeploymentPlan) -> list[str]:
    tables = [f"  {x.name} = {x.value}: {x.source}" for x in plan.settings if x.source.startswith("table")]
    return [
        *([f"model: {plan.model_source}"] if plan.model_source else []),
        f"KV cache: {plan.kv_bytes_per_token} B/token ({plan.kv_formula}); {plan.kv_tokens} tokens in "
        f"{plan.kv_num_blocks} blocks of {plan.block_size}; {plan.concurrency:.2f}x concurrency at "
        f"{plan.max_model_len} tokens",
        *(["defaults from a documented table (not read from this release's files):", *tables] if tables else []),
        *(
            [
                f"experts backend: {x.value} ({x.source})"
                for x in plan.settings
                if x.name == "moe_backend" and not x.source.startswith("table") and x.source not in ("flag", "scenario")
            ]
        ),
        f"vllm {plan.vllm_version} on {plan.gpu or 'the budget'}: {plan.verdict.text}",
        *(
            f"or, {o.name} (+{_gib(o.torch_peak_extra_bytes)} GiB torch peak): {o.kv_tokens} tokens of KV cache, "
            f"{o.concurrency:.2f}x concurrency; {o.verdict.outcome}. {o.reason}"
            for o in plan.other_outcomes
        ),
    ]


def what_it_buys(plans: list[DeploymentPlan]) -> list[str]:
    """Each release against the one before it: KV tokens and concurrency gained (or lost), and the verdicts."""
    lines = []
    for before, after in itertools.pairwise(plans):
        tokens = after.kv_tokens - before.kv_tokens
        concurrency = after.concurrency - before.concurrency
        lines.append(
            f"vllm {before.vllm_version} -> {after.vllm_version}: {before.verdict.outcome} -> "
            f"{after.verdict.outcome}; KV cache {before.kv_tokens} -> {after.kv_tokens} tokens ({tokens:+d}), "
            f"concurrency at {after.max_model_len} tokens {before.concurrency:.2f}x -> {after.concurrency:.2f}x "
            f"({concurrency:+.2f}x); memory before the KV cache {_gib(before.non_kv_bytes)} -> "
            f"{_gib(after.non_kv_bytes)} GiB")  # fmt: skip
    return lines
