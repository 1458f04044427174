"""The profile run's first MoE call kept to the run's end: the release reading (release_defaults.first_moe_call_kept),
the routers it applies to (model_config.fused_grouped_topk_route), what the kept frames hold
(profile_run.first_moe_call_frames), the plan's other outcome and verify's reading of which one a startup took,
against the real vLLM 0.26.0 startups that took each (tests/data/real_startups).

The release trees are copies of the cached wheels' extracted files, edited at test time; nothing of vLLM is committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import release_copies
from harness.sizing import profile_run
from harness.sizing import release_defaults as defaults
from harness.sizing.deployment import GIB
from harness.sizing.model_config import fused_grouped_topk_route, load_model
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.layer_source import ReleaseFiles
from harness.sizing.vllm_source.sources import default_cache_dir
from harness.verify.compare import compare, taken_outcome, torch_peak_gib
from harness.verify.planning import plan_record, record_facts
from harness.verify.record import load_record

DATA = Path(__file__).resolve().parent / "data" / "real_startups"
ROUTER_FILE = "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py"
OPS_FILE = "vllm/_custom_ops.py"
FAKE = '@register_fake("_moe_C::grouped_topk")'

# release: whether its first MoE call can keep its frames, as its files say
READ = {
    "0.8.5": False,  # grouped_topk is compiled but has no fused op (fused_moe.py)
    "0.9.2": False,
    "0.19.0": True,  # the fused op, no fake implementation
    "0.26.0": True,
    "0.29.0": True,
    "0.30.0": False,  # _custom_ops.py registers the op's fake implementation
    "0.33.0": False,
}


def release_files(version: str) -> ReleaseFiles:
    return ReleaseFiles(locate(version=version, cache_dir=default_cache_dir()))


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("version", sorted(READ))
def test_each_release_read_from_its_files(version):
    read = defaults.first_moe_call_kept(release_files(version), version)
    assert read.value is READ[version] and read.from_source, read
    if READ[version]:
        assert "@torch.compile grouped_topk calls fused_grouped_topk" in read.source, read
        assert read.source.startswith("model_executor/layers/fused_moe/router/grouped_topk_router.py:"), read
    elif tuple(map(int, version.split("."))) >= (0, 30, 0):
        assert read.source.startswith("_custom_ops.py:") and 'register_fake("_moe_C::grouped_topk")' in read.source
    else:
        assert "calls no fused op" in read.source and read.source.startswith("model_executor/layers/fused_moe/"), read
    assert defaults.first_moe_call_kept(None, version).value is READ[version]  # the table agrees


def planted(tmp_path: Path, version: str, file: str, old: str, new: str) -> ReleaseFiles:
    """The router and _custom_ops.py copied from the release, `old` replaced by `new` in file (release_copies)."""
    root = locate(version=version, cache_dir=default_cache_dir()).root
    return release_copies.planted(tmp_path, root, (ROUTER_FILE, OPS_FILE), file, old, new)


@pytest.mark.vllm_wheel
def test_each_construct_changed_in_a_copy(tmp_path):
    """The fake registration removed from 0.30.0 turns it on; the decorator or the fused call removed from 0.26.0
    turns it off."""
    fixed = planted(tmp_path / "a", "0.30.0", OPS_FILE, FAKE, "")
    assert defaults.first_moe_call_kept(fixed, "0.30.0").value is True
    uncompiled = planted(
        tmp_path / "b",
        "0.26.0",
        ROUTER_FILE,
        "@torch.compile(\n    dynamic=True,",
        "@(lambda **k: (lambda f: f))(\n    dynamic=True,",
    )
    read = defaults.first_moe_call_kept(uncompiled, "0.26.0")
    assert read.value is False and "is not torch.compiled" in read.source, read
    unfused = planted(tmp_path / "c", "0.26.0", ROUTER_FILE, "        return fused_grouped_topk(\n",
                      "        return fused_grouped_topk_off(\n")  # fmt: skip
    read = defaults.first_moe_call_kept(unfused, "0.26.0")
    assert read.value is False and "calls no fused op" in read.source, read


def test_the_routers_that_take_the_fused_op():
    """0.26.0's router choice over DeepSeek-V3's config facts and their edges: a score-correction bias (topk_method
    noaux_tc), the router kept grouped, the experts dividing into more than n_group groups, n_group and top-k at
    most 32."""
    v3 = {"n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True}
    facts = {"score_bias": True, "num_routed_experts": 256, "top_k": 8}
    arch = "DeepseekV3ForCausalLM"
    assert fused_grouped_topk_route(v3, arch, facts)
    assert fused_grouped_topk_route({**v3, "n_group": 1, "topk_group": 1}, arch, {**facts, "num_routed_experts": 384})
    assert not fused_grouped_topk_route(v3, arch, {**facts, "score_bias": False})  # greedy: no bias, Python path
    assert not fused_grouped_topk_route({**v3, "n_group": 64}, arch, facts)  # over 32 groups
    assert not fused_grouped_topk_route(v3, arch, {**facts, "num_routed_experts": 260})  # 260 % 8: fused_topk_bias
    assert not fused_grouped_topk_route(v3, arch, {**facts, "top_k": 40})
    one_group = {**v3, "n_group": 1, "topk_group": 1, "scoring_func": "softmax"}
    assert not fused_grouped_topk_route(one_group, arch, facts)  # Unspecified with one group: not grouped
    assert fused_grouped_topk_route({"n_group": 1, "topk_group": 1}, "Glm4MoeForCausalLM",
                                    {**facts, "num_routed_experts": 160})  # always sigmoid with a bias  # fmt: skip
    assert not fused_grouped_topk_route(v3, "Qwen3MoeForCausalLM", facts)
    for preset, routed in (("deepseek-v3", True), ("deepseek-r1", True), ("kimi-k2", True), ("glm-4.5", True),
                           ("deepseek-v2-lite", False), ("qwen3-30b-a3b", False), ("minimax-m2", False)):  # fmt: skip
        assert load_model(preset).fused_grouped_topk is routed, preset


def test_what_the_kept_frames_hold_by_hand():
    """DeepSeek-V3 cut to four layers at 8192 tokens: five (8192, 7168) bf16 tensors of the MoE runner, and compiled
    the MoE piece's arguments, the attention output (8192, 128 x 128) and the residual (8192, 7168): 928 MiB, the
    high runs' difference (results/h200/startup-gaps: 5835849728 - 4858052608 B, with 4.5 MiB of small blocks)."""
    facts = record_facts(load_record(DATA / "dsv3-4l.yaml"))
    compiled = profile_run.first_moe_call_frames(facts, num_tokens=8192, tp=1, compiled=True)
    eager = profile_run.first_moe_call_frames(facts, num_tokens=8192, tp=1, compiled=False)
    assert eager.bytes == 5 * 8192 * 7168 * 2 == 587_202_560
    assert compiled.bytes == eager.bytes + 8192 * (128 * 128 + 7168) * 2 == 973_078_528
    assert 0 < 5835849728 - 4858052608 - compiled.bytes < 5 << 20
    assert profile_run.first_moe_call_frames(facts, num_tokens=8192, tp=8, compiled=True).bytes == (
        eager.bytes + 8192 * (16 * 128 + 7168) * 2
    )
    assert profile_run.layers_after_first_moe(facts) == (True, True, False)  # layer 0 dense, 1-3 MoE


# startup: the outcome it took, read from its torch peak (None: the plan's own)
TAKEN = {
    "dsv3-4l": "first MoE call kept",
    "dsv3-4l-capture1024": "first MoE call kept",
    "dsv32-4l-eager": "first MoE call kept",
    "dsv3-4l-cold": None,
    "dsv3-4l-warm": None,
    "dsv3-4l-len8k": None,
    "dsv32-4l": None,
    "dsv32-4l-eager-repeat": None,
    "glm45-4l": None,
    "kimi-k2-4l": None,  # its cut config has no topk_method: no bias, no fused op, no other outcome
}


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("name", sorted(TAKEN))
def test_each_startup_took_one_of_the_plans_outcomes(name):
    """The other outcome is where the release and router say, and the torch peak vLLM printed is within 0.05 GiB
    of the outcome it is read as, the KV tokens within 1%; verify names it."""
    record = load_record(DATA / f"{name}.yaml")
    plan = plan_record(record)
    facts = record_facts(record)
    assert bool(plan.other_outcomes) is facts.fused_grouped_topk
    taken = taken_outcome(plan, record.figures.torch_peak_increase_gib)
    assert (taken.name if taken is not None else None) == TAKEN[name]
    peak = torch_peak_gib(plan) + (taken.torch_peak_extra_bytes / GIB if taken is not None else 0)
    assert abs(peak - record.figures.torch_peak_increase_gib) <= 0.05
    tokens = (taken or plan).kv_tokens
    assert abs(tokens - record.figures.kv_cache_tokens) / record.figures.kv_cache_tokens < 0.01
    rows = {row.name: row for row in compare(record, plan, 1.0)}
    assert rows["torch peak"].within and rows["KV tokens"].within, rows
    if plan.other_outcomes:
        assert rows["outcome"].predicted == (TAKEN[name] or "the plan's own")
        other = plan.other_outcomes[0]
        assert other.kv_tokens < plan.kv_tokens and other.non_kv_bytes == plan.non_kv_bytes + \
            other.torch_peak_extra_bytes  # fmt: skip
        assert "grouped_topk" in other.reason and "chance" in other.reason


@pytest.mark.vllm_wheel
def test_a_startup_that_fails_only_when_the_call_is_kept_fails_the_verdict_gate(tmp_path):
    """DeepSeek-V3 cut to four layers on a GPU where its own startup leaves half a GiB for the KV cache: the plan
    starts, the kept-call outcome (0.91 GiB more) has no memory for it; --fail-on-verdict exits 1 and the text
    gives both, where a release with the fake implementation (0.30.0) has no other outcome."""
    import json

    from cli_utils import run_cli_inproc

    record = load_record(DATA / "dsv3-4l.yaml")
    model = tmp_path / "dsv3-4l"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(record.config))
    serve = [
        "--",
        "vllm",
        "serve",
        str(model),
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.9",
        "--max-num-batched-tokens",
        "8192",
        "--max-num-seqs",
        "256",
    ]  # not the GPU size's defaults
    probe = run_cli_inproc("plan", "--vllm-version", "0.26.0", "--gpu-memory-gib", "139.8", "--json", *serve)
    assert probe.returncode == 0, probe.stderr
    (plan,) = json.loads(probe.stdout)["deployments"]
    gib = round((plan["non_kv_bytes"] + (1 << 29)) / 0.9 / GIB, 3)  # half a GiB for the KV cache
    args = ["plan", "--vllm-version", "0.26.0", "--gpu-memory-gib", str(gib), *serve]
    result = run_cli_inproc(*args[: -len(serve)], "--json", *serve)
    (plan,) = json.loads(result.stdout)["deployments"]
    assert plan["verdict"]["outcome"] == "starts"
    (other,) = plan["other_outcomes"]
    assert other["verdict"]["outcome"] == "fails" and other["name"] == "first MoE call kept"
    gated = run_cli_inproc(*args[: -len(serve)], "--fail-on-verdict", *serve)
    assert gated.returncode == 1, gated.stdout
    assert "starts:" in gated.stdout and "or, first MoE call kept" in gated.stdout and "; fails." in gated.stdout
    fixed = run_cli_inproc("plan", "--vllm-version", "0.30.0", "--gpu-memory-gib", "139.8", "--json", *serve)
    assert json.loads(fixed.stdout)["deployments"][0]["other_outcomes"] == []


@pytest.mark.vllm_wheel
def test_the_search_ranks_a_layout_by_the_startup_it_can_count_on():
    """`harness plan --search` takes a layout's fewest KV tokens over its outcomes: the kept-call startup's for
    DeepSeek-V3 on 0.26.0, with the plan's own figure named in the verdict."""
    from harness.sizing.search import Layout, candidate_of

    plan = plan_record(load_record(DATA / "dsv3-4l.yaml"))
    (other,) = plan.other_outcomes
    layout = Layout(gpus=1, tp=1, dp=1, ep=False, all2all=None, moe_backend=None, max_num_batched_tokens=None,
                    num_redundant_experts=None, kv_cache_dtype=None)  # fmt: skip
    c = candidate_of(plan, layout, ["vllm", "serve", "dsv3-4l"], "0.26.0")
    assert c.outcome == "starts" and c.per_gpu_kv_tokens == other.kv_tokens < plan.kv_tokens
    assert c.non_kv_bytes == other.non_kv_bytes and c.kv_cache_bytes == other.kv_cache_bytes
    assert "first MoE call kept" in c.verdict and plan.verdict.text in c.verdict


@pytest.mark.vllm_wheel
def test_deepseek_v3_at_dp8_ep_starts_or_fails_by_chance_on_0_29_0():
    """The published DeepSeek-V3 at DP 8 with EP on H200s and its full context (163840 tokens): its own startup holds
    one request of that length, the kept-call startup (0.91 GiB more torch peak at 8192 tokens) does not; the
    all-gather dispatch's tensors are named as not counted. 0.30.0 registers the fake implementation: one outcome."""
    import json

    from cli_utils import run_cli_inproc
    from harness.sizing.deployment import DeploymentPlan

    line = ["vllm", "serve", "deepseek-ai/DeepSeek-V3", "--data-parallel-size", "8", "--enable-expert-parallel"]
    plans = {}
    for version in ("0.29.0", "0.30.0"):
        result = run_cli_inproc("plan", "--vllm-version", version, "--gpu", "H200-141GB", "--json", "--", *line)
        assert result.returncode == 0, result.stderr
        plans[version] = DeploymentPlan.model_validate(json.loads(result.stdout)["deployments"][0])
    plan = plans["0.29.0"]
    (other,) = plan.other_outcomes
    assert plan.verdict.outcome == "starts" and plan.kv_tokens >= 163840
    assert other.verdict.outcome == "fails" and other.kv_tokens < 163840
    assert other.torch_peak_extra_bytes == 5 * 8192 * 7168 * 2 + 8192 * (128 * 128 + 7168) * 2
    assert "allgather_reducescatter" in other.reason and "not counted" in other.reason
    assert not plan.starts_every_time and plans["0.30.0"].other_outcomes == []


@pytest.mark.vllm_wheel
def test_vllm_diff_names_a_startup_left_to_chance():
    """`harness vllm diff` on DeepSeek-V3 at DP 8 with EP: 0.29.0 -> 0.30.0 (the fake implementation registered)
    is an improvement from "starts or not, by chance" to "starts"; the other way round a regression."""
    from harness.sizing.vllm_diff import ReferenceDeployment, compare_deployment

    serve = "vllm serve deepseek-v3 --data-parallel-size 8 --enable-expert-parallel"
    ref = ReferenceDeployment(name="DeepSeek-V3 DP8 EP", gpu="H200-141GB", serve=serve)
    old, new = (locate(version=v, cache_dir=default_cache_dir()) for v in ("0.29.0", "0.30.0"))
    forward = compare_deployment(ref, old, new, 0.01)
    assert forward.base is not None and forward.head is not None
    assert not forward.base.starts_every_time and forward.head.starts_every_time and forward.head.other_outcomes == []
    assert forward.base.other_outcomes[0].startswith("first MoE call kept: fails, ")
    assert forward.regression is None and forward.improvement is not None
    assert "starts or not, by chance (first MoE call kept: fails" in forward.improvement
    backward = compare_deployment(ref, new, old, 0.01)
    assert backward.regression is not None and "starts -> starts or not, by chance" in backward.regression
