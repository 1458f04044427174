"""The serve defaults a release takes when a flag is left out, read from its source with the AST where the harness
has the file, else from a documented table (labelled `table`). Nothing is imported or exec'd.

    gpu_memory_utilization          config/cache.py   CacheConfig.gpu_memory_utilization = Field(default=...)
    all2all_backend                 config/parallel.py ParallelConfig.all2all_backend
    max_num_batched_tokens (batched DP MoE)  config/scheduler.py DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP
    max_num_batched_tokens, max_num_seqs (vllm serve on a GPU)  engine/arg_utils.py get_batch_defaults: table
    CUDA-graph memory estimate on/off  envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    DeepGEMM started at the model's build  quantization/input_quant_fp8.py QuantFP8.__init__ -> utils/deep_gemm.py
                                    is_deep_gemm_e8m0_used -> _lazy_init -> set_pdl; third_party/deep_gemm/__init__.py
    the load's max_split_size       v1/worker/gpu_worker.py Worker.load_model _scoped_allocator_max_split
    the MXFP4 Hopper padding        third_party/triton_kernels/.../hopper_value.py HopperMXValueLayout.swizzle_data;
                                    quantization/utils/mxfp4_utils.py _swizzle_mxfp4
    ModelOpt's ignore key, lm_head  quantization/modelopt.py ModelOptQuantConfigBase.from_config, get_quant_method
    GPTQ's quantized layers         quantization/auto_gptq.py (gptq_marlin.py) maybe_update_config
    AWQ's linear kernel             quantization/auto_awq.py (awq_marlin.py): choose_mp_linear_kernel (Machete on 9.0)
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from harness.core.units import GIB
from harness.sizing.vllm_source.layer_source import ReleaseFiles, env_default

CACHE_FILE = "vllm/config/cache.py"
PARALLEL_FILE = "vllm/config/parallel.py"
SCHEDULER_FILE = "vllm/config/scheduler.py"
CUDAGRAPH_ENV = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"


@dataclass(frozen=True)
class Default:
    value: object
    source: str  # "config/scheduler.py:43" or "table: ..."

    @property
    def from_source(self) -> bool:
        return not self.source.startswith("table")


def _release_key(version: str | None) -> tuple[int, ...]:
    """(X, Y, Z); no version (no release at hand) reads the table's latest row."""
    if version is None:
        return (10**6,)
    head = version.split("+")[0].split("rc")[0]
    try:
        return tuple(int(p) for p in head.split(".")[:3])
    except ValueError:
        return (0, 0, 0)


def class_default(files: ReleaseFiles | None, file: str, class_name: str, attribute: str) -> Default | None:
    """`attribute: T = LITERAL`, `= Field(default=LITERAL, ...)` or `= field(default=LITERAL)` in the class body;
    None without a release (files None) or when the file does not say."""
    module = files.module(file) if files is not None else None
    if module is None:
        return None
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.target.id == attribute
                ):
                    value = _literal(item.value, node)
                    if value is not None:
                        return Default(value, f"{file.removeprefix('vllm/')}:{item.lineno}")
    return None


def _literal(node: ast.expr | None, cls: ast.ClassDef) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Field", "field"):
        for keyword in node.keywords:
            if keyword.arg == "default":
                return _literal(keyword.value, cls)
    if isinstance(node, ast.Name):  # a ClassVar of the same class: default=DEFAULT_MAX_NUM_SEQS
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == node.id:
                return _literal(item.value, cls)
    return None


def gpu_memory_utilization(files: ReleaseFiles | None, version: str | None) -> Default:
    read = class_default(files, CACHE_FILE, "CacheConfig", "gpu_memory_utilization")
    if read is not None and isinstance(read.value, float):
        return read
    if _release_key(version) >= (0, 25, 0):
        return Default(0.92, "table: config/cache.py Field(default=0.92) in v0.25.0 and v0.30.0 (file not in this "
                             "extraction)")  # fmt: skip
    return Default(0.9, "table: config/cache.py default 0.9 before 0.25.0 (file not in this extraction)")


ALL2ALL_ENV = "VLLM_ALL2ALL_BACKEND"


def all2all_backend(files: ReleaseFiles | None) -> Default:
    """ParallelConfig.all2all_backend's default; in the releases before that field, envs.py's VLLM_ALL2ALL_BACKEND
    (0.9.x: `os.getenv("VLLM_ALL2ALL_BACKEND", "naive")`)."""
    read = class_default(files, PARALLEL_FILE, "ParallelConfig", "all2all_backend")
    if read is not None and isinstance(read.value, str):
        return read
    env = env_string_default(files, ALL2ALL_ENV)
    if env is not None:
        return env
    return Default("allgather_reducescatter", "table: config/parallel.py ParallelConfig.all2all_backend")


def env_string_default(files: ReleaseFiles | None, name: str) -> Default | None:
    """The string default of `os.getenv("NAME", "default")` in the release's envs.py; None where it reads none."""
    found = getenv_default(files, name)
    if found is None or not isinstance(found[0], str):
        return None
    return Default(found[0], f"envs.py:{found[1]} {name} (the release reads the environment, not a ParallelConfig "
                             "field)")  # fmt: skip


def getenv_default(files: ReleaseFiles | None, name: str) -> tuple[object, int] | None:
    """(the literal default, its line) of the first `os.getenv("NAME", LITERAL)` in the release's envs.py, or None."""
    module = files.module("vllm/envs.py") if files is not None else None
    for node in ast.walk(module) if module is not None else ():
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getenv"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant) and node.args[0].value == name
                and isinstance(node.args[1], ast.Constant)):  # fmt: skip
            return node.args[1].value, node.lineno
    return None


def uses_batched_dp_moe(all2all: str, enable_ep: bool, dp: int) -> bool:
    """ParallelConfig.use_batched_dp_moe (config/parallel.py): the batched DP MoE path."""
    return all2all in ("deepep_low_latency", "nixl_ep") and enable_ep and dp > 1


def max_num_batched_tokens(files: ReleaseFiles | None, *, batched_dp: bool, gpu_bytes: int, gpu: str | None) -> Default:
    """The default token budget of one step: batched DP MoE's constant, else arg_utils' per-GPU table for the API
    server (>= 70 GiB and not an A100: 8192; else 2048)."""
    if batched_dp:
        read = class_default(files, SCHEDULER_FILE, "SchedulerConfig", "DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP")
        if read is not None and isinstance(read.value, int):
            return read
        if files is None:
            return Default(256, "table: SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP")
        # a release without the constant (0.9.x: its all-to-all chosen by VLLM_ALL2ALL_BACKEND) keeps the table below
    if _large_gpu(gpu_bytes, gpu):
        return Default(8192, "table: engine/arg_utils.py get_batch_defaults, OPENAI_API_SERVER, >= 70 GiB non-A100")
    return Default(2048, "table: engine/arg_utils.py get_batch_defaults, OPENAI_API_SERVER, other GPUs")


def max_num_seqs(gpu_bytes: int, gpu: str | None) -> Default:
    if _large_gpu(gpu_bytes, gpu):
        return Default(1024, "table: engine/arg_utils.py get_batch_defaults, OPENAI_API_SERVER, >= 70 GiB non-A100")
    return Default(256, "table: engine/arg_utils.py get_batch_defaults, OPENAI_API_SERVER, other GPUs")


def _large_gpu(gpu_bytes: int, gpu: str | None) -> bool:
    return gpu_bytes >= 70 * GIB and not (gpu or "").upper().startswith("A100")


def estimates_cudagraphs(files: ReleaseFiles | None, version: str | None = None) -> Default:
    """Whether the profile subtracts a CUDA-graph estimate from the KV cache (envs.py's default of the switch)."""
    if files is None:
        on = _release_key(version) >= (0, 21, 0)
        return Default(
            on,
            f"table: {CUDAGRAPH_ENV} is off in 0.19.0 (its startup log asks to set it) and on by default from 0.21.0",
        )
    read = env_default(files, CUDAGRAPH_ENV)
    if read.ok:
        return Default(bool(read.value), str(read.ref))
    return Default(False, f"table: {CUDAGRAPH_ENV} absent from envs.py ({read.reason})")


MODULAR_KERNEL_FILE = "vllm/model_executor/layers/fused_moe/modular_kernel.py"


def workspace_persistent(files: ReleaseFiles | None, version: str | None = None) -> Default:
    """Whether the MoE workspace outlives the call: from the release whose modular_kernel.py takes it from
    `current_workspace_manager()` (vllm/v1/worker/workspace.py: one buffer grown to the largest request and kept),
    before that `torch.empty` per call, freed when the call returns (only the profile's peak sees it)."""
    module = files.module(MODULAR_KERNEL_FILE) if files is not None else None
    if module is not None:
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "current_workspace_manager":  # fmt: skip
                return Default(True, f"{MODULAR_KERNEL_FILE.removeprefix('vllm/')}:{node.lineno} "
                                     "current_workspace_manager().get_simultaneous: kept")  # fmt: skip
        return Default(False, f"{MODULAR_KERNEL_FILE.removeprefix('vllm/')}: workspace13/workspace2 torch.empty per "
                              "call, freed on return")  # fmt: skip
    on = _release_key(version) >= (0, 11, 0)
    return Default(
        on, "table: per call in 0.10.1, the workspace manager in 0.19.0 on (kept); taken as kept from 0.11.0"
    )


MXFP4_ORACLE_FILE = "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"


def mxfp4_keeps_loaded_scales(files: ReleaseFiles | None) -> Default:
    """Whether the Triton MXFP4 backend keeps the loaded block scales beside its swizzled copy: the release's
    fused_moe/oracle/mxfp4.py, the branch `elif mxfp4_backend in TRITON_BACKENDS:` that calls _swizzle_mxfp4, deletes
    `layer.w13_weight` and `layer.w2_weight` (0.19.0) and, later, `layer.w13_weight_scale` and `layer.w2_weight_scale`
    too (0.26.0)."""
    module = files.module(MXFP4_ORACLE_FILE) if files is not None else None
    if module is None:
        return Default(True, "table: kept, as in 0.19.0 (fused_moe/oracle/mxfp4.py deletes the loaded weights only)")
    where = MXFP4_ORACLE_FILE.removeprefix("vllm/")
    branches = [node for node in ast.walk(module) if isinstance(node, ast.If) and "TRITON_BACKENDS" in
                ast.unparse(node.test) and "_swizzle_mxfp4" in ast.unparse(ast.Module(node.body, []))]  # fmt: skip
    deleted = [node for branch in branches for stmt in branch.body for node in ast.walk(stmt)
               if isinstance(node, ast.Delete) and any(ast.unparse(t) == "layer.w13_weight_scale"
                                                       for t in node.targets)]  # fmt: skip
    if branches and len(deleted) >= len(branches):
        return Default(False, f"{where}:{deleted[0].lineno} del layer.w13_weight_scale after the swizzle: freed")
    return Default(True, f"{where}: the Triton branch deletes the loaded weights only: the scales kept")


GROUPED_TOPK_FILES = (
    "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py",
    "vllm/model_executor/layers/fused_moe/fused_moe.py",
)
CUSTOM_OPS_FILE = "vllm/_custom_ops.py"
GROUPED_TOPK_OP = "_moe_C::grouped_topk"
GROUPED_TOPK_READ = (
    "read in 0.8.5, 0.9.2 (no fused op), 0.19.0 and 0.26.0-0.29.0 (the fused op, no fake "
    "implementation) and 0.30.0, 0.33.0 (registered)"
)


def first_moe_call_kept(files: ReleaseFiles | None, version: str | None = None) -> Default:
    """Whether the profile run's first MoE call can keep its frames to the end of the run (value True): the release's
    `grouped_topk` is `@torch.compile`d and calls `fused_grouped_topk` (vLLM's `_moe_C::grouped_topk` op), and
    `_custom_ops.py` registers no fake implementation of that op (`register_fake("_moe_C::grouped_topk")`, from
    0.30.0). Dynamo's trace of the first call then runs the op on fake tensors, which raise; the fake-tensor fallback
    re-raises (torch/_subclasses/fake_tensor.py maybe_run_unsafe_fallback) and the two exceptions, their tracebacks
    and the frames they hold form a reference cycle. Frames held past their return keep their locals and link their
    callers' frames, so as the MoE runner's frames return they join it with their tensors. Dynamo's closing
    collection (convert_frame.py _compile: run_gc_after_compile, gc.collect(1)) frees the cycle where none of it has
    reached the collector's oldest generation; where it has, it lasts until a full collection, after the profile
    (results/h200/startup-gaps, fifth batch). Which of the two a startup gets is not read: the plan gives both."""
    modules = [(file, files.module(file)) for file in GROUPED_TOPK_FILES] if files is not None else []
    found = [(_short(file), fn) for file, module in modules if (fn := _function(module, "grouped_topk")) is not None]
    ops = files.module(CUSTOM_OPS_FILE) if files is not None else None
    if not found or ops is None:
        kept = (0, 19, 0) <= _release_key(version) < (0, 30, 0)
        return Default(kept, f"table: the fused op without a fake implementation from 0.19.0 to 0.29.0; "
                             f"{GROUPED_TOPK_READ}")  # fmt: skip
    where, fn = found[0]
    compiled = any("torch.compile" in ast.unparse(d) for d in fn.decorator_list)
    fused = bool(_calls(fn, "fused_grouped_topk"))
    fake = [d for node in ast.walk(ops) if isinstance(node, ast.FunctionDef) for d in node.decorator_list
            if isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", "")) == "register_fake"
            and d.args and isinstance(d.args[0], ast.Constant) and d.args[0].value == GROUPED_TOPK_OP]  # fmt: skip
    missing = [why for why, ok in (("is not torch.compiled", compiled), ("calls no fused op", fused)) if not ok]
    if missing:
        return Default(False, f"{where}:{fn.lineno} grouped_topk {' and '.join(missing)}: no fake-tensor fallback in "
                              "its trace")  # fmt: skip
    if fake:
        return Default(False, f"{_short(CUSTOM_OPS_FILE)}:{fake[0].lineno} register_fake(\"{GROUPED_TOPK_OP}\"): "
                              "Dynamo traces the op on fake tensors, nothing raises")  # fmt: skip
    return Default(
        True,
        f"{where}:{fn.lineno} @torch.compile grouped_topk calls fused_grouped_topk, and "
        f"{_short(CUSTOM_OPS_FILE)} registers no fake implementation of {GROUPED_TOPK_OP}",
    )


MOE_OP_FILES = (
    "vllm/model_executor/layers/fused_moe/runner/moe_runner.py",
    "vllm/model_executor/layers/fused_moe/runner/default_moe_runner.py",
    "vllm/model_executor/layers/fused_moe/layer.py",
)
MOE_OP_HIDDEN_ARGS = ("hidden_states", "router_logits", "shared_experts_input")


def moe_op_hidden_inputs(files: ReleaseFiles | None) -> Default:
    """How many (N, K) copies of the normed hidden states the compiled MoE piece hands vLLM's
    `moe_forward_shared` op (value; 0 where not read). 0.26.0's op takes `hidden_states`, `router_logits` and
    `shared_experts_input` (fused_moe/runner/moe_runner.py _moe_forward_shared); the runner holds the gate, so the
    model passes its hidden states as all three, and Inductor's code writes three buffers from the fused
    add-RMS-norm kernel, beside the new residual (the allocator's history of a real 0.26.0 profile run on the H200,
    results/h200/startup-gaps, seventh batch: `buf10`, `buf11`, `buf12`). A release whose op has no
    `shared_experts_input` was not measured: 0, the forward's MoE point stays an estimate there."""
    for file in MOE_OP_FILES:
        module = files.module(file) if files is not None else None
        fn = _function(module, "_moe_forward_shared") or _function(module, "moe_forward_shared")
        if fn is None:
            continue
        names = [a.arg for a in fn.args.args]
        where = f"{_short(file)}:{fn.lineno} {fn.name}({', '.join(names)})"
        if all(name in names for name in MOE_OP_HIDDEN_ARGS):
            return Default(
                len(MOE_OP_HIDDEN_ARGS),
                f"{where}: hidden_states, router_logits and shared_experts_input, "
                "three (N, K) buffers in the compiled piece (measured on 0.26.0)",
            )
        return Default(0, f"{where}: no shared_experts_input; this op's compiled piece was not measured")
    return Default(0, "no moe_forward_shared op found in the release (or no release at hand): not read")


FUSED_MOE_LAYER_FILE = "vllm/model_executor/layers/fused_moe/layer.py"
DP_CHUNK_ENV = "VLLM_MOE_DP_CHUNK_SIZE"


def moe_max_num_tokens(files: ReleaseFiles | None, *, max_num_batched_tokens: int, dp: int,
                       chunk_env: int | None = None) -> Default:  # fmt: skip
    """The tokens per DP rank the MoE layer is built for (FusedMoEConfig.max_num_tokens: DeepEP's
    num_max_dispatch_tokens_per_rank, the batched experts' T, the chunk the DP ranks process together): what the
    release's fused_moe/layer.py passes, `envs.VLLM_MOE_DP_CHUNK_SIZE` (0.19.0: 256, or `--env`) or the scheduler's
    `max_num_batched_tokens` (0.29.0 on). One DP rank runs no DP chunking: its max_num_batched_tokens."""
    if dp <= 1:
        return Default(max_num_batched_tokens, "one DP rank: the step's max_num_batched_tokens")
    module = files.module(FUSED_MOE_LAYER_FILE) if files is not None else None
    if module is None:
        return Default(max_num_batched_tokens, "table: FusedMoEConfig(max_num_tokens=max_num_batched_tokens) (no "
                                               "fused_moe/layer.py at hand)")  # fmt: skip
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "FusedMoEConfig":
            for keyword in node.keywords:
                if keyword.arg != "max_num_tokens":
                    continue
                text = ast.unparse(keyword.value)
                where = f"{FUSED_MOE_LAYER_FILE.removeprefix('vllm/')}:{keyword.value.lineno} max_num_tokens={text}"
                if DP_CHUNK_ENV in text:
                    if chunk_env is not None:
                        return Default(chunk_env, f"{where}; --env {DP_CHUNK_ENV}={chunk_env}")
                    read = env_default(files, DP_CHUNK_ENV)
                    if read.ok and isinstance(read.value, int):
                        return Default(read.value, f"{where}; {read.ref}")
                    return Default(256, f"{where}; table: {DP_CHUNK_ENV} 256 ({read.reason})")
                return Default(max_num_batched_tokens, where)
    return Default(max_num_batched_tokens, f"table: {FUSED_MOE_LAYER_FILE.removeprefix('vllm/')} builds no "
                                           "FusedMoEConfig(max_num_tokens=...): max_num_batched_tokens")  # fmt: skip


# Releases whose "V2" model runner (v1/worker/gpu/model_runner.py) makes no CUDA-graph estimate, and which
# architectures they run on it by default: 0.26.0's VllmConfig.use_v2_model_runner (config/vllm.py:550-622) takes
# V2 for a generate model that is not hybrid and is either not MoE or one of DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
# (config/vllm.py:68); its profile_cudagraph_memory returns 0 (v1/worker/gpu/model_runner.py:705), so the graphs
# come out of the headroom after the KV cache. 0.30.0's V2 runner estimates (_profile_cudagraph_memory) and
# runs every architecture: not listed. Real 0.26.0 startups on one H200 confirm the runner per architecture
# (tests/data/real_startups).
V2_RUNNER_WITHOUT_ESTIMATE: dict[str, frozenset[str]] = {
    "0.26.0": frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                         "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"}),
}  # fmt: skip
V2_RUNNER_SOURCE = ("table: vLLM {version} runs {arch} on its V2 model runner (config/vllm.py use_v2_model_runner: "
                    "{why}), whose profile_cudagraph_memory returns 0 (v1/worker/gpu/model_runner.py)")  # fmt: skip


def v2_runner_without_estimate(architecture: str, is_moe: bool, version: str | None) -> str | None:
    """The source line when `version` runs this architecture on a model runner that makes no CUDA-graph estimate
    (VLLM_USE_V2_MODEL_RUNNER unset); None otherwise."""
    listed = V2_RUNNER_WITHOUT_ESTIMATE.get(version or "")
    if listed is None:
        return None
    if not is_moe or architecture in listed:
        why = "not an MoE model" if not is_moe else "in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES"
        return V2_RUNNER_SOURCE.format(version=version, arch=architecture, why=why)
    return None


# The V1 model runner's CUDA-graph estimate (v1/worker/gpu_model_runner.py profile_cudagraph_memory: the first two
# captures of each mode, harness.sizing.cudagraph_memory): present from 0.19.0 (absent in 0.15.1), the same
# first-capture + (n - 1) x per-graph and max over modes in 0.19.0, 0.26.0, 0.29.0 and 0.30.0. 0.29.0 and later run
# every architecture on the V2 runner by default (config/vllm.py use_v2_model_runner), whose estimate is its own.
V1_GRAPH_ESTIMATE = ((0, 19, 0), (0, 29, 0))
ATTENTION_FILE = "vllm/config/attention.py"
SHARED_STREAM_ENV = "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD"


def v1_graph_estimate(version: str | None) -> Default:
    """Whether the release's V1 runner makes the estimate harness.sizing.cudagraph_memory models."""
    low, high = V1_GRAPH_ESTIMATE
    key = _release_key(version)
    on = version is not None and low <= key < high
    span = f"from {'.'.join(map(str, low))} until {'.'.join(map(str, high))}"
    return Default(on, f"table: v1/worker/gpu_model_runner.py profile_cudagraph_memory, the V1 runner's default {span} "
                       f"(vLLM {version or 'unknown'})")  # fmt: skip


GRAPH_EXEC_PAGES = (0, 26, 0)  # the release whose stack the driver's graph-exec memory was measured under


def graph_exec_pages(version: str | None) -> Default:
    """Which measurement of the driver's memory for instantiated graphs the CUDA-graph estimate takes
    (harness.sizing.cudagraph_memory): from 0.26.0 (torch 2.11.0+cu130), the per-graph objects and per-node blocks
    measured under that stack on an H200 (driver 580.159.04; results/h200/cudagraph-exec); before, the per-layer
    6 MiB per 32 layers of the published 0.19.0 H100 logs, another stack (torch 2.10, H100 machines) whose
    per-graph figures run higher (Qwen3-30B-A3B's estimate 1.24 GiB there, 0.49 under 0.26.0 on the H200)."""
    on = version is None or _release_key(version) >= GRAPH_EXEC_PAGES
    return Default(on, f"table: graph-exec pages measured under 0.26.0's stack, per-layer scaling before "
                       f"(vLLM {version or 'unknown: the measured pages'})")  # fmt: skip


def flash_attn_max_splits(files: ReleaseFiles | None) -> Default:
    """AttentionConfig.flash_attn_max_num_splits_for_cuda_graph: FlashAttention's splits under full graphs."""
    read = class_default(files, ATTENTION_FILE, "AttentionConfig", "flash_attn_max_num_splits_for_cuda_graph")
    if read is not None and isinstance(read.value, int):
        return read
    return Default(32, "table: config/attention.py flash_attn_max_num_splits_for_cuda_graph = 32 (0.19.0-0.30.0)")


def shared_experts_stream_threshold(files: ReleaseFiles | None) -> Default:
    """envs.py VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD: the largest batch whose shared experts run on the aux
    stream (model_executor/layers/fused_moe/runner/shared_experts.py)."""
    # "NAME": lambda: int(int(os.getenv("NAME", 256))): the default an int literal (env_default reads strings)
    found = getenv_default(files, SHARED_STREAM_ENV)
    if found is not None and isinstance(found[0], int | str) and str(found[0]).isdigit():
        return Default(int(found[0]), f"envs.py:{found[1]} {SHARED_STREAM_ENV}")
    return Default(256, f"table: envs.py {SHARED_STREAM_ENV} 256 (0.19.0-0.30.0)")


COMPILATION_FILE = "vllm/config/compilation.py"


def benchmarks_combo_kernels(files: ReleaseFiles | None, version: str | None = None) -> Default:
    """Whether the release turns on Inductor's combo-kernel benchmark, whose first compile benchmarks the fused
    rotary kernel on random copies of its arguments inside the profile run (harness.sizing.profile_run
    compile_phase): config/compilation.py CompilationConfig.__post_init__ sets
    `self.inductor_compile_config["benchmark_combo_kernel"] = True` (0.19.0, 0.26.0; 0.33.0 `= not deterministic`,
    on by default) when the torch it runs is 2.9 or later and the user set neither key."""
    module = files.module(COMPILATION_FILE) if files is not None else None
    where = COMPILATION_FILE.removeprefix("vllm/")
    if module is not None:
        for node in ast.walk(module):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Subscript) and "inductor_compile_config" in ast.unparse(t.value)
                and isinstance(t.slice, ast.Constant) and t.slice.value == "benchmark_combo_kernel"
                for t in node.targets
            ):  # fmt: skip
                off = isinstance(node.value, ast.Constant) and node.value.value is False
                return Default(not off, f"{where}:{node.lineno} inductor_compile_config['benchmark_combo_kernel'] = "
                                        f"{ast.unparse(node.value)} (torch >= 2.9)")  # fmt: skip
        return Default(False, f"{where}: sets no benchmark_combo_kernel")
    on = _release_key(version) >= (0, 19, 0)
    return Default(on, "table: config/compilation.py sets benchmark_combo_kernel from 0.19.0 (read in 0.19.0, 0.26.0, "
                       "0.29.0, 0.30.0 and 0.33.0)")  # fmt: skip


# --- what the startup allocates at the model's build and load, read from the release's files ---------------------


def _function(module: ast.Module | None, name: str, class_name: str | None = None) -> ast.FunctionDef | None:
    """A module-level function, or a method of a module-level class."""
    body = module.body if module is not None else []
    if class_name is not None:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
        body = cls.body if cls is not None else []
    return next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    """The calls of `name(...)` or `x.name(...)` under node."""
    return [c for c in ast.walk(node) if isinstance(c, ast.Call)
            and getattr(c.func, "id", getattr(c.func, "attr", None)) == name]  # fmt: skip


def _short(file: str) -> str:
    return file.removeprefix("vllm/")


# DeepGEMM's DeviceRuntime (vllm/third_party/deep_gemm, csrc/jit/device_runtime.hpp: compiled into its _C, not shipped
# as source) allocates a cuBLASLt workspace of 32 MiB through torch's caching allocator when it is first touched, and
# keeps it for the process: the one block beside the parameters in a real 0.26.0 load's allocator snapshot
# (results/h200/load-snapshot).
DEEP_GEMM_CUBLASLT_WORKSPACE = 32 << 20
INPUT_QUANT_FP8_FILE = "vllm/model_executor/layers/quantization/input_quant_fp8.py"
DEEP_GEMM_FILE = "vllm/utils/deep_gemm.py"
VENDORED_DEEP_GEMM_FILE = "vllm/third_party/deep_gemm/__init__.py"
# The table, for a plan without release files, as deep_gemm_chain reads the releases: the chain holds in every one
# from 0.24.0 to 0.33.0; 0.22.0-0.23.0's _lazy_init imports the vendored deep_gemm but calls no set_pdl; 0.19.0 vendors
# none and its _lazy_init calls no set_pdl; 0.8.5 has neither file. 0.20-0.21 are not read (taken as not started).
DEEP_GEMM_AT_LOAD_FROM = (0, 24)
DEEP_GEMM_READ = "the chain read in every release 0.24.0-0.33.0, not in 0.8.5, 0.19.0 or 0.22.0-0.23.0"


def deep_gemm_workspace_at_load(version: str | None, files: ReleaseFiles | None = None) -> Default:
    """Whether building an FP8 model resolves DeepGEMM, whose first use keeps its cuBLASLt workspace (32 MiB) in what
    vLLM logs as the model's loading: read from the release's files where given (deep_gemm_chain), else the table
    (DEEP_GEMM_AT_LOAD_FROM)."""
    if files is not None:
        return deep_gemm_chain(files)
    key = _release_key(version)[:2]
    if key >= DEEP_GEMM_AT_LOAD_FROM:
        return Default(True, "table: model_executor/layers/quantization/input_quant_fp8.py QuantFP8.__init__ -> "
                             "utils/deep_gemm.py is_deep_gemm_e8m0_used -> _lazy_init -> _apply_pdl (set_pdl starts "
                             f"DeepGEMM's DeviceRuntime): {DEEP_GEMM_READ}")  # fmt: skip
    return Default(False, f"table: DeepGEMM not started at the model's build ({DEEP_GEMM_READ})")


def deep_gemm_chain(files: ReleaseFiles) -> Default:
    """The chain in the release's files: QuantFP8.__init__ (model_executor/layers/quantization/input_quant_fp8.py)
    calls is_deep_gemm_e8m0_used(); that function of utils/deep_gemm.py calls _lazy_init(); _lazy_init calls set_pdl
    (directly or through a helper that looks it up, 0.26.0's _apply_pdl), on compute capability 9.0 and later
    (is_arch_support_pdl); and the wheel's vendored deep_gemm (third_party/deep_gemm/__init__.py) has a set_pdl,
    which starts its DeviceRuntime. envs.py's VLLM_USE_DEEP_GEMM default must be on (is_deep_gemm_supported). The
    first link missing (a release without these files: all of them) is named in the source."""
    quant, utils = files.module(INPUT_QUANT_FP8_FILE), files.module(DEEP_GEMM_FILE)

    def off(why: str) -> Default:
        return Default(False, f"{why}: DeepGEMM not started at the model's build")

    if quant is None and utils is None:
        return off(f"{_short(INPUT_QUANT_FP8_FILE)} and {_short(DEEP_GEMM_FILE)} absent from the release")

    init = _function(quant, "__init__", "QuantFP8")
    asks = _calls(init, "is_deep_gemm_e8m0_used") if init is not None else []
    if not asks:
        return off(f"{_short(INPUT_QUANT_FP8_FILE)}: QuantFP8.__init__ does not call is_deep_gemm_e8m0_used()")
    e8m0 = _function(utils, "is_deep_gemm_e8m0_used")
    if e8m0 is None or not _calls(e8m0, "_lazy_init"):
        return off(f"{_short(DEEP_GEMM_FILE)}: is_deep_gemm_e8m0_used does not call _lazy_init()")
    lazy = _function(utils, "_lazy_init")
    helpers = {n.name for n in (utils.body if utils is not None else []) if isinstance(n, ast.FunctionDef)
               and any((isinstance(x, ast.Constant) and x.value == "set_pdl") or
                       (isinstance(x, ast.Attribute) and x.attr == "set_pdl") for x in ast.walk(n))}  # fmt: skip
    pdl = [c for name in ("set_pdl", *sorted(helpers)) for c in (_calls(lazy, name) if lazy is not None else [])]
    if not pdl:
        return off(f"{_short(DEEP_GEMM_FILE)}: _lazy_init calls no set_pdl")
    vendored = files.module(VENDORED_DEEP_GEMM_FILE)
    if vendored is None:
        return off(f"{_short(DEEP_GEMM_FILE)}:{pdl[0].lineno} set_pdl, but the wheel vendors no deep_gemm "
                   f"({_short(VENDORED_DEEP_GEMM_FILE)})")  # fmt: skip
    exported = any((isinstance(n, ast.ImportFrom) and any(a.name == "set_pdl" for a in n.names)) or
                   (isinstance(n, ast.FunctionDef) and n.name == "set_pdl") for n in ast.walk(vendored))  # fmt: skip
    if not exported:
        return off(f"{_short(VENDORED_DEEP_GEMM_FILE)} has no set_pdl")
    switch = env_default(files, "VLLM_USE_DEEP_GEMM")
    if switch.ok and not switch.value:
        return off(f"{switch.ref} VLLM_USE_DEEP_GEMM is off by default")
    guard = next((ast.unparse(n.test) for n in ast.walk(lazy or ast.Module([], [])) if isinstance(n, ast.If)
                  and any(c is pdl[0] for stmt in n.body for c in ast.walk(stmt))), None)  # fmt: skip
    helper = getattr(pdl[0].func, "id", "set_pdl")
    return Default(True, f"{_short(INPUT_QUANT_FP8_FILE)}:{asks[0].lineno} QuantFP8.__init__ -> "
                         f"{_short(DEEP_GEMM_FILE)}:{e8m0.lineno} is_deep_gemm_e8m0_used -> _lazy_init -> "
                         f":{pdl[0].lineno} {helper} (set_pdl{f', if {guard}' if guard else ''}) -> the vendored "
                         f"{_short(VENDORED_DEEP_GEMM_FILE)} set_pdl starts DeepGEMM's DeviceRuntime")  # fmt: skip


GPU_WORKER_FILE = "vllm/v1/worker/gpu_worker.py"
# The table, for a plan without release files, as load_max_split_size reads the releases: Worker.load_model runs under
# max_split_size_mb=20 in every release from 0.22.0 to 0.33.0, under none in 0.8.5 and 0.19.0; 0.20-0.21 are not read
# (taken as none).
LOAD_MAX_SPLIT_FROM: tuple[tuple[int, ...], int] = ((0, 22), 20 << 20)
LOAD_MAX_SPLIT_READ = "read in every release 0.22.0-0.33.0; none in 0.8.5 and 0.19.0"


def load_max_split_size(version: str | None, files: ReleaseFiles | None = None) -> Default:
    """The caching allocator's max_split_size while the release builds and loads the model (None: PyTorch's
    default, no limit): the release's v1/worker/gpu_worker.py Worker.load_model, whose `with` runs the load under
    `self._scoped_allocator_max_split(max_split_size_mb=20)` (0.26.0: "20 MiB is the minimum PyTorch allows"), read
    where the release's files are given, else the table (LOAD_MAX_SPLIT_FROM). With it, a request of at least
    that size is never split off its segment (CUDACachingAllocator should_split), so a fresh one holds its whole
    2 MiB-rounded segment."""
    module = files.module(GPU_WORKER_FILE) if files is not None else None
    if module is not None:
        load = _function(module, "load_model", "Worker")
        where = f"{_short(GPU_WORKER_FILE)}:{load.lineno if load is not None else ''} Worker.load_model"
        for with_node in [n for n in ast.walk(load) if isinstance(n, ast.With)] if load is not None else []:
            for item in with_node.items:
                for call in _calls(item.context_expr, "_scoped_allocator_max_split"):
                    size = next((k.value for k in call.keywords if k.arg == "max_split_size_mb"),
                                call.args[0] if call.args else None)  # fmt: skip
                    if isinstance(size, ast.Constant) and isinstance(size.value, int):
                        scoped = f"_scoped_allocator_max_split(max_split_size_mb={size.value})"
                        return Default(size.value << 20, f"{_short(GPU_WORKER_FILE)}:{call.lineno} Worker.load_model "
                                                         f"{scoped}")  # fmt: skip
        return Default(None, f"{where} sets no max_split_size: PyTorch's default, no limit")
    key = _release_key(version)[:2]
    since, limit = LOAD_MAX_SPLIT_FROM
    if key >= since:
        scoped = f"_scoped_allocator_max_split(max_split_size_mb={limit >> 20})"
        return Default(limit, f"table: v1/worker/gpu_worker.py Worker.load_model {scoped} ({LOAD_MAX_SPLIT_READ})")
    return Default(None, f"table: PyTorch's default, no limit ({LOAD_MAX_SPLIT_READ})")


HOPPER_VALUE_FILE = "vllm/third_party/triton_kernels/tensor_details/layout_details/hopper_value.py"
MXFP4_UTILS_FILE = "vllm/model_executor/layers/quantization/utils/mxfp4_utils.py"
# The tables, for a plan without release files, as hopper_value_align and scale_groups_multiple read the releases.
# triton_kernels' Hopper MXFP4 value layout as vendored: 0.19.0's HopperMXValueLayout.swizzle_data pre-pads to
# SWIZZLE_ALIGN_M x SWIZZLE_ALIGN_K = 64 x 64; the file every release from 0.22.0 to 0.33.0 vendors packs, with
# mma_version 3, k_tile x warp_tile x threads x scott_trick x contig = 1 x 2 x 4 x 2 x 1 = 16 rows and
# 4 x 2 x 4 x 1 x 1 = 32 bytes (before the first key: 64 x 64).
MXFP4_VALUE_ALIGN_FROM: dict[tuple[int, ...], tuple[int, int]] = {(0, 22): (16, 32)}
MXFP4_VALUE_ALIGN_READ = "read: 64 x 64 in 0.19.0, 16 x 32 in every release 0.22.0-0.33.0"
# utils/mxfp4_utils.py _swizzle_mxfp4 pads the scale groups to a multiple of 4 on compute capability 9.0 before the
# Hopper scale layout ("Patches #47303: pad K (num scale groups) to 0 mod 4") in every release from 0.26.0 to 0.33.0,
# not in 0.19.0 or 0.22.0-0.25.1.
MXFP4_SCALE_GROUPS_PAD_FROM: dict[tuple[int, ...], int] = {(0, 26): 4}
MXFP4_SCALE_GROUPS_READ = "read: from 0.26.0 to 0.33.0, not in 0.19.0 or 0.22.0-0.25.1"


def mxfp4_hopper_padding(version: str | None, capability: int,
                         files: ReleaseFiles | None = None) -> tuple[tuple[int, int], int, str]:  # fmt: skip
    """(value rows x bytes alignment, scale-group multiple, source) of the Triton MXFP4 backend's swizzled copies on
    Hopper: read from the release's vendored hopper_value.py (hopper_value_align) and utils/mxfp4_utils.py
    (scale_groups_multiple) where its files are given, else the tables (MXFP4_VALUE_ALIGN_FROM,
    MXFP4_SCALE_GROUPS_PAD_FROM)."""
    key = _release_key(version)[:2]
    value = hopper_value_align(files) if files is not None else None
    if value is not None:
        align, where = value
    else:
        since = max((k for k in MXFP4_VALUE_ALIGN_FROM if key >= k), default=None)
        align = MXFP4_VALUE_ALIGN_FROM[since] if since is not None else (64, 64)
        where = (f"{align[0]} x {align[1]} (table: third_party/triton_kernels hopper_value.py HopperMXValueLayout; "
                 f"{MXFP4_VALUE_ALIGN_READ})")  # fmt: skip
    groups = scale_groups_multiple(files, capability) if files is not None else None
    if groups is not None:
        pad, pad_where = groups
    else:
        since = max((k for k in MXFP4_SCALE_GROUPS_PAD_FROM if key >= k), default=None)
        pad = MXFP4_SCALE_GROUPS_PAD_FROM[since] if since is not None and capability == 9 else 1
        pad_where = f"table: utils/mxfp4_utils.py _swizzle_mxfp4 on 9.0, {MXFP4_SCALE_GROUPS_READ}"
    where = f"swizzled values padded to {where}"
    where += f"; scale groups padded to a multiple of {pad} ({pad_where})" if pad > 1 else f"; {pad_where}"
    return align, pad, f"table: {where}" if value is None and groups is None else where


def _evaluate(node: ast.expr, env: dict[str, object]) -> object:
    """A constant, tuple, name bound in env, `self.attr`, arithmetic or `a if x == y else b` of those; None else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name | ast.Attribute):
        return env.get(ast.unparse(node))
    if isinstance(node, ast.Tuple):
        items = [_evaluate(e, env) for e in node.elts]
        return tuple(items) if all(isinstance(i, int) for i in items) else None
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        if not isinstance(left, int) or not isinstance(right, int):
            return None
        ops = {ast.Mult: int.__mul__, ast.Add: int.__add__, ast.Sub: int.__sub__, ast.FloorDiv: int.__floordiv__}
        op = ops.get(type(node.op))
        return op(left, right) if op is not None and (right or not isinstance(node.op, ast.FloorDiv)) else None
    if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
        left, right = _evaluate(node.test.left, env), _evaluate(node.test.comparators[0], env)
        if left is None or right is None or not isinstance(node.test.ops[0], ast.Eq | ast.NotEq):
            return None
        holds = (left == right) == isinstance(node.test.ops[0], ast.Eq)
        return _evaluate(node.body if holds else node.orelse, env)
    return None


def hopper_value_align(files: ReleaseFiles) -> tuple[tuple[int, int], str] | None:
    """(rows, bytes) the vendored triton_kernels' HopperMXValueLayout.swizzle_data pads the values to, with the
    layout's default mma_version (its __init__): the loop `for i, (a, b, c, s, d) in enumerate(zip(k_tile, ...))`
    pads each dimension to the product of those tuples' entries, and a pre-pad to SWIZZLE_ALIGN_M x SWIZZLE_ALIGN_K
    (0.19.0: 64 x 64) takes the least common multiple. None when the release vendors no such file or it does not
    say (the table answers)."""
    module = files.module(HOPPER_VALUE_FILE)
    init, swizzle = _function(module, "__init__", "HopperMXValueLayout"), _function(module, "swizzle_data",
                                                                                    "HopperMXValueLayout")  # fmt: skip
    if init is None or swizzle is None:
        return None
    env: dict[str, object] = {}
    positional = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    for arg, default in zip([*positional, *init.args.kwonlyargs], [*init.args.defaults, *init.args.kw_defaults],
                            strict=True):  # fmt: skip
        if default is not None:
            env[f"self.{arg.arg}"] = _evaluate(default, env)
    pack: tuple[int, ...] | None = None
    names = ""
    for stmt in swizzle.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            env[stmt.targets[0].id] = _evaluate(stmt.value, env)
        elif isinstance(stmt, ast.For) and isinstance(stmt.iter, ast.Call) and _calls(stmt.iter, "zip"):
            (zipped,) = _calls(stmt.iter, "zip")[:1]
            tiles = [env.get(ast.unparse(a)) for a in zipped.args]
            product = next((s.value for s in stmt.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.BinOp)
                            and all(isinstance(t, ast.Name) and t.id == "pack" for t in s.targets)), None)  # fmt: skip
            if product is None or not tiles or not all(isinstance(t, tuple) and len(t) == 2 for t in tiles):
                return None
            dims = [1, 1]
            for tile in tiles:
                dims = [d * int(t) for d, t in zip(dims, tile, strict=True)]  # type: ignore[call-overload]
            pack, names = tuple(dims), ", ".join(ast.unparse(a) for a in zipped.args)
    if pack is None:
        return None
    rows, cols = pack
    prepad = [env.get("SWIZZLE_ALIGN_M"), env.get("SWIZZLE_ALIGN_K")]
    where = f"{rows} x {cols} ({_short(HOPPER_VALUE_FILE)}:{swizzle.lineno} HopperMXValueLayout.swizzle_data: {names}"
    if isinstance(prepad[0], int) and isinstance(prepad[1], int):
        rows, cols = math.lcm(rows, prepad[0]), math.lcm(cols, prepad[1])
        where = f"{rows} x {cols} (SWIZZLE_ALIGN_M x SWIZZLE_ALIGN_K pre-pad, and " + where.split(" (", 1)[1]
    mma = env.get("self.mma_version")
    return (rows, cols), f"{where}, mma_version {mma})"


def scale_groups_multiple(files: ReleaseFiles, capability: int) -> tuple[int, str] | None:
    """The multiple utils/mxfp4_utils.py _swizzle_mxfp4 pads the scale groups (the scale's last dimension) to on this
    compute capability: under `if current_platform.is_device_capability(NN):`, `pad_k = -K % M` and
    `scale = torch.nn.functional.pad(scale, (0, pad_k))` (0.26.0: NN 90, M 4); 1 when the file pads none here. None
    when the release has no such function (the table answers)."""
    swizzle = _function(files.module(MXFP4_UTILS_FILE), "_swizzle_mxfp4")
    if swizzle is None:
        return None
    where = f"{_short(MXFP4_UTILS_FILE)}:{swizzle.lineno} _swizzle_mxfp4"
    elsewhere = []
    for branch in [n for n in ast.walk(swizzle) if isinstance(n, ast.If)]:
        test = branch.test
        if not (isinstance(test, ast.Call) and getattr(test.func, "attr", None) == "is_device_capability"
                and test.args and isinstance(test.args[0], ast.Constant)
                and isinstance(test.args[0].value, int)):  # fmt: skip
            continue
        body = [n for stmt in branch.body for n in ast.walk(stmt)]
        multiples = {t.id: n.value.right.value for n in body if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.BinOp)
                     and isinstance(n.value.op, ast.Mod) and isinstance(n.value.left, ast.UnaryOp)
                     and isinstance(n.value.left.op, ast.USub) and isinstance(n.value.right, ast.Constant)
                     and isinstance(n.value.right.value, int)}  # fmt: skip
        for call in (c for c in _calls(ast.Module(branch.body, []), "pad") if c.args):
            pads = call.args[1] if len(call.args) > 1 else None
            if ast.unparse(call.args[0]) == "scale" and isinstance(pads, ast.Tuple) and pads.elts and \
                    ast.unparse(pads.elts[-1]) in multiples:  # fmt: skip
                multiple = int(multiples[ast.unparse(pads.elts[-1])])
                if test.args[0].value == capability * 10:
                    return multiple, f"{where}:{call.lineno}, is_device_capability({test.args[0].value})"
                elsewhere.append(f"is_device_capability({test.args[0].value})")
    if elsewhere:
        return 1, f"{where}: pads the scale groups on {', '.join(elsewhere)} only"
    return 1, f"{where}: pads no scale groups"


MODELOPT_FILE = "vllm/model_executor/layers/quantization/modelopt.py"
GPTQ_FILES = ("vllm/model_executor/layers/quantization/auto_gptq.py",
              "vllm/model_executor/layers/quantization/gptq_marlin.py")  # fmt: skip


def modelopt_reads(files: ReleaseFiles | None) -> tuple[Default, Default]:
    """ModelOpt as the release builds it: the key a flat config.json quantization_config's excluded modules are read
    from (from_config's branch without a nested "quantization" dict: "ignore" in 0.26.0), and whether
    get_quant_method builds ParallelLMHead (the lm_head) quantized."""
    module = files.module(MODELOPT_FILE) if files is not None else None
    where = _short(MODELOPT_FILE)
    key = Default("ignore", 'table: as vLLM 0.26.0\'s quantization/modelopt.py from_config (config.get("ignore"))')
    lm_head = Default(True, "table: as vLLM 0.26.0's quantization/modelopt.py get_quant_method (ParallelLMHead)")
    if module is None:
        return key, lm_head
    for fn in (n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == "from_config"):
        for branch in (n for n in ast.walk(fn) if isinstance(n, ast.If) and "quantization" in ast.unparse(n.test)
                       and " in " in ast.unparse(n.test)):  # fmt: skip
            for stmt in (s for n in branch.orelse for s in ast.walk(n) if isinstance(s, ast.Assign)):
                if any(ast.unparse(t) == "exclude_modules" for t in stmt.targets):
                    names = [c.value for c in ast.walk(stmt.value) if isinstance(c, ast.Constant)
                             and isinstance(c.value, str)]  # fmt: skip
                    if names:
                        key = Default(names[0], f"{where}:{stmt.lineno} {ast.unparse(stmt)}")
                        break
    methods = [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == "get_quant_method"]
    # the branch that builds the format's linear method for ParallelLMHead (not the excluded modules' Unquantized one)
    checks = [c for m in methods for n in ast.walk(m) if isinstance(n, ast.If)
              and "Unquantized" not in ast.unparse(ast.Module(n.body, []))
              for c in _calls(n.test, "isinstance") if "ParallelLMHead" in ast.unparse(c)]  # fmt: skip
    lm_head = Default(bool(checks), f"{where}:{checks[0].lineno} {ast.unparse(checks[0])}" if checks else
                      f"{where}: get_quant_method builds no ParallelLMHead")  # fmt: skip
    return key, lm_head


def gptq_layers_from_checkpoint(files: ReleaseFiles | None) -> Default:
    """Whether the release's GPTQ config lists the quantized layers from the checkpoint's safetensors when the config
    has no modules_in_block_to_quantize (maybe_update_config: get_safetensors_params_metadata, the layers whose
    tensors are not f16/bf16/f32), so that a directory without safetensors (a config-only directory, as `harness
    verify` and dummy-weight startups use) builds every linear outside FusedMoE unquantized."""
    if files is None:
        return Default(True, "table: as vLLM 0.26.0's quantization/auto_gptq.py maybe_update_config")
    found = _first_module(files, GPTQ_FILES)
    if found is None:
        return Default(False, "the release's GPTQ files read: every linear takes the config's format")
    file, module = found
    for fn in (n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == "maybe_update_config"):
        reads = _calls(fn, "get_safetensors_params_metadata")
        sets = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
                and any(ast.unparse(t) == "self.modules_in_block_to_quantize" for t in n.targets)]  # fmt: skip
        if reads and sets:
            return Default(True, f"{_short(file)}:{reads[0].lineno} maybe_update_config lists the quantized layers "
                           "from the checkpoint's safetensors")  # fmt: skip
    return Default(False, f"{_short(file)}: the config's format applies to every linear")


def _first_module(files: ReleaseFiles, paths: tuple[str, ...]) -> tuple[str, ast.Module] | None:
    """The first of paths the release has, parsed (a format's file was renamed between releases)."""
    for file in paths:
        module = files.module(file)
        if module is not None:
            return file, module
    return None


AWQ_FILES = ("vllm/model_executor/layers/quantization/auto_awq.py",
             "vllm/model_executor/layers/quantization/awq_marlin.py")  # fmt: skip


def awq_mixed_precision_kernel(files: ReleaseFiles | None) -> Default:
    """Whether the release's AWQ linear method takes its kernel from choose_mp_linear_kernel (the mixed-precision
    kernels: Machete first on compute capability 9.0, which pre-applies the scales to the zero points and keeps them
    as an (in / group, out) tensor in the activation dtype, kernels/linear/mixed_precision/machete.py) rather than
    repacking for Marlin itself."""
    if files is None:
        return Default(True, "table: as vLLM 0.26.0's quantization/auto_awq.py (choose_mp_linear_kernel)")
    found = _first_module(files, AWQ_FILES)
    if found is None:
        return Default(False, "the release's AWQ files read: the AWQ linears repack for Marlin")
    file, module = found
    calls = _calls(module, "choose_mp_linear_kernel")
    if calls:
        return Default(True, f"{_short(file)}:{calls[0].lineno} choose_mp_linear_kernel")
    return Default(False, f"{_short(file)}: the AWQ linears repack for Marlin (no choose_mp_linear_kernel)")
