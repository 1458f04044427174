"""One source for the comm buffers' sizes: harness.core.comm_buffers declares them, harness.rank.comm allocates
them by name, and harness.scenario.fit's estimate of a rank's memory is their sum. The allocations here are real
(a counting Accountant on CPU); symm-mem's are made through a stand-in for torch's symmetric memory, which needs a
GPU, so that what its constructor allocates is counted on CPU."""

from __future__ import annotations

import socket
import sys
import types
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from harness.core.backends import DeviceType
from harness.core.comm_buffers import CommLayout, comm_buffers, comm_bytes, padded_row_bytes
from harness.rank.comm import create_comm
from harness.rank.lifecycle import dispatch_layout
from harness.rank.memory import Accountant
from harness.scenario.fit import _comm_buffers_bytes, comm_layout, estimate_rank_memory
from report_records import make_scenario

# (parallel, model, routing) of scenarios whose comm buffers differ in every letter
LAYOUTS = [
    ({"num_dispatchers": 4, "num_ranks": 2, "num_local_experts": 4, "max_tokens_per_rank": 32}, {}, {}),
    ({"num_dispatchers": 8, "num_ranks": 4, "num_local_experts": 2, "max_tokens_per_rank": 16}, {"top_k": 3}, {}),
    ({"num_dispatchers": 2, "num_ranks": 1, "num_local_experts": 8, "max_tokens_per_rank": 64}, {"top_k": 1}, {}),
    ({"num_dispatchers": 4, "num_ranks": 4, "num_local_experts": 4, "max_tokens_per_rank": 40}, {}, {"num_tokens": 7}),
]


class CountingAccountant(Accountant):
    """The real Accountant, keeping each allocation's (category, bytes) too."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.allocations: list[tuple[str, int]] = []

    def alloc(self, category: str, shape: tuple[int, ...], dtype: torch.dtype, *, touch: bool = True) -> torch.Tensor:
        tensor = super().alloc(category, shape, dtype, touch=touch)
        self.allocations.append((category, tensor.numel() * tensor.element_size()))
        return tensor

    def adopt(self, category: str, tensor: torch.Tensor) -> torch.Tensor:
        self.allocations.append((category, tensor.numel() * tensor.element_size()))
        return super().adopt(category, tensor)


def _scenario(parallel: dict, model: dict, routing: dict, comm: str):
    s = make_scenario(parallel=parallel)
    update: dict[str, object] = {"comm": comm, "device": "cuda" if comm != "gloo" else "cpu"}
    if model:
        update["model"] = s.model.model_copy(update=model)
    if routing:
        update["routing"] = s.routing.model_copy(update=routing)
    return s.model_copy(update=update)


def _check(scenario, accountant: CountingAccountant, backend: str) -> None:
    L = comm_layout(scenario)
    declared = comm_buffers(backend, L)
    # the figure scenario.fit uses is what the backend allocated, by category and buffer by buffer
    dispatch, combine = comm_bytes(backend, L)
    assert (accountant.bytes_of("dispatch"), accountant.bytes_of("combine")) == (dispatch, combine)
    device: DeviceType = "cpu" if backend == "gloo" else "cuda"
    assert _comm_buffers_bytes(scenario, device) == (dispatch, combine)
    assert estimate_rank_memory(scenario, device).buffers_bytes == dispatch + combine
    assert Counter(a for a in accountant.allocations if a[1]) == Counter(
        (b.kind, b.nbytes) for b in declared if b.nbytes
    )
    # its largest term: the FP8 slots of the batched buffer, E*M + 1 rows of K bytes
    largest = max(declared, key=lambda b: b.nbytes)
    assert (
        largest.name == "expert_x"
        and largest.nbytes == (L.num_local_experts * L.max_slots_per_expert + 1) * L.hidden_size
    )
    assert max(n for _, n in accountant.allocations) == largest.nbytes


@pytest.mark.parametrize(("parallel", "model", "routing"), LAYOUTS)
def test_fit_sizes_the_collective_backend_as_it_allocates(parallel: dict, model: dict, routing: dict) -> None:
    scenario = _scenario(parallel, model, routing, "gloo")
    accountant = CountingAccountant()
    create_comm("gloo", dispatch_layout(scenario, 0), accountant, device=torch.device("cpu"), out_dtype=torch.bfloat16)
    _check(scenario, accountant, "gloo")
    assert comm_bytes("nccl", comm_layout(scenario)) == comm_bytes("gloo", comm_layout(scenario))  # the same path


class _FakeSymmetricHandle:
    """torch's symmetric-memory handle as SymmMemComm uses it: its peers' buffers and signal pads (plain CPU
    tensors here; the sizes are what is tested)."""

    signal_pad_size = 1 << 20

    def get_buffer(self, rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def get_signal_pad(self, rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype)


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("parallel", "model", "routing"), LAYOUTS)
def test_fit_sizes_symm_mem_as_it_allocates(
    parallel: dict, model: dict, routing: dict, one_rank_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.SimpleNamespace(
        empty=lambda shape, dtype, device: torch.empty(shape, dtype=dtype),
        rendezvous=lambda tensor, group: _FakeSymmetricHandle(),
    )
    monkeypatch.setitem(sys.modules, "torch.distributed._symmetric_memory", fake)
    monkeypatch.setattr(torch.distributed, "_symmetric_memory", fake, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    from harness.rank.comm.symm_mem import SymmMemComm

    scenario = _scenario(parallel, model, routing, "symm-mem")
    accountant = CountingAccountant()
    SymmMemComm(dispatch_layout(scenario, 0), accountant, out_dtype=torch.bfloat16, device=torch.device("cpu"))
    _check(scenario, accountant, "symm-mem")


def test_the_row_formats_are_the_declared_ones() -> None:
    from harness.rank.comm.base import RowFormat
    from harness.rank.comm.push import PushFormat

    for K, k in ((512, 1), (7168, 8), (64, 3)):
        assert RowFormat(hidden_size=K, top_k=k).row_bytes == padded_row_bytes(K, 3 + (k + 1) // 2 + k)
        assert PushFormat(hidden_size=K, top_k=k).row_bytes == padded_row_bytes(K, 2 + 3 * k)
        assert padded_row_bytes(K, 3) == K + 16 and padded_row_bytes(K, 5) == K + 32


def test_the_pr_case_comm_buffers_in_closed_form() -> None:
    """DeepSeek-V3 at D = 32 on one rank (E = 16, T = 256, top-8): the batched buffer's slots dominate."""
    L = CommLayout(num_local_experts=16, max_slots_per_expert=256 * 32, hidden_size=7168, num_ranks=1,
                   buffer_tokens=256 * 32, top_k=8, out_itemsize=2)  # fmt: skip
    dispatch, combine = comm_bytes("nccl", L)
    slots = 16 * 8192 + 1
    row = 7168 + 64  # 3 + 4 + 8 = 15 metadata words (60 B), padded to 64 bytes
    assert dispatch == slots * (7168 + 4 + 8) + 8 + 16 * 4 + 2 * 8192 * row + 2 * 8
    assert combine == (2 * 8192 + 8192) * 7168 * 2
