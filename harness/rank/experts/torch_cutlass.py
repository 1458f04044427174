"""torch's CUTLASS grouped GEMM (torch._scaled_grouped_mm) on the batched buffer; sm90 and newer, GPU only.

The batched (E, M, K) x (E, K, N) form computes all M slots of every expert, padding included; TFLOP/s in the
records count only the tokens the experts hold. The GEMM returns a new tensor, so it runs over chunks of
experts and is copied into the workspace view: the transient stays a fraction of the workspace.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.rank.experts.base import BackendUnavailable, ExpertWeights, Workspace
from harness.rank.quant import quantize_per_token

MIN_ROWS_PER_CHUNK = 16384


class TorchCutlassExperts:
    name = "torch-cutlass"

    def __init__(self, device: torch.device):
        self.device = device

    @staticmethod
    def create(device: torch.device) -> TorchCutlassExperts:
        if device.type != "cuda":
            raise BackendUnavailable("torch-cutlass needs a CUDA GPU (torch._scaled_grouped_mm has no CPU kernel)")
        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            raise BackendUnavailable(f"torch-cutlass needs compute capability 9.0 or newer, this GPU has {major}.{minor}")
        if not hasattr(torch, "_scaled_grouped_mm"):
            raise BackendUnavailable(f"torch {torch.__version__} has no torch._scaled_grouped_mm")
        return TorchCutlassExperts(device)

    @property
    def kernels(self) -> str:
        return f"torch {torch.__version__} _scaled_grouped_mm (CUTLASS)"

    def apply(
        self, *, expert_x: torch.Tensor, expert_x_scale: torch.Tensor, expert_num_tokens: torch.Tensor,
        weights: ExpertWeights, workspace: Workspace,
    ) -> torch.Tensor:
        ws = workspace
        E, M, K, I = ws.num_local_experts, ws.max_slots_per_expert, ws.hidden_size, ws.intermediate_size
        chunk = max(1, min(E, -(-MIN_ROWS_PER_CHUNK // M)))
        mm1 = ws.mm1_out.view(E, M, 2 * I)
        for e0 in range(0, E, chunk):  # GEMM1
            e1 = min(E, e0 + chunk)
            mm1[e0:e1].copy_(torch._scaled_grouped_mm(
                expert_x[e0:e1], weights.w1[e0:e1].transpose(-2, -1),
                expert_x_scale[e0:e1].reshape(e1 - e0, M), weights.w1_scale[e0:e1], out_dtype=torch.bfloat16,
            ))
        act = ws.act_out.view(E, M, I)
        for e0 in range(0, E, chunk):  # silu_and_mul
            e1 = min(E, e0 + chunk)
            torch.mul(F.silu(mm1[e0:e1, :, :I]), mm1[e0:e1, :, I:], out=act[e0:e1])
        quant = ws.quant_out.view(E, M, I)
        act_scale = torch.empty((E, M), dtype=torch.float32, device=self.device)
        for e0 in range(0, E, chunk):  # per-token FP8 quant
            e1 = min(E, e0 + chunk)
            _, scale = quantize_per_token(act[e0:e1], out=quant[e0:e1])
            act_scale[e0:e1].copy_(scale.squeeze(-1))
        mm2 = ws.mm2_out.view(E, M, K)
        for e0 in range(0, E, chunk):  # GEMM2
            e1 = min(E, e0 + chunk)
            mm2[e0:e1].copy_(torch._scaled_grouped_mm(
                quant[e0:e1], weights.w2[e0:e1].transpose(-2, -1),
                act_scale[e0:e1], weights.w2_scale[e0:e1], out_dtype=torch.bfloat16,
            ))
        out = ws.out
        out.copy_(mm2)
        return out
