"""Every buffer a rank's comm backend allocates once at full capacity, declared once: its name, shape and element
size, as functions of the layout's letters. harness.rank.comm allocates from these declarations (the shapes are
looked up by name), and harness.scenario.fit sizes a rank's comm memory from the same ones before any rank starts.

The letters (docs/design.md): E local experts, M slots per expert (T*D), K hidden size, P ranks, C the tokens the
send and receive buffers are sized for (the most any rank routes), k top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

BufferKind = Literal["dispatch", "combine"]

# The route layout of symm-mem places pairs in chunks of this many tokens (harness.rank.comm.push.route_layout's
# place kernel compares every pair of a chunk: (16 k)^2).
ROUTE_BLOCK_TOKENS = 16
ROW_ALIGN_BYTES = 16  # a packed row's metadata is padded to a multiple of this


@dataclass(frozen=True)
class CommBuffer:
    kind: BufferKind  # the memory category it is counted under (harness.rank.memory.CATEGORIES)
    name: str
    shape: tuple[int, ...]
    itemsize: int  # bytes of one element of its dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class CommLayout:
    """The sizes the comm buffers depend on: E, M, K, P, C, k and the combine's output element size."""

    num_local_experts: int  # E
    max_slots_per_expert: int  # M
    hidden_size: int  # K
    num_ranks: int  # P
    buffer_tokens: int  # C
    top_k: int  # k
    out_itemsize: int  # the workspace dtype's (bf16: 2)


def padded_row_bytes(hidden_size: int, meta_words: int) -> int:
    """K FP8 bytes, then `meta_words` int32 words padded to ROW_ALIGN_BYTES."""
    return hidden_size + -(-4 * meta_words // ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES


def collective_meta_words(top_k: int) -> int:
    """A collective row's metadata (harness.rank.comm.base.RowFormat): scale, source token, source rank, top_k int16
    expert ids (two a word), top_k weights."""
    return 3 + (top_k + 1) // 2 + top_k


def push_meta_words(top_k: int) -> int:
    """A symm-mem row's metadata (harness.rank.comm.push.PushFormat): scale, source token, then per top-k slot the
    expert id, the pair's position and the weight."""
    return 2 + 3 * top_k


def route_chunks(capacity: int) -> int:
    """Chunks of the route layout's scratch for `capacity` tokens."""
    return max(1, -(-capacity // ROUTE_BLOCK_TOKENS))


def batched_buffers(L: CommLayout) -> list[CommBuffer]:
    """The batched format every backend fills (harness.rank.comm.base.BatchedBuffers): E*M slots and a sink row past
    them for pairs beyond M, and the combine's output rows."""
    E, M, K = L.num_local_experts, L.max_slots_per_expert, L.hidden_size
    return [
        CommBuffer("dispatch", "expert_x", (E * M + 1, K), 1),  # FP8
        CommBuffer("dispatch", "expert_x_scale", (E * M + 1,), 4),  # float32
        CommBuffer("dispatch", "expert_src", (E * M + 1, 2), 4),  # int32 (source rank, source token)
        CommBuffer("dispatch", "overflow", (1,), 8),  # int64
        CommBuffer("dispatch", "expert_num_tokens", (E,), 4),  # int32
        CommBuffer("combine", "combine_out", (L.buffer_tokens, K), L.out_itemsize),
    ]


def collective_buffers(L: CommLayout) -> list[CommBuffer]:
    """nccl and gloo (harness.rank.comm.collective): capacity-sized equal splits, every peer's region C rows both
    ways; in combine one partial per received row, sent and received."""
    P, C, K = L.num_ranks, L.buffer_tokens, L.hidden_size
    row = padded_row_bytes(K, collective_meta_words(L.top_k))
    return [
        CommBuffer("dispatch", "send_rows", (P * C, row), 1),
        CommBuffer("dispatch", "recv_rows", (P * C, row), 1),
        CommBuffer("dispatch", "send_counts", (P,), 8),
        CommBuffer("dispatch", "recv_counts", (P,), 8),
        CommBuffer("combine", "combine_send", (P * C, K), L.out_itemsize),
        CommBuffer("combine", "combine_recv", (P * C, K), L.out_itemsize),
    ]


def symm_mem_buffers(L: CommLayout) -> list[CommBuffer]:
    """symm-mem (harness.rank.comm.symm_mem): the other ranks' pushed rows (a rank's own go straight into its
    slots), the counts, the route layout and the combine table; the partials other ranks push back."""
    E, P, C, K, k = L.num_local_experts, L.num_ranks, L.buffer_tokens, L.hidden_size, L.top_k
    row = padded_row_bytes(K, push_meta_words(k))
    return [
        CommBuffer("dispatch", "recv_rows", ((P - 1) * C, row), 1),  # symmetric; none at P = 1
        CommBuffer("dispatch", "recv_counts", (P, E + 1), 4),  # symmetric
        CommBuffer("combine", "combine_recv", (P * C, K), L.out_itemsize),  # symmetric
        CommBuffer("dispatch", "pos", (C, k), 4),
        CommBuffer("dispatch", "row_index", (C, P), 4),
        CommBuffer("dispatch", "counts", (E * P + P,), 4),
        CommBuffer("dispatch", "route_scratch", (2, route_chunks(C), E * P + P), 4),
        CommBuffer("dispatch", "base", (P, E), 4),
        CommBuffer("dispatch", "table", (P * C, k), 8),
        CommBuffer("dispatch", "table_w", (P * C, k), 4),
        CommBuffer("dispatch", "tok", (P * C,), 4),
        CommBuffer("dispatch", "epoch", (1,), 4),
        CommBuffer("dispatch", "status", (1,), 4),
        CommBuffer("dispatch", "done", (2,), 4),  # finished programs of quantize_push and of reduce_push
    ]


BACKEND_BUFFERS = {"symm-mem": symm_mem_buffers, "nccl": collective_buffers, "gloo": collective_buffers}


def comm_buffers(backend: str, L: CommLayout) -> list[CommBuffer]:
    """Everything `backend` allocates for layout L: the batched buffers, then its own."""
    return batched_buffers(L) + BACKEND_BUFFERS[backend](L)


def shapes_of(buffers: list[CommBuffer]) -> dict[str, tuple[int, ...]]:
    """Each buffer's shape by its name, as the allocating code looks them up."""
    return {b.name: b.shape for b in buffers}


def comm_bytes(backend: str, L: CommLayout) -> tuple[int, int]:
    """(dispatch, combine) bytes `backend` allocates for layout L."""
    buffers = comm_buffers(backend, L)
    return (
        sum(b.nbytes for b in buffers if b.kind == "dispatch"),
        sum(b.nbytes for b in buffers if b.kind == "combine"),
    )
