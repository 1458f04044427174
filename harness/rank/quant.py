"""FP8 (e4m3) quantization as vLLM's CUTLASS MoE path uses it: per-token activations, per-channel weights."""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
_MIN_SCALE = 1e-12  # keeps all-zero rows (padding, empty experts) finite


def quantize_per_token(x: torch.Tensor, *, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows of `x` (..., K) to FP8 with one float32 scale per row.

    Returns (q (..., K) float8_e4m3fn, scale (..., 1) float32) with x ~= q.float() * scale.
    `out`, when given, receives q (same shape as x, fp8): the caller's workspace view.
    """
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp_min(_MIN_SCALE)
    q = (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX)
    if out is None:
        return q.to(FP8_DTYPE), scale
    out.copy_(q)
    return out, scale


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize weights (E, N_out, K_in) to FP8 with one float32 scale per output channel: (E, N_out)."""
    amax = w.abs().amax(dim=-1).float()
    scale = (amax / FP8_MAX).clamp_min(_MIN_SCALE)
    q = (w.float() / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of an FP8 tensor and its broadcastable scale."""
    return q.float() * scale
