"""Will this `vllm serve` start? The whole deployment's memory on one GPU for one release, and the verdict.

    vLLM (v1/worker/gpu_worker.py)                        here
    load_model: every layer's weights                     weights: deployment_weights (exact per tensor listed)
    the all-to-all manager's buffers (DeepEP)             held once: harness.sizing.layer (the release's source)
    EPLB's transfer buffer                                held once: one MoE layer's local expert weights
    profile_run at max_num_batched_tokens                 the MoE workspace (held once, two with DBO; the release's
                                                          workspace_shapes) + the rest of the activations (estimate)
    non-torch memory (NCCL, cuBLAS, ...)                  estimate
    CUDA-graph estimate (when the release's profiler      the V1 runner's: harness.sizing.cudagraph_memory (graph
      VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on)     counts exact, each capture an estimate); else 1 GiB
    requested = total x gpu_memory_utilization            total: the GPU's mem_get_info total
    KV cache = requested - all of the above               kv_cache (exact given the rest)
    after the KV cache: CUDA graphs (when not estimated), the sampler warm-up (max_num_seqs x vocab x 4 B)

Verdicts: `refused` (a library cap: DeepEP's), `oom` (the first component, in allocation order, that takes
the process over the GPU's physical memory), `fails` (the KV cache cannot hold one max_model_len request, or no
memory is left for it), `starts` (N tokens, W x concurrency at L tokens).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

import harness
from harness.core.records import Record
from harness.core.units import GIB, round_up
from harness.scenario.deployment import DeploymentSpec
from harness.sizing import gpus, mm_encoder, profile_run
from harness.sizing import release_defaults as defaults
from harness.sizing.deployment_weights import Sharding, experts_intermediate, routed_experts_bytes, weight_lines
from harness.sizing.gpus import Gpu
from harness.sizing.kv_cache import default_block_size, in_flight_tokens, kv_cache, kv_shape, tokens_from_concurrency
from harness.sizing.model_config import ModelFacts
from harness.sizing.quant_formats import Quant

DEPLOYMENT_PLAN_SCHEMA = 4  # 2: group_totals and approximate; 3: model_source; 4: other_outcomes
# Estimates, each with its basis: vLLM 0.19.0's own profiler figures in the 14 published H100 startup logs of
# tests/data/startup_logs/ (llm-d-planner's validation runs; docs/deployment-memory.md lists them).
# Non-torch memory the profile sees grow after the worker's first snapshot: the cuBLAS and cuBLASLt handles and the
# kernels' modules loaded on first use on one GPU ("non-torch forward increase memory" 0.24-0.27 GiB at TP 1), NCCL
# and the custom all-reduce's buffers with more ranks (2.06-2.13 GiB at TP 2 and 4). The cuBLAS workspace itself
# goes through torch's allocator (harness.sizing.profile_run).
NON_TORCH_SINGLE_BYTES = int(0.25 * GIB)
NON_TORCH_MULTI_BYTES = int(2.1 * GIB)
NON_TORCH_PP_BYTES = int(0.07 * GIB)
# The cuBLAS handle's own memory outside torch's allocator, made by the first GEMM through cuBLAS: 66 MiB on an H200
# (torch 2.11.0+cu130, results/h200/cublas-nontorch). A model none of whose GEMMs runs through cuBLAS in the profile
# never makes it: vLLM 0.26.0's fully quantized ModelOpt startups log 0.16 GiB where the others log 0.22-0.24.
CUBLAS_HANDLE_BYTES = 66 * 2**20
# The profiler's CUDA-graph estimate ("Estimated CUDA graph memory: X GiB total"): 0.57-1.69 GiB, mean 0.94.
CUDAGRAPH_BYTES = 1 * GIB


# The totals vLLM printed in the startup logs this project holds (tests/data/startup_logs, tests/data/real_startups),
# by GPU: a log names no GPU, its total tells an H100 from an H200 (harness.verify.planning.gpu_from_total). The
# values are the GPU table's (harness.sizing.gpus).
DEVICE_TOTAL_GIB: dict[str, tuple[float, str]] = {
    name: (round(gpus.lookup(name).total_bytes / GIB, 2), gpus.lookup(name).source)
    for name in ("H100-80GB", "H200-141GB")
}


def device_total(gpu: str | Gpu, nvml_bytes: int | None = None) -> tuple[int, str]:
    """(bytes, source) of the total vLLM sees on this GPU: the GPU table's row (harness.sizing.gpus)."""
    row = gpus.resolve(gpu)
    if row is not None:
        kind = "" if row.total_is_measured else f" ({row.total_kind}: torch's total is a few hundred MiB less)"
        return row.total_bytes, f"table: {row.source}{kind}"
    if nvml_bytes is None:
        raise gpus.UnknownGpuError(f"--gpu {str(gpu)[:40]!r} is not a known GPU")
    return nvml_bytes, "table: NVML's total (vLLM sees torch.cuda.mem_get_info's, a few hundred MiB less)"


def non_torch_bytes(tp: int, gpu: str | Gpu | None, *, pp: int = 1, dp: int = 1, moe: bool = True) -> tuple[int, str]:
    """The memory outside torch the profile sees grow: on one GPU the cuBLAS/cuBLASLt handles and the kernels'
    modules (0.24-0.27 GiB in the single-GPU logs); with more ranks on NVLink, NCCL's NVLink/NVLS channel buffers and
    vLLM's custom all-reduce IPC buffers (2.06-2.13 GiB at TP 2 and 4 on H100 SXM); on PCIe machines custom
    all-reduce is off beyond two GPUs (custom_all_reduce.py: not fully NVLink-connected) and NCCL's P2P/SHM buffers
    are small: the 0.20 GiB logged at TP 4 on 24 GB PCIe cards (github.com/vllm-project/vllm/pull/14447) is the
    single-GPU term."""
    row = gpus.resolve(gpu)
    link = row.interconnect if row is not None else "nvlink"
    basis = "basis: published logs' non_torch_memory (docs/deployment-memory.md)"
    # the ranks whose forward runs NCCL collectives together: the TP group, and the DP ranks of an MoE model (its
    # experts' all-to-all); the DP ranks of a dense model are independent engines
    world_size = tp * (dp if moe else 1)
    if tp == 1 and pp > 1 and world_size == 1:
        # pipeline stages exchange activations point to point: the NCCL communicators are made before the worker's
        # first snapshot, and the profile sees 0.07 GiB grow at PP 2 and PP 4 (llm-d-planner's H100 logs)
        return NON_TORCH_PP_BYTES, f"estimate: pipeline stages (TP 1): kernel modules, NCCL p2p; {basis}"
    if world_size <= 1:
        return NON_TORCH_SINGLE_BYTES, f"estimate: cuBLAS handles, loaded kernel modules; {basis}"
    if link == "pcie":
        return NON_TORCH_SINGLE_BYTES, (f"estimate: cuBLAS handles, loaded kernel modules; {world_size} ranks on PCIe: "
                                        "no custom all-reduce buffers, small NCCL P2P/SHM buffers; basis: 0.20 GiB at "
                                        "TP 4 on PCIe (vllm-project/vllm/pull/14447)")  # fmt: skip
    return NON_TORCH_MULTI_BYTES, (f"estimate: cuBLAS handles, loaded kernel modules, NCCL's NVLink buffers and custom "
                                   f"all-reduce buffers ({world_size} ranks on NVLink{'' if row else ', assumed'}); "
                                   f"{basis}")  # fmt: skip


def profile_skips_cublas(facts: ModelFacts) -> bool:
    """Whether no GEMM of the profile run goes through cuBLAS: every linear, the lm_head included, built by the
    checkpoint format's own kernels (CUTLASS, Marlin, Machete: a format that quantizes the lm_head and ignores no
    module), no MLA (its absorbed batched matmuls), no vision tower and no linear-attention layers."""
    q = facts.quant
    return (q is not None and q.lm_head and not q.ignore and q.dense_linears and not q.experts_only
            and not facts.tie_word_embeddings and not facts.kv_lora_rank and facts.vision is None
            and "linear" not in facts.layer_kinds)  # fmt: skip


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


class PlanOutcome(Record):
    """Another startup the same serve line can get on the same release, with its own figures: the release leaves
    which one to chance (the first MoE call's frames kept to the end of the profile run or not)."""

    name: str
    reason: str
    torch_peak_extra_bytes: int  # over the plan's torch peak
    non_kv_bytes: int
    kv_cache_bytes: int
    kv_tokens: int
    concurrency: float
    verdict: Verdict


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
    # bytes per group (weights, held-once, profile-peak, non-torch, cuda-graphs, kv-cache, after-kv)
    group_totals: dict[str, int] = Field(default_factory=dict)
    # why the plan is approximate: flags or GPU facts that change memory and are not modelled
    approximate: list[str] = Field(default_factory=list)
    # how the serve line's model was read where its path is not on this machine (a preset its name names)
    model_source: str = ""
    # the other startups the release can make of this line (PlanOutcome): the plan's own figures are the first's
    other_outcomes: list[PlanOutcome] = Field(default_factory=list)

    def setting(self, name: str) -> object:
        return next(s.value for s in self.settings if s.name == name)

    def group_bytes(self, group: str) -> int:
        return sum(line.bytes for line in self.lines if line.group == group)

    def line(self, name: str) -> DeploymentLine | None:
        return next((line for line in self.lines if line.name == name), None)

    @property
    def starts_every_time(self) -> bool:
        """The verdict is `starts` in the plan's own startup and in every other outcome the release can make."""
        return self.verdict.outcome == "starts" and all(o.verdict.outcome == "starts" for o in self.other_outcomes)


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
    pp: int = 1
    moe_max_num_tokens: int = 0  # FusedMoEConfig.max_num_tokens: T of the MoE layer (0: max_num_batched_tokens)
    cudagraphs: bool = True  # graphs captured at all (no: --enforce-eager, -O0, cudagraph_mode NONE)
    workspace_persistent: bool = True
    # The release resolves DeepGEMM while an FP8 model is built (release_defaults.deep_gemm_workspace_at_load)
    deep_gemm_at_load: bool = False
    # The allocator's max_split_size while the release loads the model (release_defaults.load_max_split_size)
    load_max_split: int | None = None
    mxfp4_scales_kept: bool = True  # the Triton MXFP4 backend keeps the loaded block scales beside the swizzled ones
    # The Triton MXFP4 backend's (value rows x bytes, scale-group multiple) on this GPU, read from the release's files
    # where given (release_defaults.mxfp4_hopper_padding); None: asked of the table when planned
    mxfp4_padding: tuple[tuple[int, int], int] | None = None
    # the checkpoint format as this release builds it (ModelOpt's ignore key and lm_head, GPTQ's listed layers);
    # None: the model facts' own
    quant: Quant | None = None
    kv_cache_memory_bytes: int | None = None
    cpu_offload_bytes: int = 0
    max_model_len_auto: bool = False
    approximate: tuple[str, ...] = ()
    gpu: Gpu | None = None
    vision_tower: bool = True  # a multimodal model's vision tower built (no: every image limit at 0)
    image_limit: int = 999  # --limit-mm-per-prompt's image count (config/multimodal.py: 999 if not given)
    # The monolithic experts class vLLM runs (and why), which allocates its buffers in each call instead of a modular
    # workspace; "" for a modular experts class.
    monolithic_experts: str = ""
    # The profile run's first MoE call can keep its frames to the run's end (release_defaults.first_moe_call_kept,
    # on a model whose router takes vLLM's fused grouped top-k op): the plan gives that startup as another outcome
    first_moe_call_kept: bool = False
    # The (N, K) copies of the normed hidden states the compiled MoE piece hands the MoE op
    # (release_defaults.moe_op_hidden_inputs); 0: not read, a compiled MLA model's MoE point stays an estimate
    moe_op_inputs: int = 0
    # envs.py VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (release_defaults.shared_experts_stream_threshold)
    shared_stream_threshold: int = profile_run.SHARED_EXPERTS_STREAM_TOKENS
    # vLLM 0.26.0's V2 model runner (release_defaults.v2_runner_without_estimate), whose profile_run skips attention
    # and samples through its own sampler (harness.sizing.profile_run.v2_sampler_phase)
    v2_runner: bool = False
    # The model is torch.compile'd in the profile run (not --enforce-eager): Inductor's first compile tunes its
    # kernels there (harness.sizing.profile_run.compile_phase); `combo_benchmark`: the release sets Inductor's
    # benchmark_combo_kernel (release_defaults.benchmarks_combo_kernels)
    compiled: bool = False
    combo_benchmark: bool = False
    # The V1 runner's CUDA-graph estimate as harness.sizing.cudagraph_memory models it (None: the flat estimate)
    cudagraph_bytes: int | None = None
    cudagraph_detail: str = ""
    # the same estimate for other facts (a pipeline stage's layers): facts -> (bytes, detail)
    cudagraph_for: Callable[[ModelFacts], tuple[int | None, str]] | None = None

    @property
    def ep_size(self) -> int:
        return self.tp * self.dp if self.ep else 1

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def num_dispatchers(self) -> int:
        """The ranks whose tokens fill the MoE layer's M under EP: the EP group for the batched all-to-alls
        (num_dispatchers=all2all_manager.world_size), the DP group for the all-gather dispatch (moe_workspace)."""
        if not self.ep:
            return 1
        return self.dp if self.all2all in GATHER_ALL2ALL else self.tp * self.dp


def _graph_flags(spec: DeploymentSpec) -> list[str]:
    """The graph settings a plan without the modelled estimate does not size."""
    out = []
    if spec.cudagraph_mode is not None and spec.cudagraph_mode != "NONE":
        out.append("--compilation-config's CUDA-graph settings are not sized (the graph estimate is the default's)")
    for value, option in ((spec.cudagraph_capture_sizes, "--cudagraph-capture-sizes"),
                          (spec.max_cudagraph_capture_size, "--max-cudagraph-capture-size")):  # fmt: skip
        if value is not None:
            out.append(f"{option}: the graph pool for other capture sizes is not sized (the estimate is the "
                       "default's)")  # fmt: skip
    return out


def _graph_estimate(facts: ModelFacts, *, spec: DeploymentSpec, files, version: str | None, tp: int, seqs: int,
                    tokens: int, gpu: Gpu | None, modelled: bool, threshold: defaults.Default,
                    monolithic: str = "", mla_rows: int = 0) -> tuple[int | None, str]:  # fmt: skip
    """(bytes, detail) of the V1 runner's CUDA-graph estimate where the release makes it and subtracts it
    (harness.sizing.cudagraph_memory); (None, why) where the plan keeps the flat estimate."""
    from harness.sizing import cudagraph_memory

    if not modelled:
        return None, "no estimate subtracted"
    has = defaults.v1_graph_estimate(version)
    if not has.value:
        return None, has.source
    splits = defaults.flash_attn_max_splits(files)
    exec_pages = defaults.graph_exec_pages(version)
    experts_call = graph_experts_call(facts, tp) if monolithic else None
    found = cudagraph_memory.estimate(facts, tp=tp, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                                      mode=spec.cudagraph_mode, max_capture=spec.max_cudagraph_capture_size,
                                      sizes=spec.cudagraph_capture_sizes, gpu=gpu, max_splits=int(str(splits.value)),
                                      shared_stream_threshold=int(str(threshold.value)),
                                      kv_cache_dtype=spec.kv_cache_dtype,
                                      exec_pages=bool(exec_pages.value), experts_call=experts_call,
                                      mla_rows=mla_rows)  # fmt: skip
    why = (
        f"{has.source}; splits {splits.source}; shared-experts stream threshold {threshold.source}; "
        f"graph exec {exec_pages.source}"
    )
    return found.total, f"{found.detail} ({why})"


def resolve(facts: ModelFacts, spec: DeploymentSpec, files, version: str | None, *, gpu_bytes: int,
            gpu: str | Gpu | None, local_experts: int | None = None, origin: str = "flag",
            cudagraph_estimate: bool | None = None) -> Resolved:  # fmt: skip
    """Defaults filled from the release (files: its ReleaseFiles) or, where it does not say or no release is at
    hand (files None), the documented table; `origin` names where the given settings came from (flag, scenario);
    cudagraph_estimate: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS as the environment sets it, when known."""
    settings: list[Setting] = []

    def pick(name: str, given: object, default: defaults.Default | None = None) -> Any:
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
    row = gpus.resolve(gpu)
    approximate = list(spec.approximate)
    approximate += _format_flags(facts, spec)
    if ep and facts.is_moe and all2all not in SIZED_ALL2ALL:
        approximate.append(f"--all2all-backend {all2all}: its buffers are not sized (the all-gather path's are used)")
    family = _experts_family(spec.moe_backend, approximate if facts.is_moe else [])
    backend_default = default_experts_backend(facts, row)
    if family is None:  # the release's own selection, where it has one (harness.sizing.moe_selection)
        from harness.sizing.moe_selection import default_backend

        backend_default = default_backend(facts, files, gpu=row, tp=tp, dp=dp, ep=ep, all2all=all2all,
                                          fallback=backend_default)  # fmt: skip
    moe_backend = str(pick("moe_backend", family, backend_default))
    monolithic = _monolithic_experts(facts, files, row, moe_backend, dp=dp, eplb=bool(spec.enable_eplb))
    gpu = gpus.label(gpu)
    utilization = float(pick("gpu_memory_utilization", spec.gpu_memory_utilization,
                             defaults.gpu_memory_utilization(files, version)))  # fmt: skip
    max_len_default = defaults.Default(facts.max_position_embeddings or 0, f"{facts.ref('max_position_embeddings')}")
    max_model_len = int(pick("max_model_len", spec.max_model_len, max_len_default))
    batched = defaults.uses_batched_dp_moe(all2all, ep, dp)
    tokens = int(
        pick(
            "max_num_batched_tokens",
            spec.max_num_batched_tokens,
            defaults.max_num_batched_tokens(files, batched_dp=batched, gpu_bytes=gpu_bytes, gpu=gpu),
        )
    )
    seqs_default = defaults.max_num_seqs(gpu_bytes, gpu)
    if spec.max_num_seqs is None and isinstance(seqs_default.value, int) and seqs_default.value > tokens:
        seqs_default = defaults.Default(tokens, f"{seqs_default.source}, capped at max_num_batched_tokens")
    seqs = int(pick("max_num_seqs", spec.max_num_seqs, seqs_default))
    capability = profile_run.gpu_facts(row)[0]
    block = int(pick("block_size", spec.block_size, defaults.Default(
        *default_block_size(facts, capability, spec.kv_cache_dtype or "auto"))))  # fmt: skip
    kv_dtype = str(pick("kv_cache_dtype", spec.kv_cache_dtype))
    redundant = spec.num_redundant_experts or 0
    if facts.is_moe and ep:
        physical = facts.num_routed_experts + redundant
        computed = local_experts or math.ceil(physical / (tp * dp))
        settings.append(
            Setting(
                name="local_experts",
                value=computed,
                source=origin
                if local_experts
                else f"ceil(({facts.num_routed_experts} routed + {redundant} redundant) / EP {tp * dp})",
            )
        )
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
    graphs = not spec.enforce_eager and spec.cudagraphs is not False
    cudagraph = bool(estimate.value) and graphs
    settings.append(Setting(name="cudagraph_memory_estimate", value=cudagraph,
                            source="--enforce-eager" if spec.enforce_eager else "no CUDA graphs (-O0 or cudagraph_mode "
                            "NONE)" if not graphs else estimate.source))  # fmt: skip
    mla_rows = profile_run.mla_workspace_rows(max_model_len=max_model_len, max_num_seqs=seqs,
                                              block_size=block) if facts.is_mla else 0  # fmt: skip
    threshold = defaults.shared_experts_stream_threshold(files)
    stream_tokens = threshold.value if isinstance(threshold.value, int) else profile_run.SHARED_EXPERTS_STREAM_TOKENS
    graphs_for = functools.partial(_graph_estimate, spec=spec, files=files, version=version, tp=tp, seqs=seqs,
                                   tokens=tokens, gpu=row, modelled=cudagraph, monolithic=monolithic,
                                   mla_rows=mla_rows, threshold=threshold)  # fmt: skip
    graph_bytes, graph_detail = graphs_for(facts)
    if graph_bytes is None:
        approximate += _graph_flags(spec)
    settings.append(Setting(name="enable_dbo", value=spec.enable_dbo, source=origin))
    settings.append(Setting(name="enforce_eager", value=spec.enforce_eager, source=origin))
    pp = int(pick("pipeline_parallel_size", spec.pipeline_parallel_size))
    moe_tokens = tokens
    if facts.is_moe and origin != "scenario":  # a scenario's layout states its layer's T
        moe_tokens = int(
            pick(
                "moe_max_num_tokens",
                None,
                defaults.moe_max_num_tokens(
                    files, max_num_batched_tokens=tokens, dp=dp, chunk_env=spec.moe_dp_chunk_size
                ),
            )
        )
    persistent = defaults.workspace_persistent(files, version)
    deep_gemm = defaults.deep_gemm_workspace_at_load(version, files)
    settings.append(Setting(name="deep_gemm_at_load", value=bool(deep_gemm.value), source=deep_gemm.source))
    load_split = defaults.load_max_split_size(version, files)
    settings.append(Setting(name="load_max_split_size", value=load_split.value if isinstance(load_split.value, int)
                            else "none", source=load_split.source))  # fmt: skip
    mxfp4_scales = None
    mxfp4_padding = None
    if facts.quant is not None and facts.quant.scheme == "mxfp4":
        mxfp4_scales = defaults.mxfp4_keeps_loaded_scales(files)
        settings.append(Setting(name="mxfp4_loaded_scales_kept", value=bool(mxfp4_scales.value),
                                source=mxfp4_scales.source))  # fmt: skip
        align, groups, padding_source = defaults.mxfp4_hopper_padding(version, profile_run.gpu_facts(gpu)[0], files)
        mxfp4_padding = (align, groups)
        settings.append(Setting(name="mxfp4_swizzle_padding", value=f"{align[0]} x {align[1]}, scale groups x {groups}",
                                source=padding_source))  # fmt: skip
    quant = _release_quant(facts, files, settings, row.capability if row is not None else (9, 0))
    settings.append(Setting(name="moe_workspace_persistent", value=bool(persistent.value), source=persistent.source))
    kept_frames = False
    if facts.fused_grouped_topk:
        kept = defaults.first_moe_call_kept(files, version)
        kept_frames = bool(kept.value)
        settings.append(Setting(name="first_moe_call_kept", value=kept_frames, source=kept.source))
    op_inputs = 0
    if facts.is_mla and facts.is_moe and not spec.enforce_eager:
        read = defaults.moe_op_hidden_inputs(files)
        op_inputs = read.value if isinstance(read.value, int) else 0
        settings.append(Setting(name="moe_op_hidden_inputs", value=op_inputs, source=read.source))
    combo = defaults.benchmarks_combo_kernels(files, version)
    if not spec.enforce_eager:
        settings.append(Setting(name="benchmark_combo_kernel", value=bool(combo.value), source=combo.source))
    if spec.kv_cache_memory_bytes is not None:
        settings.append(Setting(name="kv_cache_memory_bytes", value=spec.kv_cache_memory_bytes, source=origin))
    if spec.cpu_offload_gb:
        settings.append(Setting(name="cpu_offload_gb", value=spec.cpu_offload_gb, source=origin))
    if spec.max_model_len_auto:
        settings.append(Setting(name="max_model_len_auto", value=True, source=origin))
    tower = True
    if facts.vision is not None:
        tower, tower_source = vision_tower_built(spec, version)
        settings.append(Setting(name="vision_tower", value=tower, source=tower_source))
    if row is not None:
        settings.append(Setting(name="gpu", value=row.describe, source=row.source))
    return Resolved(
        tp=tp,
        dp=dp,
        ep=ep,
        all2all=all2all,
        moe_backend=moe_backend,
        utilization=utilization,
        max_model_len=max_model_len,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        block_size=block,
        kv_cache_dtype=kv_dtype,
        num_redundant_experts=redundant,
        local_experts=computed,
        dbo=spec.enable_dbo,
        eager=spec.enforce_eager,
        cudagraph_estimate=cudagraph,
        v2_runner=runner is not None,
        compiled=not spec.enforce_eager,
        combo_benchmark=bool(combo.value) and not spec.enforce_eager,
        cudagraph_bytes=graph_bytes,
        cudagraph_detail=graph_detail,
        cudagraph_for=graphs_for,
        settings=tuple(settings),
        pp=pp,
        moe_max_num_tokens=moe_tokens,
        cudagraphs=graphs,
        workspace_persistent=bool(persistent.value),
        deep_gemm_at_load=bool(deep_gemm.value),
        load_max_split=load_split.value if isinstance(load_split.value, int) else None,
        mxfp4_scales_kept=bool(mxfp4_scales.value) if mxfp4_scales is not None else True,
        mxfp4_padding=mxfp4_padding,
        quant=quant,
        kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
        cpu_offload_bytes=round(spec.cpu_offload_gb * GIB),
        max_model_len_auto=spec.max_model_len_auto,
        approximate=tuple(approximate),
        gpu=row,
        vision_tower=tower,
        image_limit=(spec.limit_mm_per_prompt or {}).get("image", mm_encoder.DEFAULT_IMAGE_LIMIT),
        monolithic_experts=monolithic,
        first_moe_call_kept=kept_frames,
        moe_op_inputs=op_inputs,
        shared_stream_threshold=stream_tokens,
    )


# The first release (of those read) that builds a multimodal model without a tower whose every modality has a limit
# of 0: 0.19.0's (and 0.26.0's) model_executor/models/interfaces.py SupportsMultiModal._mark_tower_model swaps the
# tower's modules for StageMissingLayer (no weights allocated or loaded) where all(get_limit_per_prompt(m) == 0);
# Llama-4 (mllama4.py Llama4ForConditionalGeneration.__init__), Gemma 3 (gemma3_mm.py), LLaVA-NeXT, Mistral 3,
# Pixtral and Kimi-VL build their vision model and projector inside _mark_tower_model(vllm_config, "image"). 0.8.5
# has no _mark_tower_model and builds every tower; the releases between were not read: they are taken to build it.
TOWER_SKIP_FROM = (0, 19, 0)
TOWER_MODALITIES = ("image",)  # the vision towers' modalities (their _mark_tower_model(vllm_config, "image"))


def vision_tower_built(spec: DeploymentSpec, version: str | None) -> tuple[bool, str]:
    """Whether the release builds (and loads) the vision tower, and why: config/multimodal.py
    MultiModalConfig.get_limit_per_prompt is 0 under --language-model-only, the given count otherwise, 999 for a
    modality left out of --limit-mm-per-prompt."""
    limits = spec.limit_mm_per_prompt or {}
    off = spec.language_model_only or all(limits.get(m, 999) == 0 for m in TOWER_MODALITIES)
    if not off:
        return True, "a limit above 0 for its modality (config/multimodal.py get_limit_per_prompt: 999 if not given)"
    flag = "--language-model-only" if spec.language_model_only else "--limit-mm-per-prompt image=0"
    if defaults._release_key(version) < TOWER_SKIP_FROM:
        return True, f"{flag}: this release builds the tower anyway (before 0.19.0's _mark_tower_model)"
    return False, (f"{flag}: models/interfaces.py _mark_tower_model builds no vision tower (StageMissingLayer) "
                   "and gpu_model_runner.py profile_run runs no encoder profile")  # fmt: skip


def _monolithic_experts(facts: ModelFacts, files, row: Gpu | None, moe_backend: str, *, dp: int, eplb: bool) -> str:
    """An MXFP4 MoE checkpoint on compute capability 9.x runs vLLM's TRITON MXFP4 backend (fused_moe/oracle/mxfp4.py
    _get_priority_backends: FlashInfer's TRT-LLM MXFP4 kernels need 10.x, CK is ROCm's; the Triton classes take
    9.0 <= capability < 11.0). Where the release's TRITON backend tries a monolithic class first, that class runs
    when the deployment has no all-to-all kernels, no EPLB and DP <= 1 (its _supports_parallel_config): no modular
    workspace; its buffers are allocated in each call (monolithic_call_bytes). "" otherwise."""
    from harness.sizing.moe_selection import mxfp4_triton_monolithic

    if not facts.is_moe or facts.quant is None or facts.quant.scheme != "mxfp4" or files is None:
        return ""
    capability = row.capability if row is not None else (9, 0)
    if moe_backend != "triton" or capability[0] != 9 or dp > 1 or eplb:
        return ""
    cls = mxfp4_triton_monolithic(files)
    if cls is None:
        return ""
    return (
        f"{cls}: the TRITON MXFP4 backend on compute capability {capability[0]}.{capability[1]}, monolithic "
        "with no all-to-all kernels, no EPLB and DP <= 1 (its _supports_parallel_config)"
    )


def monolithic_call_tensors(facts: ModelFacts, num_tokens: int, intermediate: int) -> list[int]:
    """The bf16 tensors the monolithic Triton MXFP4 kernel allocates in one call of M tokens: the first matmul_ogs's
    output, the SwiGLU-fused intermediate (M x topk, I), the layer's output (M, K) (fused_moe/experts/
    gpt_oss_triton_kernels_moe.py triton_kernel_moe_forward `torch.empty_like(hidden_states)`,
    triton_kernel_fused_experts), and the second matmul_ogs's scratchpad (M x topk, K), which it takes for a scatter
    with more than one expert per token on CUDA (third_party/triton_kernels/matmul_ogs.py init_allocation; split_k
    1)."""
    M, topk, K = num_tokens, facts.top_k, facts.hidden_size
    return [2 * M * topk * intermediate, 2 * M * K, 2 * M * topk * K]


def graph_experts_call(facts: ModelFacts, tp: int) -> Callable[[int], list[int]]:
    """The monolithic Triton MXFP4 kernel's own tensors at n tokens (it runs without DP or EP: the experts'
    intermediate split over TP), for the CUDA-graph estimate: outside vLLM's workspace, in the graph pool."""
    inter = experts_intermediate(facts, Sharding(tp=tp, moe_tp=tp, local_experts=facts.num_routed_experts))
    return functools.partial(monolithic_call_tensors, facts, intermediate=inter)


def monolithic_call_bytes(facts: ModelFacts, r: Resolved, sharding: Sharding) -> tuple[int, str]:
    """What the monolithic Triton MXFP4 kernel allocates in one call of M tokens (the dummy forward's M =
    max_num_batched_tokens): monolithic_call_tensors."""
    M, topk, K = r.max_num_batched_tokens, facts.top_k, facts.hidden_size
    I = experts_intermediate(facts, sharding)
    return sum(monolithic_call_tensors(facts, M, I)), (
        f"{r.monolithic_experts}: intermediate (M={M} x topk {topk}, I={I}) + output (M, K={K}) + the "
        "scatter's scratchpad (M x topk, K), bf16 (gpt_oss_triton_kernels_moe.py "
        "triton_kernel_fused_experts; triton_kernels matmul_ogs init_allocation)"
    )


FAMILIES = ("cutlass", "deep_gemm", "triton", "marlin")
# the all-to-all backends whose buffers the layer model sizes (docs/layer-memory.md)
SIZED_ALL2ALL = ("allgather_reducescatter", "naive", "deepep_low_latency", "deepep_high_throughput")
GATHER_ALL2ALL = ("allgather_reducescatter", "naive")  # dispatch by all-gather over the DP group
DTYPE_NAMES = {"half": "float16", "float": "float32", "float16": "float16", "bfloat16": "bfloat16",
               "float32": "float32"}  # fmt: skip


def _format_flags(facts: ModelFacts, spec: DeploymentSpec) -> list[str]:
    """--dtype and --quantization: sized, as the model facts are built with them (harness.sizing.model_config
    load_model: the dtype's element size, the format's layout), so nothing is approximate here."""
    return []


def _experts_family(value: str | None, approximate: list[str]) -> str | None:
    """The layer model's experts family for a --moe-backend value: its own names, `auto` (the default), a release's
    other values by the family they run (flashinfer_cutlass: CUTLASS); others take the default's, flagged."""
    if value is None or value == "auto":
        return None
    if value in FAMILIES:
        return value
    for family in FAMILIES:
        if family in value:
            return family
    approximate.append(f"--moe-backend {value}: its experts' workspace is not sized; the default family's is used")
    return None


def default_experts_backend(facts: ModelFacts, gpu: Gpu | None) -> defaults.Default:
    """The experts family vLLM picks without --moe-backend: unquantized MoE runs the Triton experts; FP8 runs the
    CUTLASS grouped GEMM where the GPU has it (compute capability 9.0 and 10.x: vLLM's cutlass_group_gemm_supported),
    else the Triton (or Marlin weight-only) experts."""
    if facts.quant_method != "fp8":
        return defaults.Default("triton", "table: unquantized MoE runs the Triton experts (\"Using TRITON backend for "
                                          "Unquantized MoE\")")  # fmt: skip
    major, minor = gpu.capability if gpu is not None else (9, 0)
    where = f"compute capability {major}.{minor}{'' if gpu is not None else ' (assumed)'}"
    if (major, minor) == (9, 0) or major == 10:
        return defaults.Default("cutlass", f"table: FP8 MoE on {where}: the CUTLASS grouped GEMM "
                                           "(cutlass_group_gemm_supported: 90, 100)")  # fmt: skip
    return defaults.Default("triton", f"table: FP8 MoE on {where}: no CUTLASS FP8 grouped GEMM "
                                      "(cutlass_group_gemm_supported: 90, 100 only); the Triton experts")  # fmt: skip


def sharding_of(facts: ModelFacts, r: Resolved) -> Sharding:
    """EP: whole experts, E per GPU; without EP the experts' intermediate is split over TP x DP (FusedMoE)."""
    return Sharding(tp=r.tp, moe_tp=1 if r.ep else r.tp * r.dp, local_experts=r.local_experts)


def stage_layers(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) of each pipeline stage's layers: vLLM's get_pp_indices (model_executor/models/utils.py) without
    VLLM_PP_LAYER_PARTITION: num_layers // pp each, the remainder one more on the stages before the last."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def stage_facts(facts: ModelFacts, start: int, end: int) -> ModelFacts:
    """The model as one pipeline stage holds it: layers [start, end), its MoE layers among them."""
    moe = tuple(i - start for i in facts.moe_layers if start <= i < end)
    return dataclasses.replace(facts, num_hidden_layers=end - start, moe_layers=moe)


def plan_deployment(facts: ModelFacts, r: Resolved, layer_plan, *, version: str | None, gpu: str | Gpu | None,
                    total_bytes: int, layer_lines: Sequence[DeploymentLine] = ()) -> DeploymentPlan:  # fmt: skip
    """layer_plan: the MoE layer's LayerPlan for this release at the deployment's layout (None for dense, or
    without a release: then `layer_lines` give the MoE layer's buffers). With pipeline parallelism every stage is
    planned and the one with the fewest KV tokens is returned: vLLM sizes the KV cache of every worker and keeps
    the smallest block count (v1/engine/core.py, min over the workers)."""
    if r.pp <= 1:
        return _plan_stage(facts, r, layer_plan, version=version, gpu=gpu, total_bytes=total_bytes,
                           layer_lines=layer_lines, stage=None)  # fmt: skip
    plans = []
    bounds = stage_layers(facts.num_hidden_layers, r.pp)
    for index, (start, end) in enumerate(bounds):
        plans.append(_plan_stage(stage_facts(facts, start, end), r, layer_plan, version=version, gpu=gpu,
                                 total_bytes=total_bytes, layer_lines=layer_lines,
                                 stage=(index, r.pp, start, end, facts)))  # fmt: skip
    order = {"refused": 0, "unknown": 1, "oom": 2, "fails": 3, "starts": 4}
    return min(plans, key=lambda p: (order[p.verdict.outcome], p.kv_tokens))


def _vocab_matrix_bytes(facts: ModelFacts, tp: int) -> int:
    from harness.sizing.model_config import pad_vocab

    return pad_vocab(facts.vocab_size, tp) * facts.hidden_size * facts.dtype_bytes


def sparse_attention_lines(facts: ModelFacts, r: Resolved) -> list[DeploymentLine]:
    """DeepSeek-V3.2's buffers made while the model is built, so in what vLLM logs as the model's loading: the top-k
    indices every layer's indexer writes (models/deepseek_v2.py DeepseekV2Model.__init__: topk_indices_buffer
    (max_num_batched_tokens, index_topk) int32), and with an fp8 cache on compute capability 9.x, where
    FLASH_ATTN_MLA_SPARSE takes 16-bit caches only and FLASHMLA_SPARSE runs fp8_ds_mla, the workspace its impl
    reserves in __init__ and keeps a view of (v1/attention/backends/mla/flashmla_sparse.py FlashMLASparseImpl:
    q_concat (max_num_batched_tokens, heads, kv_lora + qk_rope) bf16 and the prefill workspace
    (5 x max_model_len, kv_lora + qk_rope) bf16, each rounded to 256 B by v1/worker/workspace.py get_simultaneous)."""
    if not facts.index_topk:
        return []
    N = r.max_num_batched_tokens
    topk = N * facts.index_topk * 4
    lines = [DeploymentLine(group="weights", name="sparse indexer top-k buffer", bytes=topk, kind="exact",
                            source=f"topk_indices_buffer ({N}, {facts.index_topk}) int32 (models/deepseek_v2.py "
                            "DeepseekV2Model.__init__), shared by the layers")]  # fmt: skip
    capability = profile_run.gpu_facts(r.gpu)[0]
    if capability == 9 and r.kv_cache_dtype.startswith("fp8"):
        head = facts.kv_lora_rank + facts.qk_rope_head_dim
        heads = facts.num_attention_heads // r.tp
        prefill_rows = 5 * r.max_model_len
        size = round_up(N * heads * head * 2, 256) + round_up(prefill_rows * head * 2, 256)
        lines.append(DeploymentLine(group="weights", name="FlashMLA sparse workspace", bytes=size, kind="exact",
                                    source=f"FLASHMLA_SPARSE (fp8_ds_mla cache, compute capability 9.x) reserves in "
                                    f"__init__ q_concat ({N}, {heads}, {head}) bf16 + the prefill workspace "
                                    f"({prefill_rows}, {head}) bf16 and keeps a view (v1/attention/backends/mla/"
                                    "flashmla_sparse.py FlashMLASparseImpl.__init__, "
                                    "get_prefill_workspace_size)"))  # fmt: skip
    return lines


def deep_gemm_lines(facts: ModelFacts, r: Resolved) -> list[DeploymentLine]:
    """DeepGEMM's cuBLASLt workspace, kept from the model's build, so in what vLLM logs as the model's loading
    (release_defaults.deep_gemm_workspace_at_load): the first QuantFP8 built resolves DeepGEMM, which on compute
    capability 9.x, 10.x and 12.x (platforms/cuda.py support_deep_gemm; PDL from 9.0) starts its DeviceRuntime. A
    QuantFP8 is built by every FP8 linear's kernel (kernels/linear/scaled_mm ScaledMMLinearKernel.py
    FP8ScaledMMLinearKernel.__init__: per-tensor, per-channel, block and online FP8 alike) and by the attention
    layer's query quantization with an fp8 KV cache (model_executor/layers/attention/attention.py, where the backend
    takes a quantized query: FlashAttention 3 and the MLA backends do, on every fp8-cache startup measured; an fp8
    cache is taken to build it on any backend). Once per process."""
    if not r.deep_gemm_at_load or profile_run.gpu_facts(r.gpu)[0] not in (9, 10, 12):
        return []
    fp8_weights = facts.quant is not None and facts.quant.scheme.startswith("fp8")
    fp8_cache = r.kv_cache_dtype.startswith("fp8")
    if not (fp8_weights or fp8_cache):
        return []
    why = "the FP8 linears' QuantFP8" if fp8_weights else "the fp8 KV cache's query QuantFP8"
    return [DeploymentLine(group="weights", name="DeepGEMM cuBLASLt workspace",
                           bytes=defaults.DEEP_GEMM_CUBLASLT_WORKSPACE, kind="exact",
                           source=f"{why} resolves DeepGEMM at the model's build (utils/deep_gemm.py _lazy_init -> "
                           "set_pdl), whose DeviceRuntime keeps a 32 MiB cuBLASLt workspace (vllm/third_party/"
                           "deep_gemm); measured in a real 0.26.0 startup's load "
                           "(results/h200/load-snapshot)")]  # fmt: skip


def _stage_weight_lines(facts: ModelFacts, r: Resolved, sharding: Sharding, stage) -> list[DeploymentLine]:
    lines = [DeploymentLine(group="weights", name=w.name, bytes=w.bytes, kind="exact", source=w.source)
             for w in weight_lines(facts, sharding, r.load_max_split)]  # fmt: skip
    lines += sparse_attention_lines(facts, r)
    lines += deep_gemm_lines(facts, r)
    if stage is not None:
        from harness.sizing.deployment_weights import allocator_block_bytes

        index, pp, start, end, whole = stage
        matrix = _vocab_matrix_bytes(facts, r.tp)
        first, last = index == 0, index == pp - 1
        held = [matrix] if first else []
        held += [matrix, facts.hidden_size * facts.dtype_bytes] if last else []
        kept = sum(held)
        for i, line in enumerate(lines):
            if line.name == "embeddings + lm_head":
                parts = [*(["embed_tokens"] if first else []), *(["lm_head + final norm"] if last else [])]
                lines[i] = line.model_copy(
                    update={
                        "bytes": kept,
                        "source": (
                            f"pipeline stage {index} of {pp} (layers {start}-{end - 1} of "
                            f"{whole.num_hidden_layers}, vLLM's "
                            f"get_pp_indices): {' and '.join(parts) or 'none (PPMissingLayer)'}; {matrix} B per vocab "
                            "matrix"
                        ),
                    }
                )
            elif line.name == "allocator rounding":
                whole_matrices = 1 if facts.tie_word_embeddings else 2
                dropped = whole_matrices - (int(first) + int(last))
                fix = dropped * (allocator_block_bytes(matrix, r.load_max_split) - matrix)
                lines[i] = line.model_copy(update={"bytes": max(0, line.bytes - fix)})
    if r.cpu_offload_bytes:
        total = sum(line.bytes for line in lines)
        offloaded = min(r.cpu_offload_bytes, total)
        lines.append(DeploymentLine(group="weights", name="cpu offload", bytes=-offloaded, kind="estimate",
                                    source=f"--cpu-offload-gb: {offloaded} B of parameters kept in host memory, "
                                    "module by module until the budget is used (model_executor/models/utils.py "
                                    "maybe_offload_to_cpu); the module granularity is not modelled"))  # fmt: skip
    return lines


def _release_quant(facts: ModelFacts, files, settings: list[Setting], capability: tuple[int, int]) -> Quant | None:
    """The checkpoint format as the release builds it, where the release decides more than the config says; None:
    the facts' own. ModelOpt: which key of a flat quantization_config lists the excluded modules, and whether the
    lm_head is quantized; GPTQ: a directory without safetensors quantizes no linear outside FusedMoE in a release
    that lists the quantized layers from them."""
    quant = facts.quant
    if quant is None:
        return None
    if quant.method in ("modelopt", "modelopt_fp4"):
        key, lm_head = defaults.modelopt_reads(files)
        if quant.nested:
            settings.append(Setting(name="modelopt_excluded_from", value="quantization.exclude_modules",
                                    source="the nested hf_quant_config form (modelopt.py from_config)"))  # fmt: skip
            ignore = quant.ignore
        else:
            settings.append(Setting(name="modelopt_excluded_from", value=str(key.value), source=key.source))
            ignore = dict(quant.ignore_by_key).get(str(key.value), ())
        settings.append(Setting(name="modelopt_lm_head", value=bool(lm_head.value), source=lm_head.source))
        return dataclasses.replace(quant, ignore=ignore, lm_head=bool(lm_head.value))
    if quant.scheme == "awq" and quant.marlin and capability == (9, 0):
        kernel = defaults.awq_mixed_precision_kernel(files)
        settings.append(Setting(name="awq_linear_kernel", value="machete" if kernel.value else "marlin",
                                source=f"{kernel.source}; compute capability 9.0"))  # fmt: skip
        return dataclasses.replace(quant, machete=bool(kernel.value))
    if quant.scheme == "gptq" and facts.checkpoint_tensors is False and not quant.layers_listed:
        listed = defaults.gptq_layers_from_checkpoint(files)
        settings.append(Setting(name="gptq_linears_quantized", value=not listed.value,
                                source=f"{listed.source}; the model directory holds no *.safetensors"))  # fmt: skip
        return dataclasses.replace(quant, dense_linears=not listed.value)
    return None


def _plan_stage(facts: ModelFacts, r: Resolved, layer_plan, *, version: str | None, gpu: str | Gpu | None,
                total_bytes: int, layer_lines, stage) -> DeploymentPlan:  # fmt: skip
    if r.quant is not None:
        facts = dataclasses.replace(facts, quant=r.quant)
    if facts.vision is not None and not r.vision_tower:
        facts = dataclasses.replace(facts, vision=None)  # sized as the language model alone (vision_tower_built)
    if facts.quant is not None and facts.quant.scheme == "mxfp4" and not r.mxfp4_scales_kept:
        facts = dataclasses.replace(facts, quant=dataclasses.replace(facts.quant, loaded_scales_kept=False))
    if facts.quant is not None and facts.quant.scheme == "mxfp4":
        capability = profile_run.gpu_facts(gpu)[0]
        align, group_multiple = r.mxfp4_padding or defaults.mxfp4_hopper_padding(version, capability)[:2]
        facts = dataclasses.replace(
            facts, quant=dataclasses.replace(facts.quant, swizzle_align=align, scale_groups_multiple=group_multiple)
        )
    sharding = sharding_of(facts, r)
    gpu_name = gpus.label(gpu)
    lines = _stage_weight_lines(facts, r, sharding, stage)
    moe_here = facts.is_moe
    layer = layer_plan if moe_here else None
    lines += [line for line in layer_lines if line.group != "profile-peak"] if moe_here else []
    lines += held_once_lines(facts, r, sharding, layer)
    first, last = (stage[0] == 0, stage[0] == stage[1] - 1) if stage is not None else (True, True)
    lines += profile_lines(facts, r, layer, gpu, layer_lines if moe_here else [], first=first, last=last)
    non_torch, non_torch_source = non_torch_bytes(r.tp, gpu if gpu is not None else r.gpu, pp=r.pp, dp=r.dp,
                                                  moe=facts.is_moe)  # fmt: skip
    if profile_skips_cublas(facts):
        non_torch -= CUBLAS_HANDLE_BYTES
        non_torch_source += (f"; less the cuBLAS handle's {CUBLAS_HANDLE_BYTES} B (results/h200/cublas-nontorch): "
                             f"{facts.quant.label if facts.quant else ''} builds every linear and the lm_head, no "
                             "GEMM of the profile runs through cuBLAS")  # fmt: skip
    lines.append(DeploymentLine(group="non-torch", name="non-torch memory", bytes=non_torch, kind="estimate",
                                source=non_torch_source))  # fmt: skip
    graph_bytes, graph_detail = r.cudagraph_bytes, r.cudagraph_detail
    if stage is not None and graph_bytes is not None and r.cudagraph_for is not None:
        graph_bytes, graph_detail = r.cudagraph_for(facts)  # the stage's layers are what its worker captures
    if r.cudagraph_estimate and graph_bytes is not None:
        lines.append(DeploymentLine(group="cuda-graphs", name="CUDA-graph estimate", bytes=graph_bytes,
                                    kind="estimate", source=f"estimate: the V1 runner's profile_cudagraph_memory "
                                    f"({_setting_source(r, 'cudagraph_memory_estimate')} on), subtracted before the "
                                    f"KV cache is sized: {graph_detail}"))  # fmt: skip
    elif r.cudagraph_estimate:
        lines.append(DeploymentLine(group="cuda-graphs", name="CUDA-graph estimate", bytes=CUDAGRAPH_BYTES,
                                    kind="estimate", source=f"estimate: the profiler's graph-pool estimate "
                                    f"({_setting_source(r, 'cudagraph_memory_estimate')} on), subtracted before the "
                                    "KV cache is sized; basis: published logs "
                                    "(docs/deployment-memory.md)"))  # fmt: skip
    row = gpus.resolve(gpu) or r.gpu
    total_source = device_total(row)[1] if row is not None and row.total_bytes == total_bytes else \
        "given: --budget-gb, --gpu-memory-gib or the GPU's total"  # fmt: skip
    extra = [Setting(name="gpu_total_bytes", value=total_bytes, source=total_source)]
    if stage is not None:
        extra.append(
            Setting(
                name="pipeline_stage",
                value=f"{stage[0]} of {stage[1]}: layers {stage[2]}-{stage[3] - 1}",
                source="the stage with the fewest KV tokens (vLLM keeps the smallest block count)",
            )
        )
    r = dataclasses.replace(r, settings=(*r.settings, *extra))
    requested = int(total_bytes * r.utilization)
    non_kv = sum(line.bytes for line in lines)
    shape = kv_shape(facts, r.tp, r.kv_cache_dtype)
    approximate = list(r.approximate)
    if r.kv_cache_memory_bytes is not None:
        # gpu_worker.py determine_available_memory: with kv_cache_memory_bytes the profile is skipped and the cache
        # is exactly that size; what the rest needs is not checked against gpu_memory_utilization.
        available = r.kv_cache_memory_bytes
        kv_source = f"--kv-cache-memory-bytes {available} (profiling skipped; gpu_memory_utilization not applied)"
    else:
        available = requested - non_kv
        kv_source = "requested - everything before the KV cache"
    max_len = r.max_model_len
    by_concurrency = tokens_from_concurrency(version)  # how the release prints its tokens (kv_cache.py)
    in_flight = in_flight_tokens(version, r.max_num_batched_tokens, pp=r.pp, v2_runner=r.v2_runner)
    cache = kv_cache(shape, available, r.block_size, max_len, in_flight, concurrency_tokens=by_concurrency)
    if r.max_model_len_auto:
        # v1/core/kv_cache_utils.py _auto_fit_max_model_len: the longest length whose blocks fit (a binary search on
        # max_memory_usage_bytes: ceil(L / block_size) pages of every layer), at most the model's derived length
        fitted = min(facts.max_position_embeddings or cache.tokens, cache.tokens)
        max_len = max(fitted, 1)
        r = dataclasses.replace(r, max_model_len=max_len, settings=(*r.settings, Setting(
            name="max_model_len_fitted", value=max_len, source="--max-model-len auto: the longest that the KV cache "
            f"holds, at most max_position_embeddings ({facts.max_position_embeddings}); v1/core/kv_cache_utils.py "
            "_auto_fit_max_model_len")))  # fmt: skip
        cache = kv_cache(shape, available, r.block_size, max_len, in_flight, concurrency_tokens=by_concurrency)
    kv_bytes = cache.bytes
    grouped = f" in {cache.groups} groups of {cache.group_size} layers" if cache.group_size else ""
    lines.append(DeploymentLine(group="kv-cache", name="KV cache", bytes=kv_bytes, kind="exact",
                                source=f"{cache.num_blocks} blocks x {cache.block_size} tokens{grouped}"
                                f" x {shape.bytes_per_token} B/token: {shape.formula}; {kv_source}"))  # fmt: skip
    if r.cudagraphs and not r.cudagraph_estimate:
        lines.append(DeploymentLine(group="after-kv", name="CUDA graphs", bytes=CUDAGRAPH_BYTES, kind="estimate",
                                    source="estimate: graphs captured after the KV cache is sized (this release's "
                                    "profiler does not subtract them: "
                                    f"{_setting_source(r, 'cudagraph_memory_estimate')}); beyond what was requested; "
                                    "basis: published logs' estimates (docs/deployment-memory.md)"))  # fmt: skip
    sampler = r.max_num_seqs * facts.vocab_size * 4
    lines.append(DeploymentLine(group="after-kv", name="sampler warm-up", bytes=sampler, kind="exact",
                                source=f"max_num_seqs {r.max_num_seqs} x vocab {facts.vocab_size} x 4 B (f32 logits, "
                                "v1/worker/gpu_worker.py compile_or_warm_up_model)"))  # fmt: skip
    r = dataclasses.replace(r, approximate=tuple(approximate))
    verdict = _verdict(lines, layer, total_bytes, requested, cache, r)
    others: list[PlanOutcome] = []
    if r.first_moe_call_kept and r.kv_cache_memory_bytes is None:
        frames = profile_run.first_moe_call_frames(facts, num_tokens=r.max_num_batched_tokens, tp=r.tp,
                                                   compiled=r.compiled)  # fmt: skip
        kept_lines = profile_lines(facts, r, layer, gpu, layer_lines if moe_here else [], first=first, last=last,
                                   kept_call=frames.bytes)  # fmt: skip
        more = _activations(kept_lines) - _activations(lines)
        if more > 0:
            kept_cache = kv_cache(shape, requested - non_kv - more, r.block_size, r.max_model_len, in_flight,
                                  concurrency_tokens=by_concurrency)  # fmt: skip
            kept_verdict = _verdict(_with_extra(lines, more, kept_cache.bytes), layer, total_bytes, requested,
                                    kept_cache, r)  # fmt: skip
            others.append(_kept_outcome(frames, r, lines, non_kv + more, more, kept_cache, kept_verdict, version))
    groups: dict[str, int] = {}
    for line in lines:
        groups[line.group] = groups.get(line.group, 0) + line.bytes
    return DeploymentPlan(
        harness_version=harness.__version__, python_version=platform.python_version(), model=facts.name,
        model_source=facts.read_as, vllm_version=version, gpu=gpu_name, total_bytes=total_bytes,
        settings=list(r.settings), lines=lines,
        requested_bytes=requested, non_kv_bytes=non_kv, kv_bytes_per_token=shape.bytes_per_token,
        kv_formula=shape.formula, kv_cache_bytes=kv_bytes, kv_tokens=cache.tokens, kv_num_blocks=cache.num_blocks,
        block_size=cache.block_size, max_model_len=r.max_model_len, concurrency=cache.concurrency, verdict=verdict,
        group_totals=groups, approximate=list(approximate), other_outcomes=others,
    )  # fmt: skip


def _activations(lines: Sequence[DeploymentLine]) -> int:
    return next(line.bytes for line in lines if line.group == "profile-peak" and line.name == "activations")


def _with_extra(lines: list[DeploymentLine], extra: int, kv_bytes: int) -> list[DeploymentLine]:
    """The plan's lines with the torch peak `extra` higher and the KV cache that leaves."""
    out = []
    for line in lines:
        if line.group == "profile-peak" and line.name == "activations":
            line = line.model_copy(update={"bytes": line.bytes + extra})
        elif line.group == "kv-cache":
            line = line.model_copy(update={"bytes": kv_bytes})
        out.append(line)
    return out


def _kept_outcome(frames: profile_run.Phase, r: Resolved, lines: list[DeploymentLine], non_kv: int, extra: int,
                  cache, verdict: Verdict, version: str | None) -> PlanOutcome:  # fmt: skip
    dispatch = (r.ep and r.dp > 1) or any(line.name == "dispatch receive" for line in lines)
    caveat = (f" (measured on one GPU: with {r.all2all} the tensors it gathers or receives for the experts, which the "
              "frames would hold too, are not counted)") if dispatch else ""  # fmt: skip
    reason = (
        f"vLLM {version or 'this release'} can keep the profile run's first MoE call frames to the run's end "
        f"({_setting_source(r, 'first_moe_call_kept')}): a reference cycle from torch.compile's first trace of "
        "grouped_topk that Dynamo's closing collection frees only while none of it has reached the oldest "
        f"generation; which startup a process gets is chance. Kept: {frames.detail}{caveat}; "
        f"{extra / GIB:.2f} GiB more at the profile's peak"
    )
    return PlanOutcome(name="first MoE call kept", reason=reason, torch_peak_extra_bytes=extra, non_kv_bytes=non_kv,
                       kv_cache_bytes=cache.bytes, kv_tokens=cache.tokens, concurrency=cache.concurrency,
                       verdict=verdict)  # fmt: skip


def _setting_source(r: Resolved, name: str) -> str:
    return next(s.source for s in r.settings if s.name == name)


def held_once_lines(facts: ModelFacts, r: Resolved, sharding: Sharding, layer_plan) -> list[DeploymentLine]:
    lines = []
    if layer_plan is not None:
        for name in ("deepep-nvl", "deepep-workspace", "deepep-rdma"):
            c = layer_plan.component(name)
            if c is not None and c.bytes is not None:
                lines.append(
                    DeploymentLine(
                        group="held-once",
                        name=name,
                        bytes=c.bytes,
                        kind="release",
                        source=f"{c.source} (one Buffer per process, every MoE layer)",
                    )
                )
        workspace = moe_workspace(r, layer_plan) if not r.monolithic_experts else None
        if workspace is not None and r.workspace_persistent:
            ws_bytes, ws_source = workspace
            lines.append(DeploymentLine(group="held-once", name="moe-workspace", bytes=ws_bytes, kind="release",
                                        source=f"{ws_source}; one for every layer (fused_moe/modular_kernel.py: "
                                        "current_workspace_manager), allocated in the profile run, kept ("
                                        f"{_setting_source(r, 'moe_workspace_persistent')})"))  # fmt: skip
    if r.num_redundant_experts or (facts.is_moe and r.ep and _eplb(r)):
        one_layer, _ = routed_experts_bytes(facts, sharding)
        lines.append(DeploymentLine(group="held-once", name="eplb-transfer-buffer", bytes=one_layer, kind="estimate",
                                    source="estimate: EPLB rearranges one layer at a time through a buffer of one "
                                    "layer's local expert weights (distributed/eplb)"))  # fmt: skip
    return lines


def moe_workspace(r: Resolved, layer_plan) -> tuple[int, str] | None:
    """(bytes, source) of the MoE workspace at the deployment's M, x 2 with --enable-dbo. The layer model's is at
    D = TP x DP dispatchers under EP: the batched all-to-alls (DeepEP low-latency, ...) are built with
    num_dispatchers=all2all_manager.world_size, the EP group, TP ranks included (fused_moe/all2all_utils.py). The
    all-gather dispatch (allgather_reducescatter, naive) gathers over the DP group instead
    (distributed/device_communicators/all2all.py AgRsAll2AllManager._get_comm_group; with sequence parallelism the
    EP group, each TP rank holding 1/TP of the tokens): M = T x DP, the layer model's scaled by 1/TP (its shapes are
    linear in M)."""
    workspace = layer_plan.component("workspace") if layer_plan is not None else None
    if workspace is None or workspace.bytes is None:
        return None
    size, source = workspace.bytes, workspace.source
    if r.ep and r.tp > 1 and r.all2all in GATHER_ALL2ALL:
        size //= r.tp
        source += (f"; M = T x DP {r.dp}: the all-gather dispatch gathers over the DP group, not the {r.tp * r.dp} "
                   "EP ranks (AgRsAll2AllManager._get_comm_group)")  # fmt: skip
    if r.dbo:
        size *= 2
        source += ", x 2 micro-batches (--enable-dbo)"
    return size, source


def _eplb(r: Resolved) -> bool:
    return any(s.name == "num_redundant_experts" and s.value for s in r.settings)


def profile_lines(facts: ModelFacts, r: Resolved, layer_plan, gpu: str | Gpu | None = None,
                  layer_lines: Sequence[DeploymentLine] = (), *, first: bool = True,
                  last: bool = True, kept_call: int = 0) -> list[DeploymentLine]:  # fmt: skip
    """The profile run's torch peak beyond the weights and the held-once buffers (harness.sizing.profile_run): the
    cuBLAS workspace, kept from the first GEMM, and the larger of two phases: the dummy forward of
    max_num_batched_tokens tokens (per DP rank) with DeepEP's receive tensors, and the dummy sampler over
    min(N, max_num_seqs) logits. The receive tensors are a line of their own (the run allocates them); the
    activations line is the larger phase less them. `kept_call`: what a kept first MoE call holds from its return on
    (profile_run.first_moe_call_frames), in the forward's later points and in the sampler."""
    N, tp = r.max_num_batched_tokens, r.tp
    lines = [line for line in layer_lines if line.group == "profile-peak"]
    if layer_plan is not None:
        recv = sum((c.bytes or 0) for c in layer_plan.components if c.name in ("dispatch-recv", "dispatch-quant"))
        if recv:
            lines.append(DeploymentLine(group="profile-peak", name="dispatch receive", bytes=recv, kind="release",
                                        source=f"{layer_plan.component('dispatch-recv').source}; one layer's at a "
                                        "time, in the forward"))  # fmt: skip
    recv = sum(line.bytes for line in lines if line.name == "dispatch receive")
    per_call = 0
    workspace = moe_workspace(r, layer_plan) if not r.workspace_persistent and not r.monolithic_experts else None
    if r.monolithic_experts:
        per_call, call_source = monolithic_call_bytes(facts, r, sharding_of(facts, r))
        lines.append(DeploymentLine(group="profile-peak", name="moe kernel buffers (per call)", bytes=per_call,
                                    kind="release", source=f"{call_source}; freed on return: counted once, in the "
                                    "forward's peak"))  # fmt: skip
    if workspace is not None:
        per_call = workspace[0]
        lines.append(DeploymentLine(group="profile-peak", name="moe-workspace (per call)", bytes=per_call,
                                    kind="release", source=f"{workspace[1]}; allocated in each MoE call and freed "
                                    f"on return ({_setting_source(r, 'moe_workspace_persistent')}): counted once, in "
                                    "the forward's peak"))  # fmt: skip
    cublas, cublas_source = profile_run.cublas_workspace(gpu)
    lines.append(DeploymentLine(group="profile-peak", name="cuBLAS workspace", bytes=cublas, kind="estimate",
                                source=cublas_source))  # fmt: skip
    if not first:
        received = 2 * N * facts.hidden_size * facts.dtype_bytes
        lines.append(DeploymentLine(
            group="profile-peak", name="pipeline intermediate tensors", bytes=received, kind="exact",
            source=f"a later pipeline stage's receive buffers, hidden_states and residual 2 x (N={N}, "
            f"{facts.hidden_size}) {facts.dtype}, made in the first dummy run and kept (v1/worker/gpu_model_runner.py "
            "_dummy_run: make_empty_intermediate_tensors(batch_size=max_num_tokens))"))  # fmt: skip
    mla: dict[str, Any] = {}
    if facts.is_mla:
        kept = moe_workspace(r, layer_plan) if r.workspace_persistent and not r.monolithic_experts else None
        held = kept[0] if kept is not None else 0
        rows = profile_run.mla_workspace_rows(max_model_len=r.max_model_len, max_num_seqs=r.max_num_seqs,
                                              block_size=r.block_size)  # fmt: skip
        mla = {"mla_rows": rows, "eager": r.eager, "held_workspace": held}
    moe_call = 0
    if facts.is_moe and not recv and not r.monolithic_experts:  # the modular experts without a dispatch
        q = facts.quant
        act = q.scheme if q is not None and q.scheme.startswith("fp8") else None
        moe_call, _ = profile_run.moe_call_tensors(
            facts, num_tokens=N, act_quant=act, intermediate=experts_intermediate(facts, sharding_of(facts, r))
        )
    eager_v2 = None
    if r.v2_runner and r.eager and r.pp == 1 and not recv:
        eager_v2 = profile_run.v2_eager_forward_phase(facts, num_tokens=N, tp=tp)
    compiled_v2 = None
    if r.v2_runner and r.compiled and r.pp == 1 and not recv:
        compiled_v2 = profile_run.v2_compiled_forward_phase(facts, num_tokens=N, tp=tp, gpu=gpu, cublas=cublas)
    if eager_v2 is not None:
        forward = eager_v2
    elif compiled_v2 is not None:
        forward = compiled_v2
    elif r.v2_runner:
        forward = profile_run.forward_phase(facts, num_tokens=N, tp=tp, dispatch_recv=recv, shared_experts=True,
                                            kept=kept_call, **mla)  # fmt: skip
        if not mla:
            forward = profile_run.Phase(forward.bytes, f"{forward.detail}; the V2 runner's "
                                        f"{'eager' if r.eager else 'compiled (torch.compile)'} forward of this "
                                        "model is not read: 0.19.0's estimate")  # fmt: skip
    else:
        query_fp8 = profile_run.query_quant_fused(r.kv_cache_dtype, compiled=r.compiled)
        op_inputs = r.moe_op_inputs if r.compiled and not recv and not r.monolithic_experts else 0
        forward = profile_run.forward_phase(facts, num_tokens=N, tp=tp, dispatch_recv=recv, moe_call=moe_call,
                                            query_fp8=query_fp8, kept=kept_call, moe_op_inputs=op_inputs,
                                            shared_stream_threshold=r.shared_stream_threshold, **mla)  # fmt: skip
        gdn = profile_run.gdn_compiled_point(facts, num_tokens=N, tp=tp, gpu=gpu) if r.compiled and not recv else None
        if gdn is not None and gdn.bytes > forward.bytes:
            forward = profile_run.Phase(gdn.bytes, f"{gdn.detail}, over {forward.detail}")
    if not last:  # profile_run runs the dummy sampler on the last pipeline rank only
        sampler = profile_run.Phase(0, "no dummy sampler (not the last pipeline stage: the model runner's "
                                       "profile_run runs it where the pipeline rank is the last)")  # fmt: skip
    elif r.v2_runner:
        sampler = profile_run.v2_sampler_phase(facts, num_tokens=N, max_num_seqs=r.max_num_seqs, tp=tp)
    else:
        sampler = profile_run.sampler_phase(facts, num_tokens=N, max_num_seqs=r.max_num_seqs, tp=tp, gpu=gpu)
    compile_ = profile_run.Phase(0, "")
    if r.compiled:
        rope = _largest_rope_cache(facts)
        compile_ = profile_run.compile_phase(facts, num_tokens=N, tp=tp, gpu=gpu, first_rank=first,
                                             combo=r.combo_benchmark, rope_cache=rope)  # fmt: skip
    # the first compile runs before any GEMM or MoE call: it holds neither the cuBLAS workspace nor the MoE layer's
    # buffers, per call or kept (its line is its bytes less them: the lines above and the held-once workspace add
    # them back)
    kept_ws = moe_workspace(r, layer_plan) if r.workspace_persistent and not r.monolithic_experts else None
    held_ws = kept_ws[0] if kept_ws is not None else 0
    # the multimodal encoder's dummy run comes first (mm_encoder): its batch and outputs are held through the
    # language model's phases (their own line), and its GEMMs have made the cuBLAS workspace before the first compile.
    # 0.26.0's V2 runner runs none (v1/worker/gpu/model_runner.py profile_run: _dummy_run and the sampler only)
    encoder = None
    if facts.vision is not None and not r.v2_runner:
        encoder = mm_encoder.encoder_profile(facts, max_num_batched_tokens=N, max_num_seqs=r.max_num_seqs,
                                             max_model_len=r.max_model_len, image_limit=r.image_limit)  # fmt: skip
    held_encoder = encoder.held if encoder is not None else 0
    if encoder is not None:
        lines.append(DeploymentLine(group="profile-peak", name="encoder cache", bytes=held_encoder, kind="exact",
                                    source=f"{encoder.detail} (harness/sizing/mm_encoder.py)"))  # fmt: skip
    if kept_call and last:
        sampler = profile_run.Phase(sampler.bytes + kept_call, f"{sampler.detail} + the kept first MoE call "
                                    f"{kept_call} B")  # fmt: skip
    candidates = {"forward pass": forward.bytes, "dummy sampler": sampler.bytes - per_call,
                  "first compile": compile_.bytes - per_call - (0 if encoder else cublas) - held_ws}  # fmt: skip
    if encoder is not None:  # before the language model's run: none of its buffers, the encoder cache not yet made
        candidates["encoder run"] = encoder.run_peak - per_call - held_ws - held_encoder
    where = max(candidates, key=lambda k: candidates[k])
    _, _, gpu_source = profile_run.gpu_facts(gpu)
    runner = ("vLLM 0.26.0's V2 runner's profile_run (v1/worker/gpu/model_runner.py)" if r.v2_runner
              else "vLLM 0.19.0's profile_run")  # fmt: skip
    # the first compile was measured at TP 1 (under TP the embedding kernel's arguments are taken per rank: labelled)
    exact = where == "dummy sampler" or (where == "first compile" and tp == 1) or eager_v2 is not None or (
        where == "forward pass" and compiled_v2 is not None and tp == 1 and facts.quant is None)  # fmt: skip
    compiled_part = f"; {compile_.detail}" if compile_.bytes else ""
    if encoder is not None:
        compiled_part += f"; {encoder.run_detail}, less the encoder cache line"
    lines.append(DeploymentLine(
        group="profile-peak", name="activations", bytes=max(candidates.values()) - recv,
        kind="exact" if exact else "estimate",
        source=f"peak in the {where}: max({forward.detail}; {sampler.detail}{compiled_part})"
        f"{' less the dispatch receive above' if recv else ''}; {runner} (harness/sizing/profile_run.py); "
        f"{gpu_source}"))  # fmt: skip
    return lines


def _largest_rope_cache(facts: ModelFacts) -> int:
    """The bytes of the largest cos_sin_cache the model's rotary layers share (the one a layer's combo kernel reads;
    deployment_weights.rotary_cache_bytes sums them)."""
    if facts.is_mla:
        return 0
    rotary_dim = facts.rotary_dim or facts.head_dim
    width = 4 if (facts.rotary_dtype or facts.dtype) == "float32" else facts.dtype_bytes
    return max(facts.rope_positions or (facts.max_position_embeddings or 0,)) * rotary_dim * width


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
    if non_kv >= requested and r.kv_cache_memory_bytes is None:
        return Verdict(outcome="fails", component="KV cache",
                       text=f"fails: no memory left for the KV cache ({non_kv / GIB:.2f} GiB before it, over the "
                       f"{requested / GIB:.2f} GiB requested at gpu_memory_utilization {r.utilization})")  # fmt: skip
    if not cache.holds_one_request:
        return Verdict(outcome="fails", component="KV cache",
                       text=f"fails: the KV cache cannot hold one request of {r.max_model_len} tokens "
                       f"({cache.tokens} tokens in {cache.available_bytes / GIB:.2f} GiB)")  # fmt: skip
    held = non_kv
    kv_line = next(line for line in lines if line.group == "kv-cache")
    base = requested if r.kv_cache_memory_bytes is None else held + kv_line.bytes
    if r.kv_cache_memory_bytes is not None and base > total:
        return Verdict(outcome="oom", component="KV cache",
                       text=f"OOM at KV cache: --kv-cache-memory-bytes {kv_line.bytes / GIB:.2f} GiB after "
                       f"{held / GIB:.2f} GiB takes the GPU to {base / GIB:.2f} GiB of "
                       f"{total / GIB:.2f} GiB")  # fmt: skip
    graphs = next((line for line in lines if line.group == "after-kv" and line.name == "CUDA graphs"), None)
    if graphs is not None and base + graphs.bytes > total:
        return Verdict(outcome="oom", component=graphs.name,
                       text=f"OOM at CUDA graphs: {graphs.bytes / GIB:.2f} GiB captured after the KV cache takes the "
                       f"GPU to {(base + graphs.bytes) / GIB:.2f} GiB of {total / GIB:.2f} GiB")  # fmt: skip
    base += graphs.bytes if graphs is not None else 0
    sampler = next(line for line in lines if line.name == "sampler warm-up")
    transient = sum(line.bytes for line in lines if line.group == "profile-peak" and line.name == "activations")
    after = base + max(0, sampler.bytes - transient)
    if after > total:
        return Verdict(outcome="oom", component=sampler.name,
                       text=f"OOM at sampler warm-up: {sampler.bytes / GIB:.2f} GiB after the KV cache takes the GPU "
                       f"to {after / GIB:.2f} GiB of {total / GIB:.2f} GiB")  # fmt: skip
    text = (
        f"starts: {cache.tokens} tokens of KV cache, {cache.concurrency:.2f}x concurrency at {r.max_model_len} tokens"
    )
    if r.approximate:
        text += f" (approximate: {'; '.join(r.approximate)})"
    return Verdict(outcome="starts", text=text)
