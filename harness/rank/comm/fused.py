"""Row kernels of the comm path: one pass over the rows each, where torch's eager ops took several.

    bag_sum      out[r] = sum_w weights[r, w] * src[table[r, w]], float32 accumulation; a zero weight is
                 skipped, so a padding cell never reads its row (an unwritten slot may hold anything)
    place_rows   every received row written once into each batched slot it fills, with its scale and source

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
import torch.nn.functional as F

Impl = Literal["auto", "triton", "torch"]
_BLOCK_SUM = 1024  # elements of a row one bag_sum program reduces
_BLOCK_WORDS = 512  # int64 words of a row one place_rows step moves (4 KiB)


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


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
    def bag_sum_kernel(table, weights, src, out, K, src_stride, out_stride,
                       W: tl.constexpr, BLOCK: tl.constexpr):
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
    def place_rows_kernel(rows, row_stride, slots, sink, scales, sources, x, x_stride, x_scale, x_src,
                          NUM_WORDS: tl.constexpr, k: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        scale = tl.load(scales + r)
        src_rank = tl.load(sources + 2 * r)
        src_token = tl.load(sources + 2 * r + 1)
        for j in tl.static_range(k):
            slot = tl.load(slots + r * k + j)
            if slot != sink:
                tl.store(x_scale + slot, scale)
                tl.store(x_src + 2 * slot, src_rank)
                tl.store(x_src + 2 * slot + 1, src_token)
        for start in tl.static_range(0, NUM_WORDS, BLOCK):  # a row is a few KiB: unrolled
            offs = start + tl.arange(0, BLOCK)
            mask = offs < NUM_WORDS
            words = tl.load(rows + r * row_stride + offs, mask=mask)
            for j in tl.static_range(k):
                slot = tl.load(slots + r * k + j)
                tl.store(x + slot * x_stride + offs, words, mask=mask & (slot != sink))

    return {"bag_sum": bag_sum_kernel, "place_rows": place_rows_kernel, "cdiv": triton.cdiv}


def _built() -> dict[str, Any]:
    return _kernels(os.environ.get("TRITON_INTERPRET") == "1")


def bag_sum(table: torch.Tensor, weights: torch.Tensor, src: torch.Tensor, *, out: torch.Tensor | None = None,
            impl: Impl = "auto") -> torch.Tensor:
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
        used = weights != 0
        safe = torch.where(used, table, 0)  # a padding cell's index may be anything: read row 0 at weight 0
        if src.is_cuda:  # embedding_bag's CUDA kernel: float accumulation, weights in the rows' dtype
            out.copy_(F.embedding_bag(safe, src, mode="sum", per_sample_weights=weights.to(src.dtype)))
        else:  # float32 products and sum on CPU (CPU embedding_bag rounds each product to bf16)
            terms = src.index_select(0, safe.reshape(-1)).view(R, W, K).float() * weights.unsqueeze(-1)
            out.copy_(terms.masked_fill_(~used.unsqueeze(-1), 0).sum(1))
        return out
    assert src.stride(1) == 1 and out.stride(1) == 1
    k = _built()
    k["bag_sum"][(R, k["cdiv"](K, _BLOCK_SUM))](
        table.contiguous(), weights.float().contiguous(), src, out, K, src.stride(0), out.stride(0),
        W=W, BLOCK=_BLOCK_SUM)
    return out


def place_rows(payload: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor, sources: torch.Tensor, *,
               x_flat: torch.Tensor, x_scale_flat: torch.Tensor, x_src_flat: torch.Tensor, sink: int,
               impl: Impl = "auto") -> None:
    """Write received row r into every slot slots[r, j] != sink: its payload (R, words) int64 into x_flat's row,
    its scale (R,) float32 into x_scale_flat, its (source rank, token) (R, 2) int32 into x_src_flat."""
    R, k = slots.shape
    if R == 0:
        return
    if not _use_triton(impl, payload, slots, x_flat):
        flat = slots.reshape(-1)
        keep = flat != sink
        row = torch.arange(R, device=slots.device).repeat_interleave(k)[keep]
        slot = flat[keep]
        x_flat.index_copy_(0, slot, payload.index_select(0, row))
        x_scale_flat.index_copy_(0, slot, scales.index_select(0, row))
        x_src_flat.index_copy_(0, slot, sources.index_select(0, row))
        return
    assert payload.stride(1) == 1 and x_flat.is_contiguous() and sources.is_contiguous()
    assert x_src_flat.is_contiguous() and x_scale_flat.is_contiguous()
    _built()["place_rows"][(R,)](
        payload, payload.stride(0), slots.contiguous(), sink, scales.contiguous(), sources, x_flat,
        x_flat.stride(0), x_scale_flat, x_src_flat, NUM_WORDS=payload.shape[1], k=k, BLOCK=_BLOCK_WORDS)
