"""The rank data path on real gloo process groups: routing cases, slot contents, correctness, FP8 quantization."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distributed_utils import parallel_launch
from harness.core.contract import fixed_shapes
from harness.core.records import PolicyResult
from harness.rank.comm import create_comm
from harness.rank.dispatch import DispatchError, DispatchLayout, dispatch
from harness.rank.experts import Workspace, make_weights
from harness.rank.experts.reference import ReferenceExperts
from harness.rank.memory import Accountant
from harness.rank.quant import FP8_MAX, dequantize, quantize_per_channel, quantize_per_token
from harness.rank.route import route
from scenario_utils import tiny
from verdicts import judge_policy


def test_per_token_quant_matches_float_within_fp8_rounding():
    torch.manual_seed(0)
    x = torch.randn(64, 256) * torch.logspace(-3, 3, 64).unsqueeze(1)
    q, scale = quantize_per_token(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and scale.shape == (64, 1)
    assert torch.allclose(scale.squeeze(1), x.abs().amax(dim=1) / FP8_MAX)
    err = (dequantize(q, scale) - x).abs()
    # e4m3 keeps 3 mantissa bits: relative rounding <= 2^-4; near zero the subnormal step is 2^-9 * scale.
    assert bool((err <= x.abs() * 2**-4 + scale * 2**-9).all())


def test_per_channel_quant_matches_float_within_fp8_rounding():
    torch.manual_seed(1)
    w = torch.randn(3, 48, 128)
    q, scale = quantize_per_channel(w)
    assert q.shape == w.shape and scale.shape == (3, 48)
    err = (dequantize(q, scale.unsqueeze(-1)) - w).abs()
    assert bool((err <= w.abs() * 2**-4 + scale.unsqueeze(-1) * 2**-9).all())


def _plain_moe_expert(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """A plain PyTorch expert in float32: silu(x W_gate^T) * (x W_up^T), per-token FP8, then W2."""
    h = x @ w1.T
    half = h.shape[1] // 2
    act = torch.nn.functional.silu(h[:, :half]) * h[:, half:]
    aq, ascale = quantize_per_token(act)
    return dequantize(aq, ascale) @ w2.T


def test_reference_experts_match_plain_pytorch_moe_and_write_into_workspace_views():
    E, T, D, K, I = 4, 8, 2, 64, 32
    M = T * D
    device = torch.device("cpu")
    acc = Accountant(device)
    weights = make_weights(
        rank=0, num_local_experts=E, hidden_size=K, intermediate_size=I, seed=3, device=device, accountant=acc
    )
    from harness.core.contract import SizingArgs

    args = SizingArgs(
        max_tokens_per_rank=T,
        num_dispatchers=D,
        num_local_experts=E,
        num_global_experts=E * D,
        hidden_size=K,
        intermediate_size=I,
        top_k=2,
    )
    ws = Workspace.allocate(
        fixed_shapes(args),
        acc,
        dtype=torch.bfloat16,
        num_local_experts=E,
        max_slots_per_expert=M,
        hidden_size=K,
        intermediate_size=I,
    )
    counts = torch.tensor([5, 0, M, 1], dtype=torch.int32)  # an empty expert and a full one
    torch.manual_seed(4)
    x = torch.randn(E, M, K)
    q, s = quantize_per_token(x)
    out = ReferenceExperts().apply(
        expert_x=q, expert_x_scale=s, expert_num_tokens=counts, weights=weights, workspace=ws
    )
    assert out.data_ptr() == ws.common.data_ptr() and out.shape == (E, M, K)  # out aliases common, as in vLLM
    assert ws.mm2_out.data_ptr() == ws.ws2.data_ptr()
    for e, n in enumerate(counts.tolist()):
        if n == 0:
            continue
        w1 = dequantize(weights.w1[e], weights.w1_scale[e].unsqueeze(1))
        w2 = dequantize(weights.w2[e], weights.w2_scale[e].unsqueeze(1))
        want = _plain_moe_expert(dequantize(q[e, :n], s[e, :n]), w1, w2)
        rel = float((out[e, :n].float() - want).abs().max() / want.abs().max())
        assert rel < 3e-2, f"expert {e}: relative error {rel}"


def _run_policies(info, scenario_data: dict, policies: list[str]):
    from harness.rank.lifecycle import measure_policy, setup_rank
    from harness.scenario.schema import parse_scenario

    scenario = parse_scenario(scenario_data)
    setup = setup_rank(scenario, info, torch.device("cpu"), Path("/tmp"), 0)
    out = []
    for policy in policies:
        result, counts = measure_policy(setup, policy, None)
        out.append(
            {"result": result.model_dump(mode="json"), "counts": counts, "num_tokens": int(setup.tokens.shape[0])}
        )
    return out


ROUTING_CASES = {
    "1 rank uniform": dict(**{"parallel.num_ranks": 1, "parallel.num_dispatchers": 1, "model.num_experts": 8}),
    "2 ranks skewed": dict(**{"routing.kind": "skewed", "routing.zipf_exponent": 2.0}),
    "3 ranks uneven splits": dict(
        **{
            "parallel.num_ranks": 3,
            "parallel.num_dispatchers": 3,
            "parallel.num_local_experts": 6,
            "model.num_experts": 18,
        }
    ),
    "4 ranks worst case fills expert 0 to M": dict(
        **{
            "parallel.num_ranks": 4,
            "parallel.num_dispatchers": 4,
            "parallel.num_local_experts": 4,
            "routing.kind": "worst-case",
        }
    ),
    "2 ranks, rank 1 holds no tokens": dict(**{"routing.idle_ranks": [1]}),
    "4 ranks, experts that receive nothing": dict(
        **{
            "parallel.num_ranks": 4,
            "parallel.num_dispatchers": 4,
            "parallel.num_local_experts": 16,
            "model.num_experts": 64,
            "routing.num_tokens": 2,
        }
    ),
    "2 ranks emulating D=8": dict(
        **{"parallel.num_dispatchers": 8, "parallel.num_local_experts": 2, "parallel.max_tokens_per_rank": 4}
    ),
}


def _assert_every_stage_passed(corr: dict, counts: list[int], *, num_tokens: int) -> None:
    """The reference backend agrees with the check at every stage; the check saw every valid row where it should."""
    stages = {c["stage"]: c for c in corr["stages"]}
    assert list(stages) == ["dispatch", "gemm1", "activation", "quant", "gemm2", "combine"]
    for check in stages.values():  # no diverging stage
        assert check["num_rows_wrong"] == 0 and check["first_wrong_row"] is None, check
        assert check["max_rel_error"] <= check["tolerance"], check
    for name in ("dispatch", "activation", "quant"):  # every valid row
        assert stages[name]["num_rows_checked"] == sum(counts), stages[name]
    for name in ("gemm1", "gemm2"):  # sampled rows of every expert that holds any
        assert stages[name]["num_rows_checked"] == sum(min(n, 16) for n in counts), stages[name]
    assert stages["combine"]["num_rows_checked"] == num_tokens
    assert corr["check_us"] > 0


@pytest.mark.parametrize("case", list(ROUTING_CASES))
def test_dispatch_experts_combine_on_gloo(case):
    scenario = tiny(**ROUTING_CASES[case])
    P, E = scenario.parallel.num_ranks, scenario.num_local_experts
    M = scenario.parallel.max_tokens_per_rank * scenario.parallel.num_dispatchers
    per_rank = parallel_launch(P, _run_policies, scenario.model_dump(mode="json"), ["fixed", "legacy"])
    total_tokens = sum(r[0]["num_tokens"] for r in per_rank)
    received = sum(sum(r[0]["counts"]) for r in per_rank)
    assert received == total_tokens * scenario.model.top_k  # every (token, slot) landed exactly once
    for rank, results in enumerate(per_rank):
        assert results[0]["num_tokens"] == scenario.num_tokens_on_rank(rank)
        for item in results:
            res = item["result"]
            assert res["status"] == "ok", res
            corr = res["correctness"]
            assert corr["num_wrong_slots"] == 0
            verdict = judge_policy(PolicyResult.model_validate(res), scenario, rank=rank).correctness
            assert verdict.outcome == "pass", verdict
            assert corr["max_rel_error"] < 0.06
            assert len(item["counts"]) == E and max(item["counts"]) <= M
            _assert_every_stage_passed(corr, item["counts"], num_tokens=results[0]["num_tokens"])
            # Same inputs under both policies: the sizing changes memory, never the answer.
            assert dict(corr, check_us=None) == dict(results[0]["result"]["correctness"], check_us=None)
    if scenario.routing.kind == "worst-case":
        assert per_rank[0][0]["counts"][0] == M  # T tokens from each of the D ranks
    if scenario.routing.idle_ranks:
        assert per_rank[1][0]["num_tokens"] == 0 and sum(per_rank[1][0]["counts"]) > 0
    if case.startswith("4 ranks, experts"):
        assert any(c == 0 for r in per_rank for c in r[0]["counts"])


def _overflow(info):
    layout = DispatchLayout(
        num_ranks=1, rank=0, num_local_experts=2, max_slots_per_expert=4, hidden_size=16, top_k=1, max_tokens=4
    )
    buffers = create_comm(
        "gloo", layout, Accountant(torch.device("cpu")), device=torch.device("cpu"), out_dtype=torch.bfloat16
    )
    tokens = torch.randn(5, 16).to(torch.bfloat16)
    routing = route(kind="uniform", num_tokens=5, num_experts=2, top_k=1, seed=0)
    try:
        dispatch(tokens, routing, layout, buffers)
    except DispatchError as exc:
        return str(exc)
    return None


def test_rank_handed_more_than_T_tokens_gets_a_clear_error():
    (message,) = parallel_launch(1, _overflow)
    assert message is not None
    assert "rank 0 was handed 5 tokens, more than its capacity of 4" in message
    assert "max_tokens_per_rank" in message


def test_routing_is_seeded_distinct_and_normalized():
    a = route(kind="skewed", num_tokens=100, num_experts=32, top_k=8, seed=5)
    b = route(kind="skewed", num_tokens=100, num_experts=32, top_k=8, seed=5)
    assert torch.equal(a.topk_ids, b.topk_ids)
    assert all(len(set(row)) == 8 for row in a.topk_ids.tolist())
    assert torch.allclose(a.topk_weights.sum(1), torch.ones(100))
    worst = route(kind="worst-case", num_tokens=10, num_experts=8, top_k=3, seed=0)
    assert bool((worst.topk_ids[:, 0] == 0).all())
    assert all(len(set(row)) == 3 for row in worst.topk_ids.tolist())
