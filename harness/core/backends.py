"""The backends a scenario can name, declared once: every experts backend and every comm backend.

Each declares its name, the devices it runs on, what it supports, its place in `auto`'s order and one line for
help text. The schema's allowed values, the `--experts-backend` / `--comm` choices and help, the machine-fit
check (harness.scenario.fit) and the selection on each rank (harness.rank.experts.select_backend,
harness.rank.comm.resolve_comm) all read these declarations; harness.rank.experts and harness.rank.comm bind one
implementation to each name, with the conditions only a rank can ask (tests/test_backends.py keeps the sets
equal):

    field            name           devices    supports, from the data      auto  asked on the rank
    experts_backend  reference      cpu, cuda  silu, fp8 e4m3               3rd   nothing
    experts_backend  torch-cutlass  cuda       silu, fp8 e4m3               2nd   sm90+, torch._scaled_grouped_mm
    experts_backend  vllm-ops       cuda       silu, fp8 e4m3               1st   vLLM's ops library at hand, loads
    comm             symm-mem       cuda       bf16 workspace               1st   torch's symmetric memory on CUDA
    comm             nccl           cuda       any layout                   2nd   nothing
    comm             gloo           cpu        any layout                   3rd   nothing

`Backend.supports(query)` answers as vLLM's FusedMoEExperts.is_supported_config does: a chain of `_supports_*`
checks, the first that fails giving the reason. Here the reason is one line naming the field, the value and what
is allowed. `auto` takes the first backend in its order that the data allow and the rank's probe accepts.
Pure data: no torch, nothing of harness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DeviceType = Literal["cuda", "cpu"]
AUTO = "auto"
_NEEDS = {"cuda": "GPUs (device cuda)", "cpu": "CPU ranks (device cpu)"}


@dataclass(frozen=True, kw_only=True)
class BackendQuery:
    """What a backend's fit depends on, from the scenario alone (harness.scenario.fit.backend_query builds it)."""

    device_type: DeviceType
    num_ranks: int  # P, physical ranks
    num_local_experts: int  # E
    activation: str = "silu"  # model.activation
    workspace_dtype: str = "bfloat16"  # model.workspace_dtype
    quant_dtype: str = "float8_e4m3fn"  # model.quant_dtype

    @property
    def where(self) -> str:
        """ "2 cpu ranks", "1 cuda rank": the setting an "allowed" list is about."""
        return f"{self.num_ranks} {self.device_type} rank{'s' if self.num_ranks != 1 else ''}"


@dataclass(frozen=True, kw_only=True)
class Backend:
    """One backend's declaration. A limit left None does not apply to this kind of backend."""

    field: str  # the scenario field that names it: experts_backend or comm
    name: str
    description: str  # one line, for help text and the schema reference
    devices: tuple[DeviceType, ...]
    auto_rank: int | None  # its place in auto's order (0 first); None: auto never takes it
    min_ranks: int = 1
    min_ranks_why: str = ""
    activations: tuple[str, ...] | None = None  # model.activation values it computes
    quant_dtypes: tuple[str, ...] | None = None  # model.quant_dtype values it takes
    workspace_dtypes: tuple[str, ...] | None = None  # model.workspace_dtype values it writes

    def supports(self, query: BackendQuery) -> str | None:
        """Why this backend cannot carry a run of `query`, or None; from the data alone."""
        return (
            self._supports_device(query)
            or self._supports_ranks(query)
            or self._supports_activation(query)
            or self._supports_dtypes(query)
        )

    def _supports_device(self, q: BackendQuery) -> str | None:
        if q.device_type in self.devices:
            return None
        return f"{self.field} {self.name} needs {' or '.join(_NEEDS[d] for d in self.devices)}"

    def _supports_ranks(self, q: BackendQuery) -> str | None:
        if q.num_ranks >= self.min_ranks:
            return None
        return (
            f"{self.field} {self.name} needs at least {self.min_ranks} ranks ({self.min_ranks_why}), "
            f"parallel.num_ranks is {q.num_ranks}"
        )

    def _supports_activation(self, q: BackendQuery) -> str | None:
        if self.activations is None or q.activation in self.activations:
            return None
        return (
            f"{self.field} {self.name} computes {', '.join(self.activations)} only, not model.activation {q.activation}"
        )

    def _supports_dtypes(self, q: BackendQuery) -> str | None:
        for what, value, allowed in (
            ("quant_dtype", q.quant_dtype, self.quant_dtypes),
            ("workspace_dtype", q.workspace_dtype, self.workspace_dtypes),
        ):
            if allowed is not None and value not in allowed:
                return f"{self.field} {self.name} takes model.{what} {', '.join(allowed)} only, not {value}"
        return None


@dataclass(frozen=True)
class BackendKind:
    """The backends one scenario field chooses from, in the order they are listed."""

    field: str
    backends: tuple[Backend, ...]

    def __post_init__(self) -> None:
        assert all(b.field == self.field for b in self.backends), f"a backend of {self.field} names another field"
        assert len(set(self.names)) == len(self.names) and AUTO not in self.names, f"{self.field}: names repeat"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)

    @property
    def choices(self) -> tuple[str, ...]:
        """What the field, and the command-line option, accept: auto and every name."""
        return (AUTO, *self.names)

    @property
    def auto_order(self) -> tuple[Backend, ...]:
        ranked = [b for b in self.backends if b.auto_rank is not None]
        return tuple(sorted(ranked, key=lambda b: b.auto_rank or 0))

    def get(self, name: str) -> Backend | None:
        return next((b for b in self.backends if b.name == name), None)

    def unknown(self, name: str) -> str:
        return f"{self.field} {name!r} is not one of {', '.join(self.choices)}"

    def auto_candidates(self, query: BackendQuery) -> tuple[Backend, ...]:
        """The backends auto may take for `query`, in its order, as far as the data tell."""
        return tuple(b for b in self.auto_order if b.supports(query) is None)

    def allowed(self, query: BackendQuery) -> list[str]:
        """The choices that the data allow for `query` (auto when it has a candidate)."""
        names = [b.name for b in self.backends if b.supports(query) is None]
        return ([AUTO] if self.auto_candidates(query) else []) + names

    def reason(self, name: str, query: BackendQuery) -> str | None:
        """Why choice `name` (auto included) cannot carry a run of `query`, from the data alone, or None."""
        if name == AUTO:
            if self.auto_candidates(query):
                return None
            order = self.auto_order  # the last of the order is the fallback, the most widely usable
            why = order[-1].supports(query) if order else "no backend takes part in auto"
            return f"{self.field} auto: none of {', '.join(b.name for b in order)} can run this: {why}"
        backend = self.get(name)
        if backend is None:
            return self.unknown(name)
        reason = backend.supports(query)
        if reason is None:
            return None
        allowed = self.allowed(query)
        return f"{reason}; allowed on {query.where}: {', '.join(allowed)}" if allowed else reason

    def auto_text(self) -> str:
        return f"auto: the first of {', '.join(b.name for b in self.auto_order)} that can run here"

    def help_text(self) -> str:
        """Every choice in one line: "reference (...), ...; auto: the first of ... that can run here"."""
        return ", ".join(f"{b.name} ({b.description})" for b in self.backends) + "; " + self.auto_text()


_SILU = ("silu",)  # every experts backend computes silu_and_mul (harness.rank.experts.reference.silu_and_mul)
_FP8 = ("float8_e4m3fn",)
_OUT = ("bfloat16", "float16")

EXPERTS = BackendKind(
    "experts_backend",
    (
        Backend(
            field="experts_backend",
            name="reference",
            devices=("cpu", "cuda"),
            auto_rank=2,
            description="float32 dequantize and matmul on any device; the oracle",
            activations=_SILU,
            quant_dtypes=_FP8,
            workspace_dtypes=_OUT,
        ),
        Backend(
            field="experts_backend",
            name="torch-cutlass",
            devices=("cuda",),
            auto_rank=1,
            description="torch._scaled_grouped_mm, torch's FP8 grouped GEMM, on sm90+",
            activations=_SILU,
            quant_dtypes=_FP8,
            workspace_dtypes=_OUT,
        ),
        Backend(
            field="experts_backend",
            name="vllm-ops",
            devices=("cuda",),
            auto_rank=0,
            description="vLLM's compiled CUTLASS MoE ops, from the ops library vllm.* or --kernels names",
            activations=_SILU,
            quant_dtypes=_FP8,
            workspace_dtypes=_OUT,
        ),
    ),
)

COMM = BackendKind(
    "comm",
    (
        Backend(
            field="comm",
            name="symm-mem",
            devices=("cuda",),
            auto_rank=0,
            workspace_dtypes=("bfloat16",),
            description="torch's symmetric memory with Triton push kernels, no host read per dispatch, "
            "graph-capturable; one node",
        ),
        Backend(
            field="comm",
            name="nccl",
            devices=("cuda",),
            auto_rank=1,
            description="packed rows over all_to_all_single in capacity-sized equal splits, no host read, "
            "graph-capturable",
        ),
        Backend(
            field="comm", name="gloo", devices=("cpu",), auto_rank=2, description="the same packed rows on CPU ranks"
        ),
    ),
)

KINDS = (EXPERTS, COMM)
