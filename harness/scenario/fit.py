"""Can this machine (or cluster) run a scenario? A separate check from validation, returning a reason or None.

Validation (harness.scenario.schema) says whether a scenario is well formed anywhere; this says whether the
resources a launcher reports can hold it: the rank count against the CPUs and GPUs, and an estimate of each
rank's memory against what the device has (CPU: the available RAM, shared by every local rank; GPU: the total
memory of one device, or the scenario's budget). It takes the resources as data and never touches a device, so
`harness run` answers before torch is imported or a rank is spawned.

The estimate counts what a rank allocates before its first policy (weights, dispatch and combine buffers,
tokens, ballast) plus the process itself; on CPU, where an allocation past the RAM is not an error but the OOM
killer, it adds the largest workspace of the scenario's policies. On a GPU a workspace that does not fit is an
OOM the run records (often the expected outcome), so it is not counted there.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.backends import COMM, EXPERTS, BackendQuery, DeviceType
from harness.core.comm_buffers import CommLayout, comm_bytes
from harness.core.contract import BUILTIN_POLICIES, DTYPE_BYTES, builtin_shapes
from harness.core.units import GIB, human_bytes
from harness.scenario.schema import Scenario

__all__ = [
    "DeviceType",
    "Machine",
    "RankMemory",
    "backend_query",
    "backends_reason",
    "can_run",
    "estimate_rank_memory",
    "resolve_device",
]

# Ranks per CPU core a local CPU run may start: the CI machine runs 8 ranks on 2 cores (scenarios/smoke-8ranks).
MAX_RANKS_PER_CPU = 4
# Resident memory of a rank process before it allocates: 220 MiB measured after `import torch` (2.13, CPU),
# plus the gloo group and the interpreter's own.
CPU_RANK_OVERHEAD_BYTES = 300 * 2**20
# A CUDA context and NCCL's buffers, which the rank cannot do without.
GPU_RANK_OVERHEAD_BYTES = GIB


@dataclass(frozen=True, kw_only=True)
class Machine:
    """What a launcher can place ranks on, as data."""

    num_cpus: int
    num_gpus: int
    description: str  # "this machine: 2 CPU, 0 GPU"
    cpu_memory_bytes: int | None = None  # RAM available to all ranks together; None: not known
    gpu_memory_bytes: int | None = None  # total memory of the smallest GPU; None: not known
    shared: bool = True  # every rank on this one machine (the local launcher): CPU memory adds up


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """Estimated bytes of one rank, by what holds them."""

    weights_bytes: int  # FP8 w1, w2 and their float32 scales
    buffers_bytes: int  # dispatch and combine buffers, allocated once at full capacity
    tokens_bytes: int  # the rank's hidden states and routing
    ballast_bytes: int
    workspace_bytes: int  # the largest workspace among the scenario's policies
    transient_bytes: int  # one expert's float weights while they are generated, the reference's float rows
    process_bytes: int

    @property
    def setup_bytes(self) -> int:
        """What a rank holds before its first policy (ballast aside)."""
        return self.weights_bytes + self.buffers_bytes + self.tokens_bytes

    def on(self, device_type: DeviceType) -> int:
        """What must fit: on CPU everything that is paged in (ballast is not); on GPU all but the workspace."""
        if device_type == "cpu":
            return self.setup_bytes + self.workspace_bytes + self.transient_bytes + self.process_bytes
        return self.setup_bytes + self.ballast_bytes + self.transient_bytes + self.process_bytes


def resolve_device(scenario: Scenario, num_gpus: int) -> DeviceType:
    """The scenario's device; "auto" takes GPUs when there is one per physical rank."""
    if scenario.device == "auto":
        return "cuda" if num_gpus >= scenario.parallel.num_ranks else "cpu"
    return scenario.device


def _largest_workspace_bytes(scenario: Scenario) -> int:
    """A release policy sizes like one of the builtin ones (legacy or fixed), so the builtin maximum bounds it."""
    args = scenario.sizing_args()
    return max(builtin_shapes(policy, args).total_bytes for policy in BUILTIN_POLICIES)


def backend_query(scenario: Scenario, device_type: DeviceType) -> BackendQuery:
    """What the backends' declarations (harness.core.backends) are asked about, for `device_type` ranks."""
    m = scenario.model
    return BackendQuery(
        device_type=device_type,
        num_ranks=scenario.parallel.num_ranks,
        num_local_experts=scenario.num_local_experts,
        activation=m.activation or "silu",
        workspace_dtype=m.workspace_dtype,
        quant_dtype=m.quant_dtype,
    )


def backends_reason(scenario: Scenario, device_type: DeviceType) -> str | None:
    """Why the scenario's experts_backend or comm cannot run on `device_type` ranks, or None: the one check of
    the backends' declarations. What only a rank can tell (symmetric memory, sm90, an ops library) is asked there."""
    query = backend_query(scenario, device_type)
    return EXPERTS.reason(scenario.experts_backend, query) or COMM.reason(scenario.comm, query)


def comm_layout(s: Scenario) -> CommLayout:
    """The sizes a rank's comm buffers are declared from (harness.core.comm_buffers), for this scenario: C is the
    most tokens any rank routes (harness.rank.lifecycle.dispatch_layout)."""
    return CommLayout(
        num_local_experts=s.num_local_experts,
        max_slots_per_expert=s.parallel.max_tokens_per_rank * s.parallel.num_dispatchers,
        hidden_size=s.model.hidden_size or 0,
        num_ranks=s.parallel.num_ranks,
        buffer_tokens=max(s.num_tokens_on_rank(r) for r in range(s.parallel.num_ranks)),
        top_k=s.model.top_k or 1,
        out_itemsize=DTYPE_BYTES[s.model.workspace_dtype],
    )


def comm_backend(s: Scenario, device_type: DeviceType) -> str:
    """The comm backend a rank would take: the scenario's, or for auto the first of its order that the data allow
    (symm-mem on 2 GPUs or more)."""
    if s.comm != "auto":
        return s.comm
    candidates = COMM.auto_candidates(backend_query(s, device_type))
    return candidates[0].name if candidates else "gloo" if device_type == "cpu" else "nccl"


def _comm_buffers_bytes(s: Scenario, device_type: DeviceType) -> tuple[int, int]:
    """(dispatch, combine) bytes of the comm backend a rank would allocate (harness.rank.comm.create_comm), from
    the buffers harness.core.comm_buffers declares and harness.rank.comm allocates. DeepEP's comm region is not
    here: it is harness.sizing.deepep's, above this layer."""
    return comm_bytes(comm_backend(s, device_type), comm_layout(s))


def estimate_rank_memory(scenario: Scenario, device_type: DeviceType) -> RankMemory:
    """Bytes rank 0 would hold, from the shapes of harness.rank (experts.make_weights, comm.create_comm)."""
    s = scenario
    E, K, I = s.num_local_experts, s.model.hidden_size or 0, s.model.intermediate_size or 0
    D, P, T = s.parallel.num_dispatchers, s.parallel.num_ranks, s.parallel.max_tokens_per_rank
    M, top_k = T * D, s.model.top_k or 1
    out_bytes = DTYPE_BYTES[s.model.workspace_dtype]
    buffer_tokens = max(s.num_tokens_on_rank(r) for r in range(P))
    send_rows = buffer_tokens * top_k
    weights = E * (3 * I * K) + E * (2 * I + K) * 4  # fp8 w1 (E, 2I, K), w2 (E, K, I); float32 scales
    dispatch, combine = _comm_buffers_bytes(s, device_type)
    tokens = buffer_tokens * K * out_bytes + send_rows * (8 + 4)
    workspace = _largest_workspace_bytes(s)
    if device_type == "cpu" and s.memory.budget_bytes is not None:
        workspace = min(workspace, max(0, s.memory.budget_bytes - weights - dispatch - combine))
    return RankMemory(
        weights_bytes=weights,
        buffers_bytes=dispatch + combine,
        tokens_bytes=tokens,
        ballast_bytes=s.memory.ballast_bytes,
        workspace_bytes=workspace,
        transient_bytes=3 * I * K * 4 + (4 * M * (2 * I + K) if device_type == "cpu" else 0),
        process_bytes=CPU_RANK_OVERHEAD_BYTES if device_type == "cpu" else GPU_RANK_OVERHEAD_BYTES,
    )


def _gib(num_bytes: int) -> str:
    return human_bytes(num_bytes)  # "1.78 TiB", never "1.82e+03 GiB"


def _count_reason(scenario: Scenario, machine: Machine, device_type: DeviceType) -> str | None:
    P = scenario.parallel.num_ranks
    if device_type == "cuda" and machine.num_gpus < P:
        return f"the scenario needs {P} GPUs (one per physical rank), {machine.num_gpus} are available"
    reason = backends_reason(scenario, device_type)
    if reason is not None:
        return reason
    if device_type == "cpu" and machine.shared and P > MAX_RANKS_PER_CPU * machine.num_cpus:
        return (
            f"parallel.num_ranks ({P}) CPU ranks on {machine.num_cpus} CPU core(s); allowed: at most "
            f"{MAX_RANKS_PER_CPU} ranks per core ({MAX_RANKS_PER_CPU * machine.num_cpus} here)"
        )
    if not machine.shared and P * scenario.launch.cpus_per_rank > machine.num_cpus:
        return (
            f"parallel.num_ranks ({P}) x launch.cpus_per_rank ({scenario.launch.cpus_per_rank}) CPUs; "
            f"allowed: at most the cluster's {machine.num_cpus}"
        )
    return None


def _memory_reason(scenario: Scenario, machine: Machine, device_type: DeviceType) -> str | None:
    estimate = estimate_rank_memory(scenario, device_type)
    need = estimate.on(device_type)
    if device_type == "cpu" and machine.cpu_memory_bytes is not None:
        num_local = scenario.parallel.num_ranks if machine.shared else 1
        if need * num_local > machine.cpu_memory_bytes:
            return (
                f"{num_local} rank(s) need about {_gib(need)} of RAM each (weights and buffers "
                f"{_gib(estimate.setup_bytes)}, largest workspace {_gib(estimate.workspace_bytes)}), "
                f"{_gib(need * num_local)} in all; allowed: the {_gib(machine.cpu_memory_bytes)} available"
            )
    if device_type == "cuda":
        limits = [b for b in (machine.gpu_memory_bytes, scenario.memory.budget_bytes) if b is not None]
        if limits and need > min(limits):
            what = "the budget" if min(limits) == scenario.memory.budget_bytes else "the GPU's memory"
            return (
                f"each rank needs about {_gib(need)} before its first workspace (weights and buffers "
                f"{_gib(estimate.setup_bytes)}, ballast {_gib(estimate.ballast_bytes)}); allowed: {what}, "
                f"{_gib(min(limits))}"
            )
    return None


def can_run(
    scenario: Scenario, *, device_type: DeviceType, num_gpus: int | None = None, machine: Machine | None = None
) -> str | None:
    """Why this scenario cannot run with these resources, or None. Never touches a device itself.

    With only `num_gpus` it checks the GPU count and the backend; with a `machine` also the CPU count and the
    estimated memory per rank.
    """
    if machine is None:
        machine = Machine(num_cpus=2**31, num_gpus=num_gpus or 0, description="", shared=True)
    return _count_reason(scenario, machine, device_type) or _memory_reason(scenario, machine, device_type)
