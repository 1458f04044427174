"""The reference experts: FP8 operands dequantized to float32 and multiplied; the CPU default and the oracle.

It follows the batched CUTLASS path step by step (bf16 results of each GEMM, per-token FP8 quantization of the
activation) and writes into the same workspace views, so its memory equals the GPU backends'.
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
        for e, lo, hi in spans:  # GEMM1
            a = dequantize(expert_x[e, : hi - lo], expert_x_scale[e, : hi - lo])
            w1 = dequantize(weights.w1[e], weights.w1_scale[e].unsqueeze(1))
            ws.mm1_out[lo:hi].copy_(a @ w1.T)
        for _, lo, hi in spans:  # silu_and_mul
            ws.act_out[lo:hi].copy_(silu_and_mul(ws.mm1_out[lo:hi]))
        scales = {}
        for e, lo, hi in spans:  # per-token FP8 quant, over ws13
            _, scales[e] = quantize_per_token(ws.act_out[lo:hi], out=ws.quant_out[lo:hi])
        for e, lo, hi in spans:  # GEMM2
            w2 = dequantize(weights.w2[e], weights.w2_scale[e].unsqueeze(1))
            ws.mm2_out[lo:hi].copy_(dequantize(ws.quant_out[lo:hi], scales[e]) @ w2.T)
        out = ws.out
        for e, lo, hi in spans:  # copy into out (aliases common)
            out[e, : hi - lo].copy_(ws.mm2_out[lo:hi])
        return out
