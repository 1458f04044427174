"""Module-level Triton kernels of the comm paths' packing (imported on first use: triton.jit reads TRITON_INTERPRET
when it wraps a function, so the CPU tests set it before and run Triton's interpreter; Triton's interpreter
resolves the helpers a kernel calls only at module level):

    quantize_words   one token's bf16 row as FP8 and its scale, harness.rank.quant.quantize_per_token operation
                     for operation (bit-equal on the same device); push_kernels' quantize_push and pack_rows call it
    pack_rows        the collective path's send rows (base.RowFormat), quantizing each token on the way or copying
                     a quantize kernel's FP8 rows (harness.rank.comm.fused.pack_rows has its wrapper and torch form)
"""

import triton
import triton.language as tl


@triton.jit
def quantize_words(x, t, x_stride, inv_fp8_max, K: tl.constexpr, BLOCK_W: tl.constexpr, RECIPROCAL: tl.constexpr,
                   NATIVE_FP8: tl.constexpr):
    """Row t of x ((n, K) bf16): (its FP8 bytes as BLOCK_W int32 words of 4, little-endian, 0 past K / 4; its
    float32 scale). RECIPROCAL: the scale as torch on CUDA computes `amax / 448` (a product with the float32
    reciprocal), else an IEEE division as torch on CPU. NATIVE_FP8: the hardware's float8 cast (compiled), else
    the same rounding in integer arithmetic (the interpreter's cast rounds otherwise)."""
    w4 = tl.arange(0, BLOCK_W)
    wm = w4 < K // 4
    byte = tl.arange(0, 4)
    offs = w4[:, None] * 4 + byte[None, :]
    v = tl.load(x + t * x_stride + offs, mask=wm[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
    if RECIPROCAL:
        scale = tl.maximum(amax * inv_fp8_max, 1e-12)
    else:
        scale = tl.maximum(tl.div_rn(amax, tl.full([], 448.0, tl.float32)), 1e-12)
    q = tl.div_rn(v, tl.zeros([BLOCK_W, 4], tl.float32) + scale)  # IEEE division, as torch's tensor / tensor
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    if NATIVE_FP8:  # round to nearest even, as torch's cast; |q| <= 448
        code = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
    else:  # float8_e4m3fn bits, round to nearest even as torch's cast
        bits = q.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - ((127 - 7) << 3)  # 3 mantissa bits
        sub = tl.abs(q) * 512.0  # below 2^-6 (exponent 121 - 127): multiples of 2^-9, exact in float32
        whole = sub.to(tl.int32)
        frac = sub - whole.to(tl.float32)
        sub_bits = whole + ((frac > 0.5) | ((frac == 0.5) & ((whole & 1) == 1))).to(tl.int32)
        code = ((bits >> 24) & 0x80) | tl.where(mag < (121 << 23), sub_bits, normal)
    return tl.sum(code << (8 * byte[None, :]), axis=1), scale


@triton.jit
def pack_rows_kernel(x, x_stride, scale, inv_fp8_max, topk_ids, topk_weights, selected, rows, row_words, P, E, rank,
                     K: tl.constexpr, PAYLOAD_WORDS: tl.constexpr, ID_WORDS: tl.constexpr, k: tl.constexpr,
                     KP2: tl.constexpr, BLOCK: tl.constexpr, BLOCK_W: tl.constexpr, QUANTIZE: tl.constexpr,
                     RECIPROCAL: tl.constexpr, NATIVE_FP8: tl.constexpr):
    """Send row i, for selected[i] = token * P + destination. QUANTIZE: x is the bf16 tokens, each quantized here
    (quantize_words); else x is the FP8 payload as int64 words (n, K / 8) with its scale."""
    i = tl.program_id(0).to(tl.int64)
    flat = tl.load(selected + i)
    token = flat // P
    dest = flat % P
    row64 = rows + i * row_words  # the row as int64 words
    if QUANTIZE:
        payload, s = quantize_words(x, token, x_stride, inv_fp8_max, K, BLOCK_W, RECIPROCAL, NATIVE_FP8)
        w4 = tl.arange(0, BLOCK_W)
        tl.store(row64.to(tl.pointer_type(tl.int32)) + w4, payload, mask=w4 < K // 4)
    else:
        for start in tl.static_range(0, PAYLOAD_WORDS, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < PAYLOAD_WORDS
            tl.store(row64 + offs, tl.load(x + token * x_stride + offs, mask=mask), mask=mask)
        s = tl.load(scale + token)
    meta = row64.to(tl.pointer_type(tl.int32)) + 2 * PAYLOAD_WORDS  # the int32 words after the payload
    tl.store(meta, s.to(tl.int32, bitcast=True))
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
