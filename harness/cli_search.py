"""`harness plan --search [--gpus 8,16,32] [--objective O] ... -- vllm serve MODEL FLAGS`: the options and the command.

Exit codes: 0 the search ran (whatever it found); 1 with --fail-on-verdict when a release has no layout that starts
(or reaches --min-concurrency); 2 bad input (one line naming the field, the value and what is allowed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, NoReturn

from harness.core.errors import BadInput
from harness.core.exits import EXIT_FAILED, EXIT_OK

log = logging.getLogger(__name__)


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    from harness.sizing.search_choices import ALLOWANCES, OBJECTIVES

    p.add_argument(
        "--search",
        action="store_true",
        help="with `-- vllm serve MODEL FLAGS`: search every layout the line leaves open (TP x DP, EP, "
        "all2all, experts backend, max-num-batched-tokens, EPLB) and rank them (docs/layout-search.md)",
    )
    p.add_argument(
        "--gpus",
        default=None,
        metavar="N[,N...]",
        help="with --search: the GPU counts to lay out (e.g. 16, or 8,16,32); default: the line's TP x DP",
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="kv-tokens",
        help="with --search: rank by total KV tokens of the deployment (default), by its concurrency at "
        "--max-model-len, or by the fewest GPUs reaching --min-concurrency",
    )
    p.add_argument(
        "--min-concurrency",
        type=float,
        default=None,
        metavar="C",
        help="with --search: only layouts whose deployment serves at least C requests of --max-model-len",
    )
    p.add_argument(
        "--allow",
        action="append",
        choices=ALLOWANCES,
        default=None,
        help="with --search: also search what changes the model's numerics (kv-fp8: --kv-cache-dtype fp8)",
    )
    p.add_argument(
        "--search-backends",
        action="store_true",
        help="with --search: also force each experts backend (--moe-backend), beside the release's choice",
    )
    p.add_argument("--top", type=int, default=10, metavar="N", help="with --search: rows of each ranked table")


def stray_search_option(ns: argparse.Namespace) -> str | None:
    """The message for a search option given without --search (it would change nothing), or None."""
    given = [flag for flag, value in (("--gpus", ns.gpus), ("--objective", ns.objective != "kv-tokens" or None),
                                      ("--min-concurrency", ns.min_concurrency), ("--allow", ns.allow),
                                      ("--search-backends", ns.search_backends or None),
                                      ("--top", ns.top != 10 or None)) if value]  # fmt: skip
    return f"{given[0]} goes with --search (harness plan --search ... -- vllm serve MODEL FLAGS)" if given else None


def _error(message: str) -> NoReturn:
    """Refuse in one line: harness.cli.main shows it and exits 2."""
    raise BadInput(message)


def search_command(ns: argparse.Namespace, gpu: str | None, total: int | None) -> int:
    from harness.sizing.model_config import ModelConfigError
    from harness.sizing.search import SearchError, SearchRequest, gpu_counts_of
    from harness.sizing.serve_args import ServeArgsError, canonical_serve, image_release, parse_serve
    from harness.sizing.vllm_source.sources import VllmSourceError

    serve = getattr(ns, "serve", None)
    if serve is None:
        return _error("--search needs `-- vllm serve MODEL FLAGS` after the options")
    if ns.scenario is not None:
        return _error("--search takes `-- vllm serve MODEL FLAGS`, not a scenario")
    if total is None:
        return _error("--search needs --gpu NAME or --budget-gb N (the GPU's total memory)")
    versions = list(ns.vllm_version or ())
    if not versions and (tagged := image_release(list(serve))) is not None:
        log.info(f"the release from the image's tag: vLLM {tagged} (--vllm-version to search another)")
        versions = [tagged]
    if not versions:
        return _error("--search needs --vllm-version X.Y.Z (repeat it to compare releases)")
    if ns.min_concurrency is not None and not 0 < ns.min_concurrency < 1e9:
        return _error(f"--min-concurrency {ns.min_concurrency}: allowed: a number above 0")
    if not 0 < ns.top <= 100000:
        return _error(f"--top {ns.top}: allowed: 1..100000")
    try:
        serve = canonical_serve(list(serve))  # the line each candidate is written as: `vllm serve MODEL FLAGS`
        _, spec, _ = parse_serve(serve)
        counts = gpu_counts_of(ns.gpus) if ns.gpus is not None else \
            (spec.tensor_parallel_size * (spec.data_parallel_size or 1),)  # fmt: skip
        request = SearchRequest(
            serve=tuple(serve), vllm_versions=tuple(versions), gpu=gpu, total_bytes=total,
            gpu_counts=counts, objective=ns.objective, min_concurrency=ns.min_concurrency,
            allow=tuple(dict.fromkeys(ns.allow or ())), search_backends=ns.search_backends, top=ns.top,
            cache_dir=ns.cache_dir)  # fmt: skip
        report = _run(request, progress_on=not ns.json)
    except (SearchError, ServeArgsError, ModelConfigError, VllmSourceError) as error:
        return _error(str(error))
    nothing = [r for r in report.releases if r.best is None]
    code = EXIT_FAILED if ns.fail_on_verdict and nothing else EXIT_OK
    if ns.json:
        print(json.dumps(report.model_dump(mode="json"), indent=1))
        return code
    print_report(report, request.top)
    return code


def _run(request: Any, *, progress_on: bool) -> Any:
    """The search, with a progress bar on an interactive terminal (none in a pipe or a log)."""
    from harness.sizing.search import search

    if not (progress_on and sys.stderr.isatty()):
        return search(request)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tasks: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:  # fmt: skip

        def progress(version: str, done: int, total: int) -> None:
            if version not in tasks:
                tasks[version] = bar.add_task(f"vllm {version}: planning layouts", total=total)
            bar.update(tasks[version], completed=done)

        return search(request, progress)


def print_report(report: Any, top: int) -> None:
    from harness.core.console import make_console
    from harness.sizing.search import gpus_needed, render_release

    console = make_console()
    for version in report.vllm_versions:
        for item in render_release(report, version, top):
            console.print(item) if not isinstance(item, str) else console.print(item, highlight=False, markup=False)
    for line in report.changes:
        console.print(line, highlight=False, markup=False)
    if report.objective == "min-gpus":
        for line in gpus_needed(report):
            console.print(line, highlight=False, markup=False)
