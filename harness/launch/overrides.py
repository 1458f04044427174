"""The scenario a command runs: the file it names (or the embedded default) with the command line's overrides.

ScenarioOverrides (typed, from harness.cli) ──> dotted keys {"parallel.num_ranks": 8, ...}
scenario file + dotted keys                 ──> parse_scenario again, so a bad override reads like a bad file
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.scenario.dotted import DottedKeyError, set_dotted
from harness.scenario.schema import Scenario, ScenarioError, parse_scenario
from harness.scenario.sections import SCENARIOS_DIR
from harness.scenario.source import display, read_yaml_file

PACKAGED_DEFAULTS_DIR = Path(__file__).resolve().parents[1] / "defaults"  # package data, for non-editable installs


def _embedded(name: str) -> Path:
    """A default scenario: the repository's scenarios/ when there is one, else the copy packaged with harness."""
    in_repo = SCENARIOS_DIR / name
    return in_repo if in_repo.exists() else PACKAGED_DEFAULTS_DIR / name


DEFAULT_CPU_SCENARIO = _embedded("smoke.yaml")
DEFAULT_GPU_SCENARIO = _embedded("deepseek-v3-dp32-pr55579.yaml")


@dataclass(frozen=True, kw_only=True)
class ScenarioOverrides:
    """What the command line sets in the scenario; None: the scenario's own value.

    The launcher is not among them: it picks how ranks start, not what they measure, so a scenario keeps its hash
    (and stays comparable) whichever launcher ran it; run.json and launch.json record the launcher.
    """

    experts_backend: str | None = None
    device: str | None = None
    comm: str | None = None
    placement_strategy: str | None = None
    num_ranks: int | None = None
    policies: str | None = None  # comma-separated, as typed
    kernels: str | None = None
    vllm_version: str | None = None
    vllm_wheel: Path | None = None
    vllm_src: Path | None = None
    vllm_ops_library: Path | None = None

    def dotted(self) -> dict[str, Any]:
        """The scenario fields set, as dotted keys: {"parallel.num_ranks": 8, ...}."""
        if self.num_ranks is not None and self.num_ranks < 1:
            raise ScenarioError(f"--num-ranks {self.num_ranks}: must be at least 1")
        overrides: dict[str, Any] = {}
        for key, value in (
            ("experts_backend", self.experts_backend),
            ("device", self.device),
            ("comm", self.comm),
            ("launch.placement_strategy", self.placement_strategy),
            ("parallel.num_ranks", self.num_ranks),
        ):
            if value is not None:
                overrides[key] = value
        if self.policies is not None:
            overrides["policies"] = [p.strip() for p in self.policies.split(",") if p.strip()]
        # vllm.* holds at most one source, so a source given here replaces the scenario's (--kernels X.Y.Z with
        # --vllm-ops-library names a file and its release together).
        vllm = {
            key: str(value)
            for key, value in (
                ("kernels", self.kernels),
                ("version", self.vllm_version),
                ("wheel", self.vllm_wheel),
                ("src", self.vllm_src),
                ("ops_library", self.vllm_ops_library),
            )
            if value is not None
        }
        if vllm:
            overrides["vllm"] = vllm
        return overrides


def _flag(key: str) -> str:
    return {
        "experts_backend": "--experts-backend",
        "comm": "--comm",
        "device": "--device",
        "launch.placement_strategy": "--placement-strategy",
        "parallel.num_ranks": "--num-ranks",
        "policies": "--policies",
        "vllm": "--kernels/--vllm-*",
    }[key]


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], *, path: Path | str, name: str | None) -> Scenario:
    """Set dotted keys in raw scenario data and validate it again, so a bad override reads like a bad file."""
    data = dict(data)  # set_dotted copies what it sets; the caller's top level stays as it was
    for dotted, value in overrides.items():
        try:
            set_dotted(data, dotted, value)
        except DottedKeyError as exc:
            raise ScenarioError(f"{display(path)}: {exc}; cannot apply {_flag(dotted)}") from None
    if "policies" in overrides:
        # --policies narrows the run: expectations about policies left out no longer apply.
        outcomes = data.get("expect", {}).get("outcomes")
        if isinstance(outcomes, dict):
            data["expect"]["outcomes"] = {k: v for k, v in outcomes.items() if k in overrides["policies"]}
    if name is not None:
        data.setdefault("name", name)
    label = f"{path} (with {', '.join(f'{_flag(k)}' for k in overrides)})" if overrides else path
    return parse_scenario(data, path=label)


def load_with_overrides(path: Path, overrides: dict[str, Any], *, data: Any = None) -> Scenario:
    """The scenario file (already read: `data`) with the command line's overrides; the file's own errors first."""
    data = read_yaml_file(path) if data is None else data
    scenario = parse_scenario(data, path=path)
    if not overrides:
        return scenario
    return apply_overrides(data, overrides, path=path, name=scenario.name)


def override_scenario(scenario: Scenario, overrides: dict[str, Any], *, label: str) -> Scenario:
    """Overrides applied to an already-validated scenario (a matrix cell)."""
    if not overrides:
        return scenario
    return apply_overrides(scenario.model_dump(mode="json"), overrides, path=label, name=scenario.name)


def default_scenario_path(num_gpus: int) -> Path:
    """The embedded default: the PR case on a machine or cluster with a GPU, the CPU smoke scenario otherwise."""
    return DEFAULT_GPU_SCENARIO if num_gpus >= 1 else DEFAULT_CPU_SCENARIO
