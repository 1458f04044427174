"""The sections of a scenario file, one pydantic model each (model, parallel, routing, memory, expect, bench,
launch, vllm, layer), and the value rules they share (counts, amounts, release versions, safe names).
harness.scenario.schema puts them together into the Scenario."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.core.backends import COMM, EXPERTS
from harness.core.contract import RELEASE_POLICY_PREFIX
from harness.core.records import STAGES, Stage
from harness.scenario import limits as L
from harness.scenario.limits import shown
from harness.scenario.presets import PRESETS

REPO_DIR = Path(__file__).resolve().parents[2]
SCENARIOS_DIR = REPO_DIR / "scenarios"

# Total memory that NVML reports for GPUs a budget can emulate, in bytes.
GPU_MEMORY_BYTES: dict[str, int] = {
    "A100-40GB": 40960 * 2**20,
    "A100-80GB": 81920 * 2**20,
    "H100-80GB": 81559 * 2**20,
    "H100-94GB": 95830 * 2**20,
    "H20-96GB": 97871 * 2**20,
    "H200-141GB": 143771 * 2**20,
}


Path_ = Annotated[str, Field(min_length=1, max_length=L.MAX_PATH_CHARS)]

# X.Y.Z and an optional suffix (rc1, .post1, +cu130): checked in linear time, without a backtracking pattern.
_VERSION_HEAD = re.compile(r"\d{1,4}\.\d{1,4}\.\d{1,4}")
_VERSION_SUFFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+-")
MAX_VERSION_SUFFIX_CHARS = 24
VERSION_TEXT = f"X.Y.Z (numbers of at most 4 digits) and at most {MAX_VERSION_SUFFIX_CHARS} of [A-Za-z0-9.+-]"
_SAFE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-")


def is_release_version(text: str) -> bool:
    """'0.30.0', '0.9.2rc1', '0.10.1+cu128': the version part of a release policy or of vllm.version."""
    head = _VERSION_HEAD.match(text)
    if head is None:
        return False
    suffix = text[head.end() :]
    return len(suffix) <= MAX_VERSION_SUFFIX_CHARS and all(ch in _VERSION_SUFFIX_CHARS for ch in suffix)


def is_release_policy_name(policy: str) -> bool:
    return policy.startswith(RELEASE_POLICY_PREFIX) and is_release_version(policy.removeprefix(RELEASE_POLICY_PREFIX))


def is_safe_name(name: str, max_chars: int = L.MAX_NAME_CHARS) -> bool:
    """A name usable as one path component: no '/', no '..', no control characters, not too long."""
    return 0 < len(name) <= max_chars and name[0].isascii() and name[0].isalnum() and set(name) <= _SAFE_NAME_CHARS


def safe_name(text: str, max_chars: int = L.MAX_NAME_CHARS) -> str:
    """`text` made into a safe name: other characters become '-', at most max_chars ('run' when nothing is left)."""
    cleaned = "".join(ch if ch in _SAFE_NAME_CHARS else "-" for ch in text[: max_chars * 2])
    cleaned = cleaned.lstrip("._+-")[:max_chars].rstrip(".")
    return cleaned or "run"


# The names harness.core.backends declares (pydantic's refusal lists them: "Input should be 'auto', ... or ...").
if TYPE_CHECKING:  # a Literal of names computed at import time is beyond a static checker
    ExpertsBackendName = str
    CommName = str
else:
    ExpertsBackendName = Literal[EXPERTS.choices]
    CommName = Literal[COMM.choices]


class _Strict(BaseModel):
    # strict: a YAML `true`, "512" or 512.0 is not an integer; allow_inf_nan: .inf and .nan are not numbers.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """The MoE layer's shapes. `preset` fills any field left out."""

    preset: str | None = Field(None, description=f"fills any shape left out: {', '.join(PRESETS)}")
    hidden_size: Annotated[int, Field(gt=0, le=L.MAX_HIDDEN_SIZE)] | None = Field(None, description="K")
    intermediate_size: Annotated[int, Field(gt=0, le=L.MAX_INTERMEDIATE_SIZE)] | None = Field(
        None, description="I; GEMM1 outputs N = 2I"
    )
    num_experts: Annotated[int, Field(gt=0, le=L.MAX_NUM_EXPERTS)] | None = Field(
        None, description="routed experts of the model"
    )
    top_k: Annotated[int, Field(gt=0, le=L.MAX_TOP_K)] | None = Field(
        None, description="distinct experts each token picks"
    )
    activation: Literal["silu", "gelu"] | None = Field(
        None, description="gated, on GEMM1's (gate, up) halves; default the preset's, else silu"
    )
    workspace_dtype: Literal["bfloat16", "float16"] = Field(
        "bfloat16", description="dtype of the workspace buffers and the GEMM outputs"
    )
    quant_dtype: Literal["float8_e4m3fn"] = Field(
        "float8_e4m3fn", description="dtype of the dispatched activations and the expert weights"
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"unknown preset {shown(value)}; allowed: {', '.join(sorted(PRESETS))}")
        return value

    @model_validator(mode="after")
    def _fill_from_preset(self) -> ModelSpec:
        """hidden_size, intermediate_size, num_experts and top_k come from the file or from model.preset."""
        filled: dict[str, Any] = {}
        if self.preset is not None:
            preset = PRESETS[self.preset]
            for name in ("hidden_size", "intermediate_size", "num_experts", "top_k", "activation"):
                if getattr(self, name) is None:
                    filled[name] = getattr(preset, name)
        if self.activation is None and "activation" not in filled:
            filled["activation"] = "silu"
        # Rebuilt, never mutated: the model is frozen (validated through model_validate, which keeps the copy).
        spec = self.model_copy(update=filled) if filled else self
        missing = [n for n in ("hidden_size", "intermediate_size", "num_experts", "top_k") if getattr(spec, n) is None]
        if missing:
            raise ValueError(f"missing {', '.join('model.' + m for m in missing)}: give them or a model.preset")
        return spec


class ParallelSpec(_Strict):
    """The EP+DP layout: D dispatchers (emulated by P <= D physical ranks), E local experts, T tokens each."""

    num_dispatchers: Annotated[int, Field(gt=0, le=L.MAX_NUM_DISPATCHERS)] = Field(
        description="D, the EP/DP world size whose memory is reproduced"
    )
    num_ranks: Annotated[int, Field(gt=0, le=L.MAX_NUM_RANKS)] = Field(
        1,
        description="P, physical ranks (one GPU each); D/P dispatchers each; `harness run` also checks them "
        "against the machine",
    )
    num_local_experts: Annotated[int, Field(gt=0, le=L.MAX_NUM_EXPERTS)] | None = Field(
        None, description="E; default num_experts / D"
    )
    max_tokens_per_rank: Annotated[int, Field(gt=0, le=L.MAX_TOKENS_PER_RANK)] = Field(
        description="T, per-dispatcher token capacity"
    )


class RoutingSpec(_Strict):
    """Which experts the tokens pick; seeded, so every rank can regenerate every rank's choice."""

    kind: Literal["uniform", "skewed", "worst-case"] = Field(
        "uniform", description="skewed: Zipf popularity over experts; worst-case: every token picks expert 0"
    )
    num_tokens: Annotated[int, Field(gt=0, le=L.MAX_TOKENS_PER_RANK)] | None = Field(
        None, description="tokens per dispatcher; default T"
    )
    zipf_exponent: Annotated[float, Field(gt=0, le=L.MAX_ZIPF_EXPONENT)] = Field(
        1.2, description="skewed: expert popularity ~ 1/rank^s"
    )
    idle_ranks: list[Annotated[int, Field(ge=0, lt=L.MAX_NUM_RANKS)]] = Field(
        default_factory=list,
        max_length=L.MAX_NUM_RANKS,
        description="physical ranks that hold no tokens (DP ranks without requests)",
    )


class MemorySpec(_Strict):
    """How memory is measured, and a budget or ballast that emulates a smaller GPU or a loaded one."""

    budget_gb: Annotated[float, Field(gt=0, le=L.MAX_MEMORY_GB)] | None = Field(
        None, description="device memory the process may use, in GB (1e9 B)"
    )
    budget_gpu: str | None = Field(None, description=f"a named GPU to emulate: {', '.join(GPU_MEMORY_BYTES)}")
    ballast_gb: Annotated[float, Field(ge=0, le=L.MAX_MEMORY_GB)] = Field(
        0.0, description="stands for weights + KV cache, GB"
    )
    method: Literal["same-baseline"] = Field(
        "same-baseline", description="every policy measured from one baseline: weights and comm buffers up, cache empty"
    )
    sample_interval_ms: Annotated[float, Field(ge=L.MIN_SAMPLE_INTERVAL_MS, le=L.MAX_SAMPLE_INTERVAL_MS)] = Field(
        1.0, description="period of the peak-memory sampler (a shorter one would spin)"
    )
    comm_buffer: Literal["deepep-ll", "none"] = Field(
        "deepep-ll",
        description="deepep-ll: hold DeepEP low-latency's buffer for the same T, K and experts, as "
        "vLLM's batched path does (when layer.all2all is deepep-low-latency), counted as comm; none: only the "
        "harness's own send/receive buffers",
    )
    deployment_ballast: bool = Field(
        False,
        description="hold the rest of the deployment as ballast: every other layer's weights and the KV cache "
        "at gpu_memory_utilization, predicted from the scenario's model and deployment section "
        "(docs/deployment-memory.md)",
    )
    snapshot_on_oom: bool = Field(
        True, description="with a budget on GPU: dump a CUDA allocator snapshot next to the records on OOM"
    )

    @field_validator("budget_gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is not None and value not in GPU_MEMORY_BYTES:
            raise ValueError(f"unknown GPU {shown(value)}; allowed: {', '.join(GPU_MEMORY_BYTES)}")
        return value

    @model_validator(mode="after")
    def _one_budget(self) -> MemorySpec:
        """memory.budget_gb and memory.budget_gpu exclude each other; a budget is 1 MiB at least."""
        if self.budget_gb is not None and self.budget_gpu is not None:
            raise ValueError("give memory.budget_gb or memory.budget_gpu, not both")
        if self.budget_gb is not None and self.budget_gb * 1e9 < L.MIN_BUDGET_BYTES:
            # 4.9e-324 GB is a 0-byte budget: every allocation would fail, and the ranks with it
            raise ValueError(
                f"memory.budget_gb {shown(self.budget_gb)} is {int(self.budget_gb * 1e9)} bytes; allowed: "
                f"at least {L.MIN_BUDGET_BYTES} bytes (1 MiB, {L.MIN_BUDGET_BYTES / 1e9:g} GB)"
            )
        return self

    @property
    def budget_bytes(self) -> int | None:
        if self.budget_gpu is not None:
            return GPU_MEMORY_BYTES[self.budget_gpu]
        if self.budget_gb is not None:
            return int(self.budget_gb * 1e9)
        return None

    @property
    def ballast_bytes(self) -> int:
        return int(self.ballast_gb * 1e9)


# --- kernels: the correctness check's stages and the kernels expected to be wrong -------------------------------------
NonNegativeFloat = Annotated[float, Field(ge=0, le=L.MAX_RATIO)]


class StageTolerances(_Strict):
    """Per-row error each stage of the correctness check allows: max |got - ref| / max |ref| over a row.

    The defaults follow the number formats: a bf16 result is within 2^-8 of its float32 value (activation and
    combine allow 2^-6); FP8 e4m3 rounds to within 16/448 = 0.036 of a row's largest value (quant allows 2^-4);
    FP8 GEMMs on tensor cores may accumulate with about 14 bits (fast accumulation: up to about 2% for K = 4096 in
    the DeepSeek-V3 report), so gemm1 and gemm2 allow 2^-4. A row computed from the wrong inputs is off by order 1.
    """

    dispatch: NonNegativeFloat = Field(0.0, description="slots hold the sent FP8 bytes and scales exactly")
    gemm1: NonNegativeFloat = Field(0.0625, description="mm1_out vs the reference GEMM1 of the actual input")
    activation: NonNegativeFloat = Field(0.015625, description="act_out vs silu(gate) * up of the actual mm1_out")
    quant: NonNegativeFloat = Field(0.0625, description="dequantized quant_out vs the actual act_out")
    gemm2: NonNegativeFloat = Field(0.0625, description="mm2_out and out vs the reference GEMM2 of quant_out")
    combine: NonNegativeFloat = Field(0.015625, description="tokens vs the weighted sum of the rows that came back")


class WrongKernels(_Strict):
    """How a kernels release is expected to be wrong: the correctness check must find exactly this."""

    stage: Stage = Field(description="the first stage that diverges: " + ", ".join(STAGES))
    first_wrong_row: Annotated[int, Field(ge=0, le=L.MAX_ROW_INDEX)] | None = Field(
        None, description="global row of the (E*M) view where it starts (combine: token); unset: any"
    )
    reason: str = Field("", max_length=L.MAX_DESCRIPTION_CHARS, description="why, e.g. the upstream issue and the fix")


class ExpectSpec(_Strict):
    """What the run should find; a run whose findings differ fails."""

    outcomes: dict[str, Literal["fit", "oom"]] = Field(
        default_factory=dict, max_length=L.MAX_POLICIES, description="policy -> fit | oom"
    )
    memory_tolerance_pct: Annotated[float, Field(gt=0, le=L.MAX_PERCENT)] = Field(
        2.0, description="measured workspace delta vs contract, percent"
    )
    max_error: Annotated[float, Field(gt=0, le=L.MAX_RATIO)] = Field(
        0.06, description="combined output vs reference, max relative error"
    )
    stage_tolerance: StageTolerances = Field(
        default_factory=StageTolerances, description="per-stage row error of the correctness check"
    )
    wrong_kernels: dict[str, WrongKernels] = Field(
        default_factory=dict,
        max_length=L.MAX_POLICIES,
        description="vLLM release -> how its kernels are expected to be wrong (the run passes when they are)",
    )

    @field_validator("wrong_kernels")
    @classmethod
    def _release_keys(cls, value: dict[str, WrongKernels]) -> dict[str, WrongKernels]:
        bad = [k for k in value if not is_release_version(k)]
        if bad:
            raise ValueError(f"expect.wrong_kernels keys are vLLM releases like 0.26.0, got {shown(bad)}")
        return value


class BenchSpec(_Strict):
    """Thresholds of `harness bench`: the harness's own stages against the raw kernels and collectives."""

    experts_ratio_min: Annotated[float, Field(gt=0, le=L.MAX_RATIO)] = Field(
        0.95, description="harness experts TFLOP/s over the raw kernels', at least"
    )
    comm_busbw_ratio_min: Annotated[float, Field(gt=0, le=L.MAX_RATIO)] = Field(
        0.90,
        description="diagnostic, not gating: the fastest raw all_to_all_single moving the backend's bytes "
        "over the harness's dispatch + combine",
    )
    comm_bound_ratio_min: Annotated[float, Field(gt=0, le=L.MAX_RATIO)] = Field(
        0.5,
        description="the comm yardstick: (minimal remote bytes / link bandwidth + unavoidable local bytes / "
        "HBM bandwidth, both probed in the run) over the graph-replayed dispatch + combine, at "
        "least; n/a (not gating) on CPU ranks",
    )
    iterations: Annotated[int, Field(gt=0, le=L.MAX_ITERATIONS)] = Field(
        20, description="timed iterations per measurement"
    )


class LaunchSpec(_Strict):
    """How the ranks start: local processes, or Ray actors in one placement group."""

    launcher: Literal["local", "ray"] = Field("local", description="`harness run --launcher` overrides it")
    placement_strategy: Literal["PACK", "SPREAD"] = Field("PACK", description="Ray placement group strategy")
    cpus_per_rank: Annotated[int, Field(gt=0, le=L.MAX_CPUS_PER_RANK)] = Field(
        1, description="CPUs in each rank's Ray bundle"
    )
    placement_timeout_s: Annotated[float, Field(gt=0, le=L.MAX_TIMEOUT_S)] = Field(
        60.0, description="wait for the Ray placement group at most this"
    )
    rank_timeout_s: Annotated[float, Field(gt=0, le=L.MAX_TIMEOUT_S)] = Field(
        900.0, description="a rank still running after this ends the run, partial"
    )
    collective_timeout_s: Annotated[float, Field(gt=0, le=L.MAX_TIMEOUT_S)] = Field(
        60.0, description="timeout of each torch.distributed collective"
    )


class VllmSpec(_Strict):
    """Where the vllm-ops backend gets vLLM's compiled ops (the kernels) from; at most one source.

    vllm.kernels names the release whose ops run, independently of the sizing policies (`vllm==X.Y.Z`
    policies read their own release). It may go with vllm.ops_library: the file is used and recorded as
    that release's library (for a machine without registry access).
    """

    kernels: str | None = Field(
        None, description="the release whose compiled ops run: 0.30.0 (cache or registry), or installed"
    )
    version: str | None = Field(
        None, description=f"a release, downloaded into the cache: 0.26.0 (as vllm.kernels); {VERSION_TEXT}"
    )
    wheel: Path_ | None = Field(None, description="a vLLM wheel file")
    src: Path_ | None = Field(None, description="a vLLM source tree or installed package directory")
    ops_library: Path_ | None = Field(None, description="vLLM's compiled ops library file itself")

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None and not is_release_version(value):
            raise ValueError(f"{shown(value)} is not a release version; allowed: {VERSION_TEXT}")
        return value

    @field_validator("kernels")
    @classmethod
    def _kernels_form(cls, value: str | None) -> str | None:
        if value is not None and value != "installed" and not is_release_version(value):
            raise ValueError(f"vllm.kernels {shown(value)} is not a release (X.Y.Z) or 'installed'")
        return value

    @model_validator(mode="after")
    def _at_most_one(self) -> VllmSpec:
        """At most one of vllm.kernels, vllm.version, vllm.wheel, vllm.src, vllm.ops_library.
        vllm.kernels X.Y.Z may go with vllm.ops_library: the file is that release's library."""
        given = [n for n in ("kernels", "version", "wheel", "src", "ops_library") if getattr(self, n)]
        if given == ["kernels", "ops_library"] and self.kernels != "installed":
            return self
        if len(given) > 1:
            raise ValueError(
                "give at most one of vllm.kernels, vllm.version, vllm.wheel, vllm.src, vllm.ops_library, or "
                f"vllm.kernels X.Y.Z with vllm.ops_library (got {', '.join(given)})"
            )
        return self

    @property
    def kernels_release(self) -> str | None:
        """The release the scenario names for its kernels (vllm.kernels or vllm.version), if any."""
        named = self.kernels or self.version
        return named if named and named != "installed" else None


LAYER_VERDICTS = ("consistent", "double-count", "over-allocated", "under-sized", "over-cap", "unevaluated")
LAYER_COMPONENTS = (
    "expert-weights", "dispatch-recv", "dispatch-quant", "workspace", "deepep-nvl", "deepep-workspace", "deepep-rdma",
)  # fmt: skip


class LayerSpec(_Strict):
    """The whole EP MoE layer for `harness plan --vllm-version`: its all-to-all, EPLB's redundant experts, the
    experts backend and quantization, and buffer sizes. Left out, a buffer size takes the release's default."""

    all2all: Literal["deepep-low-latency", "deepep-high-throughput", "none"] = Field(
        "deepep-low-latency",
        description="vLLM's --all2all-backend: deepep_low_latency (batched format), deepep_high_throughput, "
        "or none (TP or a single rank: no dispatch buffers)",
    )
    moe_backend: Literal["cutlass", "deep_gemm", "triton", "marlin"] = Field(
        "cutlass",
        description="picks the experts class: e.g. batched cutlass -> CutlassBatchedExpertsFp8, marlin -> "
        "MarlinExperts (BatchedMarlinExperts batched)",
    )
    quant: Literal["fp8-per-token", "fp8-block", "bf16", "wna16"] = Field(
        "fp8-per-token", description="weights and dispatched activations; wna16: int4 weights, group 128, bf16 acts"
    )
    num_redundant_experts: Annotated[int, Field(ge=0, le=L.MAX_NUM_EXPERTS)] | None = Field(
        None,
        description="EPLB's redundant experts; num_local_experts x D must equal num_experts + this "
        "(0 included); unset: num_local_experts x D - num_experts",
    )
    deepep_buffer_size_mb: Annotated[int, Field(gt=0, le=L.MAX_BUFFER_MB)] | None = Field(
        None, description="VLLM_DEEPEP_BUFFER_SIZE_MB; default: the release's (envs.py)"
    )
    gpus_per_node: Annotated[int, Field(gt=0, le=L.MAX_GPUS_PER_NODE)] = Field(
        8, description="DeepEP high-throughput uses RDMA when D exceeds this"
    )
    deepep_layout: Literal["logfmt-combine", "bf16-combine"] = Field(
        "logfmt-combine",
        description="DeepEP's low-latency message layout: logfmt-combine from DeepEP c5facf5 on (the commits "
        "vLLM 0.22.0+ pin), bf16-combine before it",
    )
    expect: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict,
        max_length=L.MAX_POLICIES,
        description="release X.Y.Z -> component -> verdicts `harness plan` must find (else exit 1); components: "
        + ", ".join(LAYER_COMPONENTS),
    )

    @field_validator("expect")
    @classmethod
    def _known_expectations(cls, value: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
        for release, components in value.items():
            if not re.match(r"^\d+\.\d+\.\d+$", release):
                raise ValueError(f"layer.expect key {shown(release)} is not a release X.Y.Z")
            for component, verdicts in components.items():
                if component not in LAYER_COMPONENTS:
                    raise ValueError(f"layer.expect.{release}: unknown component {shown(component)}; allowed: "
                                     f"{', '.join(LAYER_COMPONENTS)}")  # fmt: skip
                unknown = [v for v in verdicts if v not in LAYER_VERDICTS]
                if unknown:
                    raise ValueError(f"layer.expect.{release}.{component}: unknown verdicts {shown(unknown)}; allowed: "
                                     f"{', '.join(LAYER_VERDICTS)}")  # fmt: skip
        return value
