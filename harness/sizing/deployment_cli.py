"""`harness plan` for deployments: `harness plan --vllm-version X --gpu G -- vllm serve MODEL FLAGS`, and the
deployment verdict a scenario gets with --vllm-version and a GPU.

Exit codes: 0 the plan was made (whatever the verdict); 1 with --fail-on-verdict when a release's deployment does
not start (oom, fails, refused, unknown), or when the scenario's layer.expect is not met; 2 bad input (an unknown
serve flag, a model without config.json, an unknown GPU, a release that cannot be had).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK


def _error(message: str) -> int:
    import sys

    from harness.scenario.limits import shown_line

    print(f"harness: error: {shown_line(message)}", file=sys.stderr)
    return EXIT_ERROR


@dataclass(frozen=True, kw_only=True)
class DeviceRequest:
    """Where a deployment is planned: a named GPU (--gpu) or a total in GB (--budget-gb), and the release cache."""

    gpu: str | None = None
    budget_gb: float | None = None
    cache_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class PlanServeRequest(DeviceRequest):
    """`harness plan [--vllm-version X ...] --gpu G -- vllm serve MODEL FLAGS`, as cli.py parsed it."""

    scenario: str | None = None
    serve: tuple[str, ...] | None = None
    vllm_versions: tuple[str, ...] = ()
    fail_on_verdict: bool = False
    json: bool = False


def _budget(device: DeviceRequest, scenario_gpu: str | None = None) -> tuple[str | None, int | None]:
    """The GPU and the total vLLM sees on it: --budget-gb as given, a named GPU's mem_get_info total."""
    from harness.scenario.sections import GPU_MEMORY_BYTES
    from harness.sizing.deployment import device_total

    if device.budget_gb:
        return None, int(device.budget_gb * 1e9)
    gpu = device.gpu or scenario_gpu
    if gpu:
        return gpu, device_total(gpu, GPU_MEMORY_BYTES[gpu])[0]
    return None, None


def plan_serve_command(request: PlanServeRequest) -> int:
    from harness.sizing.deployment_plan import plan_serve
    from harness.sizing.model_config import ModelConfigError
    from harness.sizing.serve_args import ServeArgsError, parse_serve
    from harness.sizing.vllm_source.sources import VllmSourceError

    serve = list(request.serve) if request.serve is not None else None
    if request.scenario is not None and serve is not None:
        return _error("give a scenario or `-- vllm serve MODEL FLAGS`, not both (a scenario's deployment: section "
                      "holds the same settings)")
    if serve is None:
        return _error("plan needs a scenario, or `-- vllm serve MODEL FLAGS` after the options; see `harness plan --help`")
    try:
        model, spec, ignored = parse_serve(serve)
    except ServeArgsError as error:
        return _error(str(error))
    gpu, total = _budget(request)
    if total is None:
        return _error("a deployment plan needs --gpu NAME or --budget-gb N (the GPU's total memory)")
    if not request.vllm_versions:
        return _error("a deployment plan needs --vllm-version X.Y.Z (repeat it to compare releases)")
    try:
        plans = plan_serve(model, spec, list(dict.fromkeys(request.vllm_versions)), gpu=gpu, total_bytes=total,
                           cache_dir=request.cache_dir)  # fmt: skip
    except (ModelConfigError, VllmSourceError) as error:
        return _error(str(error))
    except Exception as error:  # a scenario the layout makes invalid (harness.scenario.ScenarioError)
        from harness.scenario.source import ScenarioError

        if isinstance(error, ScenarioError):
            return _error(f"the deployment's MoE layer: {error}")
        raise
    code = EXIT_FAILED if request.fail_on_verdict and any(p.verdict.outcome != "starts" for p in plans) else EXIT_OK
    if request.json:
        print(json.dumps({"deployments": [p.model_dump(mode="json") for p in plans], "ignored_flags": ignored},
                         indent=1))  # fmt: skip
        return code
    from harness.core.console import make_console

    note = f"ignored (no effect on memory): {', '.join(ignored)}" if ignored else ""
    print_deployments(make_console(), plans, note)
    return code


def scenario_deployments(scenario, versions: list[str], device: DeviceRequest, budget: int, *,
                         wheel: Path | None = None, src: Path | None = None) -> tuple[list[Any], str] | int:
    """The scenario's deployment per release planned (`versions`, then the --vllm-wheel file and the --vllm-src
    tree themselves, as the layer table reads them), or ([], why not) when its model has no config facts."""
    from harness.sizing.deployment_plan import plan_scenario
    from harness.sizing.model_config import ModelConfigError
    from harness.sizing.vllm_source.sources import locate

    gpu, total = _budget(device, scenario.memory.budget_gpu)
    sources = [locate(wheel=wheel, cache_dir=device.cache_dir)] if wheel is not None else []
    sources += [locate(src=src)] if src is not None else []
    try:
        return plan_scenario(scenario, versions, gpu=gpu, total_bytes=total or budget, cache_dir=device.cache_dir,
                             sources=sources), ""
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
