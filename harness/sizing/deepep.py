"""DeepEP's per-GPU buffers, as DeepEP's own source sizes them (no DeepEP import, no GPU).

    Buffer(group, num_nvl_bytes, num_rdma_bytes, low_latency_mode=True, ...)      csrc/legacy/buffer.hpp
        NVL (cudaMalloc / fabric):  num_nvl_bytes + barrier signals and peer pointers (+160 B)
        workspace (cudaMalloc):     32 MiB
        RDMA (nvshmem_malloc):      num_rdma_bytes
    get_low_latency_rdma_size_hint(T, K, num_ranks, num_experts)                    csrc/legacy/config.hpp
        = LowLatencyLayout(T, K, num_ranks, num_experts).total_bytes, aligned up to 128 (+128 when aligned)
    low_latency_dispatch(x (T', K) bf16, topk_idx, T, num_experts, use_fp8)         csrc/legacy/buffer.hpp
        packed_recv_x (E, R·T, K) fp8|bf16, scales (E, K/128, R·T) f32 (fp8 only),
        src_info (E, R·T) int32, layout_range (E, R) int64, count (E) int32;  E = num_experts / R
        and it asserts LowLatencyLayout(T, K, R, num_experts).total_bytes <= num_rdma_bytes

LowLatencyLayout, double-buffered (two odd/even sets of send, receive and signaling buffers):

    msg_dispatch = 16 + max(2K, K + 4·K/128)                  an int4 header, then bf16 or fp8 + f32 scales
    msg_combine  = 2K + 4·K/128  (LogFMT, DeepEP c5facf5 2025-08-07 and later; before it: 2K)
    send   = max(T·msg_dispatch, num_experts·T·msg_combine)
    recv   = max(num_experts·T·msg_dispatch, num_experts·T·msg_combine)
    signal = align128(num_experts·4)
    total  = 2·(send + recv + signal)

Caps (Buffer's constructor asserts): num_rdma_bytes / 16 < INT_MAX, i.e. under 32 GiB; in low-latency mode
with an RDMA buffer, num_nvl_bytes <= INT_MAX.

Verified against deepseek-ai/DeepEP at 73b6ea4 (2025-10-17, csrc/config.hpp, csrc/deep_ep.cpp) and d4f41e4
(2026-05-26, csrc/legacy/config.hpp, csrc/legacy/buffer.hpp): the two commits vLLM's
tools/ep_kernels/install_python_libraries.sh has pinned in the releases this harness audits (0.22.0 and later).
See docs/layer-memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.core.units import round_up

INT_MAX = 2**31 - 1
BUFFER_ALIGNMENT_BYTES = 128  # NUM_BUFFER_ALIGNMENT_BYTES / LEGACY_NUM_BUFFER_ALIGNMENT_BYTES
WORKSPACE_BYTES = 32 * 2**20  # NUM_WORKSPACE_BYTES: a cudaMalloc in every Buffer
NUM_MAX_NVL_PEERS = 8
# Barrier signals (int) and buffer / signal pointers for NUM_MAX_NVL_PEERS peers, after the NVL buffer.
NVL_METADATA_BYTES = NUM_MAX_NVL_PEERS * (4 + 8 + 8)
INT4_BYTES = 16
# Largest num_rdma_bytes DeepEP accepts: num_rdma_bytes / sizeof(int4) < INT_MAX.
RDMA_CAP_BYTES = INT4_BYTES * INT_MAX - 1

LOGFMT_COMBINE = "logfmt-combine"
BF16_COMBINE = "bf16-combine"
LAYOUTS = {
    LOGFMT_COMBINE: "DeepEP c5facf5 (2025-08-07, LogFMT combine) and later: msg_combine = 2K + 4*K/128",
    BF16_COMBINE: "DeepEP before c5facf5: msg_combine = 2K",
}
DEFAULT_LAYOUT = LOGFMT_COMBINE

# What vLLM's tools/ep_kernels/install_python_libraries.sh pins (DEEPEP_COMMIT_HASH). The releases this harness
# audits (0.22.0, built 2026-05-29, and later) pin 73b6ea4 or d4f41e4; both carry the LogFMT layout.
PINNED_COMMITS = {
    "73b6ea4": ("2025-10-17", LOGFMT_COMBINE),
    "d4f41e4": ("2026-05-26", LOGFMT_COMBINE),
}


@dataclass(frozen=True, kw_only=True)
class LowLatencyLayout:
    """DeepEP's low-latency RDMA layout for one set of arguments; all sizes in bytes."""

    num_max_dispatch_tokens_per_rank: int  # T
    hidden: int  # K
    num_ranks: int  # R
    num_experts: int  # global experts, redundant replicas included
    layout: str = DEFAULT_LAYOUT

    @property
    def num_scales(self) -> int:
        return self.hidden // 128

    @property
    def dispatch_msg_bytes(self) -> int:
        return INT4_BYTES + max(2 * self.hidden, self.hidden + 4 * self.num_scales)

    @property
    def combine_msg_bytes(self) -> int:
        scales = 4 * self.num_scales if self.layout == LOGFMT_COMBINE else 0
        return scales + 2 * self.hidden

    @property
    def send_bytes(self) -> int:
        T, E = self.num_max_dispatch_tokens_per_rank, self.num_experts
        return max(T * self.dispatch_msg_bytes, E * T * self.combine_msg_bytes)

    @property
    def recv_bytes(self) -> int:
        T, E = self.num_max_dispatch_tokens_per_rank, self.num_experts
        return max(E * T * self.dispatch_msg_bytes, E * T * self.combine_msg_bytes)

    @property
    def signal_bytes(self) -> int:
        return round_up(self.num_experts * 4, 128)

    @property
    def total_bytes(self) -> int:
        """LowLatencyLayout::total_bytes: what low_latency_dispatch asserts num_rdma_bytes holds."""
        return 2 * (self.send_bytes + self.recv_bytes + self.signal_bytes)

    @property
    def size_hint_bytes(self) -> int:
        """Buffer.get_low_latency_rdma_size_hint: total_bytes rounded up, plus 128 when already aligned."""
        a = BUFFER_ALIGNMENT_BYTES
        return ((self.total_bytes + a) // a) * a

    def formula(self) -> str:
        return (
            f"2*(max(T*{self.dispatch_msg_bytes}, E*T*{self.combine_msg_bytes}) + "
            f"max(E*T*{self.dispatch_msg_bytes}, E*T*{self.combine_msg_bytes}) + align128(E*4)) "
            f"with T={self.num_max_dispatch_tokens_per_rank}, E={self.num_experts}, K={self.hidden}"
        )


def rdma_bytes_fit(num_rdma_bytes: int) -> bool:
    """Buffer's check: num_rdma_bytes / sizeof(int4) < INT_MAX."""
    return num_rdma_bytes // INT4_BYTES < INT_MAX


def nvl_bytes_fit(num_nvl_bytes: int, *, num_rdma_bytes: int) -> bool:
    """Buffer's checks on num_nvl_bytes: under INT_MAX when there is an RDMA buffer, and /16 under INT_MAX."""
    return (num_nvl_bytes <= INT_MAX or num_rdma_bytes == 0) and num_nvl_bytes // INT4_BYTES < INT_MAX


def max_tokens_under_cap(*, hidden: int, num_ranks: int, num_experts: int, layout: str = DEFAULT_LAYOUT) -> int:
    """The largest T whose size hint DeepEP accepts (0 if none): the size grows monotonically with T."""

    def fits(T: int) -> bool:
        hint = LowLatencyLayout(
            num_max_dispatch_tokens_per_rank=T,
            hidden=hidden,
            num_ranks=num_ranks,
            num_experts=num_experts,
            layout=layout,
        ).size_hint_bytes
        return rdma_bytes_fit(hint)

    low, high = 0, 1
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:  # invariant: fits(low) or low == 0, not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def nvl_allocation_bytes(num_nvl_bytes: int) -> int:
    """What Buffer's constructor cudaMallocs for the NVL buffer (nothing when num_nvl_bytes is 0)."""
    return num_nvl_bytes + NVL_METADATA_BYTES if num_nvl_bytes > 0 else 0


@dataclass(frozen=True, kw_only=True)
class LowLatencyRecv:
    """The tensors low_latency_dispatch allocates per call (torch.empty on the current stream), in bytes."""

    num_local_experts: int
    num_ranks: int
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    use_fp8: bool

    @property
    def num_slots(self) -> int:
        """Per-expert receive slots, R·T (= M of the batched format)."""
        return self.num_ranks * self.num_max_dispatch_tokens_per_rank

    @property
    def x_bytes(self) -> int:
        return self.num_local_experts * self.num_slots * self.hidden * (1 if self.use_fp8 else 2)

    @property
    def scales_bytes(self) -> int:
        return self.num_local_experts * (self.hidden // 128) * self.num_slots * 4 if self.use_fp8 else 0

    @property
    def metadata_bytes(self) -> int:
        E = self.num_local_experts
        return E * self.num_slots * 4 + E * self.num_ranks * 8 + E * 4

    @property
    def total_bytes(self) -> int:
        return self.x_bytes + self.scales_bytes + self.metadata_bytes


# --- the comm path's view: one call, one record of every part (harness.rank.comm) ------------------------------------

CombineVariant = Literal["bf16", "logfmt"]
ALIGNMENT_BYTES = BUFFER_ALIGNMENT_BYTES
_VARIANT_LAYOUT = {"logfmt": LOGFMT_COMBINE, "bf16": BF16_COMBINE}


@dataclass(frozen=True, kw_only=True)
class DeepEpLowLatencyBytes:
    """One GPU's DeepEP low-latency RDMA buffer as vLLM asks for it (the size hint), with its parts."""

    max_tokens_per_rank: int
    hidden_size: int
    num_experts: int
    combine_variant: CombineVariant
    msg_dispatch_bytes: int
    msg_combine_bytes: int
    send_bytes: int  # per buffer (there are two)
    recv_bytes: int  # per buffer
    signal_bytes: int  # per buffer
    layout_bytes: int  # LowLatencyLayout::total_bytes, what dispatch asserts the buffer holds
    total_bytes: int  # get_low_latency_rdma_size_hint: what vLLM passes Buffer as num_rdma_bytes


def deepep_low_latency_bytes(
    *, max_tokens_per_rank: int, hidden_size: int, num_experts: int, combine_variant: CombineVariant = "logfmt"
) -> DeepEpLowLatencyBytes:
    """DeepEP LL's buffer for T = max_tokens_per_rank tokens of K = hidden_size over num_experts global experts."""
    layout = LowLatencyLayout(num_max_dispatch_tokens_per_rank=max_tokens_per_rank, hidden=hidden_size,
                              num_ranks=1, num_experts=num_experts,
                              layout=_VARIANT_LAYOUT[combine_variant])  # fmt: skip
    return DeepEpLowLatencyBytes(
        max_tokens_per_rank=max_tokens_per_rank, hidden_size=hidden_size, num_experts=num_experts,
        combine_variant=combine_variant, msg_dispatch_bytes=layout.dispatch_msg_bytes,
        msg_combine_bytes=layout.combine_msg_bytes, send_bytes=layout.send_bytes, recv_bytes=layout.recv_bytes,
        signal_bytes=layout.signal_bytes, layout_bytes=layout.total_bytes, total_bytes=layout.size_hint_bytes,
    )  # fmt: skip
