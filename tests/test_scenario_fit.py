"""Can this machine run it: the rank and memory checks of harness.scenario.fit, against real allocations."""

from __future__ import annotations

import pytest
import torch

from harness.rank.comm import create_comm
from harness.rank.dispatch import DispatchLayout
from harness.rank.experts import make_weights
from harness.rank.memory import Accountant
from harness.scenario.fit import (
    CPU_RANK_OVERHEAD_BYTES,
    MAX_RANKS_PER_CPU,
    Machine,
    can_run,
    estimate_rank_memory,
)
from harness.scenario.schema import Scenario
from scenario_utils import tiny

GIB = 2**30


def _allocated_bytes(s: Scenario) -> int:
    """What rank 0's setup allocates through the Accountant, as harness.rank.lifecycle.setup_rank does it."""
    E, K, I = s.num_local_experts, s.model.hidden_size or 0, s.model.intermediate_size or 0
    D, P, T = s.parallel.num_dispatchers, s.parallel.num_ranks, s.parallel.max_tokens_per_rank
    layout = DispatchLayout(
        num_ranks=P,
        rank=0,
        num_local_experts=E,
        max_slots_per_expert=T * D,
        hidden_size=K,
        top_k=s.model.top_k or 1,
        max_tokens=T * (D // P),
        num_buffer_tokens=max(s.num_tokens_on_rank(r) for r in range(P)),
    )
    accountant = Accountant(torch.device("cpu"))
    make_weights(
        rank=0,
        num_local_experts=E,
        hidden_size=K,
        intermediate_size=I,
        seed=s.seed,
        device=torch.device("cpu"),
        accountant=accountant,
    )
    create_comm(
        "gloo",
        layout,
        accountant,
        device=torch.device("cpu"),  # what a CPU rank's comm="auto" takes
        out_dtype=getattr(torch, s.model.workspace_dtype),
    )
    return accountant.total_bytes


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"parallel.num_ranks": 1, "parallel.num_dispatchers": 4, "parallel.num_local_experts": 4},
        {"routing.num_tokens": 5, "routing.idle_ranks": [1]},
        {"model.top_k": 4, "model.workspace_dtype": "float16", "parallel.max_tokens_per_rank": 40},
    ],
    ids=["tiny", "emulated", "idle-rank", "top4-fp16"],
)
def test_estimate_equals_what_the_rank_allocates(overrides: dict) -> None:
    scenario = tiny(**overrides)
    estimate = estimate_rank_memory(scenario, "cpu")
    assert estimate.weights_bytes + estimate.buffers_bytes == _allocated_bytes(scenario)


def _machine(num_cpus: int = 2, num_gpus: int = 0, ram_gib: float = 16.0, gpu_gib: float | None = None) -> Machine:
    return Machine(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        description="test machine",
        cpu_memory_bytes=int(ram_gib * GIB),
        gpu_memory_bytes=int(gpu_gib * GIB) if gpu_gib else None,
    )


def test_ranks_per_core() -> None:
    fits = tiny(**{"parallel.num_ranks": 8, "parallel.num_dispatchers": 8, "parallel.num_local_experts": 2})
    assert can_run(fits, device_type="cpu", machine=_machine(num_cpus=2)) is None
    too_many = tiny(**{"parallel.num_ranks": 16, "parallel.num_dispatchers": 16, "parallel.num_local_experts": 1})
    reason = can_run(too_many, device_type="cpu", machine=_machine(num_cpus=2))
    assert reason is not None and "parallel.num_ranks (16)" in reason
    assert f"at most {MAX_RANKS_PER_CPU} ranks per core ({2 * MAX_RANKS_PER_CPU} here)" in reason


def test_cpu_memory_adds_up_over_the_local_ranks() -> None:
    scenario = tiny()
    need = estimate_rank_memory(scenario, "cpu").on("cpu")
    assert need > CPU_RANK_OVERHEAD_BYTES
    enough = _machine(ram_gib=2 * need / GIB + 0.01)
    assert can_run(scenario, device_type="cpu", machine=enough) is None
    short = _machine(ram_gib=1.5 * need / GIB)  # one rank would fit, two do not
    reason = can_run(scenario, device_type="cpu", machine=short)
    assert reason is not None and "2 rank(s) need about" in reason and "available" in reason


def test_gpu_memory_counts_the_setup_not_the_workspace() -> None:
    # The PR case's legacy workspace (112 GiB) OOMs on an 80 GB budget by design; weights and buffers fit.
    scenario = tiny(
        **{
            "model.hidden_size": 7168,
            "model.intermediate_size": 2048,
            "parallel.num_dispatchers": 32,
            "parallel.num_ranks": 1,
            "parallel.num_local_experts": 16,
            "parallel.max_tokens_per_rank": 256,
            "memory.budget_gpu": "H100-80GB",
            "device": "cuda",
        }
    )
    estimate = estimate_rank_memory(scenario, "cuda")
    assert estimate.workspace_bytes > 80 * 10**9
    assert can_run(scenario, device_type="cuda", machine=_machine(num_gpus=1, gpu_gib=140)) is None
    ballast = tiny(
        **{
            "model.hidden_size": 7168,
            "model.intermediate_size": 2048,
            "parallel.num_dispatchers": 32,
            "parallel.num_ranks": 1,
            "parallel.num_local_experts": 16,
            "memory.ballast_gb": 200,
            "device": "cuda",
        }
    )
    reason = can_run(ballast, device_type="cuda", machine=_machine(num_gpus=1, gpu_gib=140))
    assert reason is not None and "ballast 186 GiB" in reason and "the GPU's memory, 140 GiB" in reason


def test_gpu_count_and_backend() -> None:
    scenario = tiny(**{"device": "cuda"})
    assert "needs 2 GPUs" in (can_run(scenario, device_type="cuda", machine=_machine(num_gpus=1, gpu_gib=80)) or "")
    cutlass = tiny(**{"experts_backend": "torch-cutlass"})
    assert "needs GPUs" in (can_run(cutlass, device_type="cpu", machine=_machine()) or "")


def test_a_ray_cluster_is_checked_by_its_cpus() -> None:
    scenario = tiny(**{"launch.cpus_per_rank": 4})
    cluster = Machine(num_cpus=6, num_gpus=0, description="cluster", shared=False)
    reason = can_run(scenario, device_type="cpu", machine=cluster)
    assert reason is not None and "launch.cpus_per_rank (4)" in reason and "cluster's 6" in reason
