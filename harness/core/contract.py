"""The workspace contract of vLLM's batched-experts format (docs/design.md, the workspace contract).

vLLM's modular kernel asks the experts object for `workspace_shapes(M, N, K, ...)` and allocates, per GPU,

    common = max(prod(ws13), prod(out)) elements    # fused_out aliases it
    ws2    = prod(ws2) elements

in the workspace dtype. The manager is shared by every MoE layer and only grows, so the per-GPU cost is one
layer's common + ws2. This module turns a sizing policy into those shapes and bytes:

    legacy       CutlassBatchedExpertsFp8 before vLLM PR #55579: the token dim is M * D (D counted twice)
    fixed        after the PR: the token dim is M = T * D
    lower-bound  the live set of the batched CUTLASS path (GEMM1 -> silu_and_mul -> quant -> GEMM2 -> copy), as one
                 arena the views move in: allocating it lets NVML confirm the live set
    vllm==X.Y.Z  whatever that release's own `workspace_shapes` returns (see harness.sizing.vllm_source)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BUILTIN_POLICIES = ("legacy", "fixed", "lower-bound")
RELEASE_POLICY_PREFIX = "vllm=="

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}

Shape = tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class SizingArgs:
    """The arguments vLLM passes to `workspace_shapes`, plus the layout they come from.

    M is the per-expert slot count the prepare/finalize hands the experts: max_tokens_per_rank * num_dispatchers.
    """

    max_tokens_per_rank: int  # T
    num_dispatchers: int  # D
    num_local_experts: int  # E
    num_global_experts: int  # E * D (logical experts plus replicas)
    hidden_size: int  # K
    intermediate_size: int  # I; N = 2I for gated activations
    top_k: int
    activation: str = "silu"
    workspace_dtype: str = "bfloat16"

    @property
    def M(self) -> int:
        return self.max_tokens_per_rank * self.num_dispatchers

    @property
    def N(self) -> int:
        return 2 * self.intermediate_size if is_gated(self.activation) else self.intermediate_size

    @property
    def K(self) -> int:
        return self.hidden_size

    @property
    def activation_out_dim(self) -> int:
        return self.N // 2 if is_gated(self.activation) else self.N

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.workspace_dtype]


def is_gated(activation: str) -> bool:
    """silu/gelu/swigluoai act on (gate, up) halves; the *_no_mul variants do not."""
    return not activation.endswith("_no_mul")


@dataclass(frozen=True, kw_only=True)
class WorkspaceShapes:
    """Shapes (in workspace-dtype elements) of one policy, and where they came from."""

    policy: str
    ws13: Shape
    ws2: Shape
    out: Shape
    dtype_bytes: int
    source: str = "harness formula"  # e.g. "vllm 0.29.0: CutlassBatchedExpertsFp8 in .../cutlass_moe.py"
    # For lower-bound: the total is the live-set maximum, not common + ws2.
    live_set_bytes: int | None = None

    @property
    def common_elems(self) -> int:
        return max(math.prod(self.ws13), math.prod(self.out))

    @property
    def common_bytes(self) -> int:
        return self.common_elems * self.dtype_bytes

    @property
    def ws2_bytes(self) -> int:
        return math.prod(self.ws2) * self.dtype_bytes

    @property
    def out_bytes(self) -> int:
        return math.prod(self.out) * self.dtype_bytes

    @property
    def ws13_bytes(self) -> int:
        return math.prod(self.ws13) * self.dtype_bytes

    @property
    def total_bytes(self) -> int:
        if self.live_set_bytes is not None:
            return self.live_set_bytes
        return self.common_bytes + self.ws2_bytes


def legacy_shapes(args: SizingArgs) -> WorkspaceShapes:
    """CutlassBatchedExpertsFp8.workspace_shapes up to vLLM 0.29.0: M multiplied by D a second time."""
    E, M, N, K, D = args.num_local_experts, args.M, args.N, args.K, args.num_dispatchers
    return WorkspaceShapes(
        policy="legacy",
        ws13=(E, M * D, max(N, K)),
        ws2=(E, M * D, max(args.activation_out_dim, K)),
        out=(E, M, K),
        dtype_bytes=args.dtype_bytes,
    )


def fixed_shapes(args: SizingArgs) -> WorkspaceShapes:
    """CutlassBatchedExpertsFp8.workspace_shapes from vLLM 0.30.0 (PR #55579)."""
    E, M, N, K = args.num_local_experts, args.M, args.N, args.K
    return WorkspaceShapes(
        policy="fixed",
        ws13=(E, M, max(N, K)),
        ws2=(E, M, max(args.activation_out_dim, K)),
        out=(E, M, K),
        dtype_bytes=args.dtype_bytes,
    )


def live_set_bytes(args: SizingArgs) -> int:
    """Largest simultaneously-live bytes of the batched CUTLASS FP8 path over its five steps.

    Step                         live buffers (rows = E*M)
    1 GEMM1                      mm1_out (N, wdtype)
    2 silu_and_mul               mm1_out (N) + act_out (N/2, wdtype)
    3 per-token FP8 quant        act_out (N/2, wdtype) + quant_out (N/2, fp8)
    4 GEMM2                      quant_out (N/2, fp8) + mm2_out (K, wdtype)
    5 copy into out              mm2_out (K) + out (K, wdtype)
    """
    rows = args.num_local_experts * args.M
    w = args.dtype_bytes
    act = args.activation_out_dim
    per_row = max(
        args.N * w + act * w,
        act * w + act * 1,
        act * 1 + args.K * w,
        2 * args.K * w,
    )
    return rows * per_row


def live_set_width(args: SizingArgs) -> int:
    """Workspace-dtype elements per row (rows = E*M) of the live-set arena: max(N + N/2, 2K) for gated activations.

    Steps 1-2 (mm1_out beside act_out) and step 5 (mm2_out beside out) are the widest; the FP8 steps 3-4 are never
    wider (live_set_bytes' other terms), so the arena holds every step and equals live_set_bytes exactly.
    """
    return max(args.N + args.activation_out_dim, 2 * args.K)


def lower_bound_shapes(args: SizingArgs) -> WorkspaceShapes:
    """The live set: the smallest workspace any sizing of this data path could use.

    Two buffers with fixed roles cannot reach it when N/2 < K < N (the one holding mm1_out must be N wide, the
    other K wide for mm2_out), so lower-bound is one arena in which the views move from step to step:
    ws13 = (E, M, max(N + N/2, 2K)) is the arena, ws2 is empty, and out aliases the arena's start. The experts
    step's layout inside it: harness.rank.experts.base.Workspace.
    """
    E, M, K = args.num_local_experts, args.M, args.K
    shapes = WorkspaceShapes(
        policy="lower-bound",
        ws13=(E, M, live_set_width(args)),
        ws2=(E, M, 0),
        out=(E, M, K),
        dtype_bytes=args.dtype_bytes,
        source="live set of the batched CUTLASS FP8 path (one arena)",
        live_set_bytes=live_set_bytes(args),
    )
    assert shapes.common_bytes + shapes.ws2_bytes == shapes.live_set_bytes, "the arena is the live set exactly"
    return shapes


def builtin_shapes(policy: str, args: SizingArgs) -> WorkspaceShapes:
    """Shapes for one of BUILTIN_POLICIES."""
    if policy == "legacy":
        return legacy_shapes(args)
    if policy == "fixed":
        return fixed_shapes(args)
    if policy == "lower-bound":
        return lower_bound_shapes(args)
    raise ValueError(f"policy {policy!r} is not one of {', '.join(BUILTIN_POLICIES)} or vllm==X.Y.Z")


def is_release_policy(policy: str) -> bool:
    return policy.startswith(RELEASE_POLICY_PREFIX)
