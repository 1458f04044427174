"""The experts class vLLM picks for a WNA16 MoE checkpoint (AWQ, GPTQ, compressed-tensors W4A16), read from each
release's own files in the tests' cache, and the workspace the plan then sizes from that class's workspace_shapes.

Each expectation below is what the release's source says, read by hand and cited; where a test leans on a fact of
the release (an argument a caller passes, the order of the backends, a workspace formula), it first checks that
fact in the release's file text, so a release that changes it fails here and not silently. Nothing of vLLM is run.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from cli_utils import run_cli_inproc
from harness.scenario.schema import parse_scenario
from harness.sizing.layer import plan_layer_from
from harness.sizing.moe_selection import Wna16Checkpoint, pick_wna16, wna16_checkpoint
from harness.sizing.vllm_source.layer_source import release_files
from harness.sizing.vllm_source.sources import locate
from harness.verify.logparse import parse_log
from harness.verify.planning import plan_record, record_facts
from harness.verify.record import load_record

pytestmark = pytest.mark.vllm_wheel

STARTUPS = Path(__file__).resolve().parent / "data" / "real_startups"
QUANT = "vllm/model_executor/layers/quantization"
ORACLE = "vllm/model_executor/layers/fused_moe/oracle/int_wna16.py"
STANDARD = {"ep_size": 1, "batched": False, "all2all": "allgather_reducescatter"}
DEEPEP_LL = {"ep_size": 8, "batched": True, "all2all": "deepep_low_latency"}
H200, B200, A100 = 90, 100, 80


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    import os

    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


@pytest.fixture(scope="module")
def releases(cache_dir):
    return {v: locate(version=v, cache_dir=cache_dir) for v in ("0.8.5", "0.19.0", "0.26.0", "0.29.0", "0.30.0",
                                                                 "0.33.0")}  # fmt: skip


def text(release, file: str) -> str:
    return (release.root / file).read_text(encoding="utf-8")


def checkpoint(name: str) -> Wna16Checkpoint:
    """A real startup's checkpoint (Qwen3-30B-A3B cut to four layers: K 2048, I 768) as the plan reads it."""
    found = wna16_checkpoint(record_facts(load_record(STARTUPS / f"{name}.yaml")), tp=1, dp=1, ep=False)
    assert found is not None
    return found


AWQ, GPTQ, W4A16 = "qwen3-moe-4l-awq", "qwen3-moe-4l-gptq", "qwen3-moe-4l-w4a16"


def test_the_checkpoints_are_what_their_configs_say():
    awq, gptq, w4a16 = checkpoint(AWQ), checkpoint(GPTQ), checkpoint(W4A16)
    assert (awq.scheme, awq.bits, awq.group_size, awq.symmetric) == ("awq", 4, 128, False)
    assert (gptq.scheme, gptq.bits, gptq.group_size, gptq.symmetric, gptq.act_order) == ("gptq", 4, 128, True, False)
    assert (w4a16.scheme, w4a16.group_size, w4a16.symmetric) == ("wna16", 32, True)  # Kimi-K2's group of 32
    assert {(c.hidden_size, c.intermediate_size) for c in (awq, gptq, w4a16)} == {(2048, 768)}


def test_0_26_0_on_an_h200_runs_the_marlin_experts(releases):
    """0.26.0's oracle tries FLASHINFER_TRTLLM first; its only class, TrtLlmMxint4ExpertsMonolithic, runs on the
    compute capability 10.x family only, so on an H200 the next backend, MARLIN (MarlinExperts: CUDA, capability
    7.5 and up, the Standard format), is the pick for all three formats; under DeepEP low-latency the batched format
    passes MarlinExperts over for BATCHED_MARLIN."""
    release = releases["0.26.0"]
    oracle = text(release, ORACLE)
    order = re.search(r"_AVAILABLE_BACKENDS = \[(.*?)\]", oracle, re.S)
    assert order is not None
    listed = re.findall(r"WNA16MoEBackend\.(\w+)", order.group(1))
    assert listed[:3] == ["FLASHINFER_TRTLLM", "MARLIN", "BATCHED_MARLIN"]
    assert "p.is_device_capability_family(100)" in text(release, "vllm/model_executor/layers/fused_moe/experts/"
                                                                 "trtllm_mxint4_moe.py")  # fmt: skip
    assert "p.is_cuda() and p.has_device_capability((7, 5))" in text(
        release, "vllm/model_executor/layers/fused_moe/experts/marlin_moe.py"
    )
    files = release_files(release)
    for name in (AWQ, GPTQ, W4A16):
        pick = pick_wna16(files, capability=H200, **STANDARD, checkpoint=checkpoint(name))
        assert (pick.backend, pick.experts_class, pick.family) == ("MARLIN", "MarlinExperts", "marlin"), name
        assert "FLASHINFER_TRTLLM TrtLlmMxint4ExpertsMonolithic (not on this GPU)" in pick.source
        batched = pick_wna16(files, capability=H200, **DEEPEP_LL, checkpoint=checkpoint(name))
        assert (batched.backend, batched.experts_class) == ("BATCHED_MARLIN", "BatchedMarlinExperts"), name
        assert "MARLIN MarlinExperts (Standard format)" in batched.source
    # An A100 (8.0) is Marlin's too: has_device_capability((7, 5))
    a100 = pick_wna16(files, capability=A100, **STANDARD, checkpoint=checkpoint(AWQ))
    assert a100.experts_class == "MarlinExperts"


def test_the_line_vllm_logs_for_its_pick(releases):
    """select_wna16_moe_backend logs its pick through _make_log_backend: f"Using '{backend.value}' WNA16 MoE
    backend.", the enum's MARLIN = "MARLIN"; the pick carries that line, and the log parser reads it back."""
    release = releases["0.26.0"]
    oracle = text(release, ORACLE)
    template = re.search(r'return f"(Using .\{backend\.value\}. WNA16 MoE backend\.)"', oracle)
    value = re.search(r'^\s+MARLIN = "(\w+)"', oracle, re.M)
    assert template is not None and value is not None
    expected = template.group(1).replace("{backend.value}", value.group(1))
    pick = pick_wna16(release_files(release), capability=H200, **STANDARD, checkpoint=checkpoint(AWQ))
    assert pick.logged == expected == "Using 'MARLIN' WNA16 MoE backend."
    line = f"(EngineCore pid=704) INFO 12-01 23:51:40 [fused_moe/oracle/int_wna16.py:206] {expected}"
    assert parse_log(line).backends.moe == "MARLIN WNA16"


def test_what_each_release_picks(releases):
    files = {v: release_files(r) for v, r in releases.items()}

    # 0.8.5 and 0.19.0 have no oracle: AWQMarlinMoEMethod.apply calls fused_marlin_moe itself, whose buffers are
    # its own, not a modular experts class's workspace (the plan keeps its Triton default and says why)
    for version in ("0.8.5", "0.19.0"):
        assert not (releases[version].root / ORACLE).exists()
        assert "fused_marlin_moe(" in text(releases[version], f"{QUANT}/awq_marlin.py")
        old = pick_wna16(files[version], capability=H200, **STANDARD, checkpoint=checkpoint(AWQ))
        assert old.family is None and old.experts_class is None
        assert "no select_wna16_moe_backend in quantization/awq_marlin.py" in old.source
        assert "calls torch.ops.vllm.fused_marlin_moe()" in old.source or "calls fused_marlin_moe()" in old.source

    # 0.29.0 and 0.30.0 check each backend first (_backend_incompatibility_reason): FLASHINFER_TRTLLM refuses a
    # method that may have a bias, and auto_gptq.py passes may_have_bias=True, so GPTQ on a B200 is Marlin's too
    for version in ("0.29.0", "0.30.0"):
        assert "may_have_bias=True" in text(releases[version], f"{QUANT}/auto_gptq.py")
        assert 'return "zero points and bias are not supported"' in text(releases[version], ORACLE)
        for name in (AWQ, GPTQ, W4A16):
            pick = pick_wna16(files[version], capability=H200, **STANDARD, checkpoint=checkpoint(name))
            assert (pick.backend, pick.experts_class) == ("MARLIN", "MarlinExperts"), (version, name)
        gptq = pick_wna16(files[version], capability=B200, **STANDARD, checkpoint=checkpoint(GPTQ))
        assert gptq.experts_class == "MarlinExperts"
        assert "FLASHINFER_TRTLLM (zero points and bias are not supported)" in gptq.source

    # 0.33.0 returns prioritize_humming(backends), a function of another file (it moves HUMMING ahead of MARLIN on
    # 9.0): the selection is not read, and the pick says so
    assert "return prioritize_humming(backends)" in text(releases["0.33.0"], ORACLE)
    new = pick_wna16(files["0.33.0"], capability=H200, **STANDARD, checkpoint=checkpoint(AWQ))
    assert new.family is None and "prioritize_humming(backends)" in new.source


def test_a_layer_marlin_cannot_run(releases):
    """check_moe_marlin_supports_layer (marlin_utils.py) wants I % group == 0 when the tile may be padded; at
    I = 96 with groups of 128 it says no. 0.26.0's AutoAWQConfig then builds MoeWNA16 (moe_wna16.py), whose apply()
    calls fused_experts; 0.29.0 asks the oracle again, where MoeWNA16Config rules Marlin out and TRITON runs
    TritonWNA16Experts."""
    narrow = Wna16Checkpoint("awq", 4, 128, False, False, 2048, 96)
    for version in ("0.26.0", "0.29.0"):
        assert "intermediate_size_per_partition % group_size == 0" in text(
            releases[version], f"{QUANT}/utils/marlin_utils.py"
        )
    old = pick_wna16(release_files(releases["0.26.0"]), capability=H200, **STANDARD, checkpoint=narrow)
    assert old.family is None and "check_moe_marlin_supports_layer: False" in old.source
    assert "quantization/moe_wna16.py" in old.source and "fused_experts()" in old.source
    new = pick_wna16(release_files(releases["0.29.0"]), capability=H200, **STANDARD, checkpoint=narrow)
    assert (new.backend, new.experts_class, new.family) == ("TRITON", "TritonWNA16Experts", "triton")
    assert "MARLIN (the MoeWNA16 checkpoint layout is not supported)" in new.source


def test_a_check_that_cannot_be_read_keeps_the_plan_from_guessing(releases):
    """On a B200, 0.26.0's TrtLlmMxint4ExpertsMonolithic runs where is_flashinfer_mxint4_moe_available() (a function
    of another file, imported inside the method) says so, and the compressed-tensors method's weight key is built
    at run time: whether vLLM takes it or Marlin is not read, and the pick names why instead of passing it over."""
    assert "is_flashinfer_mxint4_moe_available()" in text(
        releases["0.26.0"], "vllm/model_executor/layers/fused_moe/experts/trtllm_mxint4_moe.py"
    )
    pick = pick_wna16(release_files(releases["0.26.0"]), capability=B200, **STANDARD, checkpoint=checkpoint(W4A16))
    assert pick.family is None
    assert "TrtLlmMxint4ExpertsMonolithic not evaluated" in pick.source
    assert "is_flashinfer_mxint4_moe_available()" in pick.source


def test_the_marlin_workspace_by_hand(releases):
    """0.26.0's MarlinExperts.workspace_shapes: workspace1 (M * topk, max(N, K)), workspace2
    (M * topk * max(2 * N, K),), output (M, K), with N from MarlinExpertsBase.moe_problem_size:
    marlin_moe_intermediate_size(w1, w2) = w2_packed.size(1) * 16 = I. The modular kernel holds max(workspace1,
    output) + workspace2 in the activation dtype (modular_kernel.py _allocate_buffers). For K 256, I 512, top-k 4 and
    64 tokens that is (max(256 x 512, 64 x 256) + 256 x 1024) x 2 B; with the layer's gated N = 2I it would be
    twice that."""
    release = releases["0.26.0"]
    source = text(release, "vllm/model_executor/layers/fused_moe/experts/marlin_moe.py")
    for line in ("workspace1 = (M * topk, max(N, K))", "workspace2 = (M * topk * max(2 * N, K),)",
                 "output = (M, K)", "N = marlin_moe_intermediate_size(w1, w2)"):  # fmt: skip
        assert line in source, line
    assert "return w2_packed.size(1) * marlin_tile_size" in text(release, f"{QUANT}/utils/marlin_utils.py")
    M, K, I, topk = 64, 256, 512, 4
    expected = (max(M * topk * max(I, K), M * K) + M * topk * max(2 * I, K)) * 2
    scenario = parse_scenario({
        "name": "marlin-by-hand",
        "model": {"hidden_size": K, "intermediate_size": I, "num_experts": 8, "top_k": topk},
        "parallel": {"num_dispatchers": 1, "num_ranks": 1, "num_local_experts": 8, "max_tokens_per_rank": M},
        "layer": {"all2all": "none", "moe_backend": "marlin", "quant": "wna16"},
    }, path="marlin-by-hand")  # fmt: skip
    plan = plan_layer_from(scenario, release)
    workspace = plan.component("workspace")
    assert plan.experts_class == "MarlinExperts" and workspace is not None
    assert workspace.bytes == expected == 786432
    assert workspace.bytes != (max(M * topk * max(2 * I, K), M * K) + M * topk * max(4 * I, K)) * 2
    assert f"MarlinExperts.workspace_shapes(M={M}, N={I}, K={K}, topk={topk})" in workspace.source
    assert math.prod((M * topk, max(I, K))) * 2 == workspace.facts["common_bytes"]


def test_the_plan_names_the_class_and_the_logged_backend(releases, tmp_path):
    """`harness plan` on the real AWQ startup's config: the experts line and the moe-workspace line name
    MarlinExperts and what vLLM logs; the JSON carries the same in its moe_backend setting."""
    record = load_record(STARTUPS / f"{AWQ}.yaml")
    model = tmp_path / "qwen3-moe-4l-awq"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(record.config), encoding="utf-8")
    cache = str(releases["0.26.0"].root.parent.parent.parent)
    serve = ("--", "vllm", "serve", str(model), "--max-model-len", "4096", "--max-num-batched-tokens", "8192")
    done = run_cli_inproc("plan", "--vllm-version", "0.26.0", "--gpu", "H200-141GB", "--cache-dir", cache, *serve)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "experts backend: marlin (fused_moe/oracle/int_wna16.py:136 select_wna16_moe_backend" in out
    assert "vLLM picks MARLIN (MarlinExperts)" in out
    assert "logging \"Using 'MARLIN' WNA16 MoE backend.\"" in out
    assert "MarlinExperts.workspace_shapes(M=8192, N=768, K=2048, topk=8)" in out
    plan = json.loads(run_cli_inproc("plan", "--vllm-version", "0.26.0", "--gpu", "H200-141GB", "--cache-dir", cache,
                                     "--json", *serve).stdout)["deployments"][0]  # fmt: skip
    setting = next(s for s in plan["settings"] if s["name"] == "moe_backend")
    assert setting["value"] == "marlin" and "(MarlinExperts)" in setting["source"]
    workspace = next(line for line in plan["lines"] if line["name"] == "moe-workspace")
    assert "MarlinExperts.workspace_shapes" in workspace["source"]


def test_a_release_whose_experts_are_not_read_says_so_in_the_plan(releases):
    """0.19.0's AWQ MoE runs fused_marlin_moe in its own apply(): the plan keeps the Triton WNA16 experts and its
    moe_backend line says why, as a table default."""
    plan = plan_record(load_record(STARTUPS / f"{AWQ}.yaml"), version="0.19.0", source=releases["0.19.0"])
    setting = next(s for s in plan.settings if s.name == "moe_backend")
    assert setting.value == "triton" and setting.source.startswith("table: the Triton WNA16 experts")
    assert "vLLM's experts class is not read" in setting.source and "fused_marlin_moe" in setting.source
    workspace = plan.line("moe-workspace") or plan.line("moe-workspace (per call)")
    assert workspace is not None and "TritonWNA16Experts" in workspace.source


@pytest.mark.parametrize("name", [AWQ, GPTQ, W4A16])
def test_the_real_startups_plan_marlin(name, cache_dir):
    """The three real 0.26.0 startups on an H200: the plan sizes MarlinExperts, whose workspace at these shapes is
    the Triton WNA16 class's to the byte (2 x M x topk x K when K >= 2I: M 8192, top-k 8, K 2048, bf16)."""
    plan = plan_record(load_record(STARTUPS / f"{name}.yaml"), cache_dir=cache_dir)
    assert plan.setting("moe_backend") == "marlin"
    workspace = plan.line("moe-workspace")
    assert workspace is not None and "MarlinExperts.workspace_shapes" in workspace.source
    assert workspace.bytes == 2 * 8192 * 8 * 2048 * 2


def test_a_hostile_marlin_check_stays_bounded(releases, tmp_path):
    """A tree whose check_moe_marlin_supports_layer fans out into ten calls a level, four levels deep (10^4 calls
    if run), or calls itself forever: the selection stops at its call budget or depth and says so."""
    import shutil

    root = tmp_path / "vllm-src"
    shutil.copytree(releases["0.26.0"].root / "vllm", root / "vllm")
    utils = root / QUANT / "utils" / "marlin_utils.py"
    calls = [" + ".join([f"_level{n + 1}(x)"] * 10) for n in range(4)] + ["1"]
    levels = "".join(f"\n\ndef _level{n}(x):\n    return {body}\n" for n, body in enumerate(calls))
    fan = "\n\ndef check_moe_marlin_supports_layer(layer, group_size, allow_tile_padding=False):\n" \
          "    return _level0(layer) > 0\n"  # fmt: skip
    utils.write_text(utils.read_text(encoding="utf-8") + levels + fan, encoding="utf-8")
    pick = pick_wna16(release_files(locate(src=root)), capability=H200, **STANDARD, checkpoint=checkpoint(AWQ))
    assert pick.family is None and "calls more than 64 functions" in pick.source
    loop = "\n\ndef check_moe_marlin_supports_layer(layer, group_size, allow_tile_padding=False):\n" \
           "    return check_moe_marlin_supports_layer(layer, group_size, allow_tile_padding)\n"  # fmt: skip
    utils.write_text(utils.read_text(encoding="utf-8") + loop, encoding="utf-8")
    pick = pick_wna16(release_files(locate(src=root)), capability=H200, **STANDARD, checkpoint=checkpoint(AWQ))
    assert pick.family is None and "calls nested deeper than 8" in pick.source
