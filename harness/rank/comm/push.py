"""Device-side kernels of symm-mem's path: rows and counts pushed into the peers' buffers, release/acquire flags.

    route_layout   (n, k) topk ids -> each pair's position among this rank's pairs for its expert (token order),
                   each token's row index per destination rank (token order), and the counts; in 16-token chunks
                   (count, scan over chunks, place), no sort, no host read; optionally a Wait run first (by the
                   scan's program 0)
    quantize_push  per token: the bf16 row read once, FP8 and its scale computed (bit-equal to
                   harness.rank.quant.quantize_per_token); one row per other destination rank written straight
                   into that rank's receive buffer (PushFormat: payload, scale, token, the destination's local
                   expert ids, the pairs' positions, their weights), and this rank's own pairs written straight
                   into its slots (Slots) with their combine table; optionally a Signal from its last program
    signal         per destination: this rank's counts pushed into its count buffer, then a release store of the
                   epoch into its flag pad
    wait           spin (acquire) until every peer's flag reached the epoch; a wait that runs past its spin
                   budget sets a status word instead of hanging the GPU
    expert_base    received counts -> each (source, expert)'s first slot (sources in source_order: this rank's
                   own first), expert_num_tokens and the overflow count; optionally the Wait that publishes the
                   counts, first
    expand         per row received from another rank: read once, written to slot base[src, e] + position of
                   each local expert e it picked (deterministic), with scale and source; its combine table
    reduce_push    per received row: the weighted sum of its experts' outputs (float32), one bf16 partial pushed
                   into the source rank's combine buffer; optionally a Signal from its last program
    token_reduce   per token: the partials of the ranks it went to, summed in rank order (float32)

Every kernel has a torch form (the reference; tests compare the two) and a Triton form (push_kernels.py).
quantize_push, expand and reduce_push stride over their rows with one resident wave of programs
(grid_programs), so a signal from the last program to finish (push_kernels.last_done: one counter increment a
program) stays cheap; docs/comm.md has why a signal from inside a kernel is ordered after every program's stores.
Buffers of "the peers" are reached through tables of device addresses (`*_ptrs`, (P,) int64): on the GPU those
of torch's symmetric memory (harness.rank.comm.symm_mem), in the CPU tests plain tensors of one process standing
in for P ranks, run by Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.comm_buffers import ROUTE_BLOCK_TOKENS, padded_row_bytes, push_meta_words, route_chunks
from harness.core.units import next_pow2
from harness.rank.quant import FP8_MAX

# Flag slots on each rank's pad (int32 words from FLAG_BASE): slot phase * P + peer holds the last epoch that
# peer completed in that phase towards this rank.
READY, CONSUMED, COMBINED = 0, 1, 2
NUM_PHASES = 3
FLAG_BASE = 256  # words below it are left to torch's own symmetric-memory barrier (channel * P + rank)
DEFAULT_MAX_SPINS = 1 << 26  # a wait past this many polls (seconds on NVLink) gives up and sets the status
_BLOCK_T = ROUTE_BLOCK_TOKENS  # tokens of one route_layout chunk (harness.core.comm_buffers)
_BLOCK_SUM = 1024  # elements of a row one reduce program sums
# torch on CUDA computes `amax / FP8_MAX` (a Python scalar divisor) as amax * float32(1 / FP8_MAX)
# (aten's div_true_kernel_cuda); on CPU it divides. The fused quantize does what torch does on the tensor's device.
INV_FP8_MAX = float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(FP8_MAX, dtype=torch.float32))


@dataclass(frozen=True, kw_only=True)
class PushFormat:
    """One row on the link per (token, destination rank):

        bytes [0, K)          the token's FP8 values
        int32 word 0 after    scale (float32 bits)
        word 1                source token
        words 2 .. 2+k        the destination's local expert id of each top-k slot, -1 where it is elsewhere
        words 2+k .. 2+2k     the pair's position among the source's pairs for that expert (token order)
        words 2+2k .. 2+3k    the top-k weights (float32 bits; 0 where elsewhere)

    padded to 16 bytes."""

    hidden_size: int
    top_k: int

    @property
    def meta_words(self) -> int:
        return push_meta_words(self.top_k)

    @property
    def row_bytes(self) -> int:
        return padded_row_bytes(self.hidden_size, self.meta_words)


@functools.cache
def _kernels(interpreted: bool) -> dict[str, Any]:
    """The kernels as Triton wrapped them under this TRITON_INTERPRET (a change re-imports them)."""
    import importlib

    import harness.rank.comm.push_kernels as module

    if getattr(module, "INTERPRETED", interpreted) != interpreted:
        module = importlib.reload(module)
    module.INTERPRETED = interpreted  # type: ignore[attr-defined]
    return module.KERNELS


# Programs per SM of the grid-stride kernels (quantize_push, expand, reduce_push): as many as stay resident, so
# the grid is one wave and their signal's last-program count (one atomic per program on one word) stays small.
PROGRAMS_PER_SM = 16
INTERPRETED_PROGRAMS = 3  # the interpreter's grid: fewer programs than rows, so the tests run the strides


def grid_programs(rows: int, device: torch.device, *, per_sm: int = PROGRAMS_PER_SM) -> int:
    """Programs of a grid-stride kernel over `rows` rows: at most one resident wave of the device."""
    if device.type != "cuda":
        return max(1, min(rows, INTERPRETED_PROGRAMS))
    return max(1, min(rows, per_sm * _sm_count(device.index if device.index is not None else 0)))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernels() -> dict[str, Any]:
    return _kernels(_interpreted())


# ------------------------------------------------------------------ the torch forms (the reference)


def route_layout_torch(
    ids: torch.Tensor, *, num_local_experts: int, num_ranks: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pos (n, k) int32: each pair's place among the pairs for its global expert, token order (0 where the id
    is negative); row_index (n, P) int32: the token's row among those to rank d, token order, -1 where it does
    not go; counts (G + P,) int32: pairs per global expert, then rows per destination)."""
    n, _k = ids.shape
    E, P = num_local_experts, num_ranks
    G = E * P
    valid = ids >= 0
    onehot = torch.zeros((n, G + 1), dtype=torch.int32, device=ids.device)
    onehot.scatter_(1, torch.where(valid, ids, G), 1)
    before = torch.cumsum(onehot, 0) - onehot
    pos = torch.where(valid, before.gather(1, torch.where(valid, ids, G)), 0).to(torch.int32)
    member = torch.zeros((n, P + 1), dtype=torch.int32, device=ids.device)
    member.scatter_(1, torch.where(valid, torch.div(ids, E, rounding_mode="floor"), P), 1)
    member = member[:, :P]
    row_index = torch.where(member > 0, torch.cumsum(member, 0) - member, -1).to(torch.int32)
    counts = torch.cat([onehot[:, :G].sum(0), member.sum(0)]).to(torch.int32)
    return pos, row_index, counts


@dataclass(frozen=True)
class Mapped:
    """One symmetric buffer as this rank reaches every rank's copy: `tensors[p]` (rank p's, mapped here) and
    their device addresses `ptrs` (P,) int64 for the Triton form."""

    tensors: list[torch.Tensor]
    ptrs: torch.Tensor

    @classmethod
    def of(cls, tensors: list[torch.Tensor], device: torch.device) -> Mapped:
        return cls(
            tensors=list(tensors), ptrs=torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)
        )


@dataclass(frozen=True, kw_only=True)
class Slots:
    """The receiving rank's side of a dispatch: the batched buffers and the combine table.

    x (E*M, K) uint8       the FP8 rows, slot e*M + j for the j-th pair of local expert e
    scale (E*M,) float32   their scales
    src (E*M, 2) int32     (source rank, source token) of each slot
    table (P*C, k) int64   per received row (source s's rows at [s*C, s*C + C)): its pairs' slots, 0 where none
    table_w (P*C, k) f32   their weights, 0 where none
    tok (P*C,) int32       the row's source token
    max_slots              M: a pair past it is dropped (counted as overflow by expert_base)"""

    x: torch.Tensor
    scale: torch.Tensor
    src: torch.Tensor
    table: torch.Tensor
    table_w: torch.Tensor
    tok: torch.Tensor
    max_slots: int

    def fill_torch(
        self,
        *,
        source: int,
        ids: torch.Tensor,
        slot: torch.Tensor,
        payload: torch.Tensor,
        scale: torch.Tensor,
        token: torch.Tensor,
        weights: torch.Tensor,
        received: torch.Tensor,
    ) -> None:
        """The torch form of placing R rows of one source: ids (R, k) local expert ids (-1 where elsewhere),
        slot (R, k) each pair's slot within its expert, payload (R, K) uint8, scale (R,) float32, token (R,),
        weights (R, k) float32, received (R,) the rows' indices in the combine table. A pair past M is dropped."""
        M = self.max_slots
        ok = (ids >= 0) & (slot < M)
        dst = torch.where(ok, ids * M + slot, 0)
        r, j = torch.nonzero(ok, as_tuple=True)
        at = dst[r, j]
        self.x.index_copy_(0, at, payload[r])
        self.scale.index_copy_(0, at, scale[r])
        self.src.index_copy_(0, at, torch.stack([torch.full_like(token[r], source), token[r]], 1).to(torch.int32))
        self.table.index_copy_(0, received, dst)
        self.table_w.index_copy_(0, received, torch.where(ok, weights, 0.0))
        self.tok.index_copy_(0, received, token.to(torch.int32))


def recv_region(src: int, dst: int, num_ranks: int) -> int:
    """Where rank src's rows sit in rank dst's receive buffer ((P-1)*C rows, C per region): region
    (src - dst - 1) mod P, so dst's regions hold the other ranks in source_order(dst)[1:]; a rank's own pairs
    never pass through its receive buffer."""
    assert src != dst
    return (src - dst - 1) % num_ranks


def source_order(rank: int, num_ranks: int) -> list[int]:
    """The order in which an expert's slots take the sources' pairs: this rank's own first (it writes them in
    quantize_push, where its first slot is 0), then the others in rank order after it."""
    return [(rank + i) % num_ranks for i in range(num_ranks)]


def _triton(impl: str, *tensors: torch.Tensor) -> bool:
    from harness.rank.comm.fused import _use_triton

    return _use_triton(impl, *tensors)  # type: ignore[arg-type]


def route_layout(
    ids: torch.Tensor,
    pos: torch.Tensor,
    row_index: torch.Tensor,
    counts: torch.Tensor,
    *,
    num_local_experts: int,
    num_ranks: int,
    scratch: torch.Tensor | None = None,
    wait_first: Wait | None = None,
    impl: str = "auto",
) -> None:
    """Fill pos (C, k), row_index (C, P) and counts (G + P,) int32 for ids (n, k) int64 (route_layout_torch
    says what each holds); rows past n are left as they are. scratch: (2, route_chunks(C), G + P) int32 (each
    chunk's counts and first places), allocated here when not given. In token chunks: count, scan over chunks,
    place. wait_first: a wait the kernels after this call are ordered behind (the scan's program 0 runs it)."""
    n, k = ids.shape
    E, P = num_local_experts, num_ranks
    G, W = E * P, E * P + P
    if not _triton(impl, ids, pos):
        if wait_first is not None:
            wait_first.run_torch()
        p, r, c = route_layout_torch(ids, num_local_experts=E, num_ranks=P)
        pos[:n].copy_(p)
        row_index[:n].copy_(r)
        counts.copy_(c)
        return
    NC = route_chunks(n)
    if scratch is None:
        scratch = torch.empty((2, NC, W), dtype=torch.int32, device=ids.device)
    hist, base = scratch[0], scratch[1]
    ids = ids.contiguous()
    args = (ids, n, hist, base, pos, row_index, G, E, P, W)
    shape = dict(K_TOP=k, KP2=next_pow2(k), BLOCK_T=_BLOCK_T, PP2=next_pow2(P), BINS=next_pow2(G + 1))
    kern = kernels()
    kern["route_chunk"][(NC,)](*args, **shape, PLACE=False)
    w = wait_first
    wait_args = w.args() if w is not None else (counts, 0, 0, counts, counts, 0)
    kern["route_scan"][(W,)](
        hist,
        base,
        counts,
        NC,
        W,
        *wait_args,
        NCP2=next_pow2(NC),
        WAIT=w is not None,
        BUMP=w is not None and w.bump,
        LAG=w.lag if w is not None else 0,
    )
    kern["route_chunk"][(NC,)](*args, **shape, PLACE=True)


def quantize_push(
    x: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    weights: torch.Tensor,
    pos: torch.Tensor,
    row_index: torch.Tensor,
    rows: Mapped,
    slots: Slots,
    *,
    fmt: PushFormat,
    rank: int,
    capacity: int,
    num_local_experts: int,
    then: Signal | None = None,
    impl: str = "auto",
) -> None:
    """Each token t < n read once; per destination d with row_index[t, d] >= 0:

    - d another rank: one PushFormat row into d's receive buffer rows.tensors[d] ((P-1)*C, row_bytes) uint8, at
      row recv_region(rank, d)*C + row_index[t, d] (d's expand puts it in its slots);
    - d this rank: the FP8 row straight into this rank's slots, slot pos[t, j] of each local expert it picked
      (this rank's pairs come first in every expert: source_order), with scale, (rank, t) and the combine table
      of received row rank*C + row_index[t, rank], what expand does for the other sources' rows.

    x: (n, K) bf16 with scale None (quantized here, bit-equal to quantize_per_token), or (n, K) FP8 with its
    scale (n, 1) float32. ids, weights: (n, k) int64 / float32; pos, row_index from route_layout. then: a
    signal the kernel's last program issues after every row is stored."""
    n, K = x.shape
    k, E, P, C, M = fmt.top_k, num_local_experts, row_index.shape[1], capacity, slots.max_slots
    if n == 0:
        if then is not None:
            issue(then, impl=impl)
        return
    if not _triton(impl, x, ids, rows.ptrs):
        from harness.rank.quant import quantize_per_token

        q, s = quantize_per_token(x) if scale is None else (x, scale)
        s = s.reshape(-1).float()
        here_all = torch.div(ids, E, rounding_mode="floor")
        for d in range(P):
            r = row_index[:n, d].to(torch.int64)
            sel = torch.nonzero(r >= 0).squeeze(1)
            here = (ids.index_select(0, sel) >= 0) & (here_all.index_select(0, sel) == d)
            w_here = torch.where(here, weights.index_select(0, sel).float(), 0.0)
            if d == rank:  # this rank's own pairs: their first slot is 0 (source_order)
                slots.fill_torch(
                    source=rank,
                    ids=torch.where(here, ids.index_select(0, sel) % E, -1),
                    slot=pos[:n].index_select(0, sel).to(torch.int64),
                    payload=q.index_select(0, sel).view(torch.uint8),
                    scale=s.index_select(0, sel),
                    token=sel,
                    weights=w_here,
                    received=rank * C + r.index_select(0, sel),
                )
                continue
            dst = rows.tensors[d].view((P - 1) * C, fmt.row_bytes)
            out = torch.zeros((sel.numel(), fmt.row_bytes), dtype=torch.uint8, device=x.device)
            out[:, :K] = q.index_select(0, sel).view(torch.uint8)
            words = torch.cat(
                [
                    s.index_select(0, sel).view(torch.int32).unsqueeze(1),
                    sel.to(torch.int32).unsqueeze(1),
                    torch.where(here, ids.index_select(0, sel) % E, -1).to(torch.int32),
                    torch.where(here, pos[:n].index_select(0, sel), 0).to(torch.int32),
                    w_here.view(torch.int32),
                ],
                dim=1,
            )
            out[:, K : K + 4 * fmt.meta_words] = words.contiguous().view(torch.uint8)
            dst.index_copy_(0, recv_region(rank, d, P) * C + r.index_select(0, sel), out)
        if then is not None:
            then.run_torch()
        return
    assert K % 4 == 0 and x.stride(1) == 1
    if scale is None:
        assert x.dtype == torch.bfloat16
    else:
        x = x.view(torch.uint8).view(torch.int32)  # the FP8 bytes as words of 4
    sig_args, push_counts = (rows.ptrs, 0, rows.ptrs, rows.ptrs, rows.ptrs, rows.ptrs), False
    if then is not None:
        pad_ptrs, slot, epoch, done = then.kernel_args()
        push_counts = then.pushes_counts
        sig_args = (pad_ptrs, slot, epoch, *then.count_args(), done)
    warps = 8 if K >= 4096 else 4
    kernels()["quantize_push"][(grid_programs(n, x.device, per_sm=64 // warps),)](
        x,
        x.stride(0),
        scale if scale is not None else x,
        INV_FP8_MAX,
        ids.contiguous(),
        weights.float().contiguous(),
        pos,
        row_index,
        rows.ptrs,
        rank,
        C,
        E,
        P,
        n,
        slots.x.view(torch.int32),
        slots.scale,
        slots.src,
        slots.table,
        slots.table_w,
        slots.tok,
        M,
        *sig_args,
        K=K,
        ROW_BYTES=fmt.row_bytes,
        QUANTIZE=scale is None,
        RECIPROCAL=x.is_cuda,
        NATIVE_FP8=not _interpreted(),
        BLOCK_W=next_pow2(K // 4),
        K_TOP=k,
        KP2=next_pow2(k),
        SIGNAL=then is not None,
        PUSH_COUNTS=push_counts,
        EP2=next_pow2(E),
        num_warps=warps,
    )


@dataclass(frozen=True, kw_only=True)
class Wait:
    """A wait (acquire) until every peer s's flag (phase, s) on this rank's pad ((words,) int32) is at least
    epoch - lag; `bump` first advances the epoch (the start of a dispatch). A wait past max_spins polls sets bit
    s of status ((1,) int32) and goes on: the rank reports it instead of the GPU hanging."""

    pad: torch.Tensor
    phase: int
    num_ranks: int
    epoch: torch.Tensor
    status: torch.Tensor
    bump: bool = False
    lag: int = 0
    max_spins: int = DEFAULT_MAX_SPINS

    @property
    def slot(self) -> int:
        return FLAG_BASE + self.phase * self.num_ranks

    def args(self) -> tuple:
        """The Triton kernels' wait arguments: pad, slot, P, epoch, status, max_spins."""
        return self.pad, self.slot, self.num_ranks, self.epoch, self.status, self.max_spins

    def run_torch(self) -> None:
        P = self.num_ranks
        if self.bump:
            self.epoch.add_(1)
        flags = self.pad.view(-1)[self.slot : self.slot + P]
        late = (flags < self.epoch.view(-1)[0] - self.lag).to(torch.int32)
        bits = (late << torch.arange(P, dtype=torch.int32, device=self.pad.device)).sum().view(1)
        self.status.bitwise_or_(bits.to(self.status.dtype))


@dataclass(frozen=True, kw_only=True)
class Signal:
    """For every rank d: (with counts) this rank's counts for d into d's recv_counts[rank] ((P, E+1) int32:
    pairs per local expert, then rows), then the epoch into d's pad at flag slot (phase, rank), with release
    order. Issued by a kernel's last program to finish, it needs `done`: (1,) int32, 0 between launches, one per
    kernel that signals."""

    pads: Mapped
    phase: int
    rank: int
    epoch: torch.Tensor
    done: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    recv_counts: Mapped | None = None
    num_local_experts: int = 1

    @property
    def num_ranks(self) -> int:
        return len(self.pads.tensors)

    @property
    def slot(self) -> int:
        return FLAG_BASE + self.phase * self.num_ranks

    @property
    def pushes_counts(self) -> bool:
        return self.counts is not None and self.recv_counts is not None

    def run_torch(self) -> None:
        P, E = self.num_ranks, self.num_local_experts
        for d in range(P):
            if self.counts is not None and self.recv_counts is not None:
                row = self.recv_counts.tensors[d].view(P, E + 1)[self.rank]
                row[:E].copy_(self.counts[d * E : (d + 1) * E])
                row[E] = self.counts[E * P + d]
            self.pads.tensors[d].view(-1)[self.slot + self.rank] = self.epoch.view(-1)[0]

    def count_args(self) -> tuple:
        """The kernels' counts and counts_ptrs: this rank's counts and the peers' count buffers, or placeholders
        (the pad pointers) where the signal pushes none."""
        if self.counts is not None and self.recv_counts is not None:
            return self.counts, self.recv_counts.ptrs
        return self.epoch, self.pads.ptrs

    def kernel_args(self) -> tuple:
        """What a kernel that ends with this signal takes: pad_ptrs, slot, epoch, done."""
        assert self.done is not None, "a kernel's signal needs its done counter"
        return self.pads.ptrs, self.slot, self.epoch, self.done


def signal(
    pads: Mapped,
    phase: int,
    *,
    rank: int,
    epoch: torch.Tensor,
    counts: torch.Tensor | None = None,
    recv_counts: Mapped | None = None,
    num_local_experts: int = 1,
    impl: str = "auto",
) -> None:
    """Signal (see Signal) as a kernel of its own."""
    issue(
        Signal(
            pads=pads,
            phase=phase,
            rank=rank,
            epoch=epoch,
            counts=counts,
            recv_counts=recv_counts,
            num_local_experts=num_local_experts,
        ),
        impl=impl,
    )


def issue(sig: Signal, *, impl: str = "auto") -> None:
    """Run a Signal as a kernel of its own (its done counter, if any, is not used)."""
    if not _triton(impl, sig.epoch, sig.pads.ptrs):
        return sig.run_torch()
    E, P = sig.num_local_experts, sig.num_ranks
    kernels()["signal"][(1,)](
        sig.pads.ptrs,
        sig.slot,
        sig.rank,
        sig.epoch,
        *sig.count_args(),
        E,
        E * P,
        P,
        PUSH_COUNTS=sig.pushes_counts,
        EP2=next_pow2(E),
    )


def wait(
    pad: torch.Tensor,
    phase: int,
    *,
    num_ranks: int,
    epoch: torch.Tensor,
    status: torch.Tensor,
    bump: bool = False,
    lag: int = 0,
    max_spins: int = DEFAULT_MAX_SPINS,
    impl: str = "auto",
) -> None:
    """Wait (see Wait) as a kernel of its own."""
    w = Wait(
        pad=pad, phase=phase, num_ranks=num_ranks, epoch=epoch, status=status, bump=bump, lag=lag, max_spins=max_spins
    )
    if not _triton(impl, pad, epoch):
        return w.run_torch()
    kernels()["wait"][(1,)](*w.args(), BUMP=bump, LAG=lag)


def expert_base(
    recv_counts: torch.Tensor,
    base: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    overflow: torch.Tensor,
    *,
    rank: int,
    max_slots: int,
    wait_first: Wait | None = None,
    impl: str = "auto",
) -> None:
    """recv_counts (P, E+1) int32 -> base (P, E) int32 (exclusive sums over the sources in source_order(rank):
    this rank's own pairs from slot 0), expert_num_tokens (E,) = min(total, M); overflow (1,) int64 += the pairs
    past M. wait_first: the wait for the flags that publish recv_counts, run first by the same program (it may
    not bump the epoch)."""
    P, E = recv_counts.shape[0], recv_counts.shape[1] - 1
    w = wait_first
    assert w is None or not w.bump
    if not _triton(impl, recv_counts, base):
        if w is not None:
            w.run_torch()
        order = torch.tensor(source_order(rank, P), device=recv_counts.device)
        c = recv_counts[:, :E].to(torch.int64).index_select(0, order)
        base.index_copy_(0, order, (torch.cumsum(c, 0) - c).to(base.dtype))
        total = c.sum(0)
        expert_num_tokens.copy_(total.clamp(max=max_slots))
        overflow.view(-1).add_((total - max_slots).clamp(min=0).sum())
        return
    wait_args = (w.pad, w.slot, w.epoch, w.status, w.max_spins) if w is not None else (base, 0, base, base, 0)
    kernels()["expert_base"][(1,)](
        recv_counts,
        base,
        expert_num_tokens,
        overflow,
        rank,
        P,
        E,
        max_slots,
        *wait_args,
        EP2=next_pow2(E),
        WAIT=w is not None,
        LAG=w.lag if w is not None else 0,
    )


def expand(
    recv_rows: torch.Tensor,
    recv_counts: torch.Tensor,
    base: torch.Tensor,
    slots: Slots,
    *,
    rank: int,
    fmt: PushFormat,
    impl: str = "auto",
) -> None:
    """Every row received from another rank s (recv_rows ((P-1)*C, row_bytes) uint8, rows [q*C, q*C +
    recv_counts[s, E]) with q = recv_region(s, rank)) written to slot base[s, e] + position of each local expert
    e it names in slots.x, with its scale and (s, token), and its entries of the combine table (slots.table,
    table_w, tok); a slot past M is dropped. This rank's own rows are not here: quantize_push wrote them. At
    P = 1 there is nothing to expand and no kernel runs. Its CONSUMED signal is a kernel of its own (signal):
    inside it, on the H200 it cost more than the launch it saves."""
    P, E1 = recv_counts.shape
    E, M, k, K = E1 - 1, slots.max_slots, fmt.top_k, fmt.hidden_size
    C = slots.tok.shape[0] // P
    if P == 1:
        return
    if not _triton(impl, recv_rows, recv_counts):
        recv = recv_rows.view((P - 1) * C, fmt.row_bytes)
        words = recv[:, K : K + 4 * fmt.meta_words].contiguous().view(torch.int32)
        for s in source_order(rank, P)[1:]:
            nrows = int(recv_counts[s, E])
            q = recv_region(s, rank, P) * C
            w = words[q : q + nrows]
            ids, pos = w[:, 2 : 2 + k].to(torch.int64), w[:, 2 + k : 2 + 2 * k].to(torch.int64)
            slot = base[s].to(torch.int64).index_select(0, ids.clamp(min=0).reshape(-1)).view(-1, k) + pos
            slots.fill_torch(
                source=s,
                ids=ids,
                slot=slot,
                payload=recv[q : q + nrows, :K],
                scale=w[:, 0].view(torch.float32),
                token=w[:, 1],
                weights=w[:, 2 + 2 * k :].view(torch.float32),
                received=torch.arange(s * C, s * C + nrows, device=recv_rows.device),
            )
        return
    kernels()["expand"][(grid_programs((P - 1) * C, recv_rows.device),)](
        recv_rows,
        recv_counts,
        base,
        slots.x,
        slots.scale,
        slots.src,
        slots.table,
        slots.table_w,
        slots.tok,
        rank,
        C,
        E,
        M,
        P,
        K=K,
        ROW_BYTES=fmt.row_bytes,
        BLOCK_W=min(512, next_pow2(K // 8)),
        K_TOP=k,
    )


def reduce_push(
    expert_out: torch.Tensor,
    recv_counts: torch.Tensor,
    table: torch.Tensor,
    table_w: torch.Tensor,
    tok: torch.Tensor,
    out: Mapped,
    *,
    rank: int,
    then: Signal | None = None,
    impl: str = "auto",
) -> None:
    """For each received row of source s: sum_j table_w * expert_out[table] (float32; a zero weight reads
    nothing) as one bf16 row, pushed into rank s's combine buffer out.tensors[s] (P*C, K) at row rank*C + token.
    expert_out (E*M, K) bf16. then: a signal (no counts) the kernel's last program issues after every push."""
    P, E1 = recv_counts.shape
    E, K = E1 - 1, expert_out.shape[1]
    C, k = table.shape[0] // P, table.shape[1]
    if not _triton(impl, expert_out, table):
        from harness.rank.comm.fused import bag_sum

        for s in range(P):
            nrows = int(recv_counts[s, E])
            rows = slice(s * C, s * C + nrows)
            partial = bag_sum(table[rows], table_w[rows], expert_out, impl="torch")
            out.tensors[s].view(P * C, K).index_copy_(0, rank * C + tok[rows].to(torch.int64), partial)
        if then is not None:
            then.run_torch()
        return
    assert expert_out.is_contiguous()
    assert then is None or not then.pushes_counts
    pad_ptrs, slot, epoch, done = then.kernel_args() if then is not None else (tok, 0, tok, tok)
    nb = -(-K // _BLOCK_SUM)
    grid = (grid_programs(P * C, expert_out.device, per_sm=max(1, PROGRAMS_PER_SM // nb)), nb)
    kernels()["reduce_push"][grid](
        expert_out,
        recv_counts,
        table,
        table_w,
        tok,
        out.ptrs,
        rank,
        C,
        E,
        K,
        pad_ptrs,
        slot,
        epoch,
        done,
        P,
        K_TOP=k,
        BLOCK=_BLOCK_SUM,
        SIGNAL=then is not None,
    )


def token_reduce(
    partials: torch.Tensor, row_index: torch.Tensor, out: torch.Tensor, *, impl: str = "auto"
) -> torch.Tensor:
    """out[t] (n, K) = sum over ranks d with row_index[t, d] >= 0 of partials[d*C + t] ((P*C, K) bf16), in rank
    order, float32."""
    n, K = out.shape
    P = row_index.shape[1]
    C = partials.shape[0] // P
    if n == 0:
        return out
    if not _triton(impl, partials, out):
        member = (row_index[:n] >= 0).T.unsqueeze(2)  # (P, n, 1)
        rows = partials.view(P, C, K)[:, :n].float()
        acc = torch.zeros((n, K), dtype=torch.float32, device=out.device)
        for d in range(P):  # rank order, as the Triton form sums
            acc += torch.where(member[d], rows[d], 0.0)
        return out.copy_(acc)
    kernels()["token_reduce"][(n, -(-K // _BLOCK_SUM))](partials, row_index, out, C, P, K, BLOCK=_BLOCK_SUM)
    return out
