"""Architectures and checkpoint formats against vLLM itself: published startup logs (tests/data/model_logs/*.yaml,
each with its URL) of gpt-oss-20b (MXFP4, sliding-window layers), Llama-4-Scout (interleaved MoE, chunked local
attention, its vision tower), Gemma 2 and 3 (sliding-window layers, float32 checkpoints, SigLIP), online
`--quantization fp8`, `--dtype float32` and `float16`, and compressed-tensors W8A8 FP8 and INT8 checkpoints.

Targets, as for the dense and MoE logs of tests/test_startup_logs.py: the weights within 1% of "Model loading took";
the KV cache's tokens, blocks and concurrency exactly what the logged KV memory gives through vLLM's KV cache groups
(hybrid models included); the KV cache within 2% of "Available KV cache memory". A case the model misses is a strict
expected failure naming why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.scenario.deployment import DeploymentSpec
from harness.sizing.deployment_plan import plan_source
from harness.sizing.deployment_weights import Sharding, weight_lines
from harness.sizing.kv_cache import kv_cache, kv_shape
from harness.sizing.model_config import load_model
from harness.sizing.serve_args import parse_serve

GIB = 2**30
LOGS = Path(__file__).resolve().parent / "data" / "model_logs"
CASES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(LOGS.glob("*.yaml"))}

WEIGHT_GAPS: dict[str, str] = {}
KV_MISSES: dict[str, str] = {}


def _spec(case: dict):
    model, spec, _ = parse_serve(case["serve"])
    given = {k: case["settings"][k] for k in ("max_num_batched_tokens", "max_num_seqs")}
    return model, spec.model_copy(update=given)


def _facts(case: dict):
    model, spec = _spec(case)
    return load_model(model, dtype=spec.dtype, quantization=spec.quantization), spec


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    import os

    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


def test_cases_cover_the_architectures_and_formats():
    archs = {_facts(c)[0].architecture for c in CASES.values()}
    assert {"GptOssForCausalLM", "Llama4ForConditionalGeneration", "Gemma2ForCausalLM",
            "Gemma3ForConditionalGeneration", "GemmaForCausalLM", "GraniteForCausalLM", "Phi3ForCausalLM",
            "PhiForCausalLM"} <= archs  # fmt: skip
    formats = {(f.quant.method, f.quant.scheme) if f.quant else f.dtype for f in (_facts(c)[0] for c in CASES.values())}
    assert {
        ("mxfp4", "mxfp4"),
        ("fp8", "fp8-tensor"),
        ("compressed-tensors", "fp8-channel"),
        ("compressed-tensors", "int8-channel"),
        ("gptq_marlin", "gptq"),
        "float32",
        "float16",
    } <= formats
    for name, case in CASES.items():
        assert case["url"].startswith("https://github.com/"), name


def _weights_error(name: str) -> float:
    case = CASES[name]
    facts, spec = _facts(case)
    tp = spec.tensor_parallel_size
    sharding = Sharding(tp=tp, moe_tp=tp, local_experts=facts.num_routed_experts)
    predicted = sum(line.bytes for line in weight_lines(facts, sharding))
    logged = case["figures"]["model_loading_gib"] * GIB
    return (predicted - logged) / logged


@pytest.mark.parametrize("name", [pytest.param(n, id=n, marks=[pytest.mark.xfail(strict=True, reason=WEIGHT_GAPS[n])]
                                               if n in WEIGHT_GAPS else []) for n in CASES])  # fmt: skip
def test_weights_within_one_percent(name):
    assert abs(_weights_error(name)) < 0.01, f"{name}: {_weights_error(name):+.2%}"


def test_weights_within_two_percent_everywhere():
    for name in CASES:
        assert abs(_weights_error(name)) < 0.02, f"{name}: {_weights_error(name):+.2%}"


@pytest.mark.parametrize("name", list(CASES))
def test_kv_tokens_blocks_and_concurrency_exact(name):
    """The logged "Available KV cache memory" (printed to 0.01 GiB) through vLLM's KV cache groups gives the logged
    num_gpu_blocks, "GPU KV cache size" (blocks // groups x block size) and "Maximum concurrency"."""
    case = CASES[name]
    facts, spec = _facts(case)
    figures = case["figures"]
    shape = kv_shape(facts, spec.tensor_parallel_size, spec.kv_cache_dtype)
    max_len, batched = spec.max_model_len, case["settings"]["max_num_batched_tokens"]
    low, high = (kv_cache(shape, round((figures["available_kv_cache_gib"] + d) * GIB), 16, max_len, batched)
                 for d in (-0.005, 0.005))  # fmt: skip
    assert low.num_blocks <= figures["num_gpu_blocks"] <= high.num_blocks, (name, low.num_blocks, high.num_blocks)
    exact = kv_cache(shape, 0, 16, max_len, batched)
    groups = exact.groups
    assert figures["num_gpu_blocks"] // groups * exact.block_size == figures["kv_cache_tokens"], name
    assert figures["num_gpu_blocks"] / exact.blocks_per_request == pytest.approx(figures["max_concurrency"], abs=0.006)


@pytest.mark.parametrize("name", [pytest.param(n, id=n, marks=([pytest.mark.vllm_wheel] if _facts(c)[0].is_moe else [])
                                               + ([pytest.mark.xfail(strict=True, reason=KV_MISSES[n])]
                                                  if n in KV_MISSES else [])) for n, c in CASES.items()])  # fmt: skip
def test_kv_cache_within_two_percent(name, cache_dir):
    case = CASES[name]
    facts, spec = _facts(case)
    source = None
    if facts.is_moe:
        from harness.sizing.vllm_source import locate

        source = locate(version=case["vllm_version"], cache_dir=cache_dir)
    total = round(case["figures"]["gpu_total_gib"] * GIB)
    plan = plan_source(
        facts,
        spec,
        source,
        gpu=case["gpu"],
        total_bytes=total,
        version=case["vllm_version"],
        cudagraph_estimate=case["settings"]["cudagraph_memory_estimate"],
    )
    logged = case["figures"]["available_kv_cache_gib"] * GIB
    error = (plan.requested_bytes - plan.non_kv_bytes - logged) / logged
    assert abs(error) < 0.02, f"{name}: {error:+.2%}"


@pytest.mark.vllm_wheel
def test_gpt_oss_runs_the_monolithic_triton_mxfp4_kernel_with_its_buffers_per_call(cache_dir):
    """gpt-oss-20b at TP 2 on an H100 (the published log says "Using 'TRITON' Mxfp4 MoE backend" and "Using
    MoEPrepareAndFinalizeNoDPEPMonolithic"): no modular workspace is held; the kernel's own buffers at M = 8192 are in
    the forward's peak: 2 B x (M x topk 4 x I 1472 + M x K 2880 + M x topk x K). With DP 2 and EP the monolithic
    class is refused (its _supports_parallel_config) and the modular workspace is back."""
    from harness.sizing.vllm_source import locate

    case = CASES["gpt-oss-20b-tp2-h100"]
    facts, spec = _facts(case)
    source = locate(version="0.19.0", cache_dir=cache_dir)
    total = round(case["figures"]["gpu_total_gib"] * GIB)
    plan = plan_source(facts, spec, source, gpu="H100-80GB", total_bytes=total, version="0.19.0",
                       cudagraph_estimate=False)  # fmt: skip
    names = {line.name: line for line in plan.lines}
    assert "moe-workspace" not in names and "moe-workspace (per call)" not in names
    per_call = names["moe kernel buffers (per call)"]
    M = 8192
    assert per_call.bytes == 2 * (M * 4 * 1472 + M * 2880 + M * 4 * 2880) == 332_398_592
    assert per_call.source.startswith("OAITritonMxfp4ExpertsMonolithic (fused_moe/oracle/mxfp4.py:110)")
    dp = spec.model_copy(update={"data_parallel_size": 2, "tensor_parallel_size": 1, "enable_expert_parallel": True})
    plan = plan_source(facts, dp, source, gpu="H100-80GB", total_bytes=total, version="0.19.0",
                       cudagraph_estimate=False)  # fmt: skip
    names = {line.name: line for line in plan.lines}
    assert "moe kernel buffers (per call)" not in names and names["moe-workspace"].bytes > 0


@pytest.mark.vllm_wheel
def test_gpt_oss_at_tp_8_holds_the_mxfp4_padded_intermediate(cache_dir):
    """gpt-oss-120b at TP 8: 2880 / 8 = 360 per GPU, which the MXFP4 method pads to 384 (mxfp4.py create_weights:
    round_up(intermediate_size_per_partition, 64)); the weights and the monolithic kernel's buffers hold 384."""
    from harness.sizing.deployment_plan import plan_release

    facts = load_model("gpt-oss-120b")
    spec = DeploymentSpec(tensor_parallel_size=8, max_num_batched_tokens=8192)
    plan = plan_release(facts, spec, "0.19.0", gpu="H100-80GB", total_bytes=round(79.19 * GIB), cache_dir=cache_dir)
    names = {line.name: line for line in plan.lines}
    assert "w13 (2x384, 2880) + w2 (2880, 384)" in names["routed experts"].source
    M = 8192
    assert names["moe kernel buffers (per call)"].bytes == 2 * (M * 4 * 384 + M * 2880 + M * 4 * 2880)
    assert plan.verdict.outcome == "starts"
