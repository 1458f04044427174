"""The reference experts: FP8 operands dequantized to float32 and multiplied; the CPU default and the oracle.

It follows the batched CUTLASS path step by step (bf16 results of each GEMM, per-token FP8 quantization of the
activation) and writes into the same workspace views, so its memory equals the GPU backends'.

The math lives here once: `scaled_matmul`, `silu_and_mul` and `expert_forward` (with harness.rank.quant's
per-token quantization). The rank's correctness check and the bench's raw reference variant reuse them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.rank.experts.base import ExpertWeights, Workspace
from harness.rank.quant import dequantize, quantize_per_token


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(rows, 2I) -> (rows, I): silu(gate) * up, in float32."""
    half = gate_up.shape[-1] // 2
    g = gate_up.float()
    return F.silu(g[..., :half]) * g[..., half:]


def scaled_matmul(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """One expert's FP8 GEMM in float32: a (rows, K_in) fp8 with per-token a_scale (rows, 1) float32, times
    w (N_out, K_in) fp8 with per-channel w_scale (N_out,) float32 -> (rows, N_out) float32."""
    return dequantize(a, a_scale) @ dequantize(w, w_scale.unsqueeze(-1)).T


def expert_forward(
    x: torch.Tensor, x_scale: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w2: torch.Tensor,
    w2_scale: torch.Tensor, *, store_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """One expert on its tokens: GEMM1 -> silu_and_mul -> per-token FP8 quant -> GEMM2, without any workspace.

    x (rows, K) fp8, x_scale (rows, 1) float32; w1 (2I, K) fp8, w1_scale (2I,); w2 (K, I) fp8, w2_scale (K,).
    store_dtype: the dtype the batched path keeps GEMM1's and the activation's results in (bf16 workspace
    views); None keeps float32 throughout (the correctness oracle). Returns (rows, K) float32.
    """
    h = scaled_matmul(x, x_scale, w1, w1_scale)
    if store_dtype is not None:
        h = h.to(store_dtype)
    act = silu_and_mul(h)
    if store_dtype is not None:
        act = act.to(store_dtype)
    q, scale = quantize_per_token(act)
    return scaled_matmul(q, scale, w2, w2_scale)


class ReferenceExperts:
    name = "reference"

    @property
    def kernels(self) -> str:
        return f"torch {torch.__version__} float32 matmul (reference)"

    def apply(
        self, *, expert_x: torch.Tensor, expert_x_scale: torch.Tensor, expert_num_tokens: torch.Tensor,
        weights: ExpertWeights, workspace: Workspace,
    ) -> torch.Tensor:
        ws = workspace
        M = ws.max_slots_per_expert
        counts = [int(c) for c in expert_num_tokens.tolist()]
        spans = [(e, e * M, e * M + n) for e, n in enumerate(counts) if n]
        # Stage by stage over all experts: the views overlap (DESIGN.md §2), as in the batched CUTLASS path.
        for e, lo, hi in spans:  # GEMM1
            ws.mm1_out[lo:hi].copy_(scaled_matmul(expert_x[e, : hi - lo], expert_x_scale[e, : hi - lo],
                                                  weights.w1[e], weights.w1_scale[e]))
        for _, lo, hi in spans:  # silu_and_mul
            ws.act_out[lo:hi].copy_(silu_and_mul(ws.mm1_out[lo:hi]))
        scales = {}
        for e, lo, hi in spans:  # per-token FP8 quant, over ws13
            _, scales[e] = quantize_per_token(ws.act_out[lo:hi], out=ws.quant_out[lo:hi])
        for e, lo, hi in spans:  # GEMM2
            ws.mm2_out[lo:hi].copy_(scaled_matmul(ws.quant_out[lo:hi], scales[e], weights.w2[e], weights.w2_scale[e]))
        out = ws.out
        for e, lo, hi in spans:  # copy into out (aliases common)
            out[e, : hi - lo].copy_(ws.mm2_out[lo:hi])
        return out
