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
from harness.scenario.fit import can_run
from harness.scenario.schema import ScenarioError
from harness.sizing.deepep import deepep_low_latency_bytes
from scenario_utils import tiny

ROOT = Path(__file__).resolve().parent.parent


def test_deepep_low_latency_bytes_follow_the_layout_by_hand():
    # DeepSeek-V3 shapes, T = 128, 256 experts. msg_dispatch = 16 + max(2*7168, 7168 + 4*56) = 14352 bytes.
    bf16 = deepep_low_latency_bytes(max_tokens_per_rank=128, hidden_size=7168, num_experts=256,
                                    combine_variant="bf16")
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
    from harness.rank.comm.symm_mem import nvshmem_available

    # symm-mem pulls with its own kernel: any number of local experts (torch's all_to_all_vdev_2d took 16)
    name, why = resolve_comm("auto", device_type="cuda", num_local_experts=64, num_ranks=2)
    if nvshmem_available():
        assert name == "symm-mem" and why.startswith("auto: symm-mem, the first of symm-mem, nccl, gloo")
    else:
        assert name == "nccl" and "needs NVSHMEM" in why and "is_nvshmem_available() is False" in why
    name, why = resolve_comm("auto", device_type="cuda", num_local_experts=8, num_ranks=1)
    assert name == "nccl" and "needs at least 2 ranks" in why
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
        "comm nccl needs GPUs (device cuda); allowed on 2 cpu ranks: auto, gloo")
    assert can_run(tiny(comm="gloo", device="cuda"), device_type="cuda", num_gpus=2) == (
        "comm gloo needs CPU ranks (device cpu); allowed on 2 cuda ranks: auto, symm-mem, nccl")


def test_run_with_a_gpu_comm_on_cpu_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness", "run", "smoke", "--comm", "symm-mem", "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "comm symm-mem needs GPUs (device cuda); allowed on 2 cpu ranks: auto, gloo" in lines[0]
    assert not (tmp_path / "out").exists()


def _exchange(info: Any, scenario_data: dict) -> dict:
    """One dispatch and combine through the rank's real setup; expert e's output is its global id + 1 times its
    dequantized input, so the combined output has a closed form per token."""
    import torch.distributed as dist

    from harness.rank.combine import combine
    from harness.rank.dispatch import dispatch
    from harness.rank.check import CheckedPass
    from harness.rank.lifecycle import setup_rank, source_inputs
    from harness.rank.quant import dequantize
    from harness.scenario.schema import parse_scenario

    scenario = parse_scenario(scenario_data)
    setup = setup_rank(scenario, info, info.device, Path("/tmp"), 0)
    comm, L = setup.buffers, setup.layout
    calls = []
    real = dist.all_to_all_single
    dist.all_to_all_single = lambda *a, **kw: (calls.append(1), real(*a, **kw))[1]  # counts, then does the real one
    try:
        if info.device.type == "cuda" and comm.name == "symm-mem":
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
        "backend": comm.name, "wrong_slots": stages["dispatch"].num_rows_wrong,
        "wrong_combined": stages["combine"].num_rows_wrong, "num_tokens": int(setup.tokens.shape[0]),
        "max_abs_ref": float(ref.abs().max()) if ref.numel() else 0.0,
        "max_abs_err": float((out - ref).abs().max()) if ref.numel() else 0.0,
        "dispatch_bytes": handle.dispatch_bytes, "distinct_rows": distinct_rows, "pairs": int(ids.numel()),
        "row_bytes": RowFormat(hidden_size=L.hidden_size, top_k=L.top_k).row_bytes,
        "host_syncs": handle.num_host_syncs, "dispatch_collectives": dispatch_calls,
        "counts": comm.expert_num_tokens.tolist(), "comm": setup.comm_record.model_dump(),
        "comm_bytes": setup.accountant.bytes_of("comm"),
    }


CASES = {
    "D = P = 2, uniform": {},
    "2 ranks emulating D = 4, skewed": {"parallel.num_dispatchers": 4, "parallel.num_local_experts": 4,
                                        "routing.kind": "skewed", "routing.zipf_exponent": 2.0},
    "D = P = 3, top_k 3 (odd: int16 ids padded)": {"parallel.num_ranks": 3, "parallel.num_dispatchers": 3,
                                                  "parallel.num_local_experts": 6, "model.num_experts": 18,
                                                  "model.top_k": 3},
    "4 ranks, worst case fills expert 0 to M": {"parallel.num_ranks": 4, "parallel.num_dispatchers": 4,
                                               "parallel.num_local_experts": 4, "routing.kind": "worst-case"},
    "2 ranks, rank 1 holds no tokens": {"routing.idle_ranks": [1]},
    "1 rank emulating D = 4, skewed": {"parallel.num_ranks": 1, "parallel.num_dispatchers": 4,
                                       "parallel.num_local_experts": 16, "routing.kind": "skewed",
                                       "routing.zipf_exponent": 2.0},
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
        # One row per (token, destination rank), payload and words together: exactly those bytes, one exchange of
        # rows after the fixed-size count exchange, and one host read (the split sizes).
        assert r["dispatch_bytes"] == r["distinct_rows"] * r["row_bytes"]
        assert r["distinct_rows"] < r["pairs"] or scenario.model.top_k == 1 or r["num_tokens"] == 0
        assert (r["dispatch_collectives"], r["host_syncs"]) == (2, 1)


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("comm", ["symm-mem", "nccl"])
@pytest.mark.parametrize("case", ["D = P = 2, uniform", "2 ranks emulating D = 4, skewed"])
def test_gpu_comm_is_exact(comm, case):
    from harness.rank.comm.symm_mem import nvshmem_available

    if comm == "symm-mem" and not nvshmem_available():
        pytest.skip("NVSHMEM is not available to this torch build")
    scenario = tiny(**CASES[case], device="cuda", comm=comm)
    results = parallel_launch(2, _exchange, scenario.model_dump(mode="json"), device_type="cuda")
    _check(results, scenario, comm)
    for r in results:
        if comm == "symm-mem":  # a row per (token, slot) straight into the batched buffer; nothing read on the host
            assert r["dispatch_bytes"] == r["pairs"] * (scenario.model.hidden_size + 16)
            assert r["host_syncs"] == 0
        else:
            assert r["dispatch_bytes"] == r["distinct_rows"] * r["row_bytes"]


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
def test_gpu_nccl_on_one_gpu_is_exact():
    """The one-GPU deployment (P = 1 emulating D = 4 dispatchers, skewed): nccl's rows all come back to the rank
    itself, and every slot and token still matches its sender and the closed form."""
    case = "1 rank emulating D = 4, skewed"
    scenario = tiny(**CASES[case], device="cuda", comm="nccl")
    results = parallel_launch(1, _exchange, scenario.model_dump(mode="json"), device_type="cuda")
    _check(results, scenario, "nccl")
    assert results[0]["dispatch_bytes"] == results[0]["distinct_rows"] * results[0]["row_bytes"]


def test_symm_mem_bag_table_holds_each_tokens_slots_and_reduces_like_a_plain_sum():
    """symm-mem's combine table, built on CPU from received words as the NVSHMEM exchange leaves them: every
    (source rank, token)'s slots and weights, padding that reads a row of the same bag with weight 0, and the
    weighted bag sum over it (harness.rank.comm.fused) equal to a plain per-token sum."""
    import types

    from harness.rank.comm import DispatchLayout
    from harness.rank.comm.fused import bag_sum
    from harness.rank.comm.symm_mem import SymmMemComm

    E, M, P, C, K, top_k = 3, 6, 2, 4, 8, 2
    layout = DispatchLayout(num_ranks=P, rank=0, num_local_experts=E, max_slots_per_expert=M, hidden_size=K,
                            top_k=top_k, max_tokens=C)
    counts = [4, 0, 3]  # expert 1 received nothing; slots past a count hold stale words
    routed = {0: [(0, 0), (0, 2), (1, 1), (1, 3)], 2: [(0, 2), (1, 1), (1, 0)]}  # (source rank, token) per slot
    meta = torch.randint(-9, 9, (E * M, 4), dtype=torch.int32)  # stale garbage everywhere first
    weight = {}
    for e, sources in routed.items():
        for j, (src, tok) in enumerate(sources):
            w = torch.tensor([0.25 * (e + 1) + 0.1 * j], dtype=torch.float32)
            weight[(e, j)] = float(w)
            meta[e * M + j] = torch.tensor([0, tok, src, int(w.view(torch.int32))], dtype=torch.int32)
    shim = types.SimpleNamespace(layout=layout, expert_meta=meta)
    valid = (torch.arange(M).unsqueeze(0) < torch.tensor(counts).unsqueeze(1)).reshape(-1)
    bags = SymmMemComm._bags(shim, valid)  # type: ignore[arg-type]
    # A counted slot whose words name no (source rank, token) of this layout joins no bag (no index past the table).
    bad = meta.clone()
    bad[2 * M + 3] = torch.tensor([0, C + 5, P + 7, int(torch.tensor([9.0]).view(torch.int32))], dtype=torch.int32)
    bad_valid = valid.clone()
    bad_valid[2 * M + 3] = True
    bad_shim = types.SimpleNamespace(layout=layout, expert_meta=bad)
    bad_bags = SymmMemComm._bags(bad_shim, bad_valid)  # type: ignore[arg-type]
    assert torch.equal(bad_bags["bag_table"], bags["bag_table"]) and torch.equal(bad_bags["bag_weights"],
                                                                                   bags["bag_weights"])
    table, weights = bags["bag_table"], bags["bag_weights"]
    assert table.shape == weights.shape == (P * C, min(top_k, E))
    empty = (weights == 0).all(1)
    expert_out = torch.randn(E * M, K)
    expert_out.view(E, M, K)[~valid.view(E, M)] = float("nan")  # stale slots: a cell that reads one poisons its bag
    partial = bag_sum(table, weights, expert_out, impl="torch")
    for src in range(P):
        for tok in range(C):
            slots = [(e, j) for e, sources in routed.items() for j, s in enumerate(sources) if s == (src, tok)]
            want = sum((weight[s] * expert_out[s[0] * M + s[1]] for s in slots), torch.zeros(K))
            assert bool(empty[src * C + tok]) == (not slots)
            assert torch.allclose(partial[src * C + tok], want, atol=1e-6), (src, tok, slots)
            row = set(table[src * C + tok].tolist())
            assert {e * M + j for e, j in slots} <= row and (not slots or row <= {e * M + j for e, j in slots})


def test_symm_mem_dispatch_pulls_each_chunk_into_the_batched_buffer_with_send_buffers_in_turn(monkeypatch):
    """symm-mem's dispatch on CPU, one rank standing in for P = 2 (the "peer" maps the same send buffers, and the
    (counts, offsets) exchange returns what this rank sends to rank 0's experts from both): every slot holds its
    token's FP8 row, scale and source, the counts are the routing's, the exchange reads nothing on the host, and
    successive dispatches pack into the two send buffers in turn (a peer may still be reading the last one)."""
    import harness.rank.comm.symm_mem as sm
    from harness.rank.comm import BatchedBuffers, DispatchLayout, Stages
    from harness.rank.comm.fused import PeerRows
    from harness.rank.memory import Accountant
    from harness.rank.quant import quantize_per_token

    P, E, M, K, k, n = 2, 4, 32, 32, 2, 12
    layout = DispatchLayout(num_ranks=P, rank=0, num_local_experts=E, max_slots_per_expert=M, hidden_size=K,
                            top_k=k, max_tokens=n)
    comm = object.__new__(sm.SymmMemComm)
    comm.layout, comm.group_name, comm._round = layout, "test", 0
    comm.send_x = torch.zeros((2, n * k, K), dtype=torch.uint8)
    comm.send_meta = torch.zeros((2, n * k, 4), dtype=torch.int32)
    comm.meta_out = torch.zeros((P, 2, E), dtype=torch.int64)
    comm.meta_in = torch.zeros((P, 2, E), dtype=torch.int64)
    comm.recv_x = torch.zeros((E * M, K), dtype=torch.uint8)
    comm.expert_meta = torch.zeros((E * M, 4), dtype=torch.int32)
    comm.combine_recv = torch.zeros((P * n, K), dtype=torch.bfloat16)
    comm.batched = BatchedBuffers.allocate(layout, Accountant(torch.device("cpu")), out_dtype=torch.bfloat16,
                                           expert_x=comm.recv_x)
    comm.peers = [PeerRows.of([comm.send_x[b]] * P, [comm.send_meta[b]] * P, torch.device("cpu")) for b in range(2)]
    # both "ranks" send what this one sends to rank 0: row 0 of meta_out, to every receiver row
    monkeypatch.setattr(sm.dist, "all_to_all_single", lambda out, inp: out.copy_(inp[0:1].expand_as(out)))
    g = torch.Generator().manual_seed(0)
    for round_index in range(3):
        tokens = torch.randn((n, K), generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(P * E, generator=g)[:k] for _ in range(n)])
        weights = torch.rand((n, k), generator=g)
        handle = comm.dispatch(tokens, ids, weights, quantize_per_token, Stages())
        assert comm._round == round_index + 1 and handle.num_host_syncs == 0
        q, scale = quantize_per_token(tokens)
        counts = torch.bincount(ids.reshape(-1), minlength=P * E)[:E]  # this rank's experts, from one sender
        assert torch.equal(comm.expert_num_tokens.long(), P * counts)
        for e in range(E):
            routed = [t for t in range(n) if e in ids[t].tolist()]
            for p in range(P):  # rank p's chunk follows the chunks of the ranks below it, in token order
                for j, token in enumerate(routed):
                    slot = p * len(routed) + j
                    assert comm.expert_src[e, slot].tolist() == [0, token]
                    assert torch.equal(comm.expert_x[e, slot].view(torch.uint8), q[token].view(torch.uint8))
                    assert comm.expert_x_scale[e, slot, 0] == scale[token, 0]
        first = int(torch.sort(ids.reshape(-1), stable=True).indices[0]) // k  # the first pair packed
        assert torch.equal(comm.send_x[round_index % 2, 0], q[first].view(torch.uint8))
        table, bag_weights = handle.state["bag_table"], handle.state["bag_weights"]
        assert table.shape == (P * n, min(k, E))
