"""Comm backends: one packed row per (token, destination rank), one exchange, every slot traced to its sender, the
combined output against a single-process reference; the DeepEP low-latency sizing; the comm choice as data and
on the command line. CPU tests run real gloo groups; the symm-mem and nccl exactness tests need 2 GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from distributed_utils import parallel_launch
from harness.rank.comm import CommUnavailable, RowFormat, resolve_comm
from harness.rank.comm.collective import CollectiveComm
from harness.rank.comm.symm_mem import SymmMemComm
from harness.scenario.fit import can_run, estimate_rank_memory
from harness.scenario.schema import ScenarioError
from harness.sizing.deepep import deepep_low_latency_bytes
from scenario_utils import tiny

ROOT = Path(__file__).resolve().parent.parent


def test_deepep_low_latency_bytes_follow_the_layout_by_hand():
    # DeepSeek-V3 shapes, T = 128, 256 experts. msg_dispatch = 16 + max(2*7168, 7168 + 4*56) = 14352 bytes.
    bf16 = deepep_low_latency_bytes(max_tokens_per_rank=128, hidden_size=7168, num_experts=256, combine_variant="bf16")
    assert (bf16.msg_dispatch_bytes, bf16.msg_combine_bytes) == (14352, 14336)
    assert bf16.send_bytes == 256 * 128 * 14336 and bf16.recv_bytes == 256 * 128 * 14352
    assert bf16.signal_bytes == 1024
    assert bf16.layout_bytes == 2 * (469_762_048 + 470_286_336 + 1024) == 1_880_098_816
    # vLLM passes DeepEP's size hint: the layout rounded up to 128 bytes, plus 128 when already aligned.
    assert bf16.total_bytes == 1_880_098_816 + 128
    logfmt = deepep_low_latency_bytes(max_tokens_per_rank=128, hidden_size=7168, num_experts=256)
    assert logfmt.msg_combine_bytes == 14336 + 224  # per-128 min/max pairs ride with the bf16 row
    assert logfmt.layout_bytes == 2 * (2 * 477_102_080 + 1024) == 1_908_410_368


def test_row_format_packs_payload_and_words_in_16_byte_rows():
    eight = RowFormat(hidden_size=7168, top_k=8)
    # scale, token, rank, 8 int16 ids in 4 words, 8 float32 weights: 15 words = 60 bytes -> 64
    assert (eight.meta_words, eight.meta_bytes, eight.row_bytes) == (15, 64, 7232)
    three = RowFormat(hidden_size=64, top_k=3)
    assert (three.id_words, three.meta_words, three.row_bytes) == (2, 8, 96)


def test_auto_and_named_comm_choices():
    assert resolve_comm("auto", device_type="cpu", num_local_experts=64, num_ranks=2)[0] == "gloo"
    from harness.rank.comm.symm_mem import symm_mem_available

    # symm-mem pulls with its own kernel: any number of local experts (torch's all_to_all_vdev_2d took 16)
    name, why = resolve_comm("auto", device_type="cuda", num_local_experts=64, num_ranks=2)
    if symm_mem_available():
        assert name == "symm-mem" and why.startswith("auto: symm-mem, the first of symm-mem, nccl, gloo")
    else:
        assert name == "nccl" and "needs torch's symmetric memory on CUDA" in why
    name, why = resolve_comm("auto", device_type="cuda", num_local_experts=8, num_ranks=1)  # one GPU too
    assert name == ("symm-mem" if symm_mem_available() else "nccl")
    with pytest.raises(CommUnavailable, match="comm nccl needs GPUs"):
        resolve_comm("nccl", device_type="cpu", num_local_experts=8, num_ranks=2)
    with pytest.raises(CommUnavailable, match="comm gloo needs CPU ranks"):
        resolve_comm("gloo", device_type="cuda", num_local_experts=8, num_ranks=2)
    with pytest.raises(CommUnavailable, match="comm symm-mem needs GPUs"):
        resolve_comm("symm-mem", device_type="cpu", num_local_experts=8, num_ranks=2)


def test_scenario_comm_field_is_validated_as_data_and_fitted_to_the_device():
    assert tiny().comm == "auto"
    with pytest.raises(ScenarioError, match="comm: Input should be 'auto', 'symm-mem', 'nccl' or 'gloo'"):
        tiny(comm="mpi")
    # well formed, but not for the scenario's device: the fit check says so before any rank starts
    assert can_run(tiny(comm="nccl"), device_type="cpu") == (
        "comm nccl needs GPUs (device cuda); allowed on 2 cpu ranks: auto, gloo"
    )
    assert can_run(tiny(comm="gloo", device="cuda"), device_type="cuda", num_gpus=2) == (
        "comm gloo needs CPU ranks (device cpu); allowed on 2 cuda ranks: auto, symm-mem, nccl"
    )


def test_run_with_a_gpu_comm_on_cpu_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", "smoke", "--comm", "symm-mem", "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "comm symm-mem needs GPUs (device cuda); allowed on 2 cpu ranks: auto, gloo" in lines[0]
    assert not (tmp_path / "out").exists()


def _exchange(info: Any, scenario_data: dict) -> dict:
    """One dispatch and combine through the rank's real setup; expert e's output is its global id + 1 times its
    dequantized input, so the combined output has a closed form per token."""
    import torch.distributed as dist

    from harness.rank.check import CheckedPass
    from harness.rank.combine import combine
    from harness.rank.dispatch import dispatch
    from harness.rank.lifecycle import setup_rank, source_inputs
    from harness.rank.quant import dequantize
    from harness.scenario.schema import parse_scenario

    scenario = parse_scenario(scenario_data)
    setup = setup_rank(scenario, info, info.device, Path("/tmp"), 0)
    comm, L = setup.buffers, setup.layout
    calls: list[int] = []
    real = dist.all_to_all_single

    def counted(*a: Any, **kw: Any) -> Any:  # counts, then does the real one
        calls.append(1)
        return real(*a, **kw)

    dist.all_to_all_single = counted
    try:
        if info.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")  # any host read inside dispatch or combine raises
        handle = dispatch(setup.tokens, setup.routing, L, comm, setup.quantize)
        dispatch_calls = len(calls)
        checked = CheckedPass(setup, source_inputs(setup))
        E = L.num_local_experts
        factor = (info.rank * E + torch.arange(E, device=info.device) + 1).float().view(E, 1, 1)
        expert_out = (dequantize(comm.expert_x.float(), comm.expert_x_scale) * factor).to(torch.bfloat16)
        combined = combine(expert_out, handle, L, comm)
        out = combined.float()
    finally:
        if info.device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
        dist.all_to_all_single = real
    checked.after_dispatch()  # the run's own check: every slot against what its sender quantized
    checked.after_combine(combined, handle)  # each token against the rows that came back for it
    stages = {c.stage: c for c in checked._checker().results()}
    q, scale = setup.quantize(setup.tokens)
    ids, weights = setup.routing.topk_ids, setup.routing.topk_weights
    ref = dequantize(q, scale) * (weights * (ids + 1).float()).sum(1, keepdim=True)
    token = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
    distinct_rows = int(torch.unique(token * L.num_ranks + ids // E).numel())  # (token, destination rank) pairs
    return {
        "buffers_bytes": setup.accountant.bytes_of("dispatch") + setup.accountant.bytes_of("combine"),
        "backend": comm.name,
        "wrong_slots": stages["dispatch"].num_rows_wrong,
        "wrong_combined": stages["combine"].num_rows_wrong,
        "num_tokens": int(setup.tokens.shape[0]),
        "max_abs_ref": float(ref.abs().max()) if ref.numel() else 0.0,
        "max_abs_err": float((out - ref).abs().max()) if ref.numel() else 0.0,
        "dispatch_bytes": handle.dispatch_bytes,
        "distinct_rows": distinct_rows,
        "pairs": int(ids.numel()),
        "row_bytes": RowFormat(hidden_size=L.hidden_size, top_k=L.top_k).row_bytes,
        "host_syncs": handle.num_host_syncs,
        "dispatch_collectives": dispatch_calls,
        "rows_sent": int(comm.send_counts.sum()) if isinstance(comm, CollectiveComm) else None,
        "capacity_rows": L.num_ranks * L.buffer_tokens,
        "counts": comm.expert_num_tokens.tolist(),
        "comm": setup.comm_record.model_dump(),
        "comm_bytes": setup.accountant.bytes_of("comm"),
    }


CASES = {
    "D = P = 2, uniform": {},
    "2 ranks emulating D = 4, skewed": {
        "parallel.num_dispatchers": 4,
        "parallel.num_local_experts": 4,
        "routing.kind": "skewed",
        "routing.zipf_exponent": 2.0,
    },
    "D = P = 3, top_k 3 (odd: int16 ids padded)": {
        "parallel.num_ranks": 3,
        "parallel.num_dispatchers": 3,
        "parallel.num_local_experts": 6,
        "model.num_experts": 18,
        "model.top_k": 3,
    },
    "4 ranks, worst case fills expert 0 to M": {
        "parallel.num_ranks": 4,
        "parallel.num_dispatchers": 4,
        "parallel.num_local_experts": 4,
        "routing.kind": "worst-case",
    },
    "2 ranks, rank 1 holds no tokens": {"routing.idle_ranks": [1]},
    "1 rank emulating D = 4, skewed": {
        "parallel.num_ranks": 1,
        "parallel.num_dispatchers": 4,
        "parallel.num_local_experts": 16,
        "routing.kind": "skewed",
        "routing.zipf_exponent": 2.0,
    },
}


def _check(results: list[dict], scenario: Any, backend: str) -> None:
    M = scenario.parallel.max_tokens_per_rank * scenario.parallel.num_dispatchers
    assert sum(sum(r["counts"]) for r in results) == sum(r["pairs"] for r in results)  # every pair landed once
    for r in results:
        assert r["backend"] == backend and r["wrong_slots"] == 0 and r["wrong_combined"] == 0
        assert max(r["counts"]) <= M
        if r["num_tokens"]:
            assert r["max_abs_ref"] > 0
            assert r["max_abs_err"] <= 1e-2 * r["max_abs_ref"], r  # bf16 expert rows and partial sums
        comm = r["comm"]  # tiny's layer is DeepEP low-latency: the rank holds exactly DeepEP's buffer as comm
        # what moved the rows: Triton's kernels on a GPU (the image has Triton), torch's ops on CPU ranks
        assert comm["row_kernels"].startswith("triton ") if backend != "gloo" else comm["row_kernels"] == "torch"
        assert comm["comm_bytes"] == r["comm_bytes"] == comm["deepep_ll_bytes"] > 0 and comm["harness_bytes"] > 0
    if scenario.routing.kind == "worst-case":
        assert results[0]["counts"][0] == M


@pytest.mark.parametrize("case", list(CASES))
def test_gloo_sends_one_row_per_token_and_rank_and_traces_every_slot(case):
    scenario = tiny(**CASES[case])
    results = parallel_launch(scenario.parallel.num_ranks, _exchange, scenario.model_dump(mode="json"))
    _check(results, scenario, "gloo")
    for r in results:
        # One row per (token, destination rank), payload and words together, in capacity-sized equal splits:
        # every peer's region (C rows) crosses, the rows past each count are ignored by the receiver (the check
        # above: every pair landed once, every slot traced to its sender); one exchange of rows after the
        # fixed-size count exchange, and nothing read on the host.
        assert r["rows_sent"] == r["distinct_rows"]
        assert r["dispatch_bytes"] == r["capacity_rows"] * r["row_bytes"] >= r["distinct_rows"] * r["row_bytes"]
        assert r["distinct_rows"] < r["pairs"] or scenario.model.top_k == 1 or r["num_tokens"] == 0
        assert (r["dispatch_collectives"], r["host_syncs"]) == (2, 0)


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("comm", ["symm-mem", "nccl"])
@pytest.mark.parametrize("case", ["D = P = 2, uniform", "2 ranks emulating D = 4, skewed"])
def test_gpu_comm_is_exact(comm, case):
    from harness.rank.comm.symm_mem import symm_mem_available

    if comm == "symm-mem" and not symm_mem_available():
        pytest.skip("torch's symmetric memory is not available here")
    scenario = tiny(**CASES[case], device="cuda", comm=comm)
    results = parallel_launch(2, _exchange, scenario.model_dump(mode="json"), device_type="cuda")
    _check(results, scenario, comm)
    for r in results:
        if comm == "symm-mem":  # rows pushed by the device: nothing read on the host, the bytes an upper bound
            assert r["host_syncs"] == 0 and r["dispatch_bytes"] >= r["distinct_rows"] * scenario.model.hidden_size
        else:  # capacity-sized equal splits: every region crosses; nothing read on the host
            assert r["rows_sent"] == r["distinct_rows"] and r["host_syncs"] == 0
            assert r["dispatch_bytes"] == r["capacity_rows"] * r["row_bytes"]


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize("comm", ["symm-mem", "nccl"])
def test_gpu_comm_on_one_gpu_is_exact(comm):
    """The one-GPU deployment (P = 1 emulating D = 4 dispatchers, skewed): every row comes back to the rank
    itself, and every slot and token still matches its sender and the closed form."""
    case = "1 rank emulating D = 4, skewed"
    scenario = tiny(**CASES[case], device="cuda", comm=comm)
    results = parallel_launch(1, _exchange, scenario.model_dump(mode="json"), device_type="cuda")
    _check(results, scenario, comm)
    # what `harness run` checks the machine against is what the rank allocated, byte for byte
    assert results[0]["buffers_bytes"] == estimate_rank_memory(scenario, "cuda").buffers_bytes
    if comm == "nccl":  # capacity-sized equal splits, nothing read on the host (sync debug mode: error)
        r = results[0]
        assert r["rows_sent"] == r["distinct_rows"] and r["host_syncs"] == 0
        assert r["dispatch_bytes"] == r["capacity_rows"] * r["row_bytes"]


def _valid_slots(comm: Any, *, by_source: bool) -> list[torch.Tensor]:
    """Every expert's valid slots (FP8 bytes, scale bits, source), flattened; `by_source`: each expert's slots
    ordered by (source rank, token) first (a backend that takes slots with atomics fills them in any order)."""
    counts, src = comm.expert_num_tokens.tolist(), comm.expert_src
    order = [
        torch.argsort(src[e, :c, 0].long() * (1 << 32) + src[e, :c, 1].long())
        if by_source
        else torch.arange(c, device=src.device)
        for e, c in enumerate(counts)
    ]
    return [
        torch.cat([t[e, :c][o].reshape(-1) for e, (c, o) in enumerate(zip(counts, order, strict=True))])
        for t in (comm.expert_x.view(torch.uint8), comm.expert_x_scale.view(torch.int32), src)
    ]


def _graph_exchange(info: Any, scenario_data: dict, delay_cycles: int) -> dict:
    """The comm's dispatch and combine eager, then each captured in a CUDA graph (rank r sleeping r * delay_cycles
    on the GPU before each, so the flags must order the peers) and replayed: first on other tokens (so a replay
    that wrote nothing would leave their results, not the eager ones), then on the eager pass's tokens again,
    whose slots, counts and combined output must equal the eager ones bit for bit. The expert step runs eagerly
    between the two replays (the graphs hold the comm calls alone)."""
    from harness.rank.combine import combine
    from harness.rank.dispatch import dispatch
    from harness.rank.lifecycle import setup_rank
    from harness.rank.quant import dequantize
    from harness.scenario.schema import parse_scenario

    scenario = parse_scenario(scenario_data)
    setup = setup_rank(scenario, info, info.device, Path("/tmp"), 0)
    comm, L = setup.buffers, setup.layout
    E = L.num_local_experts
    factor = (info.rank * E + torch.arange(E, device=info.device) + 1).float().view(E, 1, 1)
    expert_out = torch.empty_like(comm.expert_x, dtype=torch.bfloat16)
    tokens = setup.tokens.clone()  # the graphs' static input
    held: dict[str, Any] = {}

    def delay() -> None:
        if delay_cycles and info.rank:
            torch.cuda._sleep(info.rank * delay_cycles)

    def first() -> None:
        delay()
        held["handle"] = dispatch(tokens, setup.routing, L, comm, setup.quantize)

    def experts() -> None:
        expert_out.copy_((dequantize(comm.expert_x.float(), comm.expert_x_scale) * factor).to(torch.bfloat16))

    def second() -> None:
        delay()
        held["out"] = combine(expert_out, held["handle"], L, comm)

    def snapshot() -> list[torch.Tensor]:
        # symm-mem's slots are deterministic; nccl's are taken with atomics: compared in source order
        return [comm.expert_num_tokens.clone(), *_valid_slots(comm, by_source=comm.name == "nccl"), held["out"].clone()]

    first()
    experts()
    second()
    torch.cuda.synchronize()
    eager = snapshot()
    graphs = []
    for fn in (first, second):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graphs.append(graph)
    mismatches, differs = [], 0
    other = (setup.tokens.float() * -2.0).to(torch.bfloat16)
    for replay in range(6):
        again = replay % 2 == 1  # even replays on the other tokens, odd ones on the eager pass's
        tokens.copy_(setup.tokens if again else other)
        comm.expert_x.view(torch.uint8).fill_(0xEE)  # poison: a replay must write every valid slot again
        graphs[0].replay()
        experts()
        graphs[1].replay()
        torch.cuda.synchronize()
        got = snapshot()
        for name, a, b in zip(("counts", "x", "scale", "src", "out"), eager, got, strict=True):
            same = torch.equal(
                a.view(torch.uint8) if a.dtype.is_floating_point else a,
                b.view(torch.uint8) if b.dtype.is_floating_point else b,
            )
            if again and not same:
                mismatches.append(f"replay {replay}: {name}")
            differs += int(not again and name in ("x", "out") and not same)
    status = int(comm.status.item()) if isinstance(comm, SymmMemComm) else 0
    return {"mismatches": mismatches, "status": status, "pairs": int(sum(eager[0].tolist())), "other_differs": differs}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "num_ranks", [1, pytest.param(2, marks=pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs"))]
)
@pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize("comm", ["symm-mem", "nccl"])
def test_gpu_graph_replay_equals_eager_bit_for_bit_with_rank_delays(num_ranks, comm):
    """symm-mem, and nccl on its capacity-sized equal splits: a captured round replays."""
    case = "1 rank emulating D = 4, skewed" if num_ranks == 1 else "2 ranks emulating D = 4, skewed"
    scenario = tiny(**CASES[case], device="cuda", comm=comm)
    results = parallel_launch(
        num_ranks, _graph_exchange, scenario.model_dump(mode="json"), 20_000_000, device_type="cuda"
    )
    for r in results:
        assert r["mismatches"] == [] and r["status"] == 0 and r["pairs"] > 0, r
        assert r["other_differs"] == 6, r  # each replay on the other tokens really changed the slots and the output


def _run_iterations_graph_vs_eager(info: Any, scenario_data: dict) -> dict:
    """`harness run`'s timed iterations (graph replays where the comm captures) against its eager pass, on one
    policy's workspace: the same slots, counts and combined output, bit for bit; then the policy's record."""
    from harness.rank.lifecycle import (
        PolicyState,
        _iterate,
        _one_pass,
        allocate_workspace,
        measure_policy,
        setup_rank,
        warm_up,
    )
    from harness.rank.memory import SnapshotRecorder
    from harness.rank.timing import StageTimer
    from harness.scenario.schema import parse_scenario
    from harness.sizing.plan import policy_shapes

    scenario = parse_scenario(scenario_data)
    setup = setup_rank(scenario, info, info.device, Path("/tmp"), 0)
    assert warm_up(setup) == "full"
    comm = setup.buffers
    shapes = policy_shapes("fixed", scenario.sizing_args())
    state = PolicyState(policy="fixed", shapes=shapes, snapshot=SnapshotRecorder(info.device, enabled=False))
    state.workspace = allocate_workspace(setup, shapes)

    def snapshot() -> list[torch.Tensor]:
        # nccl takes slots with atomics (any order within an expert): each expert's slots in source order
        assert state.combined is not None
        return [
            comm.expert_num_tokens.clone(),
            *_valid_slots(comm, by_source=comm.name == "nccl"),
            state.combined.view(torch.int16).clone(),
        ]

    _iterate(setup, state)
    mode, reason = state.timing_mode, state.timing_reason
    replayed = snapshot()
    comm.expert_x.view(torch.uint8).fill_(0xEE)  # the eager pass must write every valid slot itself
    _one_pass(setup, state, StageTimer(info.device))
    eager = snapshot()
    names = ("counts", "x", "scale", "src", "out")
    mismatches = [n for n, a, b in zip(names, replayed, eager, strict=True) if not torch.equal(a, b)]
    state.workspace.release(setup.accountant)
    result, _ = measure_policy(setup, "fixed", None)
    return {
        "mode": mode,
        "reason": reason,
        "mismatches": mismatches,
        "pairs": int(eager[0].sum()),
        "record": result.model_dump(mode="json"),
    }


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize("comm", ["symm-mem", "nccl"])
def test_gpu_graph_replayed_run_iterations_equal_eager_bit_for_bit(comm):
    """The timed iterations replay CUDA graphs (symm-mem's pushes, nccl's capacity-sized equal splits): the same
    slots and output as the eager pass, bit for bit."""
    scenario = tiny(**CASES["1 rank emulating D = 4, skewed"], device="cuda", comm=comm)
    [r] = parallel_launch(1, _run_iterations_graph_vs_eager, scenario.model_dump(mode="json"), device_type="cuda")
    want = ("graph", None)
    assert (r["mode"], r["reason"]) == want and r["mismatches"] == [] and r["pairs"] > 0, r
    timings, correctness = r["record"]["timings"], r["record"]["correctness"]
    assert r["record"]["status"] == "ok"
    assert (timings["timing_mode"], timings["timing_reason"], timings["num_host_syncs"]) == (*want, 0)
    assert correctness["num_wrong_slots"] == 0 and correctness["stages"], correctness
    assert all(s["num_rows_wrong"] == 0 for s in correctness["stages"]), correctness
