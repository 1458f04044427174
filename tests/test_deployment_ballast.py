"""memory.deployment_ballast: `harness run` holds the rest of the deployment (every other layer's weights, the
buffers held once, the runtime estimates) and, after each policy's workspace, the KV cache vLLM sizes from what is
left, so a policy runs out of memory where the deployment would and starts with the KV tokens it would. On CPU
ranks with small shapes: each part allocated to the byte of the deployment model's prediction and seen by RSS;
the legacy workspace leaves no KV cache, the fixed one does. The PR case's sizing agrees with `harness plan` per
policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli_utils import run_cli_inproc
from harness.scenario.schema import ScenarioError, load_scenario, parse_scenario
from harness.sizing.deployment_ballast import (
    BALLAST_PARTS,
    KV_PART,
    ballast_parts,
    deployment_plan_without_release,
    policy_kv_cache,
)
from harness.sizing.plan import policy_shapes

BUDGET_BYTES = 360_000_000
TINY_CONFIG = {  # a one-layer Mixtral-shaped model: 32 experts of hidden 512, intermediate 256
    "architectures": ["MixtralForCausalLM"], "hidden_size": 512, "intermediate_size": 256, "num_local_experts": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
    "vocab_size": 1024, "tie_word_embeddings": False, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
}  # fmt: skip


def _scenario(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIG))
    data = {
        "name": "ballast-cpu",
        "model": {"hidden_size": 512, "intermediate_size": 256, "num_experts": 32, "top_k": 2},
        "parallel": {"num_dispatchers": 16, "num_ranks": 1, "num_local_experts": 2, "max_tokens_per_rank": 64},
        "policies": ["legacy", "fixed"], "device": "cpu", "comm": "gloo", "iterations": 1, "warmup": 1,
        "layer": {"all2all": "none"},
        "memory": {"budget_gb": BUDGET_BYTES / 1e9, "deployment_ballast": True, "comm_buffer": "none"},
        "deployment": {"model": str(model), "data_parallel_size": 1, "enable_expert_parallel": False,
                       "max_num_seqs": 1, "enforce_eager": True, "gpu_memory_utilization": 0.95,
                       "max_model_len": 1024},
        "expect": {"outcomes": {"legacy": "oom", "fixed": "fit"}},
    }  # fmt: skip
    path = tmp_path / "ballast-cpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_ballast_parts_add_up_to_the_deployment(tmp_path):
    scenario = load_scenario(_scenario(tmp_path))
    parts = {p.name: p for p in ballast_parts(scenario, BUDGET_BYTES)}
    assert list(parts) == list(BALLAST_PARTS)
    plan = deployment_plan_without_release(scenario, BUDGET_BYTES)
    fixed = policy_kv_cache(scenario, BUDGET_BYTES, "fixed", plan.line("moe-workspace").bytes)
    assert fixed.bytes == plan.kv_cache_bytes == plan.kv_num_blocks * 16 * plan.kv_bytes_per_token > 0
    assert fixed.tokens == plan.kv_tokens and fixed.outcome == "starts"
    # every weight of the one layer (32 experts unsharded, attention, embeddings) less the run's 2 FP8 experts
    own = 2 * (2 * 256 * 512 + 512 * 256) + 2 * (2 * 256 + 512) * 4
    assert parts["ballast-weights"].bytes == plan.group_bytes("weights") - own
    # the profile peak (cuBLAS workspace, activations) and non-torch memory; no dispatch receive without DeepEP
    assert plan.line("dispatch receive") is None
    assert parts["ballast-runtime"].bytes == (plan.group_bytes("non-torch") + plan.line("activations").bytes
                                              + plan.line("cuBLAS workspace").bytes)  # fmt: skip
    # what the run adds (its layer's weights, the policy's workspace, the KV cache after it) brings the process to the
    # requested memory, to less than one block
    held = sum(p.bytes for p in parts.values()) + own + plan.line("moe-workspace").bytes + fixed.bytes
    assert 0 <= plan.requested_bytes - held < 16 * plan.kv_bytes_per_token
    # legacy's workspace leaves less: no KV cache for one request of max_model_len, the deployment does not start
    legacy_workspace = policy_shapes("legacy", scenario.sizing_args()).total_bytes
    legacy = policy_kv_cache(scenario, BUDGET_BYTES, "legacy", legacy_workspace)
    assert legacy.outcome in ("fails", "oom") and legacy.bytes == legacy.tokens == 0


@pytest.mark.slow
def test_cpu_run_holds_the_ballast_and_legacy_runs_out(tmp_path):
    out = tmp_path / "run"
    result = run_cli_inproc("run", str(_scenario(tmp_path)), "--out", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (record_path,) = sorted((out / "ranks").glob("rank-*.json"))
    record = json.loads(record_path.read_text())
    expected = {p.name: p.bytes for p in ballast_parts(parse_scenario(record["scenario"]), BUDGET_BYTES)}
    ballast = {b["name"]: b for b in record["ballast"]}
    assert list(ballast) == list(BALLAST_PARTS)
    for name, part in ballast.items():
        assert part["allocated_bytes"] == part["predicted_bytes"] == expected[name], name
        assert part["within_rounding"], part
    assert (
        ballast["ballast-runtime"]["measured_delta_bytes"] >= ballast["ballast-runtime"]["allocated_bytes"] - 4 * 2**20
    )
    policies = {p["policy"]: p for p in record["policies"]}
    scenario = parse_scenario(record["scenario"])
    for name, result_ in policies.items():
        kv = policy_kv_cache(scenario, BUDGET_BYTES, name, result_["contract"]["total_bytes"])
        assert result_["deployment_kv"]["kv_tokens"] == kv.tokens and result_["deployment_kv"]["outcome"] == kv.outcome
    fixed_kv = policies["fixed"]["deployment_kv"]["component"]
    assert fixed_kv["name"] == KV_PART and fixed_kv["allocated_bytes"] == fixed_kv["predicted_bytes"] > 0
    assert fixed_kv["within_rounding"], fixed_kv
    assert policies["legacy"]["status"] == "oom" and policies["legacy"]["oom"]["stage"] in ("workspace", "kv-cache")
    assert policies["legacy"]["deployment_kv"]["kv_tokens"] == 0
    assert "legacy" in result.stdout and "oom (expected oom): pass" in result.stdout
    fixed_tokens = policies["fixed"]["deployment_kv"]["kv_tokens"]
    assert f"fit (expected fit): pass; KV cache {fixed_tokens} tokens" in result.stdout


def test_cpu_ballast_needs_a_budget(tmp_path):
    data = yaml.safe_load(_scenario(tmp_path).read_text())
    del data["memory"]["budget_gb"]
    with pytest.raises(ScenarioError, match=r"memory\.deployment_ballast on device cpu needs memory\.budget_gb"):
        parse_scenario(data)


def _held_after_setup(info, scenario_path: str) -> dict:
    import psutil
    import torch

    from harness.rank.lifecycle import setup_rank

    rss = psutil.Process().memory_info().rss
    setup = setup_rank(load_scenario(scenario_path), info, torch.device("cpu"), Path("/tmp"), 0)
    return {
        "rss_growth": psutil.Process().memory_info().rss - rss,
        "held": sum(t.numel() * t.element_size() for t in setup.ballast_tensors),
        "parts": sum(c.allocated_bytes for c in setup.ballast),
    }


@pytest.mark.slow
def test_the_ballast_stays_allocated_after_setup(tmp_path):
    """The ballast must still be held when the policies run: a dropped tensor's memory goes back (on CPU its
    mapping is unmapped and RSS falls; on a GPU torch's allocator hands the cached block to the next workspace), and
    a policy would fit where the deployment runs out."""
    from distributed_utils import parallel_launch

    (result,) = parallel_launch(1, _held_after_setup, str(_scenario(tmp_path)), timeout_s=300)
    assert result["held"] == result["parts"] > 300_000_000
    assert result["rss_growth"] >= result["parts"]  # every part's pages are still in RSS


PR_CASE = Path(__file__).resolve().parents[1] / "scenarios" / "deepseek-v3-dp32-pr55579-deployment.yaml"
H200_TOTAL = 150_109_880_320  # torch.cuda.mem_get_info's total on the H200 the ballast records ran on


@pytest.mark.vllm_wheel
@pytest.mark.parametrize(("local_experts", "verdicts"), [
    (8, {"legacy": "starts", "fixed": "starts"}),  # legacy's 56 GiB workspace fits and costs KV cache
    (16, {"legacy": "oom", "fixed": "starts"}),  # legacy's 112 GiB does not fit
])  # fmt: skip
def test_pr_case_ballast_sizes_each_policy_as_the_plan(local_experts, verdicts, tmp_path):
    """The ballast's KV cache per policy is what `harness plan` gives the release that holds that workspace (legacy:
    vLLM 0.29.0, fixed: 0.30.0), on one H200: the same verdict, the same KV tokens, the same workspace bytes."""
    from harness.sizing.deployment_plan import plan_scenario

    data = yaml.safe_load(PR_CASE.read_text())
    data["parallel"]["num_local_experts"] = local_experts
    scenario = parse_scenario(data)
    plans = dict(zip(("legacy", "fixed"), plan_scenario(scenario, ["0.29.0", "0.30.0"], gpu="H200-141GB",
                                                        total_bytes=H200_TOTAL), strict=True))  # fmt: skip
    for policy, plan in plans.items():
        workspace = policy_shapes(policy, scenario.sizing_args()).total_bytes
        assert plan.line("moe-workspace").bytes == workspace
        kv = policy_kv_cache(scenario, H200_TOTAL, policy, workspace)
        assert (kv.outcome, kv.tokens) == (plan.verdict.outcome, plan.kv_tokens) == \
            (verdicts[policy], plan.kv_tokens if verdicts[policy] == "starts" else 0), policy  # fmt: skip
    if local_experts == 8:  # the docs' figures: 330944 -> 1159872 tokens
        assert (plans["legacy"].kv_tokens, plans["fixed"].kv_tokens) == (330944, 1159872)
