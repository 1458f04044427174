"""What every experts backend shares: the weights, the workspace views, the backend protocol."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from harness.core.contract import WorkspaceShapes
from harness.rank.memory import Accountant
from harness.rank.quant import FP8_DTYPE, quantize_per_channel


class BackendUnavailable(Exception):
    """This backend cannot run here; the message says why (device, capability, versions)."""


@dataclass(frozen=True, kw_only=True)
class ExpertWeights:
    """FP8 weights of the E local experts, quantized per output channel.

    w1 (E, N, K) fp8 with w1_scale (E, N) float32; w2 (E, K, I) fp8 with w2_scale (E, K) float32.
    """

    w1: torch.Tensor
    w1_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


def expert_seed(seed: int, global_expert: int) -> int:
    return seed * 1_000_003 + 7919 * global_expert + 17


def generate_expert(
    *, seed: int, global_expert: int, hidden_size: int, intermediate_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float weights of one global expert: w1 (2I, K) and w2 (K, I), scaled to keep activations O(1).

    Seeded per expert, so any process can regenerate any expert (the single-process reference does).
    """
    g = torch.Generator(device=device)
    g.manual_seed(expert_seed(seed, global_expert))
    K, I = hidden_size, intermediate_size
    w1 = torch.randn((2 * I, K), generator=g, device=device) / math.sqrt(K)
    w2 = torch.randn((K, I), generator=g, device=device) / math.sqrt(I)
    return w1, w2


def make_weights(
    *,
    rank: int,
    num_local_experts: int,
    hidden_size: int,
    intermediate_size: int,
    seed: int,
    device: torch.device,
    accountant: Accountant,
) -> ExpertWeights:
    """FP8 weights of this rank's experts: global ids rank*E .. rank*E+E-1."""
    E, K, I = num_local_experts, hidden_size, intermediate_size
    w1 = accountant.alloc("weights", (E, 2 * I, K), FP8_DTYPE)
    w1_scale = accountant.alloc("weights", (E, 2 * I), torch.float32)
    w2 = accountant.alloc("weights", (E, K, I), FP8_DTYPE)
    w2_scale = accountant.alloc("weights", (E, K), torch.float32)
    for e in range(E):
        f1, f2 = generate_expert(
            seed=seed, global_expert=rank * E + e, hidden_size=K, intermediate_size=I, device=device
        )
        q1, s1 = quantize_per_channel(f1.unsqueeze(0))
        q2, s2 = quantize_per_channel(f2.unsqueeze(0))
        w1[e].copy_(q1[0])
        w1_scale[e].copy_(s1[0])
        w2[e].copy_(q2[0])
        w2_scale[e].copy_(s2[0])
    return ExpertWeights(w1=w1, w1_scale=w1_scale, w2=w2, w2_scale=w2_scale)


@dataclass(frozen=True, kw_only=True)
class Workspace:
    """One policy's buffers as vLLM's modular kernel allocates them, and the experts step's views into them.

    Two-buffer layout (legacy, fixed, vllm==X.Y.Z: common and ws2, as vLLM's workspace manager), rows = E*M:

        common  mm1_out (rows, 2I) bf16 -> quant_out (rows, I) fp8 -> out (E, M, K) bf16, each from offset 0
        ws2     act_out (rows, I) bf16  -> mm2_out (rows, K) bf16, from offset 0

    Arena layout (lower-bound: ws2 is empty, common is the live set, rows x max(2I + I, 2K) elements). The views
    move so that what a step reads never overlaps what it writes, and only the live set is ever needed:

        offset (elements)     [0, rows*2I)        [rows*2I, rows*3I)     [C - rows*K, C)
        1 GEMM1               mm1_out             -                      -
        2 silu_and_mul        mm1_out (read)      act_out (write)        -
        3 FP8 quant           quant_out over the first rows*I bytes (mm1_out is dead), act_out read
        4 GEMM2               quant_out read; mm2_out written at the arena's end (act_out is dead)
        5 copy into out       out over [0, rows*K) (quant_out is dead), mm2_out read

    C = rows x max(3I, 2K): steps 2 and 5 are the widest (contract.live_set_width), and step 4's quant_out
    (rows*I bytes) ends before mm2_out starts since C - rows*K >= rows*I/2 elements.
    """

    shapes: WorkspaceShapes
    common: torch.Tensor  # (max(prod(ws13), prod(out)),) workspace dtype
    ws2: torch.Tensor  # (prod(ws2),) workspace dtype; empty in the arena layout
    num_local_experts: int  # E
    max_slots_per_expert: int  # M
    hidden_size: int  # K
    intermediate_size: int  # I
    # GPU: a private CUDA memory pool holding just these two buffers. Without it the caching allocator may place
    # them in free space of segments cached earlier (weights generation, comm setup), and NVML would see no growth.
    pool: Any = None

    @property
    def is_arena(self) -> bool:
        return self.ws2.numel() == 0

    @staticmethod
    def check_fits(
        shapes: WorkspaceShapes,
        *,
        num_local_experts: int,
        max_slots_per_expert: int,
        hidden_size: int,
        intermediate_size: int,
    ) -> None:
        """Raise ValueError when the experts step's views do not fit the policy's buffers."""
        rows, K, I = num_local_experts * max_slots_per_expert, hidden_size, intermediate_size
        have = {"ws13": math.prod(shapes.ws13), "ws2": math.prod(shapes.ws2), "out": math.prod(shapes.out)}
        if have["ws2"] == 0:  # the arena: every view inside common
            need = {"ws13": rows * max(3 * I, 2 * K), "out": rows * K}
            have["ws13"] = shapes.common_elems
        else:
            need = {"ws13": rows * 2 * I, "ws2": rows * max(I, K), "out": rows * K}
        short = [f"{k} has {have[k]} elements, the data path needs {need[k]}" for k in need if have[k] < need[k]]
        if short:
            raise ValueError(f"policy {shapes.policy}: workspace too small: " + "; ".join(short))

    @staticmethod
    def allocate(
        shapes: WorkspaceShapes,
        accountant: Accountant,
        *,
        dtype: torch.dtype,
        num_local_experts: int,
        max_slots_per_expert: int,
        hidden_size: int,
        intermediate_size: int,
    ) -> Workspace:
        E, M, K, I = num_local_experts, max_slots_per_expert, hidden_size, intermediate_size
        Workspace.check_fits(shapes, num_local_experts=E, max_slots_per_expert=M, hidden_size=K, intermediate_size=I)
        pool = torch.cuda.MemPool() if accountant.device.type == "cuda" else None
        in_pool = torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext()
        with in_pool:
            common = accountant.alloc("common", (shapes.common_elems,), dtype)
            try:
                ws2 = accountant.alloc("ws2", (math.prod(shapes.ws2),), dtype)
            except BaseException as exc:
                accountant.release("common", common)  # the caller records the OOM; the accounting must not leak
                # The first block was allocated before the OOM: the report draws it as the workspace's, not as
                # the device's "other" (its peak saw it).
                exc.allocated_bytes = common.numel() * common.element_size()  # type: ignore[attr-defined]
                raise
        return Workspace(
            shapes=shapes,
            common=common,
            ws2=ws2,
            num_local_experts=E,
            max_slots_per_expert=M,
            hidden_size=K,
            intermediate_size=I,
            pool=pool,
        )

    def _rows(self) -> int:
        return self.num_local_experts * self.max_slots_per_expert

    def _view(self, buffer: torch.Tensor, start: int, width: int) -> torch.Tensor:
        rows = self._rows()
        return buffer[start : start + rows * width].view(rows, width)

    @property
    def mm1_out(self) -> torch.Tensor:
        return self._view(self.common, 0, 2 * self.intermediate_size)

    @property
    def act_out(self) -> torch.Tensor:
        if self.is_arena:
            return self._view(self.common, self._rows() * 2 * self.intermediate_size, self.intermediate_size)
        return self._view(self.ws2, 0, self.intermediate_size)

    @property
    def quant_out(self) -> torch.Tensor:
        return self._view(self.common.view(FP8_DTYPE), 0, self.intermediate_size)

    @property
    def mm2_out(self) -> torch.Tensor:
        if self.is_arena:
            return self._view(self.common, self.common.numel() - self._rows() * self.hidden_size, self.hidden_size)
        return self._view(self.ws2, 0, self.hidden_size)

    @property
    def out(self) -> torch.Tensor:
        E, M, K = self.num_local_experts, self.max_slots_per_expert, self.hidden_size
        return self.common[: E * M * K].view(E, M, K)

    def release(self, accountant: Accountant) -> None:
        accountant.release("common", self.common)
        accountant.release("ws2", self.ws2)


class StageHooks(Protocol):
    """Called by a backend between its stages, while the views named in each method are live.

    The views overlap (module docstring of harness.rank.experts), so each hook is the only moment its pair of
    views can be compared: a stage's output against the reference applied to its actual input. A hook must not
    write to the workspace. act_scale is (E*M, 1) float32, the per-token scales of quant_out.
    """

    def after_activation(self, workspace: Workspace) -> None:
        """mm1_out (GEMM1's output) and act_out (the activation's) are both live."""
        ...

    def after_quant(self, workspace: Workspace, act_scale: torch.Tensor) -> None:
        """act_out and quant_out (with act_scale) are both live."""
        ...

    def after_gemm2(self, workspace: Workspace, act_scale: torch.Tensor) -> None:
        """quant_out (with act_scale) and mm2_out are both live."""
        ...

    def after_out(self, workspace: Workspace) -> None:
        """mm2_out and out (the copy combine reads) are both live."""
        ...


class ExpertsBackend(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def kernels(self) -> str:
        """What ran: "torch 2.11.0 _scaled_grouped_mm", "vllm 0.26.0 _C_stable_libtorch.abi3.so", ..."""
        ...

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
        """Run the experts on the batched buffer; return workspace.out (E, M, K) bf16.

        expert_x (E, M, K) fp8, expert_x_scale (E, M, 1) float32, expert_num_tokens (E,) int32.
        Rows past expert_num_tokens[e] are padding; their outputs are unspecified. `hooks`, when given, is
        called between the stages (the correctness check); the timed iterations pass none.
        """
        ...

    def scratch_bytes(self, workspace: Workspace) -> int:
        """The most bytes of temporaries `apply` allocates beyond the workspace and weights (its chunking bounds it)."""
        ...


def useful_flops(expert_num_tokens: torch.Tensor, *, hidden_size: int, intermediate_size: int) -> int:
    """Multiply-adds x 2 of GEMM1 and GEMM2 over the tokens the experts actually hold."""
    rows = int(expert_num_tokens.sum())
    return 2 * rows * hidden_size * 2 * intermediate_size + 2 * rows * intermediate_size * hidden_size
