"""What `harness run` holds as ballast with memory.deployment_ballast: the rest of the deployment the layer sits in.

The run allocates one MoE layer itself (its expert weights, the dispatch buffers, DeepEP's RDMA region) and the
workspace per policy. A real deployment holds, besides: every other layer's weights and the KV cache vLLM sizes at
gpu_memory_utilization from what is left. Both are predicted here without a release (GPU hosts have no registry):
the deployment model of harness.sizing.deployment on the scenario's model, layout and `deployment:` section,
DeepEP's buffer from the layer model, and the defaults' table. vLLM's order is kept (v1/worker/gpu_worker.py):

    setup, once       ballast-weights   every layer's weights - the layer's expert weights the run allocates itself
                      ballast-held      buffers held once the run does not allocate (DeepEP's NVL buffer and
                                        workspace, EPLB's)
                      ballast-runtime   the profile run's peak (the cuBLAS workspace, the larger phase's activations
                                        less the dispatch receive tensors the run allocates), non-torch memory, the
                                        CUDA-graph estimate
    each policy       its workspace     (the run's own allocation: the profile run's MoE workspace)
                      ballast-kv-cache  requested (total x utilization) - everything above with THIS policy's
                                        workspace, in blocks: policy_kv_cache

So a policy whose workspace fits but leaves less room starts with fewer KV tokens, as `harness plan` says, and
one whose KV cache cannot hold one request (vLLM: "No available memory for the cache blocks" / "To serve at least
one request") does not start: the run records it as out of memory at the kv-cache stage. Together with what the
run allocates, the process then holds what vLLM would: total x gpu_memory_utilization.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.contract import fixed_shapes
from harness.scenario.schema import Scenario
from harness.sizing import deepep
from harness.sizing.deployment import DeploymentLine, DeploymentPlan, plan_deployment, resolve
from harness.sizing.deployment_plan import scenario_deployment
from harness.sizing.layer import run_predictions
from harness.sizing.model_config import load_model

BALLAST_PARTS = ("ballast-weights", "ballast-held", "ballast-runtime")  # held from setup on
KV_PART = "ballast-kv-cache"  # per policy, after its workspace
DEFAULT_DEEPEP_BUFFER_MB = 1024


@dataclass(frozen=True)
class BallastPart:
    name: str  # one of BALLAST_PARTS
    bytes: int
    source: str


def deployment_plan_without_release(scenario: Scenario, total_bytes: int,
                                    workspace_bytes: int | None = None) -> DeploymentPlan:  # fmt: skip
    """The scenario's deployment on a GPU of total_bytes with a policy's workspace (default: the fixed policy's, the
    one a fixed release holds) and table defaults."""
    model, spec = scenario_deployment(scenario)
    facts = load_model(model)
    local = scenario.num_local_experts if spec.enable_expert_parallel else None
    r = resolve(facts, spec, None, None, gpu_bytes=total_bytes, gpu=None, local_experts=local, origin="scenario")
    predicted = run_predictions(scenario)
    given = workspace_bytes is not None
    workspace = workspace_bytes if workspace_bytes is not None else fixed_shapes(scenario.sizing_args()).total_bytes
    held = [DeploymentLine(group="held-once", name="moe-workspace", bytes=workspace, kind="exact",
                           source="the policy's workspace, allocated by the run" if given else
                           "the fixed sizing policy's workspace (harness.core.contract.fixed_shapes)")]  # fmt: skip
    if scenario.layer.all2all == "deepep-low-latency":
        rdma = predicted["deepep-rdma"]
        buffer_mb = scenario.layer.deepep_buffer_size_mb or DEFAULT_DEEPEP_BUFFER_MB
        recv = deepep.LowLatencyRecv(num_local_experts=scenario.num_local_experts,
                                     num_ranks=scenario.parallel.num_dispatchers,
                                     num_max_dispatch_tokens_per_rank=scenario.parallel.max_tokens_per_rank,
                                     hidden=scenario.model.hidden_size or 0, use_fp8=True)  # fmt: skip
        held += [
            DeploymentLine(group="held-once", name="deepep-rdma", bytes=rdma.bytes, kind="exact", source=rdma.source),
            DeploymentLine(group="held-once", name="deepep-nvl", bytes=deepep.nvl_allocation_bytes(buffer_mb * 2**20),
                           kind="exact", source=f"DeepEP's NVL buffer: VLLM_DEEPEP_BUFFER_SIZE_MB {buffer_mb} (table: "
                           "envs.py's default in 0.22.0-0.33.0) + peer metadata"),
            DeploymentLine(group="held-once", name="deepep-workspace", bytes=deepep.WORKSPACE_BYTES, kind="exact",
                           source="DeepEP Buffer's 32 MiB workspace"),
            DeploymentLine(group="profile-peak", name="dispatch receive", bytes=recv.total_bytes, kind="exact",
                           source="low_latency_dispatch's receive tensors, fp8 (harness.sizing.deepep.LowLatencyRecv)"),
        ]  # fmt: skip
    return plan_deployment(facts, r, None, version=None, gpu=None, total_bytes=total_bytes, layer_lines=held)


def ballast_parts(scenario: Scenario, total_bytes: int) -> list[BallastPart]:
    """The deployment's memory less what the run allocates itself (the layer's expert weights, its DeepEP RDMA
    region when memory.comm_buffer holds one, its dispatch buffers, each policy's workspace), as four parts."""
    plan = deployment_plan_without_release(scenario, total_bytes)
    own = run_predictions(scenario)["expert-weights"].bytes
    run_holds_rdma = scenario.memory.comm_buffer == "deepep-ll" and scenario.layer.all2all == "deepep-low-latency"
    skip = {"moe-workspace", *(("deepep-rdma",) if run_holds_rdma else ())}
    held = [line for line in plan.lines if line.group == "held-once" and line.name not in skip]
    # the profile peak less the dispatch receive tensors, which the run allocates itself
    runtime = [line for line in plan.lines if (line.group == "profile-peak" and line.name != "dispatch receive")
               or line.group in ("non-torch", "cuda-graphs")]  # fmt: skip
    def described(lines: list[DeploymentLine]) -> str:
        return "; ".join(f"{line.name} {line.bytes} B ({line.kind})" for line in lines) or "none"

    return [
        BallastPart("ballast-weights", max(0, plan.group_bytes("weights") - own),
                    f"deployment model: every layer's weights ({plan.group_bytes('weights')} B, "
                    f"harness.sizing.deployment_weights) less the layer's expert weights the run allocates ({own} B)"),
        BallastPart("ballast-held", sum(line.bytes for line in held),
                    f"deployment model: buffers held once that the run does not allocate: {described(held)}"),
        BallastPart("ballast-runtime", sum(line.bytes for line in runtime),
                    f"deployment model: the profile peak and the memory outside torch: {described(runtime)}"),
    ]  # fmt: skip


@dataclass(frozen=True)
class PolicyKv:
    """The KV cache vLLM would size with one policy's workspace, and whether the deployment starts."""

    policy: str
    bytes: int  # what the run allocates as ballast-kv-cache (0 when the deployment does not start)
    tokens: int
    num_blocks: int
    outcome: str  # the plan's verdict: starts, fails, oom, refused
    verdict: str
    source: str


def policy_kv_cache(scenario: Scenario, total_bytes: int, policy: str, workspace_bytes: int) -> PolicyKv:
    """The KV cache of the scenario's deployment with this policy's workspace: the deployment model's plan with
    that workspace held once, the KV cache from what is left of total x gpu_memory_utilization."""
    plan = deployment_plan_without_release(scenario, total_bytes, workspace_bytes)
    starts = plan.verdict.outcome == "starts"
    return PolicyKv(
        policy=policy, bytes=plan.kv_cache_bytes if starts else 0, tokens=plan.kv_tokens if starts else 0,
        num_blocks=plan.kv_num_blocks if starts else 0, outcome=plan.verdict.outcome, verdict=plan.verdict.text,
        source=f"deployment model with {policy}'s workspace ({workspace_bytes} B): the KV cache at "
        f"gpu_memory_utilization {plan.setting('gpu_memory_utilization')} of {total_bytes} B: {plan.kv_num_blocks} "
        f"blocks x {plan.block_size} tokens x {plan.kv_bytes_per_token} B/token; {plan.verdict.text}",
    )  # fmt: skip
