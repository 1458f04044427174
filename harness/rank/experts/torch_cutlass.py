"""torch's CUTLASS grouped GEMM (torch._scaled_grouped_mm) on the batched buffer; sm90 and newer, GPU only.

The batched (E, M, K) x (E, K, N) form computes all M slots of every expert, padding included; TFLOP/s in the
records count only the tokens the experts hold. The GEMM returns a new tensor and the activation and
quantization make float temporaries, so every stage runs over chunks of rows and copies into the workspace view.
A chunk holds at most `rows_per_chunk` rows (whole experts when M is small, row blocks of one expert when M is
large), which bounds the backend's temporaries by SCRATCH_BOUND_BYTES whatever M is: at vLLM's default tokens
(M = 262144) whole-expert chunks made 20 GB of temporaries, more than the vllm-ops backend's 2.3 GB.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from harness.rank.experts.base import BackendUnavailable, ExpertWeights, StageHooks, Workspace
from harness.rank.quant import quantize_per_token

if TYPE_CHECKING:
    from harness.sizing.vllm_source.kernels import KernelsLibrary

SCRATCH_BOUND_BYTES = 512 * 2**20  # temporaries of one chunk, all stages' blocks cached at once
# What torch's grouped GEMM allocates for itself per call (CUTLASS arguments and workspace, kilobytes for a few
# groups); an allowance in the reported scratch, not a measured figure.
GEMM_LIBRARY_ALLOWANCE_BYTES = 16 * 2**20
ROW_ALIGN = 128  # row blocks start 16-byte aligned for the fp8 rows and their float32 scales


def scratch_bytes_per_row(hidden_size: int, intermediate_size: int) -> int:
    """Bytes of temporaries per row of a chunk, if the caching allocator kept every stage's blocks at once.

    GEMM1 result (2I bf16) + silu (I bf16) + harness.rank.quant.quantize_per_token (|x| in bf16, a float32
    copy, the float32 quotient, the row's float32 amax and scale) + GEMM2 result (K bf16).
    """
    K, I = hidden_size, intermediate_size
    return 4 * I + 2 * I + (2 * I + 4 * I + 4 * I + 8) + 2 * K


def rows_per_chunk(max_slots_per_expert: int, hidden_size: int, intermediate_size: int) -> int:
    """The most rows one chunk may hold so that its temporaries stay under SCRATCH_BOUND_BYTES."""
    rows = SCRATCH_BOUND_BYTES // scratch_bytes_per_row(hidden_size, intermediate_size)
    if rows >= max_slots_per_expert:
        return rows
    return max(ROW_ALIGN, rows // ROW_ALIGN * ROW_ALIGN)


def chunks(E: int, M: int, rows: int) -> Iterator[tuple[int, int, int, int]]:
    """(e0, e1, r0, r1): experts e0..e1-1, slots r0..r1-1; whole experts when `rows` >= M, else row blocks."""
    if rows >= M:
        step = rows // M
        for e0 in range(0, E, step):
            yield e0, min(E, e0 + step), 0, M
        return
    for e in range(E):
        for r0 in range(0, M, rows):
            yield e, e + 1, r0, min(M, r0 + rows)


class TorchCutlassExperts:
    name = "torch-cutlass"

    def __init__(self, device: torch.device):
        self.device = device

    @staticmethod
    def create(device: torch.device, *, kernels: KernelsLibrary | None = None) -> TorchCutlassExperts:
        """The runtime probe on a CUDA device (harness.core.backends declares the device; select_backend checks
        it first): compute capability 9.0 or newer, and a torch with _scaled_grouped_mm."""
        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            raise BackendUnavailable(
                f"torch-cutlass needs compute capability 9.0 or newer, this GPU has {major}.{minor}"
            )
        if not hasattr(torch, "_scaled_grouped_mm"):
            raise BackendUnavailable(f"torch {torch.__version__} has no torch._scaled_grouped_mm")
        return TorchCutlassExperts(device)

    @property
    def kernels(self) -> str:
        return f"torch {torch.__version__} _scaled_grouped_mm (CUTLASS)"

    def scratch_bytes(self, workspace: Workspace) -> int:
        """The chunk's temporaries, the (E, M) float32 activation scales (they live across stages) and the GEMM
        library's allowance."""
        ws = workspace
        E, M, K, I = ws.num_local_experts, ws.max_slots_per_expert, ws.hidden_size, ws.intermediate_size
        rows = min(rows_per_chunk(M, K, I), E * M)
        chunk_rows = max(min(rows // M, E) * M, M) if rows >= M else rows
        return chunk_rows * scratch_bytes_per_row(K, I) + 4 * E * M + GEMM_LIBRARY_ALLOWANCE_BYTES

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
        E, M, K, I = ws.num_local_experts, ws.max_slots_per_expert, ws.hidden_size, ws.intermediate_size
        parts = list(chunks(E, M, rows_per_chunk(M, K, I)))
        mm1, act = ws.mm1_out.view(E, M, 2 * I), ws.act_out.view(E, M, I)
        quant, mm2 = ws.quant_out.view(E, M, I), ws.mm2_out.view(E, M, K)
        for e0, e1, r0, r1 in parts:  # GEMM1
            mm1[e0:e1, r0:r1].copy_(
                torch._scaled_grouped_mm(
                    expert_x[e0:e1, r0:r1],
                    weights.w1[e0:e1].transpose(-2, -1),
                    expert_x_scale[e0:e1, r0:r1].reshape(e1 - e0, r1 - r0),
                    weights.w1_scale[e0:e1],
                    out_dtype=torch.bfloat16,
                )
            )
        for e0, e1, r0, r1 in parts:  # silu_and_mul
            torch.mul(F.silu(mm1[e0:e1, r0:r1, :I]), mm1[e0:e1, r0:r1, I:], out=act[e0:e1, r0:r1])
        if hooks is not None:
            hooks.after_activation(ws)
        act_scale = torch.empty((E, M), dtype=torch.float32, device=self.device)
        for e0, e1, r0, r1 in parts:  # per-token FP8 quant, over ws13
            _, scale = quantize_per_token(act[e0:e1, r0:r1], out=quant[e0:e1, r0:r1])
            act_scale[e0:e1, r0:r1].copy_(scale.squeeze(-1))
        if hooks is not None:
            hooks.after_quant(ws, act_scale.view(E * M, 1))
        for e0, e1, r0, r1 in parts:  # GEMM2
            mm2[e0:e1, r0:r1].copy_(
                torch._scaled_grouped_mm(
                    quant[e0:e1, r0:r1],
                    weights.w2[e0:e1].transpose(-2, -1),
                    act_scale[e0:e1, r0:r1],
                    weights.w2_scale[e0:e1],
                    out_dtype=torch.bfloat16,
                )
            )
        if hooks is not None:
            hooks.after_gemm2(ws, act_scale.view(E * M, 1))
        out = ws.out
        out.copy_(mm2)
        if hooks is not None:
            hooks.after_out(ws)
        return out
