"""The `deployment:` section of a scenario: the `vllm serve` settings that change memory, as a matrix can vary them.

`harness plan ... -- vllm serve MODEL FLAGS` fills the same model from the command line
(harness.sizing.serve_args). Left out, a setting takes the release's default (read from its source where the
harness can, else a documented table; docs/deployment-memory.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.scenario import limits as L

ALL2ALL_BACKENDS = (
    "allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput", "naive", "pplx", "nixl_ep",
    "flashinfer_all2allv", "mori",
)  # fmt: skip
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
MAX_MODEL_LEN = 1 << 24
MAX_PARALLEL = 4096


class DeploymentSpec(BaseModel):
    """The serve settings; None takes the release's default (or, in a scenario, the scenario's layout)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    model: Annotated[str, Field(min_length=1, max_length=L.MAX_PATH_CHARS)] | None = Field(
        None, description="a model directory holding config.json, or a preset (harness/defaults/models/); "
        "default: the scenario's model.preset")
    tensor_parallel_size: Annotated[int, Field(gt=0, le=MAX_PARALLEL)] = Field(1, description="--tensor-parallel-size")
    data_parallel_size: Annotated[int, Field(gt=0, le=MAX_PARALLEL)] | None = Field(
        None, description="--data-parallel-size; default in a scenario: parallel.num_dispatchers / TP")
    enable_expert_parallel: bool | None = Field(
        None, description="--enable-expert-parallel; default in a scenario: true (D dispatchers)")
    all2all_backend: Literal[ALL2ALL_BACKENDS] | None = Field(  # type: ignore[valid-type]
        None, description="--all2all-backend; default in a scenario: from layer.all2all, else the release's")
    moe_backend: Literal["cutlass", "deep_gemm", "triton"] | None = Field(
        None, description="experts class family (as layer.moe_backend); default: the scenario's layer.moe_backend")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="--gpu-memory-utilization; default: the release's (config/cache.py)")
    max_model_len: Annotated[int, Field(gt=0, le=MAX_MODEL_LEN)] | None = Field(
        None, description="--max-model-len; default: the model's max_position_embeddings")
    max_num_batched_tokens: Annotated[int, Field(gt=0, le=MAX_MODEL_LEN)] | None = Field(
        None, description="--max-num-batched-tokens; default: the release's (batched DP MoE: "
        "DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP), in a scenario parallel.max_tokens_per_rank")
    max_num_seqs: Annotated[int, Field(gt=0, le=1 << 20)] | None = Field(None, description="--max-num-seqs")
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = Field("auto", description="--kv-cache-dtype")  # type: ignore[valid-type]
    block_size: Annotated[int, Field(gt=0, le=4096)] | None = Field(
        None, description="--block-size; default 16, 64 for MLA (FlashMLA)")
    enable_eplb: bool = Field(False, description="--enable-eplb")
    num_redundant_experts: Annotated[int, Field(ge=0, le=L.MAX_NUM_EXPERTS)] | None = Field(
        None, description="--eplb-config '{\"num_redundant_experts\": N}' or --num-redundant-experts; default in a "
        "scenario: its E x D slots beyond the routed experts")
    enable_dbo: bool = Field(False, description="--enable-dbo: two micro-batches, two MoE workspaces")
    enforce_eager: bool = Field(False, description="--enforce-eager: no CUDA graphs")
    dtype: Annotated[str, Field(min_length=1, max_length=20, pattern=r"^[a-z0-9_]+$")] | None = Field(
        None, description="--dtype: the weights' and activations' dtype (auto: the checkpoint's)")
    quantization: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[a-z0-9_\-]+$")] | None = Field(
        None, description="--quantization: the weights' format (e.g. fp8, online from a bf16 checkpoint)")
