"""The deployment model (harness.sizing.deployment): serve flags, config facts, weights of every layer, the KV
cache, the verdict per release, and the published startup logs it is checked against."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_utils import run_cli_inproc
from harness.scenario.schema import ScenarioError, load_scenario, parse_scenario
from harness.sizing.deployment_weights import Sharding, allocator_block_bytes, weight_lines
from harness.sizing.kv_cache import kv_cache, kv_shape
from harness.sizing.model_config import ModelConfigError, load_model
from harness.sizing.serve_args import ServeArgsError, parse_serve

GIB = 2**30
H200 = 150_109_880_320  # what vLLM sees: torch.cuda.mem_get_info's total (harness.sizing.deployment)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


# --- vllm serve flags -----------------------------------------------------------------------------------------------


def test_serve_flags_are_read():
    model, spec, ignored = parse_serve(
        [
            "vllm",
            "serve",
            "deepseek-v3",
            "--data-parallel-size",
            "32",
            "--enable-expert-parallel",
            "--all2all-backend",
            "deepep_low_latency",
            "--max-model-len",
            "32k",
            "--gpu-memory-utilization",
            "0.85",
            "--enable-eplb",
            "--eplb-config",
            '{"num_redundant_experts":32}',
            "--enable-dbo",
            "--enforce-eager",
            "--port",
            "8000",
        ]
    )
    assert model == "deepseek-v3"
    assert (spec.data_parallel_size, spec.enable_expert_parallel, spec.all2all_backend) == (
        32,
        True,
        "deepep_low_latency",
    )
    assert (spec.max_model_len, spec.gpu_memory_utilization) == (32000, 0.85)
    assert (spec.num_redundant_experts, spec.enable_dbo, spec.enforce_eager) == (32, True, True)
    assert ignored == ["--port"]
    assert parse_serve(["m", "--max-model-len", "32K", "--enable-eplb", "--num-redundant-experts", "8"])[1].model_dump(
        include={"max_model_len", "num_redundant_experts"}
    ) == {"max_model_len": 32768, "num_redundant_experts": 8}


@pytest.mark.parametrize(("argv", "message"), [
    (["vllm", "serve", "m", "--speculatve-config", "{}"], "flag --speculatve-config is not one the plan understands"),
    (["m", "--num-redundant-experts", "8"], "needs --enable-eplb"),
    (["m", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["m", "--enable-eplb", "--eplb-config", "{bad"], "is not JSON"),
    (["--max-model-len", "4096"], "no MODEL given"),
])  # fmt: skip
def test_serve_flags_refused_in_one_line(argv, message):
    with pytest.raises(ServeArgsError) as error:
        parse_serve(argv)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.vllm_wheel
def test_cli_unknown_flag_and_missing_model_exit_2(cache_dir):
    plan = ("plan", "--vllm-version", "0.29.0", "--gpu", "H200-141GB", "--cache-dir", str(cache_dir), "--")
    result = run_cli_inproc(*plan, "vllm", "serve", "deepseek-v3", "--tensor-paralel-size", "4")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last == "harness: error: vllm serve: flag --tensor-paralel-size is not one vLLM 0.29.0 has; closest: " \
                   "--tensor-parallel-size, --data-parallel-size, --pipeline-parallel-size"  # fmt: skip
    assert "Traceback" not in result.stderr
    result = run_cli_inproc(*plan, "vllm", "serve", "/no/model")
    assert result.returncode == 2 and "not a directory with config.json nor a preset" in result.stderr


# --- config facts and weights ---------------------------------------------------------------------------------------


def test_local_model_directory(tmp_path):
    config = json.loads((Path(__file__).resolve().parents[1] / "harness/defaults/models/mixtral-8x7b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config, indent=1))
    facts = load_model(str(tmp_path))
    assert (facts.num_hidden_layers, facts.num_routed_experts, facts.top_k, facts.moe_layers) == (
        32,
        8,
        2,
        tuple(range(32)),
    )
    assert facts.ref("num_local_experts").startswith(str(tmp_path / "config.json") + ":")
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"], "hidden_size": 8}')
    with pytest.raises(ModelConfigError, match="not one this model sizes"):
        load_model(str(tmp_path))


def test_qwen3_30b_weights_equal_the_checkpoint():
    """Qwen3-30B-A3B's 30.5B BF16 parameters, counted by hand per layer; vLLM adds the rotary cache (40960, 128)."""
    facts = load_model("qwen3-30b-a3b")
    lines = weight_lines(facts, Sharding(tp=1, moe_tp=1, local_experts=128))
    rotary = next(line for line in lines if line.name == "rotary cache")
    assert rotary.bytes == 40960 * 128 * 2
    per_layer = (32 + 2 * 4) * 128 * 2048 + 2048 * 32 * 128 + 2 * 128 + 2 * 2048 + 128 * 2048 + 128 * 3 * 768 * 2048
    params = 48 * per_layer + 2 * 151936 * 2048 + 2048
    assert params == 30_532_122_624
    rounding = next(line for line in lines if line.name == "allocator rounding")
    assert sum(line.bytes for line in lines) - rotary.bytes - rounding.bytes == 2 * params
    # torch's caching allocator: embed_tokens and lm_head (151936, 2048) bf16 are 593.5 MiB, so each gets its whole
    # 594 MiB segment (0.5 MiB would remain); the q/k norms (128,) bf16 are rounded to 512 B; the rest is exact
    assert rounding.bytes == 2 * 2**19 + 48 * 2 * (512 - 256)
    tp4 = weight_lines(facts, Sharding(tp=4, moe_tp=4, local_experts=128))
    experts = next(line for line in tp4 if line.name == "routed experts")
    assert experts.bytes == 48 * 128 * 3 * (768 // 4) * 2048 * 2  # I split over TP without EP


def test_allocator_block_bytes():
    """torch's caching allocator: 512 B rounding; from 10 MiB a 2 MiB-rounded segment, kept whole when at most 1 MiB
    would remain; under 10 MiB cut from a 20 MiB segment."""
    MiB = 2**20
    assert allocator_block_bytes(0) == 0
    assert allocator_block_bytes(256) == 512 and allocator_block_bytes(513) == 1024
    assert allocator_block_bytes(MiB) == MiB and allocator_block_bytes(5 * MiB + 1) == 5 * MiB + 512
    assert allocator_block_bytes(10 * MiB) == 10 * MiB
    assert allocator_block_bytes(int(31.5 * MiB)) == 32 * MiB  # Qwen2.5-7B's qkv_proj (4608, 3584) bf16
    assert allocator_block_bytes(int(24.5 * MiB)) == int(24.5 * MiB)  # 1.5 MiB would remain: split
    assert allocator_block_bytes(259 * MiB) == 260 * MiB  # exactly 1 MiB would remain: not split
    assert allocator_block_bytes(259 * MiB - 512) == 259 * MiB - 512  # 1 MiB + 512 B would remain: split


def test_deepseek_v3_mla_and_experts_per_gpu():
    facts = load_model("deepseek-v3")
    assert (len(facts.moe_layers), facts.moe_layers[0]) == (58, 3)
    lines = {w.name: w for w in weight_lines(facts, Sharding(tp=1, moe_tp=1, local_experts=8))}
    one_expert = (2 * 2048 * 7168 + 32 * 56 * 4) + (7168 * 2048 + 56 * 16 * 4)  # fp8 + 128x128 block f32 scales
    assert lines["routed experts"].bytes == 58 * 8 * one_expert
    assert lines["embeddings + lm_head"].bytes == 2 * 129280 * 7168 * 2 + 7168 * 2


def test_kv_bytes_per_token_exact():
    assert kv_shape(load_model("deepseek-v3"), tp=8).bytes_per_token == 61 * (512 + 64) * 2  # MLA: not split by TP
    assert kv_shape(load_model("deepseek-v3"), tp=1, kv_cache_dtype="fp8").bytes_per_token == 61 * 576
    qwen = load_model("qwen3-30b-a3b")
    assert kv_shape(qwen, tp=2).bytes_per_token == 48 * 2 * 2 * 128 * 2
    assert kv_shape(qwen, tp=8).bytes_per_token == 48 * 2 * 1 * 128 * 2  # 4 KV heads replicated over TP 8
    shape = kv_shape(load_model("mixtral-8x7b"), tp=1)
    cache = kv_cache(shape, 10 * GIB, 16, 32768)
    assert cache.num_blocks == 10 * GIB // (16 * shape.per_layer_bytes_per_token) // 32
    assert cache.tokens == cache.num_blocks * 16 and cache.concurrency == cache.num_blocks / 2048


def test_scenario_deployment_section_is_strict():
    base = {"model": {"preset": "deepseek-v3"}, "parallel": {"num_dispatchers": 32, "max_tokens_per_rank": 256}}
    scenario = parse_scenario({**base, "deployment": {"max_model_len": 32768, "gpu_memory_utilization": 0.9}})
    assert scenario.deployment.max_model_len == 32768
    assert parse_scenario(base).scenario_hash != scenario.scenario_hash
    assert '"deployment' not in parse_scenario(base).canonical_json()  # hashes as before the section existed
    with pytest.raises(ScenarioError, match=r"deployment\.max_model_lenn"):
        parse_scenario({**base, "deployment": {"max_model_lenn": 1}})
    with pytest.raises(ScenarioError, match=r"deployment\.gpu_memory_utilization"):
        parse_scenario({**base, "deployment": {"gpu_memory_utilization": 1.5}})


# --- per release: the PR case (vLLM PR #55579) ----------------------------------------------------------------------


@pytest.mark.vllm_wheel
def test_pr_case_does_not_start_on_0_29_0_and_starts_on_0_30_0(cache_dir):
    from harness.sizing.deployment_plan import plan_scenario, what_it_buys

    scenario = load_scenario("deepseek-v3-dp32-pr55579")
    legacy, fixed = plan_scenario(scenario, ["0.29.0", "0.30.0"], gpu="H200-141GB", total_bytes=H200,
                                  cache_dir=cache_dir)  # fmt: skip
    assert legacy.verdict.outcome == "oom" and legacy.verdict.component == "moe-workspace"
    assert legacy.line("moe-workspace").bytes == 120259084288  # 112 GiB, the double count
    assert fixed.verdict.outcome == "starts"
    assert fixed.line("moe-workspace").bytes == 3758096384
    assert legacy.setting("gpu_memory_utilization") == fixed.setting("gpu_memory_utilization") == 0.92
    # 61 layers' weights with 16 local experts (256 redundant over D=32), FP8 block-quantized
    assert 55 * GIB < fixed.group_bytes("weights") < 60 * GIB
    available = fixed.requested_bytes - fixed.non_kv_bytes
    assert fixed.kv_num_blocks == available // (16 * 61 * 576 * 2)
    assert fixed.kv_tokens == fixed.kv_num_blocks * 16 and fixed.kv_tokens >= fixed.max_model_len
    assert fixed.verdict.text == (f"starts: {fixed.kv_tokens} tokens of KV cache, {fixed.concurrency:.2f}x "
                                  f"concurrency at 163840 tokens")  # fmt: skip
    (buys,) = what_it_buys([legacy, fixed])
    assert f"oom -> starts; KV cache 0 -> {fixed.kv_tokens} tokens (+{fixed.kv_tokens})" in buys


@pytest.mark.vllm_wheel
def test_serve_command_per_release_and_exit_codes(cache_dir):
    serve = ["--", "vllm", "serve", "deepseek-v3", "--data-parallel-size", "32", "--enable-expert-parallel",
             "--all2all-backend", "deepep_low_latency", "--moe-backend", "cutlass",
             "--max-model-len", "32768"]  # fmt: skip
    args = ["plan", "--vllm-version", "0.29.0", "--vllm-version", "0.30.0", "--gpu", "H200-141GB",
            "--cache-dir", str(cache_dir), "--json"]  # fmt: skip
    result = run_cli_inproc(*args, *serve)
    assert result.returncode == 0, result.stderr
    legacy, fixed = json.loads(result.stdout)["deployments"]
    settings = {s["name"]: s for s in fixed["settings"]}
    assert settings["max_num_batched_tokens"]["value"] == 256  # batched DP MoE default, from the release
    assert settings["max_num_batched_tokens"]["source"].startswith("config/scheduler.py:")
    assert settings["local_experts"]["value"] == 8
    assert legacy["kv_tokens"] < fixed["kv_tokens"]
    assert [line["name"] for line in legacy["lines"][-2:]] == ["KV cache", "sampler warm-up"]
    # the fixed release starts, the legacy one at E=8 starts too but with less KV: --fail-on-verdict exits 0
    assert run_cli_inproc(*args, "--fail-on-verdict", *serve).returncode == 0
    small = run_cli_inproc(*args[:-1], "--fail-on-verdict", *serve, "--gpu-memory-utilization", "0.3")
    assert small.returncode == 1 and "fails:" in small.stdout


@pytest.mark.vllm_wheel
def test_layer_line_never_says_fit(cache_dir):
    result = run_cli_inproc("plan", "deepseek-v3-dp32-pr55579", "--vllm-version", "0.29.0", "--gpu", "H200-141GB",
                         "--cache-dir", str(cache_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "FIT" not in result.stdout
    assert "this MoE layer alone (not the deployment)" in result.stdout
    assert "OOM at moe-workspace" in result.stdout
