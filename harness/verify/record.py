"""What a vLLM startup printed, as a typed, versioned record: the format of tests/data/startup_logs/*.yaml
(published logs) and tests/data/real_startups/*.yaml (startups of real vLLM on dummy weights).

Version 1 (the published logs' files, which carry no schema_version): where the log came from, the release, GPU,
model and `vllm serve` command, the settings that move memory and the figures vLLM printed. Version 2 adds, all
optional: how vLLM was started (`entry`: the API server or the LLM class, whose defaults differ), the backends
vLLM chose, the model runner, the log's key lines, the machine, the date, the model's config facts, for a
startup that did not finish its status and vLLM's own error line, for a pipeline-parallel run every stage's
figures, and what the deployment model does not size yet. A version 1 file is a valid version 2 record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

STARTUP_RECORD_SCHEMA = 2
MAX_RECORD_BYTES = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StartupFigures(_Strict):
    """vLLM's own figures, in the units it prints them (GiB to 0.01, tokens, x)."""

    gpu_total_gib: float | None = None  # the worker's snapshot total, or "Free memory on device (F/T GiB)"
    requested_gib: float | None = None  # total x gpu_memory_utilization
    model_loading_gib: float | None = None  # "Model loading took X GiB"
    non_kv_gib: float | None = None  # "Total non KV cache memory"
    torch_peak_increase_gib: float | None = None
    non_torch_increase_gib: float | None = None
    available_kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    num_gpu_blocks: int | None = None
    max_concurrency: float | None = None
    max_model_len: int | None = None  # the length "Maximum concurrency for N tokens" names
    cuda_graph_estimate_gib: float | None = None  # "Estimated CUDA graph memory: X GiB total" (absent: none made)
    cuda_graph_actual_gib: float | None = None  # "Graph capturing finished in N secs, took X GiB"


class StartupSettings(_Strict):
    """Settings the figures depend on that the command line may not show (the LLM class's own defaults)."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    cudagraph_memory_estimate: bool | None = None  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS in that run
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    dtype: str | None = None  # --dtype, where it was given
    quantization: str | None = None  # --quantization (online), where it was given
    compilation: str | None = None  # -O / --compilation-config, where it was given


class Backends(_Strict):
    """What vLLM selected on that GPU ("Using X ... backend out of potential backends: [...]")."""

    attention: str | None = None
    attention_candidates: list[str] = Field(default_factory=list)
    moe: str | None = None
    moe_candidates: list[str] = Field(default_factory=list)
    moe_experts: str | None = None  # "Using TritonExperts MoE backend"


class StageFigures(_Strict):
    """One pipeline stage's worker: what its "Memory profiling takes" and "Model loading took" lines printed."""

    stage: int
    non_kv_gib: float | None = None
    torch_peak_increase_gib: float | None = None
    non_torch_increase_gib: float | None = None
    weights_gib: float | None = None
    model_loading_gib: float | None = None
    available_kv_cache_gib: float | None = None  # printed by the first worker; the others': requested - non-KV


class Machine(_Strict):
    gpu_name: str
    gpu_memory_mib: int | None = None
    driver: str | None = None
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    transformers: str | None = None
    triton: str | None = None
    notes: str | None = None  # how the install differs from a full one (a kernel library not shipped, ...)


class StartupRecord(_Strict):
    schema_version: int = 1
    kind: Literal["vllm-startup"] = "vllm-startup"
    url: str | None = None
    source: str
    vllm_version: str
    gpu: str
    model: str  # a preset name, or the config directory's name (its facts in `config`)
    hf_model: str | None = None
    serve: list[str]  # the `vllm serve` command line these settings make
    log_args_not_memory: list[str] = Field(default_factory=list)
    settings: StartupSettings = Field(default_factory=StartupSettings)
    figures: StartupFigures
    # version 2
    entry: Literal["serve", "llm"] = "serve"  # vllm serve, or the LLM class (its kwargs in llm_kwargs)
    llm_kwargs: dict[str, Any] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    model_runner: Literal["v1", "v2"] | None = None  # v1/worker/gpu_model_runner.py or v1/worker/gpu/model_runner.py
    backends: Backends | None = None
    key_lines: list[str] = Field(default_factory=list)
    machine: Machine | None = None
    date: str | None = None
    startup_s: float | None = None
    config: dict[str, Any] | None = None  # the model's config.json facts (config directories hold only those)
    status: Literal["ready", "failed", "timeout"] = "ready"
    error: str | None = None  # vLLM's own error line, for a startup that did not finish
    note: str | None = None
    # pipeline-parallel runs: every stage's figures, and the stage whose KV cache has the fewest blocks (the tokens
    # vLLM reports are that stage's; `figures` are its)
    stages: list[StageFigures] = Field(default_factory=list)
    binding_stage: int | None = None
    unsized: str | None = None  # what the deployment model does not size of this run yet (an architecture, a format)


class RecordError(Exception):
    """A record file that cannot be read; the message is one line naming the file and the field."""


def load_record(path: Path) -> StartupRecord:
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise RecordError(f"{path}: {path.stat().st_size} bytes is not a startup record (at most 1 MiB)")
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise RecordError(f"{path}: not a readable YAML startup record: {str(error).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: a startup record is a YAML mapping")
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or version > STARTUP_RECORD_SCHEMA:
        raise RecordError(f"{path}: schema_version {str(version)[:20]} is newer than this harness reads "
                          f"(at most {STARTUP_RECORD_SCHEMA})")  # fmt: skip
    try:
        return StartupRecord.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise RecordError(f"{path}: {where}: {first['msg']}") from None


def dump_record(record: StartupRecord, header: str = "") -> str:
    """YAML, in the field order of the model, leaving out what is unset."""
    data = record.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    for key in ("log_args_not_memory", "key_lines", "env"):
        if not data.get(key):
            data.pop(key, None)
    if data.get("backends") is not None:
        data["backends"] = {k: v for k, v in data["backends"].items() if v}
    text = yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=False)
    return (f"# {header}\n" if header else "") + text
