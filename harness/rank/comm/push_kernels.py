"""The Triton kernels of symm-mem's push path (harness.rank.comm.push has their wrappers, torch forms and
shapes). Imported on first use: triton.jit reads TRITON_INTERPRET when it wraps a function, so the CPU tests set
it before (the interpreter), and a GPU compiles them."""

import triton
import triton.language as tl


@triton.jit
def spin(pad, flag_slot, P, epoch, status, max_spins, BUMP: tl.constexpr, LAG: tl.constexpr):
    """Acquire-poll every peer's flag until it reaches the epoch (less LAG); BUMP advances the epoch first.
    Past max_spins polls the peer's status bit is set instead of hanging the GPU."""
    e = tl.load(epoch)
    if BUMP:  # a new dispatch: every wait and signal of it uses the next epoch
        e += 1
        tl.store(epoch, e)
    for s in range(0, P):
        v = tl.atomic_add(pad + flag_slot + s, 0, sem="acquire", scope="sys")
        spins = 0
        while (v < e - LAG) & (spins < max_spins):
            v = tl.atomic_add(pad + flag_slot + s, 0, sem="acquire", scope="sys")
            spins += 1
        if v < e - LAG:
            tl.atomic_or(status, 1 << s)


@triton.jit
def publish(pad_ptrs, flag_slot, me, epoch, counts, counts_ptrs, E, G, P, PUSH_COUNTS: tl.constexpr, EP2: tl.constexpr):
    """Per destination d: (PUSH_COUNTS) this rank's pairs per local expert of d and its rows to d into d's
    count buffer, then a release store of the epoch into d's flag (flag_slot, me)."""
    if PUSH_COUNTS:
        e = tl.arange(0, EP2)
        for d in range(0, P):
            dst = tl.load(counts_ptrs + d).to(tl.pointer_type(tl.int32)) + me * (E + 1)
            tl.store(dst + e, tl.load(counts + d * E + e, mask=e < E), mask=e < E)
            tl.store(dst + E, tl.load(counts + G + d))
    tl.debug_barrier()  # every thread's stores before the releases below (cumulative from here)
    ep = tl.load(epoch)
    for d in range(0, P):
        flag = tl.load(pad_ptrs + d).to(tl.pointer_type(tl.int32)) + flag_slot + me
        tl.atomic_xchg(flag, ep, sem="release", scope="sys")


@triton.jit
def last_done(done, nprog):
    """Whether this program is the kernel's last to finish (then every other program's stores happen before
    what it does next: each one's barrier and acq_rel increment, read by the last one's increment). The
    last one puts the counter back to 0 for the kernel's next launch (stream order)."""
    tl.debug_barrier()  # every thread of this program has stored
    last = tl.atomic_add(done, 1, sem="acq_rel", scope="gpu") == nprog - 1
    if last:
        tl.atomic_xchg(done, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def route_chunk_kernel(
    ids,
    n,
    chunk_hist,
    chunk_base,
    pos,
    row_index,
    G,
    E,
    P,
    W,
    K_TOP: tl.constexpr,
    KP2: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PP2: tl.constexpr,
    BINS: tl.constexpr,
    PLACE: tl.constexpr,
):
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
    member = tl.max((tl.where(cell, g // E, -1)[:, :, None] == d[None, None, :]).to(tl.int32), axis=1)
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
        tl.store(
            row_index + t[:, None] * P + d[None, :],
            tl.where(member > 0, index, -1),
            mask=(t < n)[:, None] & (d < P)[None, :],
        )


@triton.jit
def route_scan_kernel(
    chunk_hist,
    chunk_base,
    counts,
    NC,
    W,
    pad,
    flag_slot,
    P,
    epoch,
    status,
    max_spins,
    NCP2: tl.constexpr,
    WAIT: tl.constexpr,
    BUMP: tl.constexpr,
    LAG: tl.constexpr,
):
    """Per column (a global expert, then a destination rank): each chunk's first place, the column's total.
    WAIT: program 0 first runs a wait (spin), which the kernels after this one are ordered behind."""
    col = tl.program_id(0)
    if WAIT:
        if col == 0:
            spin(pad, flag_slot, P, epoch, status, max_spins, BUMP, LAG)
    c = tl.arange(0, NCP2)
    v = tl.load(chunk_hist + c * W + col, mask=c < NC, other=0)
    tl.store(chunk_base + c * W + col, tl.cumsum(v, axis=0) - v, mask=c < NC)
    tl.store(counts + col, tl.sum(v, axis=0))


@triton.jit
def quantize_push_kernel(
    x,
    x_stride,
    scale_in,
    inv_fp8_max,
    ids,
    weights,
    pos,
    row_index,
    rows_ptrs,
    me,
    C,
    E,
    P,
    n,
    x_out,
    x_scale,
    x_src,
    table,
    table_w,
    tok,
    M,
    pad_ptrs,
    flag_slot,
    epoch,
    counts,
    counts_ptrs,
    done,
    K: tl.constexpr,
    ROW_BYTES: tl.constexpr,
    QUANTIZE: tl.constexpr,
    RECIPROCAL: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
    BLOCK_W: tl.constexpr,
    K_TOP: tl.constexpr,
    KP2: tl.constexpr,
    SIGNAL: tl.constexpr,
    PUSH_COUNTS: tl.constexpr,
    EP2: tl.constexpr,
):
    # grid-stride over tokens: fewer programs than tokens, so the signal's count stays small
    for t32 in range(tl.program_id(0), n, tl.num_programs(0)):
        t = t32 + tl.zeros([], tl.int64)  # (the interpreter's range gives Python ints)
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
            if NATIVE_FP8:  # compiled: the hardware's cvt (round to nearest even, as torch's cast; |q| <= 448)
                code = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
            else:
                # float8_e4m3fn bits, round to nearest even as torch's cast, in integer arithmetic: the
                # interpreter's float8 cast rounds otherwise
                bits = q.to(tl.int32, bitcast=True)
                mag = bits & 0x7FFFFFFF
                normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - ((127 - 7) << 3)  # 3 mantissa bits
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
            if (r >= 0) & (d == me):  # this rank's own pairs: straight into its slots (its first slot is 0)
                received = (me * C + r).to(tl.int64)
                tl.store(tok + received, t.to(tl.int32))
                for jj in tl.static_range(K_TOP):
                    gj = tl.load(ids + t * K_TOP + jj)
                    slot = tl.load(pos + t * K_TOP + jj)
                    ok = (gj >= 0) & (gj // E == me) & (slot < M)
                    dst = tl.where(ok, ((gj % E) * M + slot).to(tl.int64), 0)
                    if ok:
                        tl.store(x_out + dst * (K // 4) + w4, payload, mask=wm)
                        tl.store(x_scale + dst, scale)
                        tl.store(x_src + 2 * dst, me)
                        tl.store(x_src + 2 * dst + 1, t.to(tl.int32))
                    tl.store(table + received * K_TOP + jj, dst)
                    wj = tl.load(weights + t * K_TOP + jj)
                    tl.store(table_w + received * K_TOP + jj, tl.where(ok, wj, 0.0))
            if (r >= 0) & (d != me):
                row = tl.load(rows_ptrs + d).to(tl.pointer_type(tl.int32))
                region = (me - d - 1 + P) % P  # push.recv_region(me, d)
                row += (region * C + r).to(tl.int64) * (ROW_BYTES // 4)
                tl.store(row + w4, payload, mask=wm)
                meta = row + K // 4
                tl.store(meta, scale.to(tl.int32, bitcast=True))
                tl.store(meta + 1, t.to(tl.int32))
                here = (g >= 0) & (g // E == d)
                tl.store(meta + 2 + j, tl.where(here, g % E, -1).to(tl.int32), mask=jm)
                tl.store(meta + 2 + K_TOP + j, tl.where(here, p_in, 0), mask=jm)
                tl.store(meta + 2 + 2 * K_TOP + j, tl.where(here, w, 0.0).to(tl.int32, bitcast=True), mask=jm)
    if SIGNAL:  # the last program to finish publishes every program's rows: counts, then READY
        if last_done(done, tl.num_programs(0)):
            publish(pad_ptrs, flag_slot, me, epoch, counts, counts_ptrs, E, E * P, P, PUSH_COUNTS, EP2)


@triton.jit
def signal_kernel(
    pad_ptrs, flag_slot, me, epoch, counts, counts_ptrs, E, G, P, PUSH_COUNTS: tl.constexpr, EP2: tl.constexpr
):
    publish(pad_ptrs, flag_slot, me, epoch, counts, counts_ptrs, E, G, P, PUSH_COUNTS, EP2)


@triton.jit
def wait_kernel(pad, flag_slot, P, epoch, status, max_spins, BUMP: tl.constexpr, LAG: tl.constexpr):
    spin(pad, flag_slot, P, epoch, status, max_spins, BUMP, LAG)


@triton.jit
def expert_base_kernel(
    recv_counts,
    base,
    expert_num_tokens,
    overflow,
    me,
    P,
    E,
    M,
    pad,
    flag_slot,
    epoch,
    status,
    max_spins,
    EP2: tl.constexpr,
    WAIT: tl.constexpr,
    LAG: tl.constexpr,
):
    if WAIT:  # the counts it reads are the peers' (their READY flags publish them)
        spin(pad, flag_slot, P, epoch, status, max_spins, False, LAG)
    e = tl.arange(0, EP2)
    em = e < E
    total = tl.zeros([EP2], tl.int32)
    for i in range(0, P):  # this rank first, then the others in rank order after it (push.source_order)
        s = (me + i) % P
        tl.store(base + s * E + e, total, mask=em)
        total += tl.load(recv_counts + s * (E + 1) + e, mask=em, other=0)
    tl.store(expert_num_tokens + e, tl.minimum(total, M), mask=em)
    tl.atomic_add(overflow, tl.sum(tl.maximum(total - M, 0).to(tl.int64), axis=0))


@triton.jit
def expand_kernel(
    recv_rows,
    recv_counts,
    base,
    x,
    x_scale,
    x_src,
    table,
    table_w,
    tok,
    me,
    C,
    E,
    M,
    P,
    K: tl.constexpr,
    ROW_BYTES: tl.constexpr,
    BLOCK_W: tl.constexpr,
    K_TOP: tl.constexpr,
):
    # grid-stride over the rows of the other ranks (this rank's own went to their slots in quantize_push):
    # region remote // C of the receive buffer is rank (me + 1 + region) % P's (push.recv_region)
    for remote in range(tl.program_id(0), (P - 1) * C, tl.num_programs(0)):
        src = (me + 1 + remote // C) % P
        i = remote % C
        pid = src * C + i
        if i < tl.load(recv_counts + src * (E + 1) + E):
            row = recv_rows + (remote + tl.zeros([], tl.int64)) * ROW_BYTES
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
def reduce_push_kernel(
    expert_out,
    recv_counts,
    table,
    table_w,
    tok,
    out_ptrs,
    me,
    C,
    E,
    K,
    pad_ptrs,
    flag_slot,
    epoch,
    done,
    P,
    K_TOP: tl.constexpr,
    BLOCK: tl.constexpr,
    SIGNAL: tl.constexpr,
):
    for pid in range(tl.program_id(0), P * C, tl.num_programs(0)):  # grid-stride over received rows
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
    if SIGNAL:  # the last program to finish: every partial is pushed (COMBINED to every source)
        if last_done(done, tl.num_programs(0) * tl.num_programs(1)):
            publish(pad_ptrs, flag_slot, me, epoch, done, done, 1, 1, P, False, 1)


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


KERNELS = {name.removesuffix("_kernel"): fn for name, fn in dict(globals()).items() if name.endswith("_kernel")}
