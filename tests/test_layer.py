"""The whole EP MoE layer per GPU (harness.sizing.layer): DeepEP's layout, the release readers, the verdicts.

The release tests read real vLLM wheels from the registry (cached in ~/.cache/moe-harness): nothing of vLLM is
imported or executed; the expressions run in harness.sizing.vllm_source.exprs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_utils import run_cli_inproc

from harness.scenario.schema import ScenarioError, load_scenario, parse_scenario
from harness.sizing import deepep
from harness.sizing.layer import plan_layer, plan_layer_from
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.layer_source import ReleaseFiles, env_default, moe_num_experts

GIB = 2**30
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
CASE_57894 = SCENARIOS / "vllm-57894-eplb-deepep-ll.yaml"
CASE_53241 = SCENARIOS / "vllm-53241-triton-wna16-tp4.yaml"
CASE_55579 = SCENARIOS / "deepseek-v3-dp32-pr55579.yaml"


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


# --- DeepEP's low-latency layout ------------------------------------------------------------------------------------


def ll(T: int, experts: int, *, hidden: int = 5120, ranks: int = 16, layout: str = deepep.LOGFMT_COMBINE):
    return deepep.LowLatencyLayout(num_max_dispatch_tokens_per_rank=T, hidden=hidden, num_ranks=ranks,
                                   num_experts=experts, layout=layout)  # fmt: skip


def test_the_57894_table_is_reproduced():
    """The issue's table (hidden 5120, 16 ranks, 448 experts): 2048 -> 35.55, 1856 -> 32.21, 1840 -> 31.94,
    1536 -> 26.66 GiB; the first two over DeepEP's cap, the last two under it."""
    expected = {2048: (35.55, False), 1856: (32.21, False), 1840: (31.94, True), 1536: (26.66, True)}
    for T, (gib, fits) in expected.items():
        hint = ll(T, 448).size_hint_bytes
        assert round(hint / GIB, 2) == gib, T
        assert deepep.rdma_bytes_fit(hint) is fits, T
    # Exactly: 2 x (send + recv + signal) with msg_combine = 2K + 4K/128 = 10400 B dominating send and recv.
    assert ll(2048, 448).total_bytes == 2 * (2 * 448 * 2048 * 10400 + 1792)
    assert ll(2048, 448).size_hint_bytes == 38168170112


def test_the_ceiling_is_1843_tokens_at_448_experts_and_2150_at_384():
    assert deepep.max_tokens_under_cap(hidden=5120, num_ranks=16, num_experts=448) == 1843
    assert deepep.rdma_bytes_fit(ll(1843, 448).size_hint_bytes)
    assert not deepep.rdma_bytes_fit(ll(1844, 448).size_hint_bytes)
    # Sized for the 384 routed experts alone, T = 2048 fits: where the guidance's 2048 comes from.
    assert round(ll(2048, 384).size_hint_bytes / GIB, 2) == 30.47
    assert deepep.max_tokens_under_cap(hidden=5120, num_ranks=16, num_experts=384) == 2150


def test_cap_boundary_and_layouts():
    assert deepep.rdma_bytes_fit(deepep.RDMA_CAP_BYTES)
    assert not deepep.rdma_bytes_fit(deepep.RDMA_CAP_BYTES + 1)
    assert deepep.RDMA_CAP_BYTES == 16 * (2**31 - 1) - 1
    # Before DeepEP c5facf5 the combine message had no LogFMT scales (2K): send holds E*T combine messages,
    # receive E*T dispatch messages (16 + 2K).
    old = ll(2048, 448, layout=deepep.BF16_COMBINE)
    assert old.combine_msg_bytes == 10240 and old.dispatch_msg_bytes == 10256
    assert old.total_bytes == 2 * (448 * 2048 * 10240 + 448 * 2048 * 10256 + 1792)
    # Alignment: rounded up to 128 B, plus 128 B when already aligned (DeepEP's own rounding).
    assert ll(2048, 448).size_hint_bytes == ll(2048, 448).total_bytes + 128


def test_low_latency_receive_tensors():
    recv = deepep.LowLatencyRecv(num_local_experts=28, num_ranks=16, num_max_dispatch_tokens_per_rank=2048,
                                 hidden=5120, use_fp8=True)  # fmt: skip
    slots = 16 * 2048
    assert recv.num_slots == slots
    assert recv.x_bytes == 28 * slots * 5120
    assert recv.scales_bytes == 28 * 40 * slots * 4
    assert recv.total_bytes == recv.x_bytes + recv.scales_bytes + 28 * slots * 4 + 28 * 16 * 8 + 28 * 4


# --- the readers, on a real release ---------------------------------------------------------------------------------


@pytest.mark.vllm_wheel
def test_readers_on_vllm_0_33_0(cache_dir):
    files = ReleaseFiles(locate(version="0.33.0", cache_dir=cache_dir))
    env = env_default(files, "VLLM_DEEPEP_BUFFER_SIZE_MB")
    assert env.value == 1024 and env.ref is not None and env.ref.file == "envs.py"
    experts = moe_num_experts(files, num_routed_experts=384, num_redundant_experts=64)
    assert experts.value == 448, experts.reason
    assert experts.ref is not None and experts.ref.file.endswith("fused_moe/layer.py")


# --- the whole layer, through the CLI -------------------------------------------------------------------------------


@pytest.mark.vllm_wheel
def test_57894_on_0_33_0_json(cache_dir):
    """What vLLM 0.33.0 asks DeepEP for: 448 experts (redundant ones included), 35.55 GiB; dispatch needs the
    same 448 experts, so the buffer is not under-sized; it is over DeepEP's 32 GiB cap."""
    result = run_cli_inproc("plan", str(CASE_57894), "--vllm-version", "0.33.0", "--json", "--cache-dir", str(cache_dir))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    (plan,) = data["layers"]
    assert plan["schema_version"] == 1 and plan["kind"] == "layer-plan" and plan["vllm_version"] == "0.33.0"
    rdma = next(c for c in plan["components"] if c["name"] == "deepep-rdma")
    assert rdma["bytes"] == 38168170112 and round(rdma["bytes"] / GIB, 2) == 35.55
    assert rdma["facts"]["requested_num_experts"] == 448
    assert rdma["facts"]["needed_num_experts"] == 448
    assert rdma["needed_bytes"] == ll(2048, 448).total_bytes
    assert rdma["verdicts"] == ["over-cap"]
    assert rdma["facts"]["max_tokens_under_cap"] == 1843
    assert round(rdma["facts"]["routed_only_bytes"] / GIB, 2) == 30.47
    assert "all2all.py:327" in rdma["source"] and "all2all_utils.py:263" in rdma["source"]
    nvl = next(c for c in plan["components"] if c["name"] == "deepep-nvl")
    assert nvl["facts"]["num_nvl_bytes"] == 1024 * 2**20 and nvl["verdicts"] == ["consistent"]
    assert data["layer_expectation_failures"] == []


@pytest.mark.vllm_wheel
def test_57894_budget_names_the_refused_buffer(cache_dir):
    result = run_cli_inproc("plan", str(CASE_57894), "--vllm-version", "0.33.0", "--gpu", "H100-80GB",
                         "--cache-dir", str(cache_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "H100-80GB: REFUSED (deepep-rdma): 35.55 GiB is over the library's cap of 32.00 GiB" in result.stdout


@pytest.mark.slow
@pytest.mark.vllm_wheel
def test_under_sized_when_a_tree_sizes_for_the_routed_experts_only(cache_dir, tmp_path):
    """A tree that passes DeepEP the routed experts alone (what #57894's title suspected) is under-sized: the
    buffer holds 384 experts' layout while dispatch runs with 448, and DeepEP's dispatch assert would fire."""
    release = locate(version="0.33.0", cache_dir=cache_dir)
    tree = tmp_path / "tree"
    shutil.copytree(release.root / "vllm", tree / "vllm")
    utils = tree / "vllm/model_executor/layers/fused_moe/all2all_utils.py"
    text = utils.read_text()
    ll_args = "num_ep_ranks=all2all_manager.world_size,\n            num_global_experts=moe.num_experts,"
    assert text.count(ll_args) == 1
    utils.write_text(text.replace(ll_args, ll_args.replace("moe.num_experts", "moe.num_logical_experts")))
    scenario = load_scenario(CASE_57894)
    plan = plan_layer_from(scenario, locate(src=tree), budget_bytes=81559 * 2**20, gpu="H100-80GB")
    rdma = plan.component("deepep-rdma")
    assert rdma is not None and rdma.verdicts == ["under-sized"]
    assert rdma.bytes == ll(2048, 384).size_hint_bytes and rdma.needed_bytes == ll(2048, 448).total_bytes
    assert plan.budget is not None and plan.budget.outcome == "refused"
    assert plan.budget.breaking_component == "deepep-rdma" and "DeepEP asserts" in plan.budget.reason


@pytest.mark.vllm_wheel
def test_53241_triton_workspace_is_672_mib_over_its_live_set(cache_dir):
    plan = plan_layer(load_scenario(CASE_53241), "0.33.0", cache_dir=cache_dir)
    assert plan.experts_class == "TritonWNA16Experts"
    workspace = plan.component("workspace")
    assert workspace is not None and workspace.verdicts == ["over-allocated"]
    M, topk, K, act = 16384, 8, 3072, 256
    assert workspace.bytes == 2 * (2 * M * topk * max(act, K))  # common (ws13 > out) + ws2, bf16
    assert workspace.needed_bytes == 2 * (max(M * topk * act, M * K) + M * topk * max(2 * act, K))
    assert workspace.bytes - workspace.needed_bytes == 672 * 2**20
    assert "triton_moe.py:773" in workspace.detail and "triton_moe.py:240" in workspace.source
    assert [c.name for c in plan.components] == ["expert-weights", "workspace"]  # TP4, no all-to-all


@pytest.mark.vllm_wheel
@pytest.mark.parametrize(("version", "verdicts", "total"), [("0.29.0", ["double-count"], 120259084288),
                                                             ("0.30.0", ["consistent"], 3758096384)])
def test_55579_workspace_per_release(cache_dir, version, verdicts, total):
    plan = plan_layer(load_scenario(CASE_55579), version, cache_dir=cache_dir)
    workspace = plan.component("workspace")
    assert workspace is not None and workspace.verdicts == verdicts and workspace.bytes == total
    assert workspace.needed_bytes == 3758096384  # the batched CUTLASS live set, docs/design.md


@pytest.mark.vllm_wheel
def test_a_failed_layer_expectation_exits_1(cache_dir, tmp_path):
    text = CASE_57894.read_text().replace("deepep-rdma: [over-cap]", "deepep-rdma: [under-sized]")
    path = tmp_path / "wrong.yaml"
    path.write_text(text)
    result = run_cli_inproc("plan", str(path), "--vllm-version", "0.33.0", "--cache-dir", str(cache_dir))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED: vllm 0.33.0 deepep-rdma: expected under-sized, found over-cap" in result.stdout


# --- bad input ------------------------------------------------------------------------------------------------------


def test_unknown_gpu_is_one_line_exit_2():
    result = run_cli_inproc("plan", str(CASE_57894), "--gpu", "H300")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--gpu 'H300' is not a known GPU; allowed:" in result.stderr


def test_layer_block_validation():
    base = {"model": {"hidden_size": 5120, "intermediate_size": 2048, "num_experts": 384, "top_k": 8},
            "parallel": {"num_dispatchers": 16, "max_tokens_per_rank": 2048}}  # fmt: skip
    with pytest.raises(ScenarioError, match=r"= 384 must equal model.num_experts \(384\) \+ layer.num_redundant_"
                                            r"experts \(64\) = 448: set parallel.num_local_experts to 28"):
        parse_scenario({**base, "layer": {"num_redundant_experts": 64}})
    with pytest.raises(ScenarioError, match="unknown component 'rdma'"):
        parse_scenario({**base, "layer": {"expect": {"0.33.0": {"rdma": ["over-cap"]}}}})
    with pytest.raises(ScenarioError, match="unknown verdicts"):
        parse_scenario({**base, "layer": {"expect": {"0.33.0": {"deepep-rdma": ["too-big"]}}}})


def test_a_scenario_without_a_layer_block_hashes_as_before():
    scenario = load_scenario(CASE_55579)
    assert '"layer"' not in scenario.canonical_json()
    triton = scenario.layer.model_copy(update={"moe_backend": "triton"})
    with_layer = scenario.model_copy(update={"layer": triton})
    assert '"layer"' in with_layer.canonical_json()


# --- the release-wide audit -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm_wheel
def test_layer_audit_names_the_file_that_fixed_55579(cache_dir, tmp_path):
    out = tmp_path / "audit"
    result = run_cli_inproc("vllm", "audit", "--layer", "--releases", "0.29.0..0.30.0", "--out", str(out),
                            "--cache-dir", str(cache_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "layer-audit.json").read_text())
    assert data["schema_version"] == 1 and data["kind"] == "layer-audit"
    assert [r["vllm_version"] for r in data["releases"]] == ["0.29.0", "0.30.0"]
    runs = [t for t in data["transitions"] if t["case"] == "55579 LL cutlass" and t["component"] == "workspace"]
    assert [(t["first"], t["last"], t["verdicts"], t["bytes"]) for t in runs] == [
        ("0.29.0", "0.29.0", ["double-count"], 120259084288), ("0.30.0", "0.30.0", ["consistent"], 3758096384)]
    assert runs[1]["changed_files"] == ["model_executor/layers/fused_moe/experts/cutlass_moe.py"]
    table = (out / "layer-audit.md").read_text()
    assert ("| 55579 LL cutlass | CutlassBatchedExpertsFp8 | workspace | 0.30.0 | consistent | 3.50 | "
            "`model_executor/layers/fused_moe/experts/cutlass_moe.py` |") in table
    assert table == result.stdout


def test_releases_without_layer_is_a_usage_error():
    result = run_cli_inproc("vllm", "audit", "--releases", "0.30.0")
    assert result.returncode == 2 and "--releases and --out go with --layer" in result.stderr


def test_the_comm_paths_view_is_the_same_layout():
    """harness.rank.comm sizes its buffers with deepep_low_latency_bytes: the size hint vLLM passes DeepEP."""
    view = deepep.deepep_low_latency_bytes(max_tokens_per_rank=2048, hidden_size=5120, num_experts=448)
    assert view.total_bytes == ll(2048, 448).size_hint_bytes == 38168170112
    assert view.layout_bytes == ll(2048, 448).total_bytes
    old = deepep.deepep_low_latency_bytes(max_tokens_per_rank=2048, hidden_size=5120, num_experts=448,
                                          combine_variant="bf16")  # fmt: skip
    assert old.msg_combine_bytes == 10240
    assert old.total_bytes == ll(2048, 448, layout=deepep.BF16_COMBINE).size_hint_bytes


# --- harness run: the components the rank allocates, measured against the prediction ---------------------------------


@pytest.mark.slow
def test_rank_setup_allocates_the_predicted_weights_and_dispatch_output():
    """The weights and the batched dispatch output the rank allocates are the layer model's bytes exactly; the
    measured step covers them (RSS here, NVML on a GPU)."""
    import torch

    from harness.rank.comm import create_comm
    from harness.rank.dispatch import DispatchLayout
    from harness.rank.experts import make_weights
    from harness.rank.lifecycle import _measured_step, _tensor_bytes
    from harness.rank.memory import Accountant, MemoryProbe
    from harness.sizing.layer import run_predictions

    scenario = load_scenario(SCENARIOS / "smoke.yaml")
    predicted = run_predictions(scenario)
    E, K, I = scenario.num_local_experts, scenario.model.hidden_size, scenario.model.intermediate_size
    D, P, T = scenario.parallel.num_dispatchers, scenario.parallel.num_ranks, scenario.parallel.max_tokens_per_rank
    device = torch.device("cpu")
    accountant, probe = Accountant(device), MemoryProbe(device, use_nvml=False)
    weights, step = _measured_step(probe, accountant, lambda: make_weights(
        rank=0, num_local_experts=E, hidden_size=K, intermediate_size=I, seed=0, device=device,
        accountant=accountant))  # fmt: skip
    component = step.component("expert-weights", predicted, step.allocated_bytes)
    assert component.predicted_bytes == component.allocated_bytes == accountant.bytes_of("weights")
    assert step.num_tensors == 4
    layout = DispatchLayout(num_ranks=P, rank=0, num_local_experts=E, max_slots_per_expert=T * D, hidden_size=K,
                            top_k=scenario.model.top_k, max_tokens=T * (D // P),
                            num_buffer_tokens=T * (D // P))  # fmt: skip
    buffers, step = _measured_step(probe, accountant, lambda: create_comm(
        "gloo", layout, accountant, device=device, out_dtype=torch.bfloat16))  # fmt: skip
    output = step.component("dispatch-quant", predicted, _tensor_bytes(buffers.expert_x, buffers.expert_x_scale))
    assert output.predicted_bytes == output.allocated_bytes == E * T * D * (K + 4)
    assert output.step_allocated_bytes == accountant.bytes_of("dispatch") + accountant.bytes_of("combine")
    assert predicted["deepep-rdma"].bytes == ll(T, E * D, hidden=K, ranks=D).size_hint_bytes


@pytest.mark.slow
@pytest.mark.vllm_wheel
def test_a_hostile_tree_ends_unevaluated_quickly(cache_dir, tmp_path):
    """The layer readers run the release's code only in the budgeted interpreter: an endless manager, a recursive
    expert-count helper and an escape attempt end as unevaluated components, and nothing is written."""
    release = locate(version="0.33.0", cache_dir=cache_dir)
    tree = tmp_path / "tree"
    shutil.copytree(release.root / "vllm", tree / "vllm")
    all2all = tree / "vllm/distributed/device_communicators/all2all.py"
    text = all2all.read_text()
    marker = '        """max_num_tokens_per_dp_rank : the maximum number of tokens a DP rank'
    assert text.count(marker) == 1
    all2all.write_text(text.replace(marker, "        while True:\n            pass\n" + marker))
    plan = plan_layer_from(load_scenario(CASE_57894), locate(src=tree))  # ends by the interpreter's step budget
    rdma = plan.component("deepep-rdma")
    assert rdma is not None and rdma.verdicts == ["unevaluated"] and rdma.bytes is None
    assert "_make_all2all_kwargs" in rdma.detail and "step" in rdma.detail, rdma.detail
    layer = tree / "vllm/model_executor/layers/fused_moe/layer.py"
    text = layer.read_text()
    helper = "    global_num_experts = num_experts + num_redundant_experts\n"
    assert text.count(helper) == 1
    escape = "().__class__.__subclasses__()[0]('touch " + str(tmp_path / "pwned") + "')"
    layer.write_text(text.replace(helper, f"    global_num_experts = {escape}\n"))
    plan = plan_layer_from(load_scenario(CASE_57894), locate(src=tree))
    rdma = plan.component("deepep-rdma")
    assert rdma is not None and rdma.verdicts == ["unevaluated"] and "__class__" in rdma.detail, rdma.detail
    assert not (tmp_path / "pwned").exists()


def test_the_committed_audit_table_is_the_one_in_the_docs():
    """docs/vllm-sources.md carries results/audit/layer-audit.md verbatim, and the table is what the JSON says."""
    from harness.sizing.layer_audit import LayerAudit, audit_markdown

    root = SCENARIOS.parent
    table = (root / "results/audit/layer-audit.md").read_text()
    assert table in (root / "docs/vllm-sources.md").read_text()
    audit = LayerAudit.model_validate_json((root / "results/audit/layer-audit.json").read_text())
    assert audit_markdown(audit) == table
    # From the first release with the batched CUTLASS path (and its double count) to the last one checked.
    assert [r.vllm_version for r in audit.releases][:1] == ["0.9.2"] and audit.releases[-1].vllm_version == "0.33.0"
    assert len(audit.releases) >= 40 and all(r.error is None for r in audit.releases)


# --- the hidden size DeepEP sees, and declared redundant experts ---------------------------------------------------

HIDDEN_2880 = {
    "name": "hidden-2880", "description": "hidden 2880 (GPT-OSS) over DeepEP low-latency",
    "model": {"hidden_size": 2880, "intermediate_size": 2880, "num_experts": 128, "top_k": 4},
    "parallel": {"num_dispatchers": 8, "num_ranks": 1, "num_local_experts": 16, "max_tokens_per_rank": 256},
    "policies": ["fixed"],
    "layer": {"all2all": "deepep-low-latency", "moe_backend": "triton", "quant": "bf16"},
}  # fmt: skip


@pytest.mark.vllm_wheel
def test_deepep_ll_hidden_is_rounded_up_as_vllm_does(cache_dir):
    # vLLM rounds 2880 up to 3072 (DeepEPLLPrepareAndFinalize.SUPPORTED_HIDDEN_SIZES) before sizing the buffer.
    plan = plan_layer(parse_scenario(HIDDEN_2880), "0.30.0", cache_dir=cache_dir)
    rdma = plan.component("deepep-rdma")
    assert rdma.bytes == 817_890_432
    assert ll(256, 128, hidden=2880, ranks=8).size_hint_bytes == 766_510_208  # what the layer's own K would give
    assert "hidden=3072" in rdma.detail and rdma.verdicts == ["consistent"]
    recv = plan.component("dispatch-recv")
    assert recv.facts["x_bytes"] == 16 * 8 * 256 * 3072 * 2  # (E, D*T, 3072) bf16


def test_declared_redundant_experts_are_respected_or_refused():
    base = {"model": {"hidden_size": 5120, "intermediate_size": 2048, "num_experts": 384, "top_k": 8},
            "parallel": {"num_dispatchers": 16, "max_tokens_per_rank": 2048, "num_local_experts": 48}}  # fmt: skip
    # E x D = 768 slots for 384 experts: an explicit 0 contradicts it, and says so with both numbers.
    with pytest.raises(ScenarioError, match=r"= 768 must equal model.num_experts \(384\) \+ layer.num_redundant_"
                                            r"experts \(0\) = 384"):
        parse_scenario({**base, "layer": {"num_redundant_experts": 0}})
    from harness.sizing.layer import layout_of

    assert layout_of(parse_scenario(base)).num_redundant_experts == 384  # unset: derived from E x D
    exact = {**base, "parallel": {**base["parallel"], "num_local_experts": 24}}
    assert layout_of(parse_scenario({**exact, "layer": {"num_redundant_experts": 0}})).num_redundant_experts == 0
    # Unset and an explicit 0 hash alike (as before the field could be unset).
    with_zero = parse_scenario({**exact, "layer": {"num_redundant_experts": 0, "moe_backend": "triton"}})
    unset = parse_scenario({**exact, "layer": {"moe_backend": "triton"}})
    assert with_zero.scenario_hash == unset.scenario_hash


@pytest.mark.slow
@pytest.mark.vllm_wheel
def test_plan_takes_a_source_tree_and_a_wheel_like_audit(cache_dir, tmp_path):
    release = locate(version="0.30.0", cache_dir=cache_dir)
    tree = tmp_path / "tree"
    shutil.copytree(release.root / "vllm", tree / "vllm")
    by_version = run_cli_inproc("plan", str(CASE_55579), "--vllm-version", "0.30.0", "--json")
    by_tree = run_cli_inproc("plan", str(CASE_55579), "--vllm-src", str(tree), "--json")
    assert by_version.returncode == by_tree.returncode == 0, by_tree.stderr
    (from_release,) = json.loads(by_version.stdout)["layers"]
    (from_tree,) = json.loads(by_tree.stdout)["layers"]
    assert from_tree["vllm_version"] == "0.30.0"
    assert [(c["name"], c["bytes"]) for c in from_tree["components"]] == \
        [(c["name"], c["bytes"]) for c in from_release["components"]]  # fmt: skip
    missing = run_cli_inproc("plan", str(CASE_55579), "--vllm-wheel", str(tmp_path / "none.whl"))
    assert missing.returncode == 2 and "--vllm-wheel" in missing.stderr and "no such file" in missing.stderr
    assert missing.stderr.strip().count("\n") == 0
