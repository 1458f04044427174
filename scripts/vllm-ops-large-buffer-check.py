"""Which vLLM op goes wrong when the batched buffer passes 2^31 elements (E*M*K)? Compares each op per expert.

    python3 scripts/vllm-ops-large-buffer-check.py /path/to/vllm/_C_stable_libtorch.abi3.so   (one H200, ~45 GB)
"""
import sys, torch
torch.ops.load_library(sys.argv[1])
ops = torch.ops._C
dev = torch.device("cuda")
for E, M in ((8, 262144), (8, 32768)):
    K, I, n = 7168, 2048, 4096
    torch.manual_seed(0)
    cnt = torch.full((E,), n, dtype=torch.int32, device=dev)
    xq = torch.zeros(E, M, K, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    xs = torch.ones(E, M, 1, device=dev)
    for e in range(E):
        xr = torch.randn(n, K, device=dev)
        s_ = xr.abs().amax(-1, keepdim=True) / 448
        xq[e, :n] = (xr / s_).to(torch.float8_e4m3fn); xs[e, :n] = s_
    w1 = (torch.randn(E, 2 * I, K, device=dev) / K**0.5); w1s = w1.abs().amax(-1) / 448; w1q = (w1 / w1s[..., None]).to(torch.float8_e4m3fn); del w1
    off = torch.empty(E, dtype=torch.int32, device=dev); p1 = torch.empty(E, 3, dtype=torch.int32, device=dev); p2 = torch.empty_like(p1)
    ops.get_cutlass_batched_moe_mm_data(off, p1, p2, cnt, E, M, I, K)
    print(f"E={E} M={M} E*M*K={E*M*K:.3e} (2^31={2**31:.3e}) offsets={off.tolist()} p1[-1]={p1[-1].tolist()}")
    mm1 = torch.zeros(E * M, 2 * I, dtype=torch.bfloat16, device=dev)
    sk = torch.full((E,), K, dtype=torch.int64, device=dev); s2i = torch.full((E,), 2 * I, dtype=torch.int64, device=dev)
    ops.cutlass_moe_mm(mm1, xq.view(E * M, K), w1q, xs.view(E * M, 1), w1s, off.to(torch.int64), p1, sk, sk, s2i, True, True)
    for e in (0, E // 2, E - 1):
        ref = (xq[e, :n].float() * xs[e, :n]) @ (w1q[e].float() * w1s[e][:, None]).T
        got = mm1[e * M: e * M + n].float()
        print(f"  GEMM1 expert {e}: rel err {float((got - ref).abs().max() / ref.abs().max()):.4f}")
    act = torch.empty(E * M, I, dtype=torch.bfloat16, device=dev)
    ops.silu_and_mul(act, mm1)
    for e in (0, E - 1):
        g = mm1[e * M: e * M + n].float(); ref = torch.nn.functional.silu(g[:, :I]) * g[:, I:]
        print(f"  silu_and_mul expert {e}: rel err {float((act[e * M: e * M + n].float() - ref).abs().max() / ref.abs().max()):.4f}")
    q = torch.empty(E * M, I, dtype=torch.float8_e4m3fn, device=dev); s = torch.empty(E * M, 1, dtype=torch.float32, device=dev)
    ops.dynamic_per_token_scaled_fp8_quant(q, act, s, None)
    for e in (0, E - 1):
        a = act[e * M: e * M + n].float(); deq = q[e * M: e * M + n].float() * s[e * M: e * M + n]
        print(f"  per-token quant expert {e}: rel err {float((deq - a).abs().max() / a.abs().max()):.4f}")
    del xq, mm1, act, q, s, w1q
    torch.cuda.empty_cache()
