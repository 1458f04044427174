"""Combine: expert outputs back to the tokens' ranks, weighted by the top-k weights and summed per token."""

from __future__ import annotations

import torch

from harness.rank.comm import Comm, DispatchHandle, DispatchLayout, Stages


def combine(
    expert_out: torch.Tensor,
    handle: DispatchHandle,
    layout: DispatchLayout,
    comm: Comm,
    *,
    stages: Stages | None = None,
) -> torch.Tensor:
    """Return (num_tokens, K) in expert_out's dtype: sum over top-k slots of weight * expert output.

    expert_out: (E, M, K) bf16, the experts' `out` (a view of the policy's common workspace); only the slots
    below expert_num_tokens are read. The weighted sum accumulates in float32. The result is a view of the comm
    backend's combine buffer, valid until the next combine.
    """
    return comm.combine(expert_out, handle, stages or Stages())
