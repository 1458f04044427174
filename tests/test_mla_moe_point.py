"""A compiled MLA model's MoE layer in the profile run (profile_run.mla_moe_point), against the CUDA caching
allocator's history of real vLLM 0.26.0 profile runs on one H200 (results/h200/startup-gaps/summary7.json: the blocks
live at the trace's peak that the profile run made, with their stacks), and the release reading of the MoE op's
inputs (release_defaults.moe_op_hidden_inputs) in every cached release and in copies with its construct changed.

DeepSeek-V3 cut to four layers with 16 attention heads peaks inside its first MoE layer's routed-experts call: the
MoE workspace, the cuBLAS workspace and the point's own tensors, to the byte but for the routed call's
moe_align_block_size buffers (0.32 MiB). With two shared experts it peaks at the same bytes (their intermediates are
freed before the routed call); at 4096 batched tokens the peak moves to Inductor's first compile."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import release_copies
from harness.core.units import MIB
from harness.sizing import profile_run
from harness.sizing import release_defaults as defaults
from harness.sizing.deployment import GIB
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.layer_source import ReleaseFiles
from harness.sizing.vllm_source.sources import default_cache_dir
from harness.verify.compare import torch_peak_gib
from harness.verify.logparse import llm_kwargs_to_serve
from harness.verify.planning import plan_record, record_facts
from harness.verify.record import StartupRecord, load_record

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = json.loads((ROOT / "results" / "h200" / "startup-gaps" / "summary7.json").read_text())
RECORD = load_record(ROOT / "tests" / "data" / "real_startups" / "dsv3-4l-heads16.yaml")
# the probe -> what it changed of the committed dsv3-4l-heads16 startup: (config keys, LLM keyword arguments)
PROBES: dict[str, tuple[dict, dict]] = {
    "dsv3-4l-heads16": ({}, {}),
    "dsv3-4l-heads16-shared2": ({"n_shared_experts": 2}, {}),
    "dsv3-4l-heads16-b4096": ({}, {"max_num_batched_tokens": 4096}),
}
ALIGN_BUFFERS = 326656 + 5104 + 4  # moe_align_block_size's sorted ids, expert ids and count, read in the history
MOE_RUNNER = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"


def _variant(probe: str) -> StartupRecord:
    config, changed = PROBES[probe]
    kwargs = {**(RECORD.llm_kwargs or {}), **changed}
    settings = RECORD.settings.model_copy(update=changed)
    serve = llm_kwargs_to_serve(RECORD.model, kwargs)
    return RECORD.model_copy(
        update={
            "config": {**(RECORD.config or {}), **config},
            "llm_kwargs": kwargs,
            "settings": settings,
            "serve": serve,
        }
    )


def _measured_peak(probe: str) -> int:
    """vLLM's torch peak of the probe's profile run: the allocator's peak counter over its start."""
    points = SUMMARY[probe]["points"]
    return points[-1]["max_allocated"] - points[0]["allocated"]


def _blocks(probe: str, *frames: str) -> list[int]:
    """The sizes of the peak's live blocks whose stack names each of `frames`."""
    out = []
    for group in SUMMARY[probe]["new_at_peak"]:
        if all(any(f in x for x in group["frames"]) for f in frames):
            out += [size for size, count in group["sizes"] for _ in range(count)]
    return out


def _blocks_frames(probe: str) -> list[str]:
    return [f for group in SUMMARY[probe]["new_at_peak"] for f in group["frames"]]


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("probe", ["dsv3-4l-heads16", "dsv3-4l-heads16-shared2"])
def test_the_moe_layer_is_the_peak_to_the_byte_but_the_align_buffers(probe):
    plan = plan_record(_variant(probe))
    measured = _measured_peak(probe)
    planned = round(torch_peak_gib(plan) * GIB)
    assert 0 <= measured - planned <= ALIGN_BUFFERS + 300_000, (measured, planned)  # the counter's peak vs the trace
    assert "MoE layer" in next(line.source for line in plan.lines if line.name == "activations")
    assert SUMMARY[probe]["peak_event"][3].startswith("vllm/model_executor/layers/fused_moe/experts/triton_moe.py")


def test_each_term_is_a_block_of_the_history():
    """The point's terms, by hand, are the blocks the history holds at the peak."""
    probe = "dsv3-4l-heads16"
    N, K, E, topk, d = 8192, 7168, 256, 8, 2
    inductor = [size for group in SUMMARY[probe]["new_at_peak"] for size, count in group["sizes"] for _ in range(count)
                if group["frames"][0].startswith("inductor:")]  # fmt: skip
    # the piece's arguments (the attention output (N, 16 x 128), the residual) and its own residual and three copies
    assert sorted(inductor) == sorted([N * 16 * 128 * d] + [N * K * d] * 5)
    assert _blocks(probe, "shared_experts.py", "deep_gemm.py") == [N * K * d]  # the shared experts' output
    assert _blocks(probe, "gate_linear.py") == [32 * MIB, N * E * d]  # the cuBLAS workspace, the router logits
    assert _blocks(probe, "grouped_topk") == [N * topk * 4] * 2  # top-k weights f32 and ids int32
    facts = record_facts(RECORD)
    call, _ = profile_run.moe_call_tensors(facts, num_tokens=N, intermediate=2048, act_quant="fp8-block")
    point = profile_run.mla_moe_point(facts, num_tokens=N, tp=1, op_inputs=3, moe_call=call)
    assert point.bytes == sum(inductor) + N * K * d + N * E * d + 2 * N * topk * 4 + call
    experts = _blocks(probe, "modular_kernel.py:1422") + _blocks(probe, "no_dp_ep.py:27:_quantize_input") + \
        _blocks(probe, "triton_moe.py:450:apply")  # fmt: skip
    assert sum(experts) == call  # output, a1q and its scales, a2q and its scales


def test_the_shared_experts_intermediates_are_not_at_the_peak():
    one, two = (sum(g["bytes"] for g in SUMMARY[p]["new_at_peak"]) for p in ("dsv3-4l-heads16",
                                                                              "dsv3-4l-heads16-shared2"))  # fmt: skip
    assert one == two and _measured_peak("dsv3-4l-heads16") == _measured_peak("dsv3-4l-heads16-shared2")


@pytest.mark.vllm_wheel
def test_at_4096_tokens_the_first_compile_is_the_peak_and_the_moe_point_under_it():
    probe = "dsv3-4l-heads16-b4096"
    assert any("select_algorithm.py" in f for f in _blocks_frames(probe))
    plan = plan_record(_variant(probe))
    source = next(line.source for line in plan.lines if line.name == "activations")
    assert "first compile" in source
    assert abs(torch_peak_gib(plan) - _measured_peak(probe) / GIB) <= 0.01, (torch_peak_gib(plan), source[:300])


def test_eager_and_small_batches():
    """Eager keeps the estimate (no compiled piece); at most 256 tokens the shared experts run on the aux stream after
    the routed call, so their output is not in the point."""
    facts = record_facts(RECORD)
    eager = profile_run.forward_phase(facts, num_tokens=8192, tp=1, mla_rows=32768, eager=True, moe_op_inputs=3)
    compiled = profile_run.forward_phase(facts, num_tokens=8192, tp=1, mla_rows=32768, moe_op_inputs=3)
    assert "4 x (N, 7168)" in eager.detail and "compiled piece" not in eager.detail
    assert "compiled piece" in compiled.detail
    for n, shared in ((256, 0), (257, 257 * 7168 * 2)):
        with_shared = profile_run.mla_moe_point(facts, num_tokens=n, tp=1, op_inputs=3, moe_call=0)
        without = profile_run.mla_moe_point(replace(facts, num_shared_experts=0), num_tokens=n, tp=1, op_inputs=3,
                                            moe_call=0)  # fmt: skip
        assert with_shared.bytes - without.bytes == shared
    # the release's threshold where it sets another (envs.py VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD)
    raised = profile_run.mla_moe_point(
        facts, num_tokens=300, tp=1, op_inputs=3, moe_call=0, shared_stream_threshold=512
    )
    assert "shared experts' output" not in raised.detail


RELEASES = {"0.8.5": 0, "0.9.2": 0, "0.19.0": 3, "0.26.0": 3, "0.29.0": 3, "0.30.0": 3, "0.33.0": 3}


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_each_release_read_from_its_files(version):
    read = defaults.moe_op_hidden_inputs(ReleaseFiles(locate(version=version, cache_dir=default_cache_dir())))
    assert read.value == RELEASES[version], read
    if read.value:
        assert "_moe_forward_shared(hidden_states, router_logits, shared_experts_input" in read.source, read
    assert defaults.moe_op_hidden_inputs(None).value == 0


@pytest.mark.vllm_wheel
def test_an_op_without_the_shared_input_is_not_read(tmp_path):
    root = locate(version="0.26.0", cache_dir=default_cache_dir()).root
    copy = release_copies.planted(tmp_path, root, (MOE_RUNNER,), MOE_RUNNER,
                                  "def _moe_forward_shared(\n    hidden_states: torch.Tensor,\n    router_logits: "
                                  "torch.Tensor,\n    shared_experts_input:",
                                  "def _moe_forward_shared(\n    hidden_states: torch.Tensor,\n    router_logits: "
                                  "torch.Tensor,\n    shared_input:")  # fmt: skip
    read = defaults.moe_op_hidden_inputs(copy)
    assert read.value == 0 and "no shared_experts_input" in read.source, read
