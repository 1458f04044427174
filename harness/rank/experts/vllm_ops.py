"""vLLM's own compiled CUTLASS MoE ops, loaded with torch.ops.load_library without importing vLLM.

The same calls as vLLM's run_cutlass_moe_fp8 with use_batched_format=True:
get_cutlass_batched_moe_mm_data -> cutlass_moe_mm (GEMM1) -> silu_and_mul -> dynamic_per_token_scaled_fp8_quant
-> cutlass_moe_mm (GEMM2) -> copy into out. Only the tokens each expert holds are computed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.rank.experts.base import BackendUnavailable, ExpertWeights, StageHooks, Workspace
from harness.sizing.vllm_source.kernels import KernelsLibrary, on_this_node
from harness.sizing.vllm_source.sources import VllmSourceError

REQUIRED_OPS = (
    "get_cutlass_batched_moe_mm_data",
    "cutlass_moe_mm",
    "silu_and_mul",
    "dynamic_per_token_scaled_fp8_quant",
)
_LOADED: dict[str, str] = {}


def load_ops_library(kernels: KernelsLibrary) -> None:
    """Load vLLM's ops library once per process; BackendUnavailable says in one line why it does not load."""
    path = str(kernels.path.resolve())
    if path in _LOADED:
        return
    if not Path(path).exists():
        raise BackendUnavailable(f"kernels {kernels.describe()}: {path} does not exist")
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as exc:  # dlopen's undefined symbols; the dispatcher's registration errors
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        pin = f"; the release pins {kernels.torch_requirement}" if kernels.torch_requirement else ""
        raise BackendUnavailable(
            f"kernels {kernels.describe()} do not load into torch {torch.__version__} (CUDA {torch.version.cuda}): "
            f"{first_line}{pin}"
        ) from None
    missing = [op for op in REQUIRED_OPS if not hasattr(torch.ops._C, op)]
    if missing:
        raise BackendUnavailable(f"kernels {kernels.describe()} lack {', '.join(missing)}")
    _LOADED[path] = kernels.sha256


class VllmOpsExperts:
    name = "vllm-ops"

    def __init__(self, device: torch.device, kernels: KernelsLibrary):
        self.device = device
        self.library = kernels
        self._aux: dict[tuple[int, int, int, int], tuple[torch.Tensor, ...]] = {}

    def _aux_tensors(self, E: int, M: int, K: int, I: int) -> tuple[torch.Tensor, ...]:
        """Offsets, problem sizes, strides and scales: allocated once per shape, as vLLM's experts object does."""
        key = (E, M, K, I)
        if key not in self._aux:
            dev = self.device
            self._aux[key] = (
                torch.empty((E,), dtype=torch.int32, device=dev),
                torch.empty((E, 3), dtype=torch.int32, device=dev),
                torch.empty((E, 3), dtype=torch.int32, device=dev),
                torch.full((E,), K, dtype=torch.int64, device=dev),
                torch.full((E,), 2 * I, dtype=torch.int64, device=dev),
                torch.full((E,), I, dtype=torch.int64, device=dev),
                torch.empty((E * M, 1), dtype=torch.float32, device=dev),
            )
        return self._aux[key]

    @staticmethod
    def create(device: torch.device, *, kernels: KernelsLibrary | None = None) -> VllmOpsExperts:
        """The runtime probe on a CUDA device (harness.core.backends declares the device; select_backend checks
        it first): an ops library at hand that loads and has the ops."""
        if kernels is None:
            raise BackendUnavailable(
                "vllm-ops needs vLLM's ops library: give vllm.kernels / --kernels X.Y.Z, a wheel, a source tree, "
                "a library file (--vllm-ops-library), or install vLLM"
            )
        try:
            kernels = on_this_node(kernels)
        except VllmSourceError as exc:
            raise BackendUnavailable(str(exc)) from None
        load_ops_library(kernels)
        return VllmOpsExperts(device, kernels)

    def quantize_per_token(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's per-token FP8 kernel, for the dispatch side (vLLM quantizes in prepare() with it too)."""
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)
        if x.shape[0]:
            torch.ops._C.dynamic_per_token_scaled_fp8_quant(q, x.contiguous(), scale, None)
        return q, scale

    @property
    def kernels(self) -> str:
        return self.library.describe()

    def scratch_bytes(self, workspace: Workspace) -> int:
        """The auxiliary tensors: offsets (int32 and int64), problem sizes, strides, the (E*M, 1) scales."""
        E, M = workspace.num_local_experts, workspace.max_slots_per_expert
        return 4 * E + 8 * E + 2 * 4 * 3 * E + 3 * 8 * E + 4 * E * M

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
        ops = torch.ops._C
        ws = workspace
        E, M, K, I = ws.num_local_experts, ws.max_slots_per_expert, ws.hidden_size, ws.intermediate_size
        expert_offsets, problem_sizes1, problem_sizes2, strides_k, strides_2i, strides_i, act_scale = self._aux_tensors(
            E, M, K, I
        )
        # n is I (vLLM passes w2's last dim), not 2I.
        ops.get_cutlass_batched_moe_mm_data(
            expert_offsets, problem_sizes1, problem_sizes2, expert_num_tokens, E, M, I, K
        )
        offsets = expert_offsets.to(torch.int64)
        a1q = expert_x.reshape(E * M, K)
        a1q_scale = expert_x_scale.reshape(E * M, 1)
        ops.cutlass_moe_mm(
            ws.mm1_out,
            a1q,
            weights.w1,
            a1q_scale,
            weights.w1_scale,
            offsets,
            problem_sizes1,
            strides_k,
            strides_k,
            strides_2i,
            True,
            True,
        )
        # Over the whole (E*M, 2I) view, padding included, as vLLM's apply_moe_activation does.
        ops.silu_and_mul(ws.act_out, ws.mm1_out)
        if hooks is not None:
            hooks.after_activation(ws)
        ops.dynamic_per_token_scaled_fp8_quant(ws.quant_out, ws.act_out, act_scale, None)
        if hooks is not None:
            hooks.after_quant(ws, act_scale)
        ops.cutlass_moe_mm(
            ws.mm2_out,
            ws.quant_out,
            weights.w2,
            act_scale,
            weights.w2_scale,
            offsets,
            problem_sizes2,
            strides_i,
            strides_i,
            strides_k,
            True,
            True,
        )
        if hooks is not None:
            hooks.after_gemm2(ws, act_scale)
        out = ws.out
        out.copy_(ws.mm2_out.view(E, M, K))
        if hooks is not None:
            hooks.after_out(ws)
        return out
