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
`torch-cutlass` (torch._scaled_grouped_mm, sm90+), `vllm-ops` (vLLM's compiled CUTLASS ops). Each is declared in
harness.core.backends.EXPERTS (devices, what it supports, auto's order, help text) and bound to its class here in
IMPLEMENTATIONS; the class's `create(device, kernels=...)` is its runtime probe, raising BackendUnavailable.
"""

from __future__ import annotations

from typing import Protocol

import torch

from harness.core.backends import AUTO, EXPERTS, BackendQuery
from harness.core.records import KernelsRecord
from harness.rank.experts.base import (
    BackendUnavailable,
    ExpertsBackend,
    ExpertWeights,
    StageHooks,
    Workspace,
    expert_seed,
    generate_expert,
    make_weights,
    useful_flops,
)
from harness.rank.experts.reference import ReferenceExperts
from harness.rank.experts.torch_cutlass import TorchCutlassExperts
from harness.rank.experts.vllm_ops import VllmOpsExperts
from harness.sizing.vllm_source.kernels import KernelsLibrary

__all__ = [
    "IMPLEMENTATIONS",
    "BackendUnavailable",
    "ExpertWeights",
    "ExpertsBackend",
    "StageHooks",
    "Workspace",
    "expert_seed",
    "generate_expert",
    "kernels_record",
    "make_weights",
    "select_backend",
    "useful_flops",
]


class ExpertsImplementation(Protocol):
    """A backend class: `create` probes what only this process can tell and raises BackendUnavailable."""

    name: str

    @staticmethod
    def create(device: torch.device, *, kernels: KernelsLibrary | None = None) -> ExpertsBackend: ...


# The class of every backend harness.core.backends.EXPERTS declares, by its name.
IMPLEMENTATIONS: dict[str, ExpertsImplementation] = {
    cls.name: cls for cls in (ReferenceExperts, TorchCutlassExperts, VllmOpsExperts)
}


def select_backend(
    name: str, device: torch.device, query: BackendQuery, *, kernels: KernelsLibrary | None = None
) -> ExpertsBackend:
    """The backend `name` for this device and scenario (`query`, harness.scenario.fit.backend_query).

    A named backend must pass its declaration (harness.core.backends.EXPERTS) and then its runtime probe; auto
    takes the first of its order that passes both (vllm-ops when `kernels` names a library, then torch-cutlass
    on sm90+, then reference). Raises BackendUnavailable with the reason.
    """
    if name != AUTO:
        reason = EXPERTS.reason(name, query)
        if reason is not None:
            raise BackendUnavailable(reason)
        return IMPLEMENTATIONS[name].create(device, kernels=kernels)
    skipped: list[str] = []
    for backend in EXPERTS.auto_candidates(query):
        try:
            return IMPLEMENTATIONS[backend.name].create(device, kernels=kernels)
        except BackendUnavailable as exc:
            skipped.append(f"{backend.name}: {exc}")
    raise BackendUnavailable(
        EXPERTS.reason(AUTO, query) or f"experts_backend auto: none of its order runs here ({'; '.join(skipped)})"
    )


def kernels_record(backend: ExpertsBackend, kernels: KernelsLibrary | None) -> KernelsRecord:
    """What ran on this rank: the backend and, when it ran vLLM's ops, which release and which file exactly."""
    if backend.name != "vllm-ops" or kernels is None:
        return KernelsRecord(backend=backend.name, description=backend.kernels)
    return KernelsRecord(
        backend=backend.name,
        description=kernels.describe(),
        release=kernels.release,
        release_from=kernels.release_from,
        library=str(kernels.path),
        library_sha256=kernels.sha256,
        library_bytes=kernels.num_bytes,
        torch_requirement=kernels.torch_requirement,
    )
