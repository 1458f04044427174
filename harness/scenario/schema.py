"""Scenario files: pure data, validated without touching a GPU.

A scenario names a model (a preset, explicit shapes, or both: explicit fields win), the parallel layout
(D dispatchers, P physical ranks, E local experts, T tokens per rank), the routing, the sizing policies to
measure, and what the run should find (expectations and thresholds). Whether *this machine* can run it, and
whether the named backends run on the scenario's device and layout, is a separate question, answered by
`harness.scenario.fit.can_run` from the backends' declarations (harness.core.backends).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from harness.core.backends import COMM, EXPERTS
from harness.core.contract import BUILTIN_POLICIES, RELEASE_POLICY_PREFIX, SizingArgs
from harness.scenario import limits as L
from harness.scenario.deployment import DeploymentSpec
from harness.scenario.fields import describe_field
from harness.scenario.limits import shown
from harness.scenario.presets import PRESETS
from harness.scenario.sections import (
    SCENARIOS_DIR,
    BenchSpec,
    CommName,
    ExpectSpec,
    ExpertsBackendName,
    LaunchSpec,
    LayerSpec,
    MemorySpec,
    ModelSpec,
    ParallelSpec,
    RoutingSpec,
    VllmSpec,
    _Strict,
    is_release_policy_name,
    is_safe_name,
    safe_name,
)
from harness.scenario.source import ScenarioError, display, read_yaml_file


class Scenario(_Strict):
    """One experiment: a model, a layout, the sizing policies to measure and what they should do."""

    name: str | None = Field(
        None,
        description=f"names the run directory: {L.NAME_PATTERN_TEXT}, at most {L.MAX_NAME_CHARS} characters; "
        "default: the file name without .yaml (other characters become -)",
    )
    description: str = Field(
        "", description=f"one line of at most {L.MAX_DESCRIPTION_CHARS} characters, shown by `harness scenarios`"
    )
    model: ModelSpec
    parallel: ParallelSpec
    routing: RoutingSpec = RoutingSpec()
    policies: list[str] = Field(
        default_factory=lambda: ["legacy", "fixed"],
        min_length=1,
        max_length=L.MAX_POLICIES,
        description=f"sizing policies measured in this order: {', '.join(BUILTIN_POLICIES)}, or "
        f"{RELEASE_POLICY_PREFIX}X.Y.Z (that release's own workspace_shapes)",
    )
    experts_backend: ExpertsBackendName = Field("auto", description="the experts: " + EXPERTS.help_text())
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when there is a GPU per rank")
    comm: CommName = Field("auto", description="dispatch/combine backend: " + COMM.help_text())
    vllm: VllmSpec = VllmSpec()
    iterations: Annotated[int, Field(gt=0, le=L.MAX_ITERATIONS)] = Field(
        3, description="measured iterations of the data path per policy"
    )
    warmup: Annotated[int, Field(ge=0, le=L.MAX_ITERATIONS)] = Field(
        1, description="iterations per policy before measuring"
    )
    seed: Annotated[int, Field(ge=0, le=L.MAX_SEED)] = Field(
        0, description="global seed; routing, tokens and weights derive theirs from it"
    )
    memory: MemorySpec = MemorySpec()
    expect: ExpectSpec = ExpectSpec()
    bench: BenchSpec = BenchSpec()
    launch: LaunchSpec = LaunchSpec()
    layer: LayerSpec = LayerSpec()
    deployment: DeploymentSpec = Field(
        DeploymentSpec(),
        description="the `vllm serve` settings `harness plan --vllm-version --gpu` sizes the whole deployment "
        "with (docs/deployment-memory.md); unset: the scenario's model preset and layout",
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not is_safe_name(value):
            raise ValueError(
                f"{shown(value)} ({len(value)} characters) cannot name a run directory; allowed: "
                f"{L.NAME_PATTERN_TEXT}, at most {L.MAX_NAME_CHARS} characters"
            )
        return value

    @field_validator("description")
    @classmethod
    def _one_line(cls, value: str) -> str:
        value = value.strip()  # a YAML block scalar (`>`) ends in a newline
        if len(value) > L.MAX_DESCRIPTION_CHARS or "\n" in value or "\t" in value:
            raise ValueError(
                f"{shown(value)} ({len(value)} characters) is not one line of text; allowed: one line of at most "
                f"{L.MAX_DESCRIPTION_CHARS} characters"
            )
        return value

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, value: list[str]) -> list[str]:
        for policy in value:
            if policy not in BUILTIN_POLICIES and not (
                len(policy) <= L.MAX_POLICY_CHARS and is_release_policy_name(policy)
            ):
                allowed = ", ".join(BUILTIN_POLICIES) + f", {RELEASE_POLICY_PREFIX}X.Y.Z"
                raise ValueError(f"unknown policy {shown(policy)}; allowed: {allowed}")
        if len(set(value)) != len(value):
            raise ValueError(f"policies repeat a name: {shown(value)}")
        return value

    @model_validator(mode="after")
    def _layout(self) -> Scenario:
        """- num_dispatchers is a multiple of num_ranks (D >= P; each rank stands in for D/P dispatchers).
        - num_local_experts defaults to num_experts / D, which must divide; given, E x D holds num_experts.
        - hidden_size and intermediate_size are multiples of 16 (FP8 CUTLASS row alignment).
        - top_k is at most num_experts and at most the experts on the physical ranks, E x P.
        - routing.num_tokens is at most max_tokens_per_rank; routing.idle_ranks are ranks below num_ranks.
        - expect.outcomes names only policies of the scenario.
        """
        p, m = self.parallel, self.model
        D, P = p.num_dispatchers, p.num_ranks
        assert m.num_experts is not None and m.top_k is not None  # ModelSpec filled them or refused
        if D < P:
            raise ValueError(f"parallel.num_dispatchers ({D}) is smaller than parallel.num_ranks ({P}): D >= P")
        if D % P:
            raise ValueError(
                f"parallel.num_dispatchers ({D}) must be a multiple of parallel.num_ranks ({P}): "
                "each physical rank stands in for D/P dispatchers"
            )
        if p.num_local_experts is None:
            if m.num_experts % D:
                # num_experts <= MAX_NUM_EXPERTS bounds this scan.
                divisors = [d for d in range(P, m.num_experts + 1) if m.num_experts % d == 0 and d % P == 0]
                raise ValueError(
                    f"model.num_experts ({m.num_experts}) does not divide over parallel.num_dispatchers ({D}); "
                    f"set parallel.num_local_experts (at least {-(-m.num_experts // D)} for D={D}) "
                    f"or choose D from {', '.join(map(str, divisors))}"
                )
            # Rebuilt, never mutated (frozen); the checks below and the caller see the filled copy.
            p = p.model_copy(update={"num_local_experts": m.num_experts // D})
            self = self.model_copy(update={"parallel": p})
        elif p.num_local_experts * D < m.num_experts:
            raise ValueError(
                f"parallel.num_local_experts ({p.num_local_experts}) x num_dispatchers ({D}) = "
                f"{p.num_local_experts * D} slots cannot hold model.num_experts ({m.num_experts})"
            )
        for name in ("hidden_size", "intermediate_size"):
            if getattr(m, name) % 16:
                raise ValueError(
                    f"model.{name} ({getattr(m, name)}) must be a multiple of 16 (FP8 CUTLASS row alignment)"
                )
        assert p.num_local_experts is not None  # given, or filled above
        num_physical_experts = p.num_local_experts * P
        if m.top_k > m.num_experts or m.top_k > num_physical_experts:
            raise ValueError(
                f"model.top_k ({m.top_k}) is larger than the experts: model.num_experts ({m.num_experts}), "
                f"experts on the physical ranks (num_local_experts x num_ranks = {num_physical_experts}); "
                f"allowed: 1..{min(m.num_experts, num_physical_experts)}"
            )
        if self.routing.num_tokens is not None and self.routing.num_tokens > p.max_tokens_per_rank:
            raise ValueError(
                f"routing.num_tokens ({self.routing.num_tokens}) exceeds parallel.max_tokens_per_rank "
                f"({p.max_tokens_per_rank}): a dispatcher may not send more than T tokens"
            )
        bad_idle = [r for r in self.routing.idle_ranks if r >= P]
        if bad_idle:
            raise ValueError(
                f"routing.idle_ranks {bad_idle} are not ranks of parallel.num_ranks ({P}): allowed 0..{P - 1}"
            )
        unknown = sorted(set(self.expect.outcomes) - set(self.policies))
        if unknown:
            raise ValueError(f"expect.outcomes names {unknown}, which are not in policies {self.policies}")
        return self

    @model_validator(mode="after")
    def _deployment_ballast(self) -> Scenario:
        """- memory.deployment_ballast on CPU ranks needs a budget: the deployment is sized on it, not on the RAM."""
        if self.memory.deployment_ballast and self.device == "cpu" and self.memory.budget_bytes is None:
            raise ValueError(
                "memory.deployment_ballast on device cpu needs memory.budget_gb or memory.budget_gpu: the "
                "deployment's KV cache is sized on that total"
            )
        return self

    @model_validator(mode="after")
    def _layer(self) -> Scenario:
        """- with EPLB, num_local_experts x D holds the routed and the redundant experts exactly."""
        layer, m, p = self.layer, self.model, self.parallel
        if layer.num_redundant_experts is not None:
            physical = m.num_experts + layer.num_redundant_experts  # type: ignore[operator]
            slots = self.num_local_experts * p.num_dispatchers
            if slots != physical:
                raise ValueError(
                    f"parallel.num_local_experts ({self.num_local_experts}) x num_dispatchers ({p.num_dispatchers}) "
                    f"= {slots} must equal model.num_experts ({m.num_experts}) + layer.num_redundant_experts "
                    f"({layer.num_redundant_experts}) = {physical}: set parallel.num_local_experts to "
                    f"{physical // p.num_dispatchers if physical % p.num_dispatchers == 0 else 'a divisor'}"
                )
        return self

    # Derived quantities, in the letters of docs/design.md.
    @property
    def num_local_experts(self) -> int:
        assert self.parallel.num_local_experts is not None
        return self.parallel.num_local_experts

    @property
    def num_dispatchers_per_rank(self) -> int:
        return self.parallel.num_dispatchers // self.parallel.num_ranks

    @property
    def num_tokens_per_dispatcher(self) -> int:
        return self.routing.num_tokens or self.parallel.max_tokens_per_rank

    def num_tokens_on_rank(self, rank: int) -> int:
        """Tokens physical rank `rank` routes: D/P dispatchers' worth, or none for an idle rank."""
        if rank in self.routing.idle_ranks:
            return 0
        return self.num_tokens_per_dispatcher * self.num_dispatchers_per_rank

    @property
    def emulated(self) -> bool:
        return self.parallel.num_dispatchers > self.parallel.num_ranks

    def sizing_args(self) -> SizingArgs:
        return SizingArgs(
            max_tokens_per_rank=self.parallel.max_tokens_per_rank,
            num_dispatchers=self.parallel.num_dispatchers,
            num_local_experts=self.num_local_experts,
            num_global_experts=self.num_local_experts * self.parallel.num_dispatchers,
            hidden_size=self.model.hidden_size,  # type: ignore[arg-type]
            intermediate_size=self.model.intermediate_size,  # type: ignore[arg-type]
            top_k=self.model.top_k,  # type: ignore[arg-type]
            activation=self.model.activation or "silu",
            workspace_dtype=self.model.workspace_dtype,
        )

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        if self.layer == LayerSpec():
            # A scenario without a layer block hashes as it did before the block existed: baselines stay comparable.
            del data["layer"]
        elif data["layer"].get("num_redundant_experts") is None:
            data["layer"]["num_redundant_experts"] = 0  # unset hashes as the 0 it used to default to
        if self.deployment == DeploymentSpec():
            del data["deployment"]  # likewise for scenarios without a deployment section
        else:
            unset_before = ("limit_mm_per_prompt", "language_model_only", "cudagraph_mode",
                            "max_cudagraph_capture_size", "cudagraph_capture_sizes")  # fmt: skip
            for key in unset_before:  # unset: hashes as before the fields existed
                if not data["deployment"].get(key):
                    data["deployment"].pop(key, None)
        if not self.memory.deployment_ballast:
            del data["memory"]["deployment_ballast"]
        if self.bench.comm_bound_ratio_min == BenchSpec.model_fields["comm_bound_ratio_min"].default:
            del data["bench"]["comm_bound_ratio_min"]  # likewise for the comm yardstick's threshold at its default
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def scenario_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def summary(self) -> str:
        p, m = self.parallel, self.model
        label = m.preset or f"K={m.hidden_size} I={m.intermediate_size}"
        emulated = f" (emulated on {p.num_ranks})" if self.emulated else ""
        return (
            f"{label}: D={p.num_dispatchers}{emulated} E={self.num_local_experts} T={p.max_tokens_per_rank} "
            f"top_k={m.top_k}; policies {', '.join(self.policies)}"
        )


MAX_PROBLEMS_SHOWN = 10


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(L.shown_text(str(part), 40) for part in loc) if loc else "(top level)"


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The nested model that holds the key at `loc` (Scenario for a top-level key), or None."""
    current: Any = model
    for part in loc[:-1]:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        current = field.annotation
    return current


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a nested model accepts at `loc`, for "unknown key" messages."""
    return sorted(getattr(_model_at(model, loc), "model_fields", {}))


def _expected(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """What the field at `loc` takes, for "missing field" messages: " (integer > 0: T, ...)"."""
    field = getattr(_model_at(model, loc), "model_fields", {}).get(loc[-1]) if loc else None
    return f" ({describe_field(field)})" if field is not None else ""


def _allowed(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """ "; allowed: integer > 0, <= 4096" for the field at `loc` or the nearest field above it (a list item's)."""
    for end in range(len(loc), 0, -1):
        field = getattr(_model_at(model, loc[:end]), "model_fields", {}).get(loc[end - 1])
        if field is not None:
            return f"; allowed: {describe_field(field, with_description=False)}"
    return ""


def _format_error(path: Path | str, error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    where = _format_loc(loc)
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(Scenario, loc)
        return f"{path}: unknown key {L.shown_key(where)}; allowed here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{path}: missing field {where!r}{_expected(Scenario, loc)}"
    message = error["msg"].removeprefix("Value error, ")
    if kind == "value_error":
        return f"{path}: {message}" if not loc else f"{path}: {where}: {message}"
    return f"{path}: {where}: {message} (got {shown(value)}){_allowed(Scenario, loc)}"


def format_errors(path: Path | str, errors: list[Any], format_one: Any) -> str:
    """One line per problem, at most MAX_PROBLEMS_SHOWN of them."""
    lines = [format_one(path, e) for e in errors[:MAX_PROBLEMS_SHOWN]]
    if len(errors) > MAX_PROBLEMS_SHOWN:
        lines.append(f"{path}: ... and {len(errors) - MAX_PROBLEMS_SHOWN} more problems")
    return "\n".join(lines)


def parse_scenario(data: Any, *, path: Path | str = "<scenario>") -> Scenario:
    """Validate already-parsed YAML data; raise ScenarioError with one line per problem."""
    source, path = path, display(path)
    if data is None:
        raise ScenarioError(
            f"{path}: the file is empty; a scenario is a YAML mapping with at least model: and parallel:"
        )
    if not isinstance(data, dict):
        kind = {list: "a YAML list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
        raise ScenarioError(
            f"{path}: a scenario is a YAML mapping of keys (model:, parallel:, ...), "
            f"got {kind.get(type(data), type(data).__name__)}: {shown(data)}"
        )
    if "matrix" in data and "model" not in data:
        raise ScenarioError(
            f"{path}: is a matrix file (top-level `matrix:`), not a scenario; `harness plan` and `harness run` "
            "take it as it is"
        )
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_errors(path, exc.errors(), _format_error)) from None
    if scenario.name is None:
        scenario = scenario.model_copy(update={"name": safe_name(Path(str(source)).stem)})
    return scenario


def parse_stored_scenario(data: Any, *, path: Path | str) -> Scenario:
    """A scenario a run wrote (run.json, matrix.json), validated as parse_scenario does, read the way the harness
    that wrote it meant it: `layer.num_redundant_experts: 0` where local experts x D exceeds the model's experts is
    an older harness's default, which meant "derive them" (it hashes as unset does), not a declared 0."""
    layer = data.get("layer") if isinstance(data, dict) else None
    if isinstance(layer, dict) and layer.get("num_redundant_experts") == 0:
        parallel, model = data.get("parallel") or {}, data.get("model") or {}
        try:
            local, dispatchers = int(parallel["num_local_experts"]), int(parallel["num_dispatchers"])
            experts = int(model.get("num_experts") or PRESETS[model["preset"]].num_experts)
        except (KeyError, TypeError, ValueError):
            local = dispatchers = experts = 0
        if local * dispatchers > experts > 0:
            data = {**data, "layer": {**data["layer"], "num_redundant_experts": None}}
    return parse_scenario(data, path=path)


def _exists(path: Path) -> bool:
    """Something is at `path` (a dangling link too: the reader says so); a name too long or a loop of links is
    taken as nothing there, never raised."""
    return os.path.lexists(path)


def scenario_names() -> list[str]:
    """Names `harness run NAME` takes: scenarios/*.yaml and scenarios/matrix/*.yaml, without .yaml."""
    paths = list(SCENARIOS_DIR.glob("*.yaml")) + list(SCENARIOS_DIR.glob("matrix/*.yaml"))
    return sorted(str(p.relative_to(SCENARIOS_DIR).with_suffix("")) for p in paths)


def resolve_scenario_path(name_or_path: str | Path) -> Path:
    """A path, or a bare name looked up in scenarios/ (with or without .yaml)."""
    text = str(name_or_path)
    if len(text) > L.MAX_PATH_CHARS or "\0" in text:
        raise ScenarioError(
            f"{display(text)}: not a usable file name ({len(text)} characters); allowed: a path of at "
            f"most {L.MAX_PATH_CHARS} characters without NUL"
        )
    path = Path(name_or_path)
    if _exists(path):
        return path
    for candidate in (SCENARIOS_DIR / path, SCENARIOS_DIR / f"{path}.yaml"):
        if _exists(candidate):
            return candidate
    close = difflib.get_close_matches(path.stem if path.suffix in (".yaml", ".yml") else text, scenario_names(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ScenarioError(
        f"{display(text)}: no such scenario file (looked in . and {SCENARIOS_DIR}){hint} `harness scenarios` lists them"
    )


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    path = resolve_scenario_path(name_or_path)
    return parse_scenario(read_yaml_file(path), path=path)


def list_scenarios() -> list[Path]:
    return sorted(SCENARIOS_DIR.glob("*.yaml"))
