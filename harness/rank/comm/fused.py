"""Row kernels of the comm path: one pass over the rows each, where torch's eager ops took several.

    bag_sum      out[r] = sum_w weights[r, w] * src[table[r, w]], float32 accumulation; a zero weight is
                 skipped, so a padding cell never reads its row (an unwritten slot may hold anything)
    pack_rows    one send row per (token, destination rank): payload and base.RowFormat's words in one pass
    place_rows   every received row given a slot of each local expert it picked and written there (read once),
                 with its scale and source; the combine bags come out of it

Each has a torch form (any device; the CPU ranks and the reference) and a Triton form (CUDA tensors, where Triton
is importable). `impl` picks: "auto" takes Triton on CUDA tensors and torch elsewhere; "triton" and "torch" force
one. With TRITON_INTERPRET=1 in the environment before Triton is first imported, "triton" runs the Triton form in
Triton's interpreter on CPU tensors: the tests compare the two forms that way on a machine with no GPU, and on
the GPU directly.

The Triton kernels are built on first use (a process that never uses them never imports Triton).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Literal

import torch

from harness.core.units import next_pow2
from harness.rank.comm.base import RowFormat

Impl = Literal["auto", "triton", "torch"]
_BLOCK_SUM = 1024  # elements of a row one bag_sum program reduces
_BLOCK_WORDS = 512  # int64 words of a row one place_rows step moves (4 KiB)
_TORCH_CHUNK_BYTES = 64 * 2**20  # float32 sums the torch form of bag_sum holds at once


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def row_kernels(device: torch.device) -> str:
    """What moves the rows on `device` under impl="auto": "triton <version>" on CUDA where Triton imports, else
    "torch" (the records name it)."""
    if device.type == "cuda" and triton_available():
        import triton

        return f"triton {triton.__version__}"
    return "torch"


def _use_triton(impl: Impl, *tensors: torch.Tensor) -> bool:
    if impl == "torch":
        return False
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' but Triton is not importable here")
        return True
    return all(t.is_cuda for t in tensors) and triton_available()


@functools.cache
def _kernels(interpreted: bool) -> dict[str, Any]:
    """The jitted kernels; built once per process (and once more if the interpreter flag changes)."""
    del interpreted  # the cache key only: triton.jit reads TRITON_INTERPRET when it wraps the function
    import triton
    import triton.language as tl

    @triton.jit
    def bag_sum_kernel(table, weights, src, out, K, src_stride, out_stride, W: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < K
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for w in tl.static_range(W):
            weight = tl.load(weights + r * W + w)
            row = tl.load(table + r * W + w).to(tl.int64)
            if weight != 0.0:
                values = tl.load(src + row * src_stride + offs, mask=mask, other=0.0)
                acc += weight * values.to(tl.float32)
        tl.store(out + r * out_stride + offs, acc.to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def place_rows_kernel(
        rows,
        row_stride,
        ids,
        weights,
        scales,
        sources,
        counts,
        table,
        bag_weights,
        x,
        x_stride,
        x_scale,
        x_src,
        M,
        NUM_WORDS: tl.constexpr,
        k: tl.constexpr,
        KP2: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        r = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, KP2)
        expert = tl.load(ids + r * k + j, mask=j < k, other=-1).to(tl.int64)
        valid = expert >= 0
        slot = tl.atomic_add(counts + expert, 1, mask=valid).to(tl.int64)  # the slot this pair takes
        fits = valid & (slot < M)
        dst = tl.where(fits, expert * M + slot, -1)
        tl.store(table + r * k + j, tl.where(fits, dst, 0), mask=j < k)
        tl.store(
            bag_weights + r * k + j, tl.where(fits, tl.load(weights + r * k + j, mask=fits, other=0.0), 0.0), mask=j < k
        )
        tl.store(x_scale + dst, tl.zeros([KP2], tl.float32) + tl.load(scales + r), mask=fits)
        tl.store(x_src + 2 * dst, tl.zeros([KP2], tl.int32) + tl.load(sources + 2 * r), mask=fits)
        tl.store(x_src + 2 * dst + 1, tl.zeros([KP2], tl.int32) + tl.load(sources + 2 * r + 1), mask=fits)
        for start in tl.static_range(0, NUM_WORDS, BLOCK):  # a row is a few KiB: read once, written k times
            offs = start + tl.arange(0, BLOCK)
            mask = offs < NUM_WORDS
            words = tl.load(rows + r * row_stride + offs, mask=mask)
            for i in tl.static_range(k):
                d = tl.sum(tl.where(j == i, dst, 0))  # pair i's slot row, -1 when it has none here
                if d >= 0:
                    tl.store(x + d * x_stride + offs, words, mask=mask)

    @triton.jit
    def pack_rows_kernel(
        q,
        q_stride,
        scale,
        topk_ids,
        topk_weights,
        selected,
        rows,
        row_words,
        P,
        E,
        rank,
        PAYLOAD_WORDS: tl.constexpr,
        ID_WORDS: tl.constexpr,
        k: tl.constexpr,
        KP2: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        i = tl.program_id(0).to(tl.int64)
        flat = tl.load(selected + i)
        token = flat // P
        dest = flat % P
        row64 = rows + i * row_words  # the row as int64 words
        for start in tl.static_range(0, PAYLOAD_WORDS, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < PAYLOAD_WORDS
            tl.store(row64 + offs, tl.load(q + token * q_stride + offs, mask=mask), mask=mask)
        meta = row64.to(tl.pointer_type(tl.int32)) + 2 * PAYLOAD_WORDS  # the int32 words after the payload
        tl.store(meta, tl.load(scale + token).to(tl.int32, bitcast=True))
        tl.store(meta + 1, token.to(tl.int32))
        tl.store(meta + 2, (token * 0 + rank).to(tl.int32))  # rank may come in as a constant (Triton: 1)
        j = tl.arange(0, KP2)
        expert = tl.load(topk_ids + token * k + j, mask=j < k, other=-1).to(tl.int64)
        here = (expert >= 0) & (expert // E == dest)
        local = tl.where(here, expert % E, -1).to(tl.int32)
        for h in tl.static_range(ID_WORDS):  # int16 ids in pairs, low half first (little-endian), -1 padding
            lo = tl.sum(tl.where(j == 2 * h, local, 0))
            hi = tl.sum(tl.where(j == 2 * h + 1, local, 0)) if 2 * h + 1 < k else -1
            tl.store(meta + 3 + h, (lo & 0xFFFF) | (hi << 16))
        weight = tl.load(topk_weights + token * k + j, mask=j < k, other=0.0).to(tl.float32)
        tl.store(meta + 3 + ID_WORDS + j, tl.where(here, weight, 0.0).to(tl.int32, bitcast=True), mask=j < k)

    return {
        "bag_sum": bag_sum_kernel,
        "place_rows": place_rows_kernel,
        "pack_rows": pack_rows_kernel,
        "cdiv": triton.cdiv,
    }


def _built() -> dict[str, Any]:
    return _kernels(os.environ.get("TRITON_INTERPRET") == "1")


def bag_sum(
    table: torch.Tensor,
    weights: torch.Tensor,
    src: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    impl: Impl = "auto",
) -> torch.Tensor:
    """(R, K) rows: out[r] = sum_w weights[r, w] * src[table[r, w]] in float32, stored in src's dtype.

    table (R, W) int64 row indices of src (N, K); weights (R, W) float32. A cell with weight 0 adds nothing and
    its row is not read: padding may point anywhere inside src.
    """
    R, W = table.shape
    K = src.shape[1]
    if out is None:
        out = torch.empty((R, K), dtype=src.dtype, device=src.device)
    if R == 0:
        return out
    if not _use_triton(impl, table, weights, src, out):
        # Column by column, only the cells with a weight: float32 products and sums (embedding_bag would round
        # each weight to the rows' dtype and multiply a padding cell's row, NaN included, by 0).
        # Row chunks bound the float32 sums (a GPU without Triton takes this form too).
        step = max(1, _TORCH_CHUNK_BYTES // (4 * K))
        for r0 in range(0, R, step):
            t, wts = table[r0 : r0 + step], weights[r0 : r0 + step]
            acc = torch.zeros((t.shape[0], K), dtype=torch.float32, device=src.device)
            for w in range(W):
                rows = torch.nonzero(wts[:, w] != 0).squeeze(1)
                terms = src.index_select(0, t[:, w].index_select(0, rows)).float()
                acc.index_add_(0, rows, terms.mul_(wts[:, w].index_select(0, rows).float().unsqueeze(1)))
            out[r0 : r0 + step].copy_(acc)
        return out
    assert src.stride(1) == 1 and out.stride(1) == 1
    k = _built()
    k["bag_sum"][(R, k["cdiv"](K, _BLOCK_SUM))](
        table.contiguous(),
        weights.float().contiguous(),
        src,
        out,
        K,
        src.stride(0),
        out.stride(0),
        W=W,
        BLOCK=_BLOCK_SUM,
    )
    return out


def place_rows(
    payload: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    scales: torch.Tensor,
    sources: torch.Tensor,
    *,
    x_flat: torch.Tensor,
    x_scale_flat: torch.Tensor,
    x_src_flat: torch.Tensor,
    max_slots: int,
    num_experts: int,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Give every received (row r, pair j) with a local expert ids[r, j] >= 0 the next slot of that expert, and
    write the row there: payload (R, words) int64 into x_flat's row e*M + slot, scales (R,) float32 into
    x_scale_flat, (source rank, token) sources (R, 2) int32 into x_src_flat. A pair past M slots is not written.

    Returns (counts (E,) int32: pairs per expert, M exceeded where it overflowed; table (R, k) int64: each
    pair's slot row, 0 where none; bag weights (R, k) float32: weights[r, j] where placed, else 0).

    Slot order: the torch form gives each expert its pairs in row order; the Triton form takes slots with
    atomics, so the order within an expert may differ between runs (each slot still records its source).
    """
    R, k = ids.shape
    E, M = num_experts, max_slots
    counts = torch.zeros(E, dtype=torch.int32, device=ids.device)
    if R == 0:
        return counts, ids.new_zeros((0, k)), weights.new_zeros((0, k))
    if not _use_triton(impl, payload, ids, x_flat):
        key = torch.where(ids >= 0, ids, E).reshape(-1)  # E: the pair's expert lives on another rank
        sorted_key, pairs = torch.sort(key, stable=True)  # expert-major, row order within
        per_expert = torch.zeros(E + 1, dtype=torch.int64, device=ids.device).index_add_(0, key, torch.ones_like(key))
        rank_in_expert = torch.arange(key.numel(), device=ids.device) - (
            torch.cumsum(per_expert, 0) - per_expert
        ).index_select(0, sorted_key)
        fits = (sorted_key < E) & (rank_in_expert < M)
        dst = torch.empty_like(key).scatter_(0, pairs, torch.where(fits, sorted_key * M + rank_in_expert, -1))
        placed = dst >= 0
        row = torch.div(torch.arange(key.numel(), device=ids.device), k, rounding_mode="floor")[placed]
        slot = dst[placed]
        x_flat.index_copy_(0, slot, payload.index_select(0, row))
        x_scale_flat.index_copy_(0, slot, scales.index_select(0, row))
        x_src_flat.index_copy_(0, slot, sources.index_select(0, row))
        counts.copy_(per_expert[:E])
        placed = placed.view(R, k)
        return counts, torch.where(placed, dst.view(R, k), 0), torch.where(placed, weights, 0.0)
    assert payload.stride(1) == 1 and x_flat.is_contiguous() and sources.is_contiguous()
    assert x_src_flat.is_contiguous() and x_scale_flat.is_contiguous()
    table = torch.empty((R, k), dtype=torch.int64, device=ids.device)
    bag_weights = torch.empty((R, k), dtype=torch.float32, device=ids.device)
    _built()["place_rows"][(R,)](
        payload,
        payload.stride(0),
        ids.contiguous(),
        weights.float().contiguous(),
        scales.contiguous(),
        sources,
        counts,
        table,
        bag_weights,
        x_flat,
        x_flat.stride(0),
        x_scale_flat,
        x_src_flat,
        M,
        NUM_WORDS=payload.shape[1],
        k=k,
        KP2=next_pow2(k),
        BLOCK=_BLOCK_WORDS,
    )
    return counts, table, bag_weights


def pack_rows(
    q_words: torch.Tensor,
    scale: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    selected: torch.Tensor,
    rows: torch.Tensor,
    *,
    fmt: RowFormat,
    num_ranks: int,
    num_local_experts: int,
    rank: int,
    impl: Impl = "auto",
) -> None:
    """Write send row i for selected[i] = token * P + destination: the token's FP8 payload (q_words (n, K/8)
    int64), then base.RowFormat's words (scale, token, this rank, the destination's local expert ids as int16
    pairs, their weights; -1 and 0 where a top-k slot is on another rank). rows: (len(selected), row_bytes) uint8.
    """
    P, E, k = num_ranks, num_local_experts, fmt.top_k
    num_send = selected.numel()
    if num_send == 0:
        return
    if not _use_triton(impl, q_words, selected, rows):
        token = torch.div(selected, P, rounding_mode="floor")
        dst = selected % P
        torch.index_select(q_words, 0, token, out=rows.view(torch.int64)[:, : fmt.payload_words])
        ids = topk_ids.index_select(0, token)
        here = torch.div(ids, E, rounding_mode="floor") == dst.unsqueeze(1)
        local = torch.where(here, ids % E, -1).to(torch.int16)
        if k % 2:  # int16 ids travel as int32 pairs
            local = torch.cat([local, local.new_full((num_send, 1), -1)], dim=1)
        weights = torch.where(here, topk_weights.index_select(0, token), 0.0).float()
        meta = torch.cat(
            [
                scale.reshape(-1).index_select(0, token).view(torch.int32).unsqueeze(1),
                token.to(torch.int32).unsqueeze(1),
                torch.full((num_send, 1), rank, dtype=torch.int32, device=rows.device),
                local.view(torch.int32),
                weights.view(torch.int32),
            ],
            dim=1,
        )
        start = fmt.hidden_size // 4
        rows.view(torch.int32)[:, start : start + fmt.meta_words].copy_(meta)
        return
    assert q_words.stride(1) == 1 and rows.is_contiguous() and fmt.row_bytes % 8 == 0
    _built()["pack_rows"][(num_send,)](
        q_words,
        q_words.stride(0),
        scale.reshape(-1).float().contiguous(),
        topk_ids.contiguous(),
        topk_weights.float().contiguous(),
        selected.contiguous(),
        rows.view(torch.int64),
        fmt.row_bytes // 8,
        P,
        E,
        rank,
        PAYLOAD_WORDS=fmt.payload_words,
        ID_WORDS=fmt.id_words,
        k=k,
        KP2=next_pow2(k),
        BLOCK=_BLOCK_WORDS,
    )
