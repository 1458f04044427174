"""The raw experts kernels the bench sets against the harness's experts step: the same math on the same batched
buffer, every argument prebuilt, no harness code around the calls.

    experts:raw-vllm       vLLM's ops (cutlass_moe_mm pair, silu_and_mul, per-token quant)   (when the library loads)
    experts:raw-torch      torch._scaled_grouped_mm over all experts, no chunking, no copies into views (sm90+)
    experts:raw-reference  the reference math (harness.rank.experts.reference) on the valid rows, no views (CPU)

Each builder returns a callable that runs the kernels once and returns (E, M, K) bf16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from harness.rank.experts import Workspace
from harness.rank.experts.reference import expert_forward
from harness.rank.quant import quantize_per_token

if TYPE_CHECKING:
    from harness.rank.lifecycle import RankSetup

RawKernel = Callable[[], torch.Tensor]


def raw_torch(setup: RankSetup, workspace: Workspace) -> RawKernel:
    b, w, out = setup.buffers, setup.weights, workspace.out
    E, M = b.expert_x.shape[:2]
    I = w.w2.shape[2]
    x_scale = b.expert_x_scale.reshape(E, M)
    w1t, w2t = w.w1.transpose(-2, -1), w.w2.transpose(-2, -1)

    def run() -> torch.Tensor:
        h = torch._scaled_grouped_mm(b.expert_x, w1t, x_scale, w.w1_scale, out_dtype=torch.bfloat16)
        q, s = quantize_per_token(F.silu(h[..., :I]) * h[..., I:])
        # The batched contract ends with the result in `out`, as vLLM's copy of mm2_out does.
        return out.copy_(torch._scaled_grouped_mm(q, w2t, s.squeeze(-1), w.w2_scale, out_dtype=torch.bfloat16))

    return run


def raw_vllm(setup: RankSetup, workspace: Workspace) -> RawKernel:
    ops = torch.ops._C
    b, w, ws = setup.buffers, setup.weights, workspace
    E, M, K = b.expert_x.shape
    I = w.w2.shape[2]
    dev = b.expert_x.device
    offsets32 = torch.empty((E,), dtype=torch.int32, device=dev)
    ps1 = torch.empty((E, 3), dtype=torch.int32, device=dev)
    ps2 = torch.empty((E, 3), dtype=torch.int32, device=dev)
    ops.get_cutlass_batched_moe_mm_data(offsets32, ps1, ps2, b.expert_num_tokens, E, M, I, K)
    offsets = offsets32.to(torch.int64)
    sk = torch.full((E,), K, dtype=torch.int64, device=dev)
    s2i = torch.full((E,), 2 * I, dtype=torch.int64, device=dev)
    si = torch.full((E,), I, dtype=torch.int64, device=dev)
    a1q, a1q_scale = b.expert_x.reshape(E * M, K), b.expert_x_scale.reshape(E * M, 1)
    act_scale = torch.empty((E * M, 1), dtype=torch.float32, device=dev)
    mm1, act, quant, mm2, out = ws.mm1_out, ws.act_out, ws.quant_out, ws.mm2_out, ws.out

    def run() -> torch.Tensor:
        ops.cutlass_moe_mm(mm1, a1q, w.w1, a1q_scale, w.w1_scale, offsets, ps1, sk, sk, s2i, True, True)
        ops.silu_and_mul(act, mm1)
        ops.dynamic_per_token_scaled_fp8_quant(quant, act, act_scale, None)
        ops.cutlass_moe_mm(mm2, quant, w.w2, act_scale, w.w2_scale, offsets, ps2, si, si, sk, True, True)
        return out.copy_(mm2.view(E, M, K))  # vLLM's batched path ends with this copy too

    return run


def raw_reference(setup: RankSetup) -> RawKernel:
    b, w = setup.buffers, setup.weights
    E, M, K = b.expert_x.shape
    out = torch.empty((E, M, K), dtype=torch.bfloat16, device=b.expert_x.device)

    def run() -> torch.Tensor:
        for e, n in enumerate(b.expert_num_tokens.tolist()):
            if n:
                out[e, :n] = expert_forward(
                    b.expert_x[e, :n], b.expert_x_scale[e, :n], w.w1[e], w.w1_scale[e], w.w2[e], w.w2_scale[e]
                )
        return out

    return run


def raw_experts(setup: RankSetup, workspace: Workspace) -> tuple[str, RawKernel]:
    """The raw counterpart of the rank's experts backend: (variant name, kernel)."""
    name = setup.backend.name
    if name == "vllm-ops":
        return "experts:raw-vllm", raw_vllm(setup, workspace)
    if name == "torch-cutlass":
        return "experts:raw-torch", raw_torch(setup, workspace)
    return "experts:raw-reference", raw_reference(setup)


def max_rel_error_on_valid_rows(a: torch.Tensor, b: torch.Tensor, counts: list[int]) -> float:
    """max over experts of max |a - b| / max |b| on the rows each expert holds; a, b (E, M, K)."""
    worst = 0.0
    for e, n in enumerate(counts):
        if n:
            x, y = a[e, :n].float(), b[e, :n].float()
            worst = max(worst, float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)))
    return worst
