"""Will this `vllm serve` start? The whole deployment's memory on one GPU for one release, and the verdict.

    vLLM (v1/worker/gpu_worker.py)                        here
    load_model: every layer's weights                     weights: deployment_weights (exact per tensor listed)
    the all-to-all manager's buffers (DeepEP)             held once: harness.sizing.layer (the release's source)
    EPLB's transfer buffer                                held once: one MoE layer's local expert weights
    profile_run at max_num_batched_tokens                 the MoE workspace (held once, two with DBO; the release's
                                                          workspace_shapes) + the rest of the activations (estimate)
    non-torch memory (NCCL, cuBLAS, ...)                  estimate
    CUDA-graph estimate (when the release's profiler      estimate
      VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on)
    requested = total x gpu_memory_utilization            total: the GPU's mem_get_info total
    KV cache = requested - all of the above               kv_cache (exact given the rest)
    after the KV cache: CUDA graphs (when not estimated), the sampler warm-up (max_num_seqs x vocab x 4 B)

Verdicts: `refused` (a library cap: DeepEP's), `oom` (the first component, in allocation order, that takes
the process over the GPU's physical memory), `fails` (the KV cache cannot hold one max_model_len request, or no
memory is left for it), `starts` (N tokens, W x concurrency at L tokens).
"""

from __future__ import annotations

import dataclasses
import math
import platform
from dataclasses import dataclass
from typing import Literal

import harness
from harness.core.records import Record
from harness.scenario.deployment import DeploymentSpec
from harness.sizing import profile_run
from harness.sizing import release_defaults as defaults
from harness.sizing.deployment_weights import Sharding, routed_experts_bytes, weight_lines
from harness.sizing.kv_cache import DEFAULT_BLOCK_SIZE, kv_cache, kv_shape
from harness.sizing.model_config import ModelFacts

DEPLOYMENT_PLAN_SCHEMA = 1
GIB = 2**30
# Estimates, each with its basis: vLLM 0.19.0's own profiler figures in the 14 published H100 startup logs of
# tests/data/startup_logs/ (llm-d-planner's validation runs; docs/deployment-memory.md lists them).
# Non-torch memory the profile sees grow after the worker's first snapshot: the cuBLAS and cuBLASLt handles and the
# kernels' modules loaded on first use on one GPU ("non-torch forward increase memory" 0.24-0.27 GiB at TP 1), NCCL
# and the custom all-reduce's buffers with more ranks (2.06-2.13 GiB at TP 2 and 4). The cuBLAS workspace itself
# goes through torch's allocator (harness.sizing.profile_run).
NON_TORCH_SINGLE_BYTES = int(0.25 * GIB)
NON_TORCH_MULTI_BYTES = int(2.1 * GIB)
# The profiler's CUDA-graph estimate ("Estimated CUDA graph memory: X GiB total"): 0.57-1.69 GiB, mean 0.94.
CUDAGRAPH_BYTES = 1 * GIB
# What vLLM divides by: torch.cuda.mem_get_info's total, a few hundred MiB under NVML's (GPU_MEMORY_BYTES), as
# vLLM and torch print it (to 0.01 GiB). Other GPUs fall back to NVML's total, labelled so.
DEVICE_TOTAL_GIB: dict[str, tuple[float, str]] = {
    "H100-80GB": (79.19, "vLLM 0.19.0's worker snapshot total_memory=79.19GiB (llm-d-planner's H100 logs)"),
    "H200-141GB": (139.81, "torch's 'GPU has a total capacity of 139.81 GiB' and vLLM's total_gpu_memory (139.81GiB) on "
                   "H200"),
}


def device_total(gpu: str, nvml_bytes: int) -> tuple[int, str]:
    """(bytes, source) of the total vLLM sees on this GPU."""
    if gpu in DEVICE_TOTAL_GIB:
        gib, source = DEVICE_TOTAL_GIB[gpu]
        return round(gib * GIB), f"table: {source}"
    return nvml_bytes, "table: NVML's total (vLLM sees torch.cuda.mem_get_info's, a few hundred MiB less)"


Kind = Literal["exact", "release", "estimate"]


class DeploymentLine(Record):
    """One component of the deployment on one GPU."""

    group: Literal["weights", "held-once", "profile-peak", "non-torch", "cuda-graphs", "kv-cache", "after-kv"]
    name: str
    bytes: int
    kind: Kind  # exact: a formula over the config's facts; release: read from the release's source; estimate
    source: str


class Setting(Record):
    name: str
    value: int | float | str | bool
    source: str  # "flag", "scenario", a release file:line, or "table: ..."


class Verdict(Record):
    outcome: Literal["starts", "fails", "oom", "refused", "unknown"]
    component: str | None = None
    text: str


class DeploymentPlan(Record):
    """`harness plan` for a deployment: per GPU, one release. Plain ints are bytes."""

    schema_version: int = DEPLOYMENT_PLAN_SCHEMA
    kind: Literal["deployment-plan"] = "deployment-plan"
    harness_version: str
    python_version: str
    model: str
    vllm_version: str | None
    gpu: str | None
    total_bytes: int
    settings: list[Setting]
    lines: list[DeploymentLine]
    requested_bytes: int
    non_kv_bytes: int
    kv_bytes_per_token: int
    kv_formula: str
    kv_cache_bytes: int
    kv_tokens: int
    kv_num_blocks: int
    block_size: int
    max_model_len: int
    concurrency: float
    verdict: Verdict

    def setting(self, name: str) -> object:
        return next(s.value for s in self.settings if s.name == name)

    def group_bytes(self, group: str) -> int:
        return sum(line.bytes for line in self.lines if line.group == group)

    def line(self, name: str) -> DeploymentLine | None:
        return next((line for line in self.lines if line.name == name), None)


@dataclass(frozen=True)
class Resolved:
    """The serve settings after defaults, each with where it came from."""

    tp: int
    dp: int
    ep: bool
    all2all: str
    moe_backend: str
    utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    kv_cache_dtype: str
    num_redundant_experts: int
    local_experts: int
    dbo: bool
    eager: bool
    cudagraph_estimate: bool
    settings: tuple[Setting, ...]

    @property
    def ep_size(self) -> int:
        return self.tp * self.dp if self.ep else 1


def resolve(facts: ModelFacts, spec: DeploymentSpec, files, version: str | None, *, gpu_bytes: int,
            gpu: str | None, local_experts: int | None = None, origin: str = "flag",
            cudagraph_estimate: bool | None = None) -> Resolved:  # fmt: skip
    """Defaults filled from the release (files: its ReleaseFiles) or, where it does not say or no release is at
    hand (files None), the documented table; `origin` names where the given settings came from (flag, scenario);
    cudagraph_estimate: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS as the environment sets it, when known."""
    settings: list[Setting] = []

    def pick(name: str, given: object, default: defaults.Default | None = None) -> object:
        if given is not None:
            settings.append(Setting(name=name, value=given, source=origin))  # type: ignore[arg-type]
            return given
        assert default is not None
        settings.append(Setting(name=name, value=default.value, source=default.source))  # type: ignore[arg-type]
        return default.value

    tp = int(pick("tensor_parallel_size", spec.tensor_parallel_size))
    dp = int(pick("data_parallel_size", spec.data_parallel_size or 1))
    ep = bool(pick("enable_expert_parallel", spec.enable_expert_parallel or False)) and tp * dp > 1
    all2all = str(pick("all2all_backend", spec.all2all_backend, defaults.all2all_backend(files)))
    backend_default = defaults.Default("cutlass", "table: the layer model's experts family for FP8 checkpoints") if \
        facts.quant_method == "fp8" else defaults.Default("triton", "table: unquantized MoE runs the Triton experts (\"Using "
                                                 "TRITON backend for Unquantized MoE\")")  # fmt: skip
    moe_backend = str(pick("moe_backend", spec.moe_backend, backend_default))
    utilization = float(pick("gpu_memory_utilization", spec.gpu_memory_utilization,  # type: ignore[arg-type]
                             defaults.gpu_memory_utilization(files, version)))  # fmt: skip
    max_len_default = defaults.Default(facts.max_position_embeddings or 0, f"{facts.ref('max_position_embeddings')}")
    max_model_len = int(pick("max_model_len", spec.max_model_len, max_len_default))  # type: ignore[arg-type]
    batched = defaults.uses_batched_dp_moe(all2all, ep, dp)
    tokens = int(pick("max_num_batched_tokens", spec.max_num_batched_tokens,  # type: ignore[arg-type]
                      defaults.max_num_batched_tokens(files, batched_dp=batched, gpu_bytes=gpu_bytes, gpu=gpu)))  # fmt: skip
    seqs_default = defaults.max_num_seqs(gpu_bytes, gpu)
    if spec.max_num_seqs is None and seqs_default.value > tokens:  # type: ignore[operator]
        seqs_default = defaults.Default(tokens, f"{seqs_default.source}, capped at max_num_batched_tokens")
    seqs = int(pick("max_num_seqs", spec.max_num_seqs, seqs_default))  # type: ignore[arg-type]
    block = int(pick("block_size", spec.block_size, defaults.Default(
        DEFAULT_BLOCK_SIZE, "table: CacheConfig.DEFAULT_BLOCK_SIZE 16 (FlashAttention, and FlashAttention MLA "
        "on Hopper; --block-size 64 for FlashMLA)")))  # type: ignore[arg-type]  # fmt: skip
    kv_dtype = str(pick("kv_cache_dtype", spec.kv_cache_dtype))
    redundant = spec.num_redundant_experts or 0
    if facts.is_moe and ep:
        physical = facts.num_routed_experts + redundant
        computed = local_experts or math.ceil(physical / (tp * dp))
        settings.append(Setting(name="local_experts", value=computed, source=origin if local_experts else
                                f"ceil(({facts.num_routed_experts} routed + {redundant} redundant) / EP {tp * dp})"))  # fmt: skip
        if local_experts:
            redundant = max(0, local_experts * tp * dp - facts.num_routed_experts)
    else:
        computed = facts.num_routed_experts
    settings.append(Setting(name="num_redundant_experts", value=redundant, source=origin))
    estimate = defaults.estimates_cudagraphs(files, version)
    if cudagraph_estimate is not None:
        estimate = defaults.Default(cudagraph_estimate, f"{defaults.CUDAGRAPH_ENV}={int(cudagraph_estimate)}")
    runner = defaults.v2_runner_without_estimate(facts.architecture, facts.is_moe, version)
    if runner is not None and estimate.value:
        estimate = defaults.Default(False, runner)
    cudagraph = bool(estimate.value) and not spec.enforce_eager
    settings.append(Setting(name="cudagraph_memory_estimate", value=cudagraph,
                            source="--enforce-eager" if spec.enforce_eager else estimate.source))  # fmt: skip
    settings.append(Setting(name="enable_dbo", value=spec.enable_dbo, source=origin))
    settings.append(Setting(name="enforce_eager", value=spec.enforce_eager, source=origin))
    return Resolved(tp=tp, dp=dp, ep=ep, all2all=all2all, moe_backend=moe_backend, utilization=utilization,
                    max_model_len=max_model_len, max_num_batched_tokens=tokens, max_num_seqs=seqs, block_size=block,
                    kv_cache_dtype=kv_dtype, num_redundant_experts=redundant, local_experts=computed,
                    dbo=spec.enable_dbo, eager=spec.enforce_eager, cudagraph_estimate=cudagraph,
                    settings=tuple(settings))  # fmt: skip


def sharding_of(facts: ModelFacts, r: Resolved) -> Sharding:
    """EP: whole experts, E per GPU; without EP the experts' intermediate is split over TP x DP (FusedMoE)."""
    return Sharding(tp=r.tp, moe_tp=1 if r.ep else r.tp * r.dp, local_experts=r.local_experts)


def plan_deployment(facts: ModelFacts, r: Resolved, layer_plan, *, version: str | None, gpu: str | None,
                    total_bytes: int, layer_lines: list[DeploymentLine] = ()) -> DeploymentPlan:  # fmt: skip
    """layer_plan: the MoE layer's LayerPlan for this release at the deployment's layout (None for dense, or
    without a release: then `layer_lines` give the MoE layer's buffers)."""
    sharding = sharding_of(facts, r)
    lines = [DeploymentLine(group="weights", name=w.name, bytes=w.bytes, kind="exact", source=w.source)
             for w in weight_lines(facts, sharding)]  # fmt: skip
    lines += [line for line in layer_lines if line.group != "profile-peak"]
    lines += held_once_lines(facts, r, sharding, layer_plan)
    lines += profile_lines(facts, r, layer_plan, gpu, layer_lines)
    multi = r.tp * r.dp > 1
    lines.append(DeploymentLine(
        group="non-torch", name="non-torch memory", bytes=NON_TORCH_MULTI_BYTES if multi else NON_TORCH_SINGLE_BYTES,
        kind="estimate", source="estimate: cuBLAS handles, loaded kernel modules"
        f"{', NCCL and custom all-reduce buffers' if multi else ''}; "
        "basis: published logs' non_torch_memory (docs/deployment-memory.md)"))  # fmt: skip
    if r.cudagraph_estimate:
        lines.append(DeploymentLine(group="cuda-graphs", name="CUDA-graph estimate", bytes=CUDAGRAPH_BYTES,
                                    kind="estimate", source=f"estimate: the profiler's graph-pool estimate "
                                    f"({_setting_source(r, 'cudagraph_memory_estimate')} on); basis: published "
                                    "logs (docs/deployment-memory.md)"))  # fmt: skip
    table = DEVICE_TOTAL_GIB.get(gpu or "")
    total_source = device_total(gpu or "", total_bytes)[1] if table and round(table[0] * GIB) == total_bytes else \
        "given: --budget-gb, or the GPU's NVML total"  # fmt: skip
    r = dataclasses.replace(r, settings=(*r.settings, Setting(name="gpu_total_bytes", value=total_bytes,
                                                                 source=total_source)))  # fmt: skip
    requested = int(total_bytes * r.utilization)
    non_kv = sum(line.bytes for line in lines)
    shape = kv_shape(facts, r.tp, r.kv_cache_dtype)
    cache = kv_cache(shape, requested - non_kv, r.block_size, r.max_model_len, r.max_num_batched_tokens)
    kv_bytes = cache.bytes
    hybrid = (f" in {cache.groups} groups of {cache.group_size} layers (hybrid KV cache manager)"
              if cache.group_size else "")  # fmt: skip
    lines.append(DeploymentLine(group="kv-cache", name="KV cache", bytes=kv_bytes, kind="exact",
                                source=f"{cache.num_blocks} blocks x {cache.block_size} tokens{hybrid} x "
                                f"{shape.bytes_per_token} B/token: {shape.formula}"))  # fmt: skip
    sampler = r.max_num_seqs * facts.vocab_size * 4
    lines.append(DeploymentLine(group="after-kv", name="sampler warm-up", bytes=sampler, kind="exact",
                                source=f"max_num_seqs {r.max_num_seqs} x vocab {facts.vocab_size} x 4 B (f32 logits, "
                                "v1/worker/gpu_worker.py compile_or_warm_up_model)"))  # fmt: skip
    verdict = _verdict(lines, layer_plan, total_bytes, requested, cache, r)
    return DeploymentPlan(
        harness_version=harness.__version__, python_version=platform.python_version(), model=facts.name,
        vllm_version=version, gpu=gpu, total_bytes=total_bytes, settings=list(r.settings), lines=lines,
        requested_bytes=requested, non_kv_bytes=non_kv, kv_bytes_per_token=shape.bytes_per_token,
        kv_formula=shape.formula, kv_cache_bytes=kv_bytes, kv_tokens=cache.tokens, kv_num_blocks=cache.num_blocks,
        block_size=cache.block_size, max_model_len=r.max_model_len, concurrency=cache.concurrency, verdict=verdict,
    )  # fmt: skip


def _setting_source(r: Resolved, name: str) -> str:
    return next(s.source for s in r.settings if s.name == name)


def held_once_lines(facts: ModelFacts, r: Resolved, sharding: Sharding, layer_plan) -> list[DeploymentLine]:
    lines = []
    if layer_plan is not None:
        for name in ("deepep-nvl", "deepep-workspace", "deepep-rdma"):
            c = layer_plan.component(name)
            if c is not None and c.bytes is not None:
                lines.append(DeploymentLine(group="held-once", name=name, bytes=c.bytes, kind="release",
                                            source=f"{c.source} (one Buffer per process, every MoE layer)"))  # fmt: skip
        workspace = layer_plan.component("workspace")
        if workspace is not None and workspace.bytes is not None:
            copies = 2 if r.dbo else 1
            lines.append(DeploymentLine(
                group="held-once", name="moe-workspace", bytes=workspace.bytes * copies, kind="release",
                source=f"{workspace.source}; one for every layer (fused_moe/modular_kernel.py: "
                f"current_workspace_manager){', x 2 micro-batches (--enable-dbo)' if r.dbo else ''}; "
                f"allocated in the profile run, kept"))  # fmt: skip
    if r.num_redundant_experts or (facts.is_moe and r.ep and _eplb(r)):
        one_layer, _ = routed_experts_bytes(facts, sharding)
        lines.append(DeploymentLine(group="held-once", name="eplb-transfer-buffer", bytes=one_layer, kind="estimate",
                                    source="estimate: EPLB rearranges one layer at a time through a buffer of one "
                                    "layer's local expert weights (distributed/eplb)"))  # fmt: skip
    return lines


def _eplb(r: Resolved) -> bool:
    return any(s.name == "num_redundant_experts" and s.value for s in r.settings)


def profile_lines(facts: ModelFacts, r: Resolved, layer_plan, gpu: str | None = None,
                  layer_lines: list[DeploymentLine] = ()) -> list[DeploymentLine]:  # fmt: skip
    """The profile run's torch peak beyond the weights and the held-once buffers (harness.sizing.profile_run): the
    cuBLAS workspace, kept from the first GEMM, and the larger of two phases: the dummy forward of
    max_num_batched_tokens tokens (per DP rank) with DeepEP's receive tensors, and the dummy sampler over
    min(N, max_num_seqs) logits. The receive tensors are a line of their own (the run allocates them); the
    activations line is the larger phase less them."""
    N, tp = r.max_num_batched_tokens, r.tp  # noqa: N806
    lines = [line for line in layer_lines if line.group == "profile-peak"]
    if layer_plan is not None:
        recv = sum((c.bytes or 0) for c in layer_plan.components if c.name in ("dispatch-recv", "dispatch-quant"))
        if recv:
            lines.append(DeploymentLine(group="profile-peak", name="dispatch receive", bytes=recv, kind="release",
                                        source=f"{layer_plan.component('dispatch-recv').source}; one layer's at a "
                                        "time, in the forward"))  # fmt: skip
    recv = sum(line.bytes for line in lines if line.name == "dispatch receive")
    cublas, cublas_source = profile_run.cublas_workspace(gpu)
    lines.append(DeploymentLine(group="profile-peak", name="cuBLAS workspace", bytes=cublas, kind="estimate",
                                source=cublas_source))  # fmt: skip
    forward = profile_run.forward_phase(facts, num_tokens=N, tp=tp, dispatch_recv=recv)
    sampler = profile_run.sampler_phase(facts, num_tokens=N, max_num_seqs=r.max_num_seqs, tp=tp, gpu=gpu)
    in_sampler = sampler.bytes >= forward.bytes
    _, _, gpu_source = profile_run.gpu_facts(gpu)
    lines.append(DeploymentLine(
        group="profile-peak", name="activations", bytes=max(forward.bytes, sampler.bytes) - recv,
        kind="exact" if in_sampler else "estimate",
        source=f"peak in the {'dummy sampler' if in_sampler else 'forward pass'}: max({forward.detail}; "
        f"{sampler.detail}){' less the dispatch receive above' if recv else ''}; vLLM 0.19.0's profile_run "
        f"(harness/sizing/profile_run.py); {gpu_source}"))  # fmt: skip
    return lines


def _verdict(lines: list[DeploymentLine], layer_plan, total: int, requested: int, cache, r: Resolved) -> Verdict:
    if layer_plan is not None:
        refused = next((c for c in layer_plan.components if {"over-cap", "under-sized"} & set(c.verdicts)), None)
        if refused is not None:
            cap = (refused.cap_bytes or 0) / GIB
            return Verdict(outcome="refused", component=refused.name,
                           text=f"refused: {refused.name} {(refused.bytes or 0) / GIB:.2f} GiB is over DeepEP's cap "
                           f"of {cap:.2f} GiB" if "over-cap" in refused.verdicts else
                           f"refused: {refused.name} is smaller than dispatch needs (DeepEP asserts)")  # fmt: skip
        unknown = next((c for c in layer_plan.components if c.bytes is None), None)
        if unknown is not None:
            return Verdict(outcome="unknown", component=unknown.name,
                           text=f"unknown: {unknown.name} was not evaluated ({unknown.detail[:160]})")  # fmt: skip
    running = 0
    for line in lines:
        if line.group in ("kv-cache", "after-kv"):
            continue
        running += line.bytes
        if running > total:
            return Verdict(outcome="oom", component=line.name,
                           text=f"OOM at {line.name}: {line.bytes / GIB:.2f} GiB takes the GPU to {running / GIB:.2f} "
                           f"GiB of its {total / GIB:.2f} GiB")  # fmt: skip
    non_kv = running
    if non_kv >= requested:
        return Verdict(outcome="fails", component="KV cache",
                       text=f"fails: no memory left for the KV cache ({non_kv / GIB:.2f} GiB before it, over the "
                       f"{requested / GIB:.2f} GiB requested at gpu_memory_utilization {r.utilization})")  # fmt: skip
    if not cache.holds_one_request:
        return Verdict(outcome="fails", component="KV cache",
                       text=f"fails: the KV cache cannot hold one request of {r.max_model_len} tokens "
                       f"({cache.tokens} tokens in {cache.available_bytes / GIB:.2f} GiB)")  # fmt: skip
    sampler = next(line for line in lines if line.name == "sampler warm-up")
    transient = sum(line.bytes for line in lines if line.group == "profile-peak" and line.name == "activations")
    after = requested + max(0, sampler.bytes - transient)
    if after > total:
        return Verdict(outcome="oom", component=sampler.name,
                       text=f"OOM at sampler warm-up: {sampler.bytes / GIB:.2f} GiB after the KV cache takes the GPU "
                       f"to {after / GIB:.2f} GiB of {total / GIB:.2f} GiB")  # fmt: skip
    return Verdict(outcome="starts", text=f"starts: {cache.tokens} tokens of KV cache, {cache.concurrency:.2f}x "
                   f"concurrency at {r.max_model_len} tokens")  # fmt: skip
