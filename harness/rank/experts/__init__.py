"""Batched FP8 experts: GEMM1 -> silu_and_mul -> per-token FP8 quant -> GEMM2 -> copy into out.

Every backend writes into *views of the policy's workspace buffers*, exactly as vLLM's batched CUTLASS path
(run_cutlass_moe_fp8 with use_batched_format) does, so the memory measured is the memory vLLM would use:

    mm1_out   (E*M, N)  bf16   over common (ws13)
    act_out   (E*M, I)  bf16   over ws2
    quant_out (E*M, I)  fp8    over common (ws13), after act_out consumed mm1_out
    mm2_out   (E*M, K)  bf16   over ws2, after quant_out consumed act_out
    out       (E, M, K) bf16   over common, after GEMM2 consumed quant_out

Stages run over all experts before the next starts: the views overlap, so per-expert interleaving would
overwrite live data.

Backends: `reference` (fp32 dequantize + matmul, any device; the CPU default and the oracle),
`torch-cutlass` (torch._scaled_grouped_mm, sm90+), `vllm-ops` (vLLM's compiled CUTLASS ops).
"""

from __future__ import annotations

import torch

from harness.core.records import KernelsRecord
from harness.sizing.vllm_source.kernels import KernelsLibrary
from harness.rank.experts.base import (
    BackendUnavailable,
    ExpertWeights,
    ExpertsBackend,
    StageHooks,
    Workspace,
    expert_seed,
    generate_expert,
    make_weights,
    useful_flops,
)

__all__ = [
    "BackendUnavailable",
    "ExpertWeights",
    "ExpertsBackend",
    "StageHooks",
    "Workspace",
    "expert_seed",
    "generate_expert",
    "make_weights",
    "useful_flops",
    "kernels_record",
    "select_backend",
]


def select_backend(name: str, device: torch.device, *, kernels: KernelsLibrary | None = None) -> ExpertsBackend:
    """The backend `name` for this device; "auto" tries vllm-ops (when `kernels` names a library), then
    torch-cutlass (sm90+), then reference.

    Raises BackendUnavailable when an explicitly named backend cannot run here.
    """
    from harness.rank.experts.reference import ReferenceExperts
    from harness.rank.experts.torch_cutlass import TorchCutlassExperts
    from harness.rank.experts.vllm_ops import VllmOpsExperts

    if name == "reference":
        return ReferenceExperts()
    if name == "torch-cutlass":
        return TorchCutlassExperts.create(device)
    if name == "vllm-ops":
        return VllmOpsExperts.create(device, kernels=kernels)
    if name != "auto":
        raise BackendUnavailable(f"experts backend {name!r} is not one of auto, reference, torch-cutlass, vllm-ops")
    if device.type == "cuda":
        if kernels is not None:
            try:
                return VllmOpsExperts.create(device, kernels=kernels)
            except BackendUnavailable:
                pass
        try:
            return TorchCutlassExperts.create(device)
        except BackendUnavailable:
            pass
    return ReferenceExperts()


def kernels_record(backend: ExpertsBackend, kernels: KernelsLibrary | None) -> KernelsRecord:
    """What ran on this rank: the backend and, when it ran vLLM's ops, which release and which file exactly."""
    if backend.name != "vllm-ops" or kernels is None:
        return KernelsRecord(backend=backend.name, description=backend.kernels)
    return KernelsRecord(
        backend=backend.name, description=kernels.describe(), release=kernels.release,
        release_from=kernels.release_from, library=str(kernels.path), library_sha256=kernels.sha256,
        library_bytes=kernels.num_bytes, torch_requirement=kernels.torch_requirement,
    )
