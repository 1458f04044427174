"""One rank's lifecycle on real gloo groups (CPU): ranks agree on a failure before the next collective, the warm-up
gives every policy the same baseline, and lower-bound allocates its live set and nothing more."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch

from distributed_utils import parallel_launch
from harness.core.contract import fixed_shapes, live_set_bytes, lower_bound_shapes
from harness.core.records import PolicyResult, RankRecord
from harness.rank.experts import Workspace
from harness.rank.memory import Accountant
from scenario_utils import tiny
from verdicts import judge_policy

# The group's collective timeout in these tests. A rank left waiting on a peer that skipped a collective would
# sit there this long: finishing well within it shows that nobody waited.
COLLECTIVE_TIMEOUT_S = 60.0


class _RaisesOnRank:
    """The real reference backend, except that on one rank it raises the way a backend does on bad input."""

    name = "reference"

    def __init__(self, inner: object, *, rank: int, policy: str, exc: Exception) -> None:
        self.inner, self.rank, self.policy, self.exc = inner, rank, policy, exc
        self.kernels = inner.kernels  # type: ignore[attr-defined]

    def apply(self, **kwargs: object) -> torch.Tensor:
        workspace = kwargs["workspace"]
        if torch.distributed.get_rank() == self.rank and workspace.shapes.policy == self.policy:  # type: ignore[attr-defined]
            raise self.exc
        return self.inner.apply(**kwargs)  # type: ignore[attr-defined]

    def scratch_bytes(self, workspace: object) -> int:
        return self.inner.scratch_bytes(workspace)  # type: ignore[attr-defined]


def _policies_with_a_failing_backend(info, scenario_data: dict, run_dir: str) -> list[dict]:
    from harness.rank.distributed import init_rank
    from harness.rank.lifecycle import measure_policy, setup_rank, warm_up
    from harness.scenario.schema import parse_scenario

    scenario = parse_scenario(scenario_data)
    setup = setup_rank(scenario, info, init_rank(info), Path(run_dir), 0)
    backend = _RaisesOnRank(setup.backend, rank=1, policy="fixed",
                            exc=ValueError("cutlass_moe_mm: problem sizes do not match the strides"))
    setup = dataclasses.replace(setup, backend=backend)
    assert warm_up(setup) == "full"
    return [measure_policy(setup, policy, None)[0].model_dump(mode="json") for policy in scenario.policies]


@pytest.mark.slow
def test_one_ranks_backend_error_ends_that_policy_on_every_rank_and_the_run_goes_on(tmp_path: Path) -> None:
    scenario = tiny(**{"policies": ["legacy", "fixed", "lower-bound"]})
    started = time.monotonic()
    raw = parallel_launch(2, _policies_with_a_failing_backend, scenario.model_dump(mode="json"), str(tmp_path),
                          timeout_s=COLLECTIVE_TIMEOUT_S)
    elapsed_s = time.monotonic() - started
    by_rank = [{r["policy"]: PolicyResult.model_validate(r) for r in results} for results in raw]
    for rank, results in enumerate(by_rank):
        assert results["legacy"].status == "ok" and results["lower-bound"].status == "ok"
        fixed = results["fixed"]
        assert fixed.status == "error" and fixed.failed_ranks == [1]
        verdict = judge_policy(fixed, scenario, rank=rank).expectation  # no pass/fail for a policy that did not run
        assert verdict.outcome == ("error" if rank == 1 else "skip"), verdict
        assert fixed.timings is None and fixed.correctness is None
        if rank == 1:  # its own error, with the stage and the message
            assert fixed.error == "experts: ValueError: cutlass_moe_mm: problem sizes do not match the strides"
        else:  # stopped with rank 1's message on its record too
            assert fixed.error == ("stopped: rank(s) [1] failed; rank 1: experts: ValueError: cutlass_moe_mm: "
                                   "problem sizes do not match the strides")
    assert elapsed_s < COLLECTIVE_TIMEOUT_S, f"a rank waited for the collective timeout ({elapsed_s:.0f} s)"


def _rank_record(info, scenario_data: dict, run_dir: str) -> dict:
    from harness.rank.lifecycle import rank_main
    from harness.scenario.schema import parse_scenario

    return rank_main(parse_scenario(scenario_data), info, Path(run_dir)).model_dump(mode="json")


@pytest.mark.slow
def test_lower_bound_allocates_its_live_set_where_it_is_below_fixed(tmp_path: Path) -> None:
    # N/2 < K < N (I=64, N=128, K=96): fixed's two buffers need N + K per row, the live set max(N + N/2, 2K).
    # T=1024 makes the live set 6 MiB, so the memory check's 2% (123 KiB) is far above RSS's page-sized noise from
    # the interpreter's own allocations (a 384 KiB live set at T=64 once measured 8 KiB over, on a loaded machine).
    scenario = tiny(**{"model.hidden_size": 96, "model.intermediate_size": 64, "parallel.max_tokens_per_rank": 1024,
                       "policies": ["fixed", "lower-bound"]})
    args = scenario.sizing_args()
    live, fixed = live_set_bytes(args), fixed_shapes(args).total_bytes
    assert live < fixed
    raw = parallel_launch(2, _rank_record, scenario.model_dump(mode="json"), str(tmp_path))
    for record in (RankRecord.model_validate(r) for r in raw):
        by = {p.policy: p for p in record.policies}
        lb = by["lower-bound"]
        assert lb.status == "ok" and lb.contract.total_bytes == live
        assert (lb.breakdown.common_bytes, lb.breakdown.ws2_bytes) == (live, 0)  # one arena, exactly the live set
        assert lb.contract.common_bytes + lb.contract.ws2_bytes == live
        assert abs(lb.memory.workspace_delta_bytes - live) <= 0.02 * live  # the scenarios' memory tolerance
        assert by["fixed"].memory.workspace_delta_bytes > lb.memory.workspace_delta_bytes
        # The views moving inside the arena never overwrite live data: the same output as fixed's two buffers.
        assert judge_policy(lb, scenario, rank=record.rank).correctness.outcome == "pass"
        assert lb.correctness.max_abs_error == by["fixed"].correctness.max_abs_error
        for p in by.values():  # CPU ranks time eager and the record says why
            assert (p.timings.timing_mode, p.timings.timing_reason) == ("eager", "CPU ranks: no CUDA graphs")


def test_arena_views_of_the_live_set_layout() -> None:
    # I=64 (N=128), K=96: the arena is rows x max(3I, 2K) = rows x 192 elements; the views sit as documented.
    scenario = tiny(**{"model.hidden_size": 96, "model.intermediate_size": 64})
    args = scenario.sizing_args()
    shapes = lower_bound_shapes(args)
    E, M, K, I = args.num_local_experts, args.M, args.K, args.intermediate_size
    ws = Workspace.allocate(shapes, Accountant(torch.device("cpu")), dtype=torch.bfloat16, num_local_experts=E,
                            max_slots_per_expert=M, hidden_size=K, intermediate_size=I)
    rows, base = E * M, ws.common.data_ptr()

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.data_ptr() - base
        return start, start + t.numel() * t.element_size()

    assert ws.is_arena and ws.common.numel() * 2 == live_set_bytes(args) and ws.ws2.numel() == 0
    mm1, act, quant, mm2, out = (span(t) for t in (ws.mm1_out, ws.act_out, ws.quant_out, ws.mm2_out, ws.out))
    end = ws.common.numel() * 2

    def disjoint(a: tuple[int, int], b: tuple[int, int]) -> bool:
        return a[1] <= b[0] or b[1] <= a[0]

    assert all(0 <= s_ and e_ <= end for s_, e_ in (mm1, act, quant, mm2, out))
    # What each step reads and writes at once: GEMM1 -> silu_and_mul -> quant -> GEMM2 -> copy into out.
    assert disjoint(mm1, act) and disjoint(act, quant) and disjoint(quant, mm2) and disjoint(mm2, out)
    assert mm2[1] == end and out[0] == 0 and quant == (0, rows * I)
