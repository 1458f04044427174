"""Types every comm backend shares: the sizes of one rank's dispatch, the batched buffers the experts read, the
handle dispatch gives combine, the packed row format, and sub-stage timing marks."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from harness.core.comm_buffers import (
    CommLayout,
    batched_buffers,
    collective_meta_words,
    padded_row_bytes,
    shapes_of,
)
from harness.rank.memory import Accountant
from harness.rank.quant import FP8_DTYPE

if TYPE_CHECKING:  # timing imports nothing of ours; the annotation only
    from harness.rank.timing import StageTimer

Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class DispatchError(Exception):
    """A configuration error in what a rank was asked to dispatch."""


class CommUnavailable(Exception):
    """The comm backend a scenario names cannot run with this device and layout; the message says why."""


@dataclass(frozen=True, kw_only=True)
class DispatchLayout:
    """Sizes of one rank's dispatch, in the letters of docs/design.md."""

    num_ranks: int  # P
    rank: int
    num_local_experts: int  # E
    max_slots_per_expert: int  # M = T * D
    hidden_size: int  # K
    top_k: int
    max_tokens: int  # this rank's capacity: T * D / P dispatchers' worth
    # Tokens the comm buffers are sized for: the most any rank routes in this run. The capacity T*D/P bounds the
    # batched buffer's M; the send side of a real rank holds only what it routes (at vLLM's default T = 8192
    # with D/P = 32 emulated dispatchers, capacity-sized send buffers alone would need over 100 GB).
    num_buffer_tokens: int | None = None

    @property
    def buffer_tokens(self) -> int:
        """C: the most tokens any rank dispatches; every send and receive buffer is sized from it."""
        return self.max_tokens if self.num_buffer_tokens is None else self.num_buffer_tokens

    def comm_layout(self, out_dtype: torch.dtype) -> CommLayout:
        """The sizes harness.core.comm_buffers declares every comm buffer from."""
        return CommLayout(
            num_local_experts=self.num_local_experts,
            max_slots_per_expert=self.max_slots_per_expert,
            hidden_size=self.hidden_size,
            num_ranks=self.num_ranks,
            buffer_tokens=self.buffer_tokens,
            top_k=self.top_k,
            out_itemsize=torch.empty((), dtype=out_dtype).element_size(),
        )

    @property
    def max_ranks_per_token(self) -> int:
        """A token goes once to each rank that holds one of its top-k experts: at most min(P, top_k) ranks."""
        return min(self.num_ranks, self.top_k)

    def check_tokens(self, num_tokens: int) -> None:
        """Raise DispatchError when this rank was handed more tokens than its capacity or its buffers."""
        if num_tokens > self.max_tokens:
            raise DispatchError(
                f"rank {self.rank} was handed {num_tokens} tokens, more than its capacity of {self.max_tokens} "
                "(max_tokens_per_rank T x D/P dispatchers); the batched buffer's M assumes no dispatcher exceeds T"
            )
        if num_tokens > self.buffer_tokens:
            raise DispatchError(
                f"rank {self.rank} was handed {num_tokens} tokens; its buffers were sized for {self.buffer_tokens}"
            )


@dataclass(frozen=True, kw_only=True)
class RowFormat:
    """One packed row on the wire per (token, destination rank), so a single exchange carries payload and metadata:

        bytes [0, K)             the token's FP8 values
        int32 word 0 after them  per-token scale (float32 bits)
        word 1                   source token index
        word 2                   source rank
        words 3 .. 3+h           top_k int16 local expert ids on the destination, -1 where the slot is elsewhere
        next top_k words         the matching top-k weights (float32; 0 where the slot is elsewhere)

    padded to a multiple of 16 bytes (h = ceil(top_k / 2)). The receiver places the row once for each of its local
    experts that the token picked, and reduces the weighted expert outputs back into one row per token.
    """

    hidden_size: int
    top_k: int

    @property
    def id_words(self) -> int:
        return (self.top_k + 1) // 2

    @property
    def meta_words(self) -> int:
        return collective_meta_words(self.top_k)

    @property
    def meta_bytes(self) -> int:
        return padded_row_bytes(0, self.meta_words)

    @property
    def row_bytes(self) -> int:
        return padded_row_bytes(self.hidden_size, self.meta_words)

    @property
    def payload_words(self) -> int:
        """int64 words of the FP8 payload: rows are moved as int64 words (8 bytes per element, not 1)."""
        return self.hidden_size // 8


def as_words(rows: torch.Tensor) -> torch.Tensor:
    """The same rows viewed as int64 words where the row size allows: row gathers and scatters then move 8 bytes
    per element instead of 1 (on GPU the uint8 form was several times slower)."""
    row_bytes = rows.shape[-1] * rows.element_size()
    if rows.dim() == 2 and rows.stride(-1) == 1 and row_bytes % 8 == 0 and rows.is_contiguous():
        return rows.view(torch.uint8).view(torch.int64)
    return rows


@dataclass(frozen=True, kw_only=True)
class BatchedBuffers:
    """The experts' side of dispatch, as vLLM's batched format takes it, and the combine output; allocated once.

    Each flat buffer has one row past E*M: a sink that a slot index lands in only if some sender broke the
    capacity invariant (then `overflow` counts it instead of writing out of bounds).
    """

    expert_x: torch.Tensor  # (E, M, K) float8_e4m3fn: slot j of expert e holds the j-th token routed to it
    expert_x_scale: torch.Tensor  # (E, M, 1) float32 per-token scales
    expert_src: torch.Tensor  # (E, M, 2) int32: source rank, source token of each slot (traces every slot)
    expert_num_tokens: torch.Tensor  # (E,) int32 valid slots per expert, on the device
    overflow: torch.Tensor  # () int64: slots that would have passed M, on the device; read once per run
    combine_out: torch.Tensor  # (C, K) bf16: the layer's output on the token's rank
    expert_x_flat: torch.Tensor | None = None  # (E*M + 1, K) uint8 with the sink row, where the backend scatters
    expert_x_scale_flat: torch.Tensor | None = None  # (E*M + 1,) float32
    expert_src_flat: torch.Tensor | None = None  # (E*M + 1, 2) int32

    @staticmethod
    def allocate(
        layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype, expert_x: torch.Tensor | None = None
    ) -> BatchedBuffers:
        """`expert_x`, when given, is a receive buffer the collective writes straight into (E*M, K) uint8."""
        E, M, K = layout.num_local_experts, layout.max_slots_per_expert, layout.hidden_size
        shape = shapes_of(batched_buffers(layout.comm_layout(out_dtype)))  # harness.core.comm_buffers
        a = accountant.alloc
        x_flat = a("dispatch", shape["expert_x"], torch.uint8) if expert_x is None else None
        scale_flat = a("dispatch", shape["expert_x_scale"], torch.float32)
        src_flat = a("dispatch", shape["expert_src"], torch.int32)
        rows = x_flat[: E * M] if x_flat is not None else expert_x
        assert rows is not None  # expert_x is given exactly when x_flat is not allocated
        x = rows.view(FP8_DTYPE).view(E, M, K)
        overflow = a("dispatch", shape["overflow"], torch.int64)
        overflow.zero_()
        return BatchedBuffers(
            expert_x=x,
            expert_x_scale=scale_flat[: E * M].view(E, M, 1),
            expert_src=src_flat[: E * M].view(E, M, 2),
            expert_num_tokens=a("dispatch", shape["expert_num_tokens"], torch.int32),
            overflow=overflow.view(()),
            combine_out=a("combine", shape["combine_out"], out_dtype),
            expert_x_flat=x_flat,
            expert_x_scale_flat=scale_flat,
            expert_src_flat=src_flat,
        )


@dataclass(frozen=True, kw_only=True)
class DispatchHandle:
    """What combine needs to send results back and reduce them; produced by a backend's dispatch.

    `state` is the backend's own frozen dataclass (collective.CollectiveState, symm_mem.SymmMemState): what its
    combine reads of the dispatch; only that backend reads it.
    """

    num_tokens: int
    topk_weights: torch.Tensor  # (num_tokens, top_k) float32
    dispatch_bytes: int  # bytes this rank put on the wire in dispatch (its own rank's share included)
    combine_bytes: int  # bytes this rank puts on the wire in combine
    num_host_syncs: int  # device-to-host reads the dispatch needed (0 for every backend: fixed shapes)
    state: Any = None


@dataclass
class Stages:
    """Sub-stage marks inside dispatch and combine, for `harness bench`: a lap closes the stage that began at the
    previous lap. With no timer every call is a no-op, so `harness run` pays nothing for it."""

    timer: StageTimer | None = None
    _last: object = None

    def begin(self) -> None:
        if self.timer is not None:
            self._last = self.timer.start()

    def lap(self, name: str) -> None:
        if self.timer is not None:
            self.timer.stop(name, self._last)
            self._last = self.timer.start()


class Comm(abc.ABC):
    """A comm backend: quantize-dispatch into the batched buffers and combine back, with its buffers allocated
    once at full capacity. Subclasses set `name` and implement `dispatch` and `combine`."""

    name: str = ""
    graph_capturable: bool = False  # dispatch and combine read nothing on the host and keep their shapes
    not_captured_why: str | None = None  # why a backend that could capture is timed eager all the same
    combine_recv: torch.Tensor  # the rows combine receives, (P*C, K) in the output dtype; each backend allocates it

    def __init__(self, layout: DispatchLayout, batched: BatchedBuffers, *, harness_bytes: int):
        self.layout = layout
        self.batched = batched
        self.harness_bytes = harness_bytes  # the send/receive staging this backend allocated (dispatch, combine)

    # The experts read these; named as in vLLM's batched format.
    @property
    def expert_x(self) -> torch.Tensor:
        return self.batched.expert_x

    @property
    def expert_x_scale(self) -> torch.Tensor:
        return self.batched.expert_x_scale

    @property
    def expert_src(self) -> torch.Tensor:
        return self.batched.expert_src

    @property
    def expert_num_tokens(self) -> torch.Tensor:
        return self.batched.expert_num_tokens

    @abc.abstractmethod
    def dispatch(
        self,
        tokens: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        quantize: Quantize,
        stages: Stages,
    ) -> DispatchHandle:
        """Quantize `tokens` (n, K) and send each to the ranks of its `topk_ids` (n, top_k) experts."""

    @abc.abstractmethod
    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle, stages: Stages) -> torch.Tensor:
        """Bring the experts' (E, M, K) rows back and return the weighted sum per token, (n, K)."""

    @abc.abstractmethod
    def combine_terms(self, handle: DispatchHandle) -> tuple[torch.Tensor, torch.Tensor]:
        """For the correctness check, after a combine: the rows that came back for this rank's tokens, W per token
        in token order, (n * W, K), and their weights (n, W) float32 (0 on padding), so that the combined output
        is sum_k weights[t, k] * rows[t * W + k]. Here each row is one rank's weighted sum of the token's expert
        rows, so W is the ranks a token went to (padded), and every weight is 1."""
