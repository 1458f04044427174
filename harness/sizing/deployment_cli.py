"""`harness plan` for deployments: `harness plan --vllm-version X --gpu G -- vllm serve MODEL FLAGS`, and the
deployment verdict a scenario gets with --vllm-version and a GPU.

Exit codes: 0 the plan was made (whatever the verdict); 1 with --fail-on-verdict when a release's deployment does
not start (oom, fails, refused, unknown), or when the scenario's layer.expect is not met; 2 bad input (an unknown
serve flag, a model without config.json, an unknown GPU, a release that cannot be had).
"""

from __future__ import annotations

import json
from typing import Any

from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK


def _error(message: str) -> int:
    import sys

    print(f"harness: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _budget(ns, scenario_gpu: str | None = None) -> tuple[str | None, int | None]:
    """The GPU and the total vLLM sees on it: --budget-gb as given, a named GPU's mem_get_info total."""
    from harness.scenario.sections import GPU_MEMORY_BYTES
    from harness.sizing.deployment import device_total

    if ns.budget_gb:
        return None, int(ns.budget_gb * 1e9)
    gpu = ns.gpu or scenario_gpu
    if gpu:
        return gpu, device_total(gpu, GPU_MEMORY_BYTES[gpu])[0]
    return None, None


def plan_serve_command(ns) -> int:
    from harness.sizing.deployment_plan import plan_serve
    from harness.sizing.model_config import ModelConfigError
    from harness.sizing.serve_args import ServeArgsError, parse_serve
    from harness.sizing.vllm_source.sources import VllmSourceError

    serve = getattr(ns, "serve", None)
    if ns.scenario is not None and serve is not None:
        return _error("give a scenario or `-- vllm serve MODEL FLAGS`, not both (a scenario's deployment: section "
                      "holds the same settings)")
    if serve is None:
        return _error("plan needs a scenario, or `-- vllm serve MODEL FLAGS` after the options; see `harness plan --help`")
    try:
        model, spec, ignored = parse_serve(serve)
    except ServeArgsError as error:
        return _error(str(error))
    gpu, total = _budget(ns)
    if total is None:
        return _error("a deployment plan needs --gpu NAME or --budget-gb N (the GPU's total memory)")
    if not ns.vllm_version:
        return _error("a deployment plan needs --vllm-version X.Y.Z (repeat it to compare releases)")
    try:
        plans = plan_serve(model, spec, list(dict.fromkeys(ns.vllm_version)), gpu=gpu, total_bytes=total,
                           cache_dir=ns.cache_dir)  # fmt: skip
    except (ModelConfigError, VllmSourceError) as error:
        return _error(str(error))
    except Exception as error:  # a scenario the layout makes invalid (harness.scenario.ScenarioError)
        from harness.scenario.source import ScenarioError

        if isinstance(error, ScenarioError):
            return _error(f"the deployment's MoE layer: {error}")
        raise
    code = EXIT_FAILED if ns.fail_on_verdict and any(p.verdict.outcome != "starts" for p in plans) else EXIT_OK
    if ns.json:
        print(json.dumps({"deployments": [p.model_dump(mode="json") for p in plans], "ignored_flags": ignored},
                         indent=1))  # fmt: skip
        return code
    from harness.core.console import make_console

    note = f"ignored (no effect on memory): {', '.join(ignored)}" if ignored else ""
    print_deployments(make_console(), plans, note)
    return code


def scenario_deployments(scenario, layers: list[Any], ns, budget: int) -> tuple[list[Any], str] | int:
    """The scenario's deployment per release planned, or ([], why not) when its model has no config facts."""
    from harness.sizing.deployment_plan import plan_scenario
    from harness.sizing.model_config import ModelConfigError

    versions = [p.vllm_version for p in layers if p.vllm_version]
    gpu, total = _budget(ns, scenario.memory.budget_gpu)
    try:
        return plan_scenario(scenario, versions, gpu=gpu, total_bytes=total or budget, cache_dir=ns.cache_dir), ""
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
