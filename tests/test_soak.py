"""The comm soak (harness.rank.soak, benchmarks/soak_comm.py): rounds of fresh inputs through real gloo ranks
pass every check, and each of its four checks reports a fault planted in the buffers it reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from distributed_utils import parallel_launch
from harness.rank.lifecycle import dispatch_layout
from harness.rank.soak import ROUND_KINDS, SoakRecord, round_inputs
from scenario_utils import tiny

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from soak_comm import run_soak  # noqa: E402


def test_round_inputs_cover_every_kind_and_are_the_same_on_every_rank():
    L = dispatch_layout(tiny(**{"parallel.num_dispatchers": 4}), 0)
    C, G = L.buffer_tokens, L.num_ranks * L.num_local_experts
    seen = {}
    for i in range(len(ROUND_KINDS)):
        for src in range(L.num_ranks):
            tokens, ids, weights = round_inputs(L, seed=3, round_index=i, src=src)
            again = round_inputs(L, seed=3, round_index=i, src=src)
            assert all(torch.equal(a, b) for a, b in zip((tokens, ids, weights), again))
            n = ids.shape[0]
            assert tokens.shape == (n, L.hidden_size) and tokens.dtype == torch.bfloat16 and 0 <= n <= C
            assert ids.shape == weights.shape == (n, L.top_k) and bool(((ids >= 0) & (ids < G)).all())
            assert all(len(set(row)) == L.top_k for row in ids.tolist())  # distinct experts per token
            torch.testing.assert_close(weights.sum(1), torch.ones(n), rtol=0, atol=1e-6)
            seen[(ROUND_KINDS[i], src)] = ids
    assert seen[("full", 0)].shape[0] == seen[("full", 1)].shape[0] == C
    assert bool((seen[("hot", 0)] == 0).any(1).all())  # every token of a hot round picks expert 0
    assert seen[("idle", 4 % L.num_ranks)].shape[0] == 0


@pytest.mark.slow
def test_soak_on_gloo_ranks_checks_every_routed_pair_and_token():
    data = tiny(**{"parallel.num_dispatchers": 4, "parallel.num_local_experts": 4, "model.top_k": 3}).model_dump(
        mode="json")
    rounds = 2 * len(ROUND_KINDS)
    records = [SoakRecord.model_validate(r) for r in run_soak(data, rounds=rounds, seed=1, timeout_s=120)]
    L0 = dispatch_layout(tiny(**{"parallel.num_dispatchers": 4, "parallel.num_local_experts": 4, "model.top_k": 3}), 0)
    E = L0.num_local_experts
    for rec in records:
        assert (rec.comm, rec.row_kernels, rec.rounds, rec.rounds_failed, rec.faults) == ("gloo", "torch", rounds, 0, [])
        pairs = tokens = 0
        for i in range(rounds):
            for src in range(L0.num_ranks):
                _, ids, _ = round_inputs(L0, seed=1, round_index=i, src=src)
                pairs += int((torch.div(ids, E, rounding_mode="floor") == rec.rank).sum())
                tokens += ids.shape[0] if src == rec.rank else 0
        assert (rec.slots_checked, rec.tokens_checked) == (pairs, tokens) and pairs > 0
    assert len({r.run_id for r in records}) == 1 and records[0].scenario_hash


def _planted(info: Any, scenario_data: dict, plant: str) -> list[dict]:
    """One real round on a rank, then `plant` corrupts one thing the checks read; the faults check_round reports."""
    from harness.rank.lifecycle import setup_rank
    from harness.rank.soak import check_round, run_round
    from harness.scenario.schema import parse_scenario

    setup = setup_rank(parse_scenario(scenario_data), info, info.device, Path("/tmp"), 0)
    comm = setup.buffers
    sources, handle, combined = run_round(setup, 1, seed=5)
    clean, slots = check_round(setup, 1, sources, handle, combined)
    assert clean == [] and slots > 0
    if plant == "counts":
        comm.expert_num_tokens[2] -= 1
    elif plant == "slot-source":
        comm.expert_src[0, 0, 1] = comm.expert_src[0, 1, 1]  # the same token twice in expert 0
    elif plant == "slot-row":
        comm.expert_x.view(torch.uint8)[1, 0, 7] ^= 1
    elif plant == "slot-scale":
        comm.expert_x_scale[1, 0, 0] *= 2
    elif plant == "partial":
        comm.combine_recv[:] = 0  # every row that came back: a token's whole size lost
    elif plant == "partial-term":
        comm.combine_recv.mul_(1.04)  # every returned row 4 % off: past the 2^-7 (0.8 %) a partial may differ
    elif plant == "output":
        combined[3] = -combined[3]
    found, _ = check_round(setup, 1, sources, handle, combined)
    return [f.model_dump() for f in found]


@pytest.mark.parametrize("plant, check, words", [
    ("counts", "counts", "expert 2: expert_num_tokens"),
    ("slot-source", "slots", "expert 0 slot"),
    ("slot-row", "slots", "FP8 row differs from the sender's"),
    ("slot-scale", "slots", "scale differs from the sender's"),
    ("partial", "partials", "row from rank 0"),
    ("partial-term", "partials", "row from rank 0"),
    ("output", "output", "token 3 element"),
])
def test_each_check_reports_a_planted_fault(plant, check, words):
    scenario = tiny(**{"parallel.num_ranks": 1, "parallel.num_dispatchers": 4, "parallel.num_local_experts": 16,
                       "model.top_k": 4})
    [found] = parallel_launch(1, _planted, scenario.model_dump(mode="json"), plant)
    assert [f["check"] for f in found] == [check] and words in found[0]["detail"], found
    assert found[0]["round"] == 1 and found[0]["kind"] == ROUND_KINDS[1]


def test_soak_script_refuses_a_bad_override_in_one_line():
    done = subprocess.run([sys.executable, "benchmarks/soak_comm.py", "smoke", "--set", "parallel.num_ranks=0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("soak_comm: ") and "num_ranks" in done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("comm", ["symm-mem", "nccl"])
def test_soak_on_two_gpus_finds_no_fault(comm):
    from harness.rank.comm.symm_mem import symm_mem_available

    if comm == "symm-mem" and not symm_mem_available():
        pytest.skip("torch's symmetric memory is not available here")
    data = tiny(**{"parallel.num_dispatchers": 4, "parallel.num_local_experts": 4, "routing.kind": "skewed"},
                device="cuda", comm=comm).model_dump(mode="json")
    records = [SoakRecord.model_validate(r) for r in run_soak(data, rounds=200, seed=2, timeout_s=240)]
    for rec in records:
        assert (rec.comm, rec.rounds, rec.rounds_failed, rec.faults) == (comm, 200, 0, []), rec.faults
        assert rec.row_kernels.startswith("triton ") and rec.slots_checked > 0


@pytest.mark.gpu
@pytest.mark.parametrize("num_ranks", [1, pytest.param(2, marks=pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"))])
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("comm", ["symm-mem", "nccl"])
def test_graph_soak_with_rank_delays_finds_no_fault(num_ranks, comm):
    """Rounds replayed from CUDA graphs (each pair replayed once first, see CollectiveComm), fresh inputs
    replay, rank r sleeping on the GPU before its dispatch and its combine (r x, then (P - 1 - r) x 5e6 cycles):
    every round checked."""
    data = tiny(**{"parallel.num_ranks": num_ranks, "parallel.num_dispatchers": 4,
                   "parallel.num_local_experts": 16 // num_ranks, "routing.kind": "skewed"},
                device="cuda", comm=comm).model_dump(mode="json")
    records = [SoakRecord.model_validate(r) for r in run_soak(data, rounds=100, seed=3, timeout_s=240, graph=True,
                                                              delay_cycles=5_000_000)]
    for rec in records:
        assert (rec.mode, rec.rounds, rec.rounds_failed, rec.faults) == ("graph", 100, 0, []), rec.faults
        assert rec.slots_checked > 0 and rec.delay_cycles == 5_000_000


def test_graph_soak_is_refused_where_nothing_captures():
    done = subprocess.run([sys.executable, "benchmarks/soak_comm.py", "smoke", "--graph", "--delay-cycles", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "soak_comm: --delay-cycles -1: must be >= 0"
    data = tiny(**{"parallel.num_ranks": 2}).model_dump(mode="json")  # gloo ranks: no CUDA graphs
    records = run_soak(data, rounds=2, seed=0, timeout_s=120, graph=True)
    assert all("graph mode needs a comm backend that captures on a GPU, not gloo on cpu" in r["error"]
               for r in records), records
