"""`harness plan` for deployments: `harness plan --vllm-version X --gpu G -- vllm serve MODEL FLAGS`, and the
deployment verdict a scenario gets with --vllm-version and a GPU.

Exit codes: 0 the plan was made (whatever the verdict); 1 with --fail-on-verdict when a release's deployment does
not start (oom, fails, refused, unknown), or when the scenario's layer.expect is not met; 2 bad input (an unknown
serve flag, a model without config.json, an unknown GPU, a release that cannot be had).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from harness.core.errors import BadInput
from harness.core.exits import EXIT_FAILED, EXIT_OK

log = logging.getLogger(__name__)


def _error(message: str) -> NoReturn:
    """Refuse in one line: harness.cli.main shows it and exits 2."""
    raise BadInput(message)


@dataclass(frozen=True, kw_only=True)
class DeviceRequest:
    """Where a deployment is planned: a named GPU (--gpu) or a total in GB (--budget-gb), and the release cache."""

    gpu: str | None = None
    budget_gb: float | None = None
    cache_dir: Path | None = None
    gpu_memory_gib: float | None = None  # any GPU not in the table: its torch total, SMs, compute capability
    gpu_sms: int | None = None
    gpu_capability: str | None = None


@dataclass(frozen=True, kw_only=True)
class PlanServeRequest(DeviceRequest):
    """`harness plan [--vllm-version X ...] --gpu G -- vllm serve MODEL FLAGS`, as cli.py parsed it."""

    scenario: str | None = None
    serve: tuple[str, ...] | None = None
    vllm_versions: tuple[str, ...] = ()
    fail_on_verdict: bool = False
    json: bool = False


def _budget(device: DeviceRequest, scenario_gpu: str | None = None) -> tuple[Any, int | None]:
    """The GPU (a row of harness.sizing.gpus, or None) and the total vLLM sees on it: --budget-gb as given, a named
    GPU's torch total, --gpu-memory-gib's. Raises UnknownGpuError (one line) for a name not in the table."""
    from harness.sizing import gpus

    if device.gpu_memory_gib is None and (device.gpu_sms is not None or device.gpu_capability is not None):
        raise gpus.UnknownGpuError("--gpu-sms and --gpu-capability describe a GPU given by --gpu-memory-gib X; "
                                   "allowed: with --gpu-memory-gib")  # fmt: skip
    if device.budget_gb:
        return None, int(device.budget_gb * 1e9)
    if device.gpu_memory_gib is not None:
        row = gpus.given(device.gpu_memory_gib, num_sms=device.gpu_sms, capability=device.gpu_capability)
        return row, row.total_bytes
    gpu = device.gpu or scenario_gpu
    if gpu:
        row = gpus.lookup(gpu)
        return row, row.total_bytes
    return None, None


def plan_serve_command(request: PlanServeRequest) -> int:
    from harness.sizing.deployment_plan import plan_serve_line
    from harness.sizing.model_config import ModelConfigError
    from harness.sizing.serve_args import ServeArgsError, image_release, parse_serve
    from harness.sizing.vllm_source.sources import VllmSourceError

    serve = list(request.serve) if request.serve is not None else None
    if request.scenario is not None and serve is not None:
        return _error(
            "give a scenario or `-- vllm serve MODEL FLAGS`, not both (a scenario's deployment: section "
            "holds the same settings)"
        )
    if serve is None:
        return _error(
            "plan needs a scenario, or `-- vllm serve MODEL FLAGS` after the options; see `harness plan --help`"
        )
    try:
        parse_serve(serve)  # the words themselves (a MODEL, values), before any release is fetched
    except ServeArgsError as error:
        if "not one the plan understands" not in str(error):  # a release's own flag is read with its parser
            return _error(str(error))
    from harness.sizing.gpus import UnknownGpuError

    try:
        gpu, total = _budget(request)
    except UnknownGpuError as error:
        return _error(str(error))
    if total is None:
        return _error("a deployment plan needs --gpu NAME, --gpu-memory-gib X or --budget-gb N (the GPU's total "
                      "memory)")  # fmt: skip
    versions = list(dict.fromkeys(request.vllm_versions))
    if not versions and (tagged := image_release(serve)) is not None:
        log.info(f"the release from the image's tag: vLLM {tagged} (--vllm-version to plan another)")
        versions = [tagged]
    if not versions:
        installed = _installed_vllm()
        hint = f"; vLLM {installed} is installed here: --vllm-version {installed}" if installed else ""
        return _error(f"a deployment plan needs --vllm-version X.Y.Z, the release you run (repeat it to compare "
                      f"releases){hint}")  # fmt: skip
    try:
        plans, ignored = plan_serve_line(serve, versions, gpu=gpu, total_bytes=total,
                                         cache_dir=request.cache_dir)  # fmt: skip
    except (ModelConfigError, VllmSourceError, ServeArgsError) as error:
        return _error(str(error))
    except Exception as error:  # a scenario the layout makes invalid (harness.scenario.ScenarioError)
        from harness.scenario.source import ScenarioError

        if isinstance(error, ScenarioError):
            return _error(f"the deployment's MoE layer: {error}")
        raise
    # an approximate plan (a memory flag or GPU fact not modelled) is not a pass either
    failed = any(not p.starts_every_time or p.approximate for p in plans)
    code = EXIT_FAILED if request.fail_on_verdict and failed else EXIT_OK
    if request.json:
        print(json.dumps({"deployments": [p.model_dump(mode="json") for p in plans], "ignored_flags": ignored},
                         indent=1))  # fmt: skip
        return code
    from harness.core.console import make_console

    note = f"ignored (no effect on memory): {', '.join(ignored)}" if ignored else ""
    print_deployments(make_console(), plans, note)
    return code


def scenario_deployments(
    scenario,
    versions: list[str],
    device: DeviceRequest,
    budget: int,
    *,
    wheel: Path | None = None,
    src: Path | None = None,
) -> tuple[list[Any], str] | int:
    """The scenario's deployment per release planned (`versions`, then the --vllm-wheel file and the --vllm-src
    tree themselves, as the layer table reads them), or ([], why not) when its model has no config facts."""
    from harness.sizing.deployment_plan import plan_scenario
    from harness.sizing.gpus import UnknownGpuError
    from harness.sizing.model_config import ModelConfigError
    from harness.sizing.vllm_source.sources import locate

    try:
        gpu, total = _budget(device, scenario.memory.budget_gpu)
    except UnknownGpuError as error:
        return [], f"no deployment verdict: {error}"
    sources = [locate(wheel=wheel, cache_dir=device.cache_dir)] if wheel is not None else []
    sources += [locate(src=src)] if src is not None else []
    try:
        return plan_scenario(
            scenario, versions, gpu=gpu, total_bytes=total or budget, cache_dir=device.cache_dir, sources=sources
        ), ""
    except (ModelConfigError, ValueError) as error:
        return [], f"no deployment verdict: {error}"


def print_deployments(console, plans: list[Any], note: str = "") -> None:
    from harness.sizing.deployment_plan import deployment_notes, render_deployment, what_it_buys

    if note:
        console.print(note)
    for plan in plans:
        console.print(render_deployment(plan))
        for line in deployment_notes(plan):
            console.print(line)
    for line in what_it_buys(plans):
        console.print(line)


def _installed_vllm() -> str | None:
    """The version of the vLLM installed in this environment, from its package metadata (nothing of it is
    imported); None when there is none or its version is not a release number."""
    import re
    from importlib import metadata

    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None
    return version if re.fullmatch(r"\d+\.\d+\.\d+", version) else None
