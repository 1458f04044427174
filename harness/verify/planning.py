"""`harness plan`'s prediction for what a startup record describes: the same model (its config facts), the same
settings (the serve command, and what the LLM class defaulted), the GPU total vLLM saw, the release it ran."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.scenario.deployment import DeploymentSpec
from harness.sizing.deployment import GIB, DeploymentPlan
from harness.sizing.model_config import ModelFacts, facts_from, load_model
from harness.sizing.serve_args import parse_serve
from harness.verify.record import StartupRecord

# The LLM class's scheduler defaults on a GPU of 70 GiB or more (engine/arg_utils.py get_batch_defaults,
# UsageContext.LLM_CLASS; vLLM logs "Defaulting max_num_batched_tokens to 16384 for LLM_CLASS usage context").
LLM_CLASS_DEFAULTS = {"max_num_batched_tokens": 16384, "max_num_seqs": 1024}


def gpu_from_total(total_gib: float | None) -> str | None:
    """The GPU whose total vLLM saw, where the log's total is one of the table's (harness.sizing.gpus, torch's
    totals, to the 0.01 GiB vLLM prints): a log names no GPU, but its total tells an H100 from an H200."""
    from harness.sizing.gpus import GIB as GPU_GIB
    from harness.sizing.gpus import GPUS

    if total_gib is None:
        return None
    near = [g for g in GPUS if g.total_kind == "torch" and abs(g.total_bytes / GPU_GIB - total_gib) <= 0.015]
    # GPUs of one total and one SM count differ only in their interconnect (H200 SXM and NVL): the table's first
    same = {(g.total_bytes, g.num_sms) for g in near}
    return near[0].name if len(same) == 1 else None


CONFIG_ONLY = "a config directory holding only config.json"


def record_facts(record: StartupRecord) -> ModelFacts:
    """The record's model as its serve command builds it (--dtype, --quantization)."""
    _, spec, _ = parse_serve(list(record.serve))
    if record.config is not None:
        facts = facts_from(dict(record.config), name=record.model, path=f"{record.model}/config.json",
                           dtype=spec.dtype, quantization=spec.quantization)  # fmt: skip
        # a startup from a directory holding its config.json alone says so in its source
        config_only = CONFIG_ONLY in " ".join(record.source.split())
        return dataclasses.replace(facts, checkpoint_tensors=False if config_only else None)
    return load_model(record.model, dtype=spec.dtype, quantization=spec.quantization)


def record_spec(record: StartupRecord) -> tuple[str, DeploymentSpec]:
    model, spec, _ = parse_serve(list(record.serve))
    given = {k: v for k in ("max_num_batched_tokens", "max_num_seqs")
             if (v := getattr(record.settings, k)) is not None}  # fmt: skip
    if record.entry == "llm":
        for key, value in LLM_CLASS_DEFAULTS.items():
            if getattr(spec, key) is None:
                given.setdefault(key, value)
    return model, spec.model_copy(update=given)


def plan_record(record: StartupRecord, *, version: str | None = None, gpu: str | None = None,
                cache_dir: Path | None = None, source=None, release: bool | None = None) -> DeploymentPlan:  # fmt: skip
    """The plan for the record's release (or `version`); the release's source is read for MoE models (their layer)
    and, with release=True, for every model (its defaults)."""
    from harness.sizing.deployment_plan import plan_source

    facts = record_facts(record)
    _, spec = record_spec(record)
    version = version or record.vllm_version
    if source is None and (release or facts.is_moe):
        from harness.sizing.vllm_source import locate

        source = locate(version=version, cache_dir=cache_dir)
    gpu = gpu or record.gpu
    total = record.figures.gpu_total_gib
    if total is None:
        from harness.scenario.sections import GPU_MEMORY_BYTES
        from harness.sizing.deployment import device_total

        total_bytes = device_total(gpu, GPU_MEMORY_BYTES[gpu])[0] if gpu in GPU_MEMORY_BYTES else 0
    else:
        total_bytes = round(total * GIB)
    return plan_source(facts, spec, source, gpu=gpu, total_bytes=total_bytes, version=version,
                       cudagraph_estimate=record.settings.cudagraph_memory_estimate)  # fmt: skip
