"""Device-side kernels of symm-mem's path: rows and counts pushed into the peers' buffers, release/acquire flags.

    route_layout   (n, k) topk ids -> each pair's position among this rank's pairs for its expert (token order),
                   each token's row index per destination rank (token order), and the counts; in 16-token chunks
                   (count, scan over chunks, place), no sort, no host read
    quantize_push  one program per token: the bf16 row read once, FP8 and its scale computed (bit-equal to
                   harness.rank.quant.quantize_per_token), and one row per destination rank written straight into
                   that rank's receive buffer (PushFormat: payload, scale, token, the destination's local expert
                   ids, the pairs' positions, their weights)
    signal         per destination: this rank's counts pushed into its count buffer, then a release store of the
                   epoch into its flag pad
    wait           spin (acquire) until every peer's flag reached the epoch; a wait that runs past its spin
                   budget sets a status word instead of hanging the GPU
    expert_base    received counts -> each (source, expert)'s first slot (sources in rank order), expert_num_tokens
                   and the overflow count
    expand         one program per received row: read once, written to slot base[src, e] + position of each local
                   expert e it picked (deterministic), with scale and source; the combine table comes out of it
    reduce_push    per received row: the weighted sum of its experts' outputs (float32), one bf16 partial pushed
                   into the source rank's combine buffer
    token_reduce   per token: the partials of the ranks it went to, summed in rank order (float32)

Every kernel has a torch form (the reference; tests compare the two) and a Triton form. Buffers of "the peers"
are reached through tables of device addresses (`*_ptrs`, (P,) int64): on the GPU those of torch's symmetric
memory (harness.rank.comm.symm_mem), in the CPU tests plain tensors of one process standing in for P ranks, run
by Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from harness.rank.quant import FP8_MAX

# Flag slots on each rank's pad (int32 words from FLAG_BASE): slot phase * P + peer holds the last epoch that
# peer completed in that phase towards this rank.
READY, CONSUMED, COMBINED = 0, 1, 2
NUM_PHASES = 3
FLAG_BASE = 256  # words below it are left to torch's own symmetric-memory barrier (channel * P + rank)
DEFAULT_MAX_SPINS = 1 << 26  # a wait past this many polls (seconds on NVLink) gives up and sets the status
_BLOCK_T = 16  # tokens of one route_layout chunk (its place kernel compares every pair of the chunk: (16 k)^2)
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
        return 2 + 3 * self.top_k

    @property
    def row_bytes(self) -> int:
        return self.hidden_size + -(-4 * self.meta_words // 16) * 16


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def _kernels(interpreted: bool) -> dict[str, Any]:
    del interpreted  # the cache key only: triton.jit reads TRITON_INTERPRET when it wraps the function
    import triton
    import triton.language as tl

    @triton.jit
    def route_chunk_kernel(ids, n, chunk_hist, chunk_base, pos, row_index, G, E, P, W, K_TOP: tl.constexpr,
                           KP2: tl.constexpr, BLOCK_T: tl.constexpr, PP2: tl.constexpr, BINS: tl.constexpr,
                           PLACE: tl.constexpr):
        """Chunk c of BLOCK_T tokens. Count (PLACE False): its pairs per global expert and tokens per destination
        rank, chunk_hist[c] (G + P,). Place (PLACE True, after the scan): each pair's place, its chunk's first
        place for the expert plus the earlier tokens of the chunk that picked it (a token picks an expert once),
        and each token's row index per destination likewise."""
        c = tl.program_id(0)
        t = c * BLOCK_T + tl.arange(0, BLOCK_T)
        j = tl.arange(0, KP2)
        cell = (t < n)[:, None] & (j < K_TOP)[None, :]
        g = tl.load(ids + t[:, None] * K_TOP + j[None, :], mask=cell, other=-1)
        cell = cell & (g >= 0)
        d = tl.arange(0, PP2)
        member = tl.max(((tl.where(cell, g // E, -1)[:, :, None] == d[None, None, :])).to(tl.int32), axis=1)
        if not PLACE:
            hist = tl.histogram(tl.reshape(tl.where(cell, g, G).to(tl.int32), (BLOCK_T * KP2,)), BINS)  # G: none
            bins = tl.arange(0, BINS)
            tl.store(chunk_hist + c * W + bins, hist, mask=bins < G)
            tl.store(chunk_hist + c * W + G + d, tl.sum(member, axis=0), mask=d < P)
        else:
            flat_g = tl.reshape(tl.where(cell, g, -1), (BLOCK_T * KP2,))
            flat_t = tl.reshape(t[:, None] + 0 * j[None, :], (BLOCK_T * KP2,))
            flat_j = tl.reshape(0 * t[:, None] + j[None, :], (BLOCK_T * KP2,))
            ok = flat_g >= 0
            earlier = (flat_g[:, None] == flat_g[None, :]) & (flat_t[None, :] < flat_t[:, None]) & ok[None, :]
            place = tl.load(chunk_base + c * W + flat_g, mask=ok, other=0) + tl.sum(earlier.to(tl.int32), axis=1)
            tl.store(pos + flat_t * K_TOP + flat_j, place, mask=ok)
            first = tl.load(chunk_base + c * W + G + d, mask=d < P, other=0)
            index = first[None, :] + tl.cumsum(member, axis=0) - member
            tl.store(row_index + t[:, None] * P + d[None, :], tl.where(member > 0, index, -1),
                     mask=(t < n)[:, None] & (d < P)[None, :])

    @triton.jit
    def route_scan_kernel(chunk_hist, chunk_base, counts, NC, W, NCP2: tl.constexpr):
        """Per column (a global expert, then a destination rank): each chunk's first place, the column's total."""
        col = tl.program_id(0)
        c = tl.arange(0, NCP2)
        v = tl.load(chunk_hist + c * W + col, mask=c < NC, other=0)
        tl.store(chunk_base + c * W + col, tl.cumsum(v, axis=0) - v, mask=c < NC)
        tl.store(counts + col, tl.sum(v, axis=0))

    @triton.jit
    def quantize_push_kernel(x, x_stride, scale_in, inv_fp8_max, ids, weights, pos, row_index, rows_ptrs, me, C,
                             E, P, K: tl.constexpr, ROW_BYTES: tl.constexpr, QUANTIZE: tl.constexpr,
                             RECIPROCAL: tl.constexpr, BLOCK_W: tl.constexpr, K_TOP: tl.constexpr,
                             KP2: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        w4 = tl.arange(0, BLOCK_W)  # the row as int32 words of 4 FP8 bytes: 4-byte stores, not 1-byte ones
        wm = w4 < K // 4
        if QUANTIZE:  # harness.rank.quant.quantize_per_token, operation for operation
            byte = tl.arange(0, 4)
            offs = w4[:, None] * 4 + byte[None, :]
            v = tl.load(x + t * x_stride + offs, mask=wm[:, None], other=0.0).to(tl.float32)
            amax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
            if RECIPROCAL:  # torch on CUDA divides by a Python scalar as a product with its float32 reciprocal
                scale = tl.maximum(amax * inv_fp8_max, 1e-12)
            else:
                scale = tl.maximum(tl.div_rn(amax, tl.full([], 448.0, tl.float32)), 1e-12)
            q = tl.div_rn(v, tl.zeros([BLOCK_W, 4], tl.float32) + scale)  # IEEE division, as torch's tensor / tensor
            q = tl.minimum(tl.maximum(q, -448.0), 448.0)
            # float8_e4m3fn bits, round to nearest even as torch's cast, in integer arithmetic: the interpreter
            # (whose float8 cast rounds otherwise) and the GPU then agree bit for bit
            bits = q.to(tl.int32, bitcast=True)
            mag = bits & 0x7FFFFFFF
            normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - ((127 - 7) << 3)  # 3 mantissa bits, rebias
            sub = tl.abs(q) * 512.0  # below 2^-6 (exponent 121 - 127): multiples of 2^-9, exact in float32
            whole = sub.to(tl.int32)
            frac = sub - whole.to(tl.float32)
            sub_bits = whole + ((frac > 0.5) | ((frac == 0.5) & ((whole & 1) == 1))).to(tl.int32)
            code = ((bits >> 24) & 0x80) | tl.where(mag < (121 << 23), sub_bits, normal)
            payload = tl.sum(code << (8 * byte[None, :]), axis=1)  # little-endian: byte 0 lowest
        else:  # already quantized (another quantize kernel ran): its FP8 bytes as int32 words, and its scale
            payload = tl.load(x + t * x_stride + w4, mask=wm)
            scale = tl.load(scale_in + t)
        j = tl.arange(0, KP2)
        jm = j < K_TOP
        g = tl.load(ids + t * K_TOP + j, mask=jm, other=-1)
        w = tl.load(weights + t * K_TOP + j, mask=jm, other=0.0).to(tl.float32)
        p_in = tl.load(pos + t * K_TOP + j, mask=jm, other=0)
        for d in range(0, P):
            r = tl.load(row_index + t * P + d)
            if r >= 0:
                row = tl.load(rows_ptrs + d).to(tl.pointer_type(tl.int32))
                row += (me * C + r).to(tl.int64) * (ROW_BYTES // 4)
                tl.store(row + w4, payload, mask=wm)
                meta = row + K // 4
                tl.store(meta, scale.to(tl.int32, bitcast=True))
                tl.store(meta + 1, t.to(tl.int32))
                here = (g >= 0) & (g // E == d)
                tl.store(meta + 2 + j, tl.where(here, g % E, -1).to(tl.int32), mask=jm)
                tl.store(meta + 2 + K_TOP + j, tl.where(here, p_in, 0), mask=jm)
                tl.store(meta + 2 + 2 * K_TOP + j, tl.where(here, w, 0.0).to(tl.int32, bitcast=True), mask=jm)

    @triton.jit
    def signal_kernel(pad_ptrs, slot, me, epoch, counts, counts_ptrs, E, G,
                      PUSH_COUNTS: tl.constexpr, EP2: tl.constexpr):
        d = tl.program_id(0)
        if PUSH_COUNTS:  # this rank's pairs per local expert of d, and its rows to d, into d's count buffer
            e = tl.arange(0, EP2)
            dst = tl.load(counts_ptrs + d).to(tl.pointer_type(tl.int32)) + me * (E + 1)
            tl.store(dst + e, tl.load(counts + d * E + e, mask=e < E), mask=e < E)
            tl.store(dst + E, tl.load(counts + G + d))
        tl.debug_barrier()  # every thread's stores before the release below (it is cumulative from here)
        flag = tl.load(pad_ptrs + d).to(tl.pointer_type(tl.int32)) + slot + me
        tl.atomic_xchg(flag, tl.load(epoch), sem="release", scope="sys")

    @triton.jit
    def wait_kernel(pad, slot, P, epoch, status, max_spins, BUMP: tl.constexpr, LAG: tl.constexpr):
        e = tl.load(epoch)
        if BUMP:  # a new dispatch: every wait and signal of it uses the next epoch
            e += 1
            tl.store(epoch, e)
        for s in range(0, P):
            v = tl.atomic_add(pad + slot + s, 0, sem="acquire", scope="sys")
            spins = 0
            while (v < e - LAG) & (spins < max_spins):
                v = tl.atomic_add(pad + slot + s, 0, sem="acquire", scope="sys")
                spins += 1
            if v < e - LAG:
                tl.atomic_or(status, 1 << s)

    @triton.jit
    def expert_base_kernel(recv_counts, base, expert_num_tokens, overflow, P, E, M, EP2: tl.constexpr):
        e = tl.arange(0, EP2)
        em = e < E
        total = tl.zeros([EP2], tl.int32)
        for s in range(0, P):
            tl.store(base + s * E + e, total, mask=em)
            total += tl.load(recv_counts + s * (E + 1) + e, mask=em, other=0)
        tl.store(expert_num_tokens + e, tl.minimum(total, M), mask=em)
        tl.atomic_add(overflow, tl.sum(tl.maximum(total - M, 0).to(tl.int64), axis=0))

    @triton.jit
    def expand_kernel(recv_rows, recv_counts, base, x, x_scale, x_src, table, table_w, tok, C, E, M,
                      K: tl.constexpr, ROW_BYTES: tl.constexpr, BLOCK_W: tl.constexpr, K_TOP: tl.constexpr):
        pid = tl.program_id(0)
        src = pid // C
        i = pid % C
        if i < tl.load(recv_counts + src * (E + 1) + E):
            row = recv_rows + pid.to(tl.int64) * ROW_BYTES
            meta = (row + K).to(tl.pointer_type(tl.int32))
            scale = tl.load(meta.to(tl.pointer_type(tl.float32)))
            token = tl.load(meta + 1)
            tl.store(tok + pid, token)
            for start in tl.static_range(0, K // 8, BLOCK_W):  # the row is read once, written once per pick
                w_offs = start + tl.arange(0, BLOCK_W)
                wm = w_offs < K // 8
                words = tl.load(row.to(tl.pointer_type(tl.int64)) + w_offs, mask=wm)
                for jj in tl.static_range(K_TOP):
                    e = tl.load(meta + 2 + jj)
                    slot = tl.load(base + src * E + e, mask=e >= 0, other=0) + tl.load(meta + 2 + K_TOP + jj)
                    if (e >= 0) & (slot < M):
                        dst = (e * M + slot).to(tl.int64)
                        tl.store(x.to(tl.pointer_type(tl.int64)) + dst * (K // 8) + w_offs, words, mask=wm)
            for jj in tl.static_range(K_TOP):
                e = tl.load(meta + 2 + jj)
                slot = tl.load(base + src * E + e, mask=e >= 0, other=0) + tl.load(meta + 2 + K_TOP + jj)
                ok = (e >= 0) & (slot < M)
                dst = tl.where(ok, (e * M + slot).to(tl.int64), 0)
                if ok:
                    tl.store(x_scale + dst, scale)
                    tl.store(x_src + 2 * dst, src)
                    tl.store(x_src + 2 * dst + 1, token)
                tl.store(table + pid * K_TOP + jj, dst)
                wt = tl.load((meta + 2 + 2 * K_TOP + jj).to(tl.pointer_type(tl.float32)))
                tl.store(table_w + pid * K_TOP + jj, tl.where(ok, wt, 0.0))

    @triton.jit
    def reduce_push_kernel(expert_out, recv_counts, table, table_w, tok, out_ptrs, me, C, E, K,
                           K_TOP: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        src = pid // C
        if pid % C < tl.load(recv_counts + src * (E + 1) + E):
            offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            m = offs < K
            acc = tl.zeros([BLOCK], tl.float32)
            for jj in tl.static_range(K_TOP):
                wt = tl.load(table_w + pid * K_TOP + jj)
                if wt != 0.0:
                    r = tl.load(table + pid * K_TOP + jj)
                    acc += wt * tl.load(expert_out + r * K + offs, mask=m, other=0.0).to(tl.float32)
            dst = tl.load(out_ptrs + src).to(tl.pointer_type(tl.bfloat16))
            row = (me * C + tl.load(tok + pid)).to(tl.int64)
            tl.store(dst + row * K + offs, acc.to(tl.bfloat16), mask=m)

    @triton.jit
    def token_reduce_kernel(partials, row_index, out, C, P, K, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < K
        acc = tl.zeros([BLOCK], tl.float32)
        for d in range(0, P):
            if tl.load(row_index + t * P + d) >= 0:
                acc += tl.load(partials + (d * C + t).to(tl.int64) * K + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(out + t.to(tl.int64) * K + offs, acc.to(out.dtype.element_ty), mask=m)

    return {name.removesuffix("_kernel"): fn for name, fn in locals().items() if name.endswith("_kernel")}


def kernels() -> dict[str, Any]:
    return _kernels(os.environ.get("TRITON_INTERPRET") == "1")


# ------------------------------------------------------------------ the torch forms (the reference)

def route_layout_torch(ids: torch.Tensor, *, num_local_experts: int, num_ranks: int) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pos (n, k) int32: each pair's place among the pairs for its global expert, token order (0 where the id
    is negative); row_index (n, P) int32: the token's row among those to rank d, token order, -1 where it does
    not go; counts (G + P,) int32: pairs per global expert, then rows per destination)."""
    n, k = ids.shape
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
        return cls(tensors=list(tensors), ptrs=torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64,
                                                            device=device))


def _triton(impl: str, *tensors: torch.Tensor) -> bool:
    from harness.rank.comm.fused import _use_triton

    return _use_triton(impl, *tensors)  # type: ignore[arg-type]


def route_chunks(capacity: int) -> int:
    """Chunks of route_layout's scratch for `capacity` tokens."""
    return max(1, -(-capacity // _BLOCK_T))


def route_layout(ids: torch.Tensor, pos: torch.Tensor, row_index: torch.Tensor, counts: torch.Tensor, *,
                 num_local_experts: int, num_ranks: int, scratch: torch.Tensor | None = None,
                 impl: str = "auto") -> None:
    """Fill pos (C, k), row_index (C, P) and counts (G + P,) int32 for ids (n, k) int64 (route_layout_torch
    says what each holds); rows past n are left as they are. scratch: (2, route_chunks(C), G + P) int32 (each
    chunk's counts and first places), allocated here when not given. In token chunks: count, scan over chunks,
    place."""
    n, k = ids.shape
    E, P = num_local_experts, num_ranks
    G, W = E * P, E * P + P
    if not _triton(impl, ids, pos):
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
    kern["route_scan"][(W,)](hist, base, counts, NC, W, NCP2=next_pow2(NC))
    kern["route_chunk"][(NC,)](*args, **shape, PLACE=True)


def quantize_push(x: torch.Tensor, scale: torch.Tensor | None, ids: torch.Tensor, weights: torch.Tensor,
                  pos: torch.Tensor, row_index: torch.Tensor, rows: Mapped, *, fmt: PushFormat, rank: int,
                  capacity: int, num_local_experts: int, impl: str = "auto") -> None:
    """Write one PushFormat row per (token t < n, destination d with row_index[t, d] >= 0) into rank d's receive
    buffer rows.tensors[d] (P*C, row_bytes) uint8 at row rank*C + row_index[t, d].

    x: (n, K) bf16 with scale None (quantized here, bit-equal to quantize_per_token), or (n, K) FP8 with its
    scale (n, 1) float32. ids, weights: (n, k) int64 / float32; pos, row_index from route_layout."""
    n, K = x.shape
    k, E, P, C = fmt.top_k, num_local_experts, row_index.shape[1], capacity
    if n == 0:
        return
    if not _triton(impl, x, ids, rows.ptrs):
        from harness.rank.quant import quantize_per_token

        q, s = quantize_per_token(x) if scale is None else (x, scale)
        here_all = torch.div(ids, E, rounding_mode="floor")
        for d in range(P):
            r = row_index[:n, d].to(torch.int64)
            sel = torch.nonzero(r >= 0).squeeze(1)
            dst = rows.tensors[d].view(P * C, fmt.row_bytes)
            out = torch.zeros((sel.numel(), fmt.row_bytes), dtype=torch.uint8, device=x.device)
            out[:, :K] = q.index_select(0, sel).view(torch.uint8)
            here = (ids.index_select(0, sel) >= 0) & (here_all.index_select(0, sel) == d)
            words = torch.cat([
                s.reshape(-1).index_select(0, sel).float().view(torch.int32).unsqueeze(1),
                sel.to(torch.int32).unsqueeze(1),
                torch.where(here, ids.index_select(0, sel) % E, -1).to(torch.int32),
                torch.where(here, pos[:n].index_select(0, sel), 0).to(torch.int32),
                torch.where(here, weights.index_select(0, sel).float(), 0.0).view(torch.int32),
            ], dim=1)
            out[:, K: K + 4 * fmt.meta_words] = words.contiguous().view(torch.uint8)
            dst.index_copy_(0, rank * C + r.index_select(0, sel), out)
        return
    assert K % 4 == 0 and x.stride(1) == 1
    if scale is None:
        assert x.dtype == torch.bfloat16
    else:
        x = x.view(torch.uint8).view(torch.int32)  # the FP8 bytes as words of 4
    kernels()["quantize_push"][(n,)](
        x, x.stride(0), scale if scale is not None else x, INV_FP8_MAX, ids.contiguous(), weights.float().contiguous(),
        pos, row_index, rows.ptrs, rank, C, E, P, K=K, ROW_BYTES=fmt.row_bytes, QUANTIZE=scale is None,
        RECIPROCAL=x.is_cuda, BLOCK_W=next_pow2(K // 4), K_TOP=k, KP2=next_pow2(k),
        num_warps=8 if K >= 4096 else 4)


def signal(pads: Mapped, phase: int, *, rank: int, epoch: torch.Tensor, counts: torch.Tensor | None = None,
           recv_counts: Mapped | None = None, num_local_experts: int = 1, impl: str = "auto") -> None:
    """For every rank d: (with counts) this rank's counts for d into d's recv_counts[rank] ((P, E+1) int32: pairs
    per local expert, then rows), then the epoch into d's pad at flag slot (phase, rank), with release order."""
    P, E = len(pads.tensors), num_local_experts
    slot = FLAG_BASE + phase * P
    if not _triton(impl, epoch, pads.ptrs):
        for d in range(P):
            if counts is not None and recv_counts is not None:
                row = recv_counts.tensors[d].view(P, E + 1)[rank]
                row[:E].copy_(counts[d * E:(d + 1) * E])
                row[E] = counts[E * P + d]
            pads.tensors[d].view(-1)[slot + rank] = epoch.view(-1)[0]
        return
    push = counts is not None and recv_counts is not None
    kernels()["signal"][(P,)](pads.ptrs, slot, rank, epoch, counts if push else epoch,
                              recv_counts.ptrs if push else pads.ptrs, E, E * P,  # type: ignore[union-attr]
                              PUSH_COUNTS=push, EP2=next_pow2(E))


def wait(pad: torch.Tensor, phase: int, *, num_ranks: int, epoch: torch.Tensor, status: torch.Tensor,
         bump: bool = False, lag: int = 0, max_spins: int = DEFAULT_MAX_SPINS, impl: str = "auto") -> None:
    """Until every peer s's flag (phase, s) on this rank's pad (int32) is at least epoch - lag (acquire);
    `bump` first advances the epoch (the start of a dispatch). A wait past max_spins polls sets bit s of
    status ((1,) int32) and goes on: the rank reports it instead of the GPU hanging."""
    P, slot = num_ranks, FLAG_BASE + phase * num_ranks
    if not _triton(impl, pad, epoch):
        if bump:
            epoch += 1
        flags = pad.view(-1)[slot: slot + P]
        late = (flags < epoch.view(-1)[0] - lag).to(torch.int32)
        status |= (late << torch.arange(P, dtype=torch.int32, device=pad.device)).sum().view(1).to(status.dtype)
        return
    kernels()["wait"][(1,)](pad, slot, P, epoch, status, max_spins, BUMP=bump, LAG=lag)


def expert_base(recv_counts: torch.Tensor, base: torch.Tensor, expert_num_tokens: torch.Tensor,
                overflow: torch.Tensor, *, max_slots: int, impl: str = "auto") -> None:
    """recv_counts (P, E+1) int32 -> base (P, E) int32 (exclusive sums over sources in rank order),
    expert_num_tokens (E,) = min(total, M); overflow (1,) int64 += the pairs past M."""
    P, E = recv_counts.shape[0], recv_counts.shape[1] - 1
    if not _triton(impl, recv_counts, base):
        c = recv_counts[:, :E].to(torch.int64)
        base.copy_(torch.cumsum(c, 0) - c)
        total = c.sum(0)
        expert_num_tokens.copy_(total.clamp(max=max_slots))
        overflow.view(-1).add_((total - max_slots).clamp(min=0).sum())
        return
    kernels()["expert_base"][(1,)](recv_counts, base, expert_num_tokens, overflow, P, E, max_slots,
                                   EP2=next_pow2(E))


def expand(recv_rows: torch.Tensor, recv_counts: torch.Tensor, base: torch.Tensor, *, x_flat: torch.Tensor,
           x_scale_flat: torch.Tensor, x_src_flat: torch.Tensor, table: torch.Tensor, table_w: torch.Tensor,
           tok: torch.Tensor, fmt: PushFormat, max_slots: int, impl: str = "auto") -> None:
    """Every received row (recv_rows (P*C, row_bytes) uint8, rows [s*C, s*C + recv_counts[s, E]) from rank s)
    written to slot base[s, e] + position of each local expert e it names, in x_flat (E*M, K) uint8, with scale
    (x_scale_flat (E*M,) float32) and (source rank, token) (x_src_flat (E*M, 2) int32); a slot past M is
    dropped. table (P*C, k) int64 / table_w (P*C, k) float32 get each row's slot rows and weights (0 where
    none), tok (P*C,) int32 its source token: what reduce_push reads."""
    P, E1 = recv_counts.shape
    E, M, k, K = E1 - 1, max_slots, fmt.top_k, fmt.hidden_size
    C = recv_rows.shape[0] // P
    if not _triton(impl, recv_rows, recv_counts):
        words = recv_rows.view(P * C, fmt.row_bytes)[:, K: K + 4 * fmt.meta_words].contiguous().view(torch.int32)
        for s in range(P):
            nrows = int(recv_counts[s, E])
            rows = slice(s * C, s * C + nrows)
            w = words[rows]
            ids, pos = w[:, 2: 2 + k].to(torch.int64), w[:, 2 + k: 2 + 2 * k].to(torch.int64)
            slot = base[s].to(torch.int64).index_select(0, ids.clamp(min=0).reshape(-1)).view(-1, k) + pos
            ok = (ids >= 0) & (slot < M)
            dst = torch.where(ok, ids * M + slot, 0)
            r, jj = torch.nonzero(ok, as_tuple=True)
            d = dst[r, jj]
            x_flat.index_copy_(0, d, recv_rows.view(P * C, fmt.row_bytes)[rows][r, :K])
            x_scale_flat.index_copy_(0, d, w[r, 0].view(torch.float32))
            x_src_flat.index_copy_(0, d, torch.stack([torch.full_like(w[r, 1], s), w[r, 1]], dim=1))
            table[rows].copy_(dst)
            table_w[rows].copy_(torch.where(ok, w[:, 2 + 2 * k:].view(torch.float32), 0.0))
            tok[rows].copy_(w[:, 1])
        return
    kernels()["expand"][(P * C,)](recv_rows, recv_counts, base, x_flat, x_scale_flat, x_src_flat, table, table_w,
                                  tok, C, E, M, K=K, ROW_BYTES=fmt.row_bytes,
                                  BLOCK_W=min(512, next_pow2(K // 8)), K_TOP=k)


def reduce_push(expert_out: torch.Tensor, recv_counts: torch.Tensor, table: torch.Tensor, table_w: torch.Tensor,
                tok: torch.Tensor, out: Mapped, *, rank: int, impl: str = "auto") -> None:
    """For each received row of source s: sum_j table_w * expert_out[table] (float32; a zero weight reads
    nothing) as one bf16 row, pushed into rank s's combine buffer out.tensors[s] (P*C, K) at row rank*C + token.
    expert_out (E*M, K) bf16."""
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
        return
    assert expert_out.is_contiguous()
    kernels()["reduce_push"][(P * C, -(-K // _BLOCK_SUM))](expert_out, recv_counts, table, table_w, tok, out.ptrs,
                                                           rank, C, E, K, K_TOP=k, BLOCK=_BLOCK_SUM)


def token_reduce(partials: torch.Tensor, row_index: torch.Tensor, out: torch.Tensor, *,
                 impl: str = "auto") -> torch.Tensor:
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
