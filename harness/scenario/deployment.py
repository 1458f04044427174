"""The `deployment:` section of a scenario: the `vllm serve` settings that change memory, as a matrix can vary them.

`harness plan ... -- vllm serve MODEL FLAGS` fills the same model from the command line
(harness.sizing.serve_args). Left out, a setting takes the release's default (read from its source where the
harness can, else a documented table; docs/deployment-memory.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.scenario import limits as L

# Every value some release's ParallelConfig.all2all_backend Literal has; which a release accepts is read from
# its own config/parallel.py (harness.sizing.release_flags).
ALL2ALL_BACKENDS = (
    "allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput", "naive", "pplx", "nixl_ep",
    "flashinfer_all2allv", "mori", "deepep_v2", "mori_high_throughput", "mori_low_latency",
    "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided",
)  # fmt: skip
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
MAX_MODEL_LEN = 1 << 24
MAX_PARALLEL = 4096


ModalityName = Annotated[str, Field(min_length=1, max_length=40)]


class DeploymentSpec(BaseModel):
    """The serve settings; None takes the release's default (or, in a scenario, the scenario's layout)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    model: Annotated[str, Field(min_length=1, max_length=L.MAX_PATH_CHARS)] | None = Field(
        None,
        description="a model directory holding config.json, or a preset (harness/defaults/models/); "
        "default: the scenario's model.preset",
    )
    tensor_parallel_size: Annotated[int, Field(gt=0, le=MAX_PARALLEL)] = Field(1, description="--tensor-parallel-size")
    data_parallel_size: Annotated[int, Field(gt=0, le=MAX_PARALLEL)] | None = Field(
        None, description="--data-parallel-size; default in a scenario: parallel.num_dispatchers / TP"
    )
    enable_expert_parallel: bool | None = Field(
        None, description="--enable-expert-parallel; default in a scenario: true (D dispatchers)"
    )
    all2all_backend: Annotated[str, Field(min_length=1, max_length=60, pattern=r"^[a-z0-9_]+$")] | None = Field(
        None,
        description="--all2all-backend: a value of the release's ParallelConfig.all2all_backend (e.g. "
        f"{', '.join(ALL2ALL_BACKENDS[:4])}); default in a scenario: from layer.all2all, else the release's",
    )
    moe_backend: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[a-z0-9_]+$")] | None = Field(
        None,
        description="--moe-backend: the experts class family (cutlass, deep_gemm, triton; a release's own "
        "values, read from its config/kernel.py, are accepted too); default: the release's choice for the checkpoint "
        "and GPU, in a scenario its layer.moe_backend",
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="--gpu-memory-utilization; default: the release's (config/cache.py)"
    )
    max_model_len: Annotated[int, Field(gt=0, le=MAX_MODEL_LEN)] | None = Field(
        None, description="--max-model-len; default: the model's max_position_embeddings"
    )
    max_num_batched_tokens: Annotated[int, Field(gt=0, le=MAX_MODEL_LEN)] | None = Field(
        None,
        description="--max-num-batched-tokens; default: the release's (batched DP MoE: "
        "DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP), in a scenario parallel.max_tokens_per_rank",
    )
    max_num_seqs: Annotated[int, Field(gt=0, le=1 << 20)] | None = Field(None, description="--max-num-seqs")
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = Field("auto", description="--kv-cache-dtype")  # type: ignore[valid-type]
    block_size: Annotated[int, Field(gt=0, le=4096)] | None = Field(
        None, description="--block-size; default 16, 64 for MLA (FlashMLA)"
    )
    enable_eplb: bool = Field(False, description="--enable-eplb")
    num_redundant_experts: Annotated[int, Field(ge=0, le=L.MAX_NUM_EXPERTS)] | None = Field(
        None,
        description="--eplb-config '{\"num_redundant_experts\": N}' or --num-redundant-experts; default in a "
        "scenario: its E x D slots beyond the routed experts",
    )
    enable_dbo: bool = Field(False, description="--enable-dbo: two micro-batches, two MoE workspaces")
    enforce_eager: bool = Field(False, description="--enforce-eager: no CUDA graphs")
    pipeline_parallel_size: Annotated[int, Field(gt=0, le=MAX_PARALLEL)] = Field(
        1, description="--pipeline-parallel-size: the layers split over stages (vLLM's get_pp_indices)"
    )
    kv_cache_memory_bytes: Annotated[int, Field(gt=0, le=1 << 50)] | None = Field(
        None, description="--kv-cache-memory-bytes: the KV cache's size, the memory profile skipped"
    )
    cpu_offload_gb: Annotated[float, Field(ge=0, le=1 << 20)] = Field(
        0.0, description="--cpu-offload-gb: weights kept in host memory (GiB)"
    )
    max_model_len_auto: bool = Field(
        False, description="--max-model-len auto or -1: the longest context the KV cache holds"
    )
    moe_dp_chunk_size: Annotated[int, Field(gt=0, le=MAX_MODEL_LEN)] | None = Field(
        None,
        description="--env VLLM_MOE_DP_CHUNK_SIZE=N: the tokens per DP rank of the MoE layer, in releases whose "
        "fused_moe/layer.py reads it",
    )
    cudagraphs: bool | None = Field(
        None,
        description="CUDA graphs captured (False: -O0, --compilation-config cudagraph_mode NONE, "
        "--enforce-eager); None: the release's default",
    )
    cudagraph_mode: Literal[CUDAGRAPH_MODES] | None = Field(  # type: ignore[valid-type]
        None, description="--compilation-config cudagraph_mode; None: the release's default (FULL_AND_PIECEWISE)"
    )
    max_cudagraph_capture_size: Annotated[int, Field(gt=0, le=MAX_MODEL_LEN)] | None = Field(
        None, description="--max-cudagraph-capture-size or --compilation-config max_cudagraph_capture_size"
    )
    cudagraph_capture_sizes: list[Annotated[int, Field(gt=0, le=MAX_MODEL_LEN)]] | None = Field(
        None, max_length=4096, description="--cudagraph-capture-sizes or --compilation-config cudagraph_capture_sizes"
    )
    dtype: Annotated[str, Field(min_length=1, max_length=20, pattern=r"^[a-z0-9_]+$")] | None = Field(
        None, description="--dtype: the weights' and activations' dtype (auto: the checkpoint's)"
    )
    quantization: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[a-z0-9_\-]+$")] | None = Field(
        None, description="--quantization: the weights' format (e.g. fp8, online from a bf16 checkpoint)"
    )
    limit_mm_per_prompt: dict[ModalityName, Annotated[int, Field(ge=0)]] | None = Field(
        None,
        max_length=16,
        description="--limit-mm-per-prompt: the items a prompt may hold per modality (a modality left out: 999); "
        "a multimodal model whose every tower modality is at 0 is built without that tower",
    )
    language_model_only: bool = Field(False, description="--language-model-only: every modality's limit at 0")
    approximate: list[Annotated[str, Field(max_length=300)]] = Field(
        default_factory=list,
        max_length=64,
        description="flags that change GPU memory the model does not size yet: the plan says it is approximate",
    )
