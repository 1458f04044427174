"""The reference experts: FP8 operands dequantized to float32 and multiplied; the CPU default and the oracle.

It follows the batched CUTLASS path step by step (bf16 results of each GEMM, per-token FP8 quantization of the
activation) and writes into the same workspace views, so its memory equals the GPU backends'. Each stage is a
method, so a test can build a variant with one stage changed (harness.rank.check is tested that way).

The math lives here once: `scaled_matmul`, `silu_and_mul` and `expert_forward` (with harness.rank.quant's
per-token quantization). The rank's correctness check and the bench's raw reference variant reuse them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from harness.rank.experts.base import ExpertWeights, StageHooks, Workspace
from harness.rank.quant import dequantize, quantize_per_token

if TYPE_CHECKING:
    from harness.sizing.vllm_source.kernels import KernelsLibrary

Spans = list[tuple[int, int, int]]  # (local expert, first row, end row) of the valid rows in the (E*M) view


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
    x: torch.Tensor,
    x_scale: torch.Tensor,
    w1: torch.Tensor,
    w1_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    store_dtype: torch.dtype | None = None,
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

    @staticmethod
    def create(device: torch.device, *, kernels: KernelsLibrary | None = None) -> ReferenceExperts:
        """Any device (harness.core.backends declares cpu and cuda); nothing to probe."""
        return ReferenceExperts()

    @property
    def kernels(self) -> str:
        return f"torch {torch.__version__} float32 matmul (reference)"

    def scratch_bytes(self, workspace: Workspace) -> int:
        """One expert's float32 operands and result at a time, plus the (E*M, 1) activation scales."""
        ws = workspace
        M, K, I = ws.max_slots_per_expert, ws.hidden_size, ws.intermediate_size
        gemm1 = 4 * (M * K + 2 * I * K + M * 2 * I)
        gemm2 = 4 * (M * I + K * I + M * K)
        return max(gemm1, gemm2, 4 * 3 * M * I) + 4 * ws.num_local_experts * M

    def apply(
        self,
        *,
        expert_x: torch.Tensor,
        expert_x_scale: torch.Tensor,
        expert_num_tokens: torch.Tensor,
        weights: ExpertWeights,
        workspace: Workspace,
        hooks: StageHooks | None = None,
    ) -> torch.Tensor:
        ws = workspace
        M = ws.max_slots_per_expert
        counts = [int(c) for c in expert_num_tokens.tolist()]
        spans = [(e, e * M, e * M + n) for e, n in enumerate(counts) if n]
        # Stage by stage over all experts: the views overlap (docs/design.md), as in the batched CUTLASS path.
        self.gemm1(ws, spans, expert_x, expert_x_scale, weights)
        self.activation(ws, spans)
        if hooks is not None:
            hooks.after_activation(ws)
        act_scale = self.quant(ws, spans)
        if hooks is not None:
            hooks.after_quant(ws, act_scale)
        self.gemm2(ws, spans, act_scale, weights)
        if hooks is not None:
            hooks.after_gemm2(ws, act_scale)
        out = ws.out
        for e, lo, hi in spans:  # copy into out (aliases common)
            out[e, : hi - lo].copy_(ws.mm2_out[lo:hi])
        if hooks is not None:
            hooks.after_out(ws)
        return out

    def gemm1(
        self, ws: Workspace, spans: Spans, expert_x: torch.Tensor, expert_x_scale: torch.Tensor, weights: ExpertWeights
    ) -> None:
        """mm1_out[rows] = x @ w1[e].T, float32 math, bf16 result."""
        for e, lo, hi in spans:
            ws.mm1_out[lo:hi].copy_(
                scaled_matmul(expert_x[e, : hi - lo], expert_x_scale[e, : hi - lo], weights.w1[e], weights.w1_scale[e])
            )

    def activation(self, ws: Workspace, spans: Spans) -> None:
        """act_out[rows] = silu(gate) * up of mm1_out[rows]."""
        for _, lo, hi in spans:
            ws.act_out[lo:hi].copy_(silu_and_mul(ws.mm1_out[lo:hi]))

    def quant(self, ws: Workspace, spans: Spans) -> torch.Tensor:
        """quant_out[rows] = per-token FP8 of act_out[rows] (over ws13); returns the scales (E*M, 1) float32."""
        act_scale = torch.ones((ws.mm1_out.shape[0], 1), dtype=torch.float32, device=ws.common.device)
        for _, lo, hi in spans:
            _, scale = quantize_per_token(ws.act_out[lo:hi], out=ws.quant_out[lo:hi])
            act_scale[lo:hi].copy_(scale)
        return act_scale

    def gemm2(self, ws: Workspace, spans: Spans, act_scale: torch.Tensor, weights: ExpertWeights) -> None:
        """mm2_out[rows] = dequant(quant_out[rows]) @ w2[e].T, float32 math, bf16 result."""
        for e, lo, hi in spans:
            ws.mm2_out[lo:hi].copy_(
                scaled_matmul(ws.quant_out[lo:hi], act_scale[lo:hi], weights.w2[e], weights.w2_scale[e])
            )
