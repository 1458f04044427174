"""The `harness` command line: the parser, one builder per command, and the options `run` and `bench` share.

harness.cli builds it with its command functions (`build_parser(commands)`: the name of each command to the
function that runs it), parses, and dispatches; this module knows the words, not what they do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from harness.core.backends import COMM, EXPERTS
from harness.core.exits import EXIT_ERROR, EXIT_OK
from harness.core.log import LOG_LEVEL_ENV

Command = Callable[[argparse.Namespace], int]
Subcommands = Any  # argparse's _SubParsersAction, private to argparse


class HarnessParser(argparse.ArgumentParser):
    """argparse with one-line refusals: the error, a close match where there is one, and where help is."""

    def error(self, message: str) -> NoReturn:  # argparse's own exit code is already 2
        close = _suggestion(self, message)
        pointer = f" See `{self.prog} --help`." if close else f"; see `{self.prog} --help`"
        print(f"{self.prog}: error: {message}{close}{pointer}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """ "; did you mean 'run'?" for a mistyped subcommand, choice or option; "" when nothing is close."""
    import difflib
    import re

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        typed, allowed = choice.group(1), re.findall(r"'([^']*)'", choice.group(2)) or choice.group(2).split(", ")
    elif message.startswith("unrecognized arguments: "):
        typed = message.removeprefix("unrecognized arguments: ").split()[0].split("=")[0]
        allowed = [o for action in parser._actions for o in action.option_strings]
    else:
        return ""
    close = difflib.get_close_matches(typed, allowed, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


_BACKEND_HELP = f"experts implementation: {EXPERTS.help_text()}; default: the scenario's experts_backend"
_COMM_HELP = f"dispatch/combine backend: {COMM.help_text()}; default: the scenario's comm"
_DEVICE_HELP = "where ranks run, overriding the scenario's device (auto: cuda when there is a GPU per rank, else cpu)"
_VERSION_HELP = "vLLM release X.Y.Z: fetched into the cache (pip download --no-deps) unless already there"
_WHEEL_HELP = "a vLLM wheel file (.whl) to read the release from, instead of downloading one"
_SRC_HELP = "a vLLM source tree (the repository root or its vllm/ directory) to read the release from"
_OPS_HELP = "vLLM's compiled ops library file itself (vllm/_C_stable_libtorch.abi3.so or vllm/_C.abi3.so)"
_KERNELS_HELP = (
    "the vLLM release whose compiled ops the vllm-ops backend runs (or 'installed'); with "
    "--vllm-ops-library, the release that file is"
)
_CACHE_HELP = "cache of downloaded vLLM releases (default: HARNESS_CACHE_DIR, else ~/.cache/moe-harness)"
_JSON_HELP = "print one JSON object instead of tables"
_WIDE_HELP = (
    "on a terminal, print every column of each table (default there: the columns that fit its width); "
    "pipes and CI logs always get every column"
)


class _VersionAction(argparse.Action):
    """--version, computed only when asked for (git runs then, not on every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(_version_text())
        raise SystemExit(EXIT_OK)


def _version_text() -> str:
    """'harness 0.1.0 (git a810dcd)': the package version, and the commit when run from a git checkout."""
    import subprocess

    from harness import __version__

    text = f"harness {__version__}"
    root = Path(__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            done = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return text
        if done.returncode == 0 and done.stdout.strip():
            text += f" (git {done.stdout.strip()}{', modified' if dirty.stdout.strip() else ''})"
    return text


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """-v/-q, before the command (`harness -v run ...`): how much the harness says on stderr, never what it does
    (so a run's recorded command leaves them out)."""
    parser.add_argument(
        "-v", "--verbose", action="count", default=0,
        help=f"say more on stderr (repeatable: -vv); {LOG_LEVEL_ENV}=debug|info|warning|error sets the default",
    )  # fmt: skip
    parser.add_argument(
        "-q", "--quiet", action="count", default=0,
        help="say less on stderr: -q warnings and errors, -qq errors only; results on stdout are unchanged",
    )  # fmt: skip


def _json(p: argparse.ArgumentParser, help: str = _JSON_HELP) -> None:
    p.add_argument("--json", action="store_true", help=help)


def _wide(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wide", action="store_true", help=_WIDE_HELP)


def _vllm_release_options(p: Any, *, version_help: str) -> None:
    """Where a vLLM release is read from: a version (fetched into the cache), a wheel file or a source tree."""
    p.add_argument("--vllm-version", default=None, help=version_help)
    p.add_argument("--vllm-wheel", type=Path, default=None, help=_WHEEL_HELP)
    p.add_argument("--vllm-src", type=Path, default=None, help=_SRC_HELP)


def add_ranks_options(p: argparse.ArgumentParser, *, policies_help: str, kernels_help: str) -> None:
    """The options `run` and `bench` share: what the ranks run (backends, device, ranks, policies) and the vLLM
    release whose ops the vllm-ops backend loads. Each sets the ScenarioOverrides field of its name."""
    p.add_argument("--experts-backend", choices=EXPERTS.choices, default=None, help=_BACKEND_HELP)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help=_DEVICE_HELP)
    p.add_argument("--comm", choices=COMM.choices, default=None, help=_COMM_HELP)
    p.add_argument("--num-ranks", type=int, default=None, help="override parallel.num_ranks")
    p.add_argument("--policies", default=None, help=policies_help)
    p.add_argument("--kernels", default=None, metavar="X.Y.Z|installed", help=kernels_help)
    _vllm_release_options(p, version_help=_VERSION_HELP + "; its ops for the vllm-ops backend")
    p.add_argument("--vllm-ops-library", type=Path, default=None, help=_OPS_HELP)


def build_parser(commands: Mapping[str, Command]) -> HarnessParser:
    """The whole command line; `commands` maps each command ("plan", ..., "vllm audit") to its function."""
    parser = HarnessParser(prog="harness", description="EP+DP MoE workspace harness (vLLM PR #55579)")
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="the harness's version and, in a git checkout, its commit"
    )
    add_log_options(parser)
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=HarnessParser,
        help="what to do; `harness COMMAND --help` for its options",
    )  # fmt: skip
    for add in (_plan, _verify, _scenarios, _run, _collect, _compare, _status, _bench, _schema, _vllm):
        add(sub, commands)
    return parser


def _plan(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser(
        "plan", help="workspace bytes per GPU for each sizing policy; with `-- vllm serve ...` the whole deployment"
    )
    p.add_argument(
        "scenario",
        nargs="?",
        default=None,
        help="scenario file or name in scenarios/; or none and `-- vllm serve MODEL FLAGS` at the end (also "
        "`python -m vllm.entrypoints.openai.api_server ...` or `docker run ... vllm/vllm-openai:TAG ...`)",
    )
    p.add_argument(
        "--fail-on-verdict",
        action="store_true",
        help="exit 1 when a release's deployment does not start (oom, fails, refused) in any startup the "
        "release can make of it (the plan's other outcomes too), its layer does not fit the budget (oom, "
        "refused) or a layer component is double-count, under-sized or over-cap; default: exit 0",
    )
    _json(p)
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP + "; for vllm==X.Y.Z policies")
    p.add_argument(
        "--vllm-version",
        action="append",
        default=None,
        metavar="X.Y.Z",
        help="also plan the whole EP MoE layer per GPU for this release (repeatable)",
    )
    p.add_argument("--vllm-wheel", type=Path, default=None, help="also plan the layer for this vLLM wheel file")
    p.add_argument(
        "--vllm-src",
        type=Path,
        default=None,
        help="also plan the layer for this vLLM source tree (the repository root or its vllm/ directory)",
    )
    p.add_argument(
        "--gpu",
        default=None,
        metavar="NAME",
        help="fit or OOM of each release's layer on this GPU (default: the scenario's memory.budget_gpu)",
    )
    p.add_argument("--budget-gb", type=float, default=None, help="fit or OOM against this many GB (1e9 B) instead")
    p.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        metavar="X",
        help="a deployment on a GPU not in the table: the total torch reports, GiB",
    )
    p.add_argument("--gpu-sms", type=int, default=None, metavar="N", help="with --gpu-memory-gib: its SM count")
    p.add_argument(
        "--gpu-capability", default=None, metavar="M.m", help="with --gpu-memory-gib: its compute capability (e.g. 8.9)"
    )
    _wide(p)
    from harness.cli_search import add_search_arguments

    add_search_arguments(p)
    p.set_defaults(func=commands["plan"], parser=p)


def _verify(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser(
        "verify",
        help="start real vLLM on dummy weights (or read its startup log, --log) and put "
        "its startup figures beside `harness plan`'s, line by line: 0 within --tolerance-pct, 1 outside",
        description="harness verify [OPTIONS] -- vllm serve MODEL FLAGS (or `python -m "
        "vllm.entrypoints.openai.api_server --model MODEL ...`, `docker run ... vllm/vllm-openai ...`): MODEL a "
        "directory holding config.json, a hub id in the local Hugging Face cache, or a preset; with --log the line "
        "may be left out (read from the log's non-default args); docs/deployment-memory.md",
    )
    p.add_argument(
        "--log",
        type=Path,
        default=None,
        metavar="FILE",
        help="compare this vLLM startup log; nothing is started (no GPU needed)",
    )
    p.add_argument(
        "--entry",
        choices=("serve", "llm"),
        default="serve",
        help="start `vllm serve` (default) or the LLM class, whose defaults differ (max_num_batched_tokens "
        "16384, max_num_seqs 1024)",
    )
    p.add_argument(
        "--tolerance-pct",
        type=float,
        default=1.0,
        metavar="P",
        help="largest difference judged ok, in percent (totals of what vLLM printed; the profile's small "
        "terms of the requested memory); default 1",
    )
    p.add_argument("--timeout", type=float, default=900.0, metavar="S", help="stop vLLM after S seconds (default 900)")
    p.add_argument("--python", default=sys.executable, help="the Python whose vLLM is started (default: this one)")
    p.add_argument(
        "--vllm-version",
        default=None,
        metavar="X.Y.Z",
        help="the release to plan (default: the installed one, or the one the log names)",
    )
    p.add_argument("--gpu", default=None, metavar="NAME", help="the GPU's name for the plan (default: nvidia-smi's)")
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="FILE",
        help="write what vLLM printed as a startup record (YAML, the format of tests/data/startup_logs)",
    )
    p.add_argument("--keep-log", type=Path, default=None, metavar="FILE", help="write vLLM's whole startup log here")
    _json(p)
    p.set_defaults(func=commands["verify"], parser=p)


def _scenarios(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser("scenarios", help="list the scenario files")
    _json(p)
    _wide(p)
    p.set_defaults(func=commands["scenarios"], parser=p)


def _run(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser("run", help="run a scenario (or matrix) on local processes or a Ray cluster")
    p.add_argument(
        "scenario",
        nargs="?",
        default=None,
        help="scenario or matrix file, or a name in scenarios/ (default: smoke on CPU, the PR case on a GPU)",
    )
    p.add_argument(
        "--launcher",
        choices=["local", "ray"],
        default=None,
        help="how ranks start: local processes or Ray actors (default: ray with --address or RAY_ADDRESS, "
        "else the scenario's)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="Ray GCS address HOST:6379 to join (default: RAY_ADDRESS, else a new local cluster)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory, must not hold a run (default results/<run-id>); absolute in a Ray job",
    )
    add_ranks_options(
        p,
        policies_help="comma-separated override of policies",
        kernels_help=_KERNELS_HELP + "; on a matrix with a vllm.kernels axis, run only that release's cells",
    )
    p.add_argument(
        "--placement-strategy",
        choices=["PACK", "SPREAD"],
        default=None,
        help="Ray placement of the rank bundles (default: the scenario's, PACK)",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
    p.add_argument(
        "--resume",
        action="store_true",
        help="a matrix into its interrupted --out again: finished cells kept, the interrupted one run again",
    )
    _wide(p)
    p.set_defaults(func=commands["run"], parser=p)


def _collect(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser("collect", help="turn per-rank records into report.{json,md,html} and junit.xml")
    p.add_argument(
        "run_dir",
        type=Path,
        help="a run directory (holds run.json and ranks/) or a matrix run directory (holds matrix.json)",
    )
    _wide(p)
    p.set_defaults(func=commands["collect"], parser=p)


def _compare(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser("compare", help="compare a run against a baseline: 0 pass, 1 regression, 2 error")
    p.add_argument(
        "baseline",
        type=Path,
        help="the reference: a run or matrix directory or its report.json (e.g. under results/baselines/)",
    )
    p.add_argument("current", type=Path, help="the run to judge: a run or matrix directory or its report.json")
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="METRIC=PCT",
        help="a metric's or group's threshold (groups: memory, error, time, throughput)",
    )
    p.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="WHAT",
        help="leave out a metric, a group (memory, error, time, throughput, coverage), policy:NAME or "
        "cell:NAME; what the baseline has and the current run lacks is a regression unless ignored",
    )
    p.add_argument(
        "--gate-across-hardware",
        action="store_true",
        help="gate timings, throughputs and RSS-vs-NVML memory even when the two ran on different hardware",
    )
    p.add_argument(
        "--gate-cpu-timings",
        action="store_true",
        help="gate the timings and throughputs of two CPU runs too (shown, not gated, by default)",
    )
    p.add_argument(
        "--allow-failed-baseline",
        action="store_true",
        help="compare against a baseline that failed its own checks (refused, exit 2, by default)",
    )
    _json(p)
    _wide(p)
    p.set_defaults(func=commands["compare"], parser=p)


def _status(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser(
        "status", help="a collected directory's recorded verdict; exits with it: 0 pass, 1 failed, 2 error"
    )
    p.add_argument("run_dir", type=Path, help="a run or matrix directory that collect wrote status.json into")
    _json(p, help="print status.json's content")
    p.set_defaults(func=commands["status"], parser=p)


def _bench(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser("bench", help="harness cost against raw kernels and raw all_to_all_single")
    p.add_argument("scenario", nargs="?", default=None, help="default: smoke on CPU, the PR case on a GPU")
    _json(p, help="print the bench report as JSON")
    p.add_argument("--out", type=Path, default=None, help="directory for bench.json and bench.md")
    add_ranks_options(
        p, policies_help="comma-separated override of policies (legacy, fixed)", kernels_help=_KERNELS_HELP
    )
    p.add_argument("--cpu-only", action="store_true", help="only the CPU-side costs")
    p.add_argument("--no-cpu-costs", action="store_true", help="skip the CPU-side costs")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="samples of each repeated CPU-side probe, 1 to 20 (default 3)")  # fmt: skip
    p.add_argument("--probes", default=None, metavar="LIST",
                   help="comma-separated CPU-side probes to run, of: plan, plan-command, run-local, run-ray, collect, "
                   "plan-matrix, matrix-collect, search (default: all)")  # fmt: skip
    p.set_defaults(func=commands["bench"], parser=p)


def _schema(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    p = sub.add_parser("schema", help="print the scenario schema reference (Markdown)")
    p.set_defaults(func=commands["schema"], parser=p)


def _vllm(sub: Subcommands, commands: Mapping[str, Command]) -> None:
    vllm = sub.add_parser("vllm", help="vLLM sources: audit a release's batched-experts sizing")
    vsub = vllm.add_subparsers(
        dest="vllm_command", required=True, parser_class=HarnessParser, help="what to do with vLLM's sources"
    )
    p = vsub.add_parser("audit", help="verdict per batched-experts class: consistent or double-count")
    _vllm_release_options(
        p.add_mutually_exclusive_group(), version_help=_VERSION_HELP + " (default: the installed vLLM)"
    )
    p.add_argument("--scenario", default=None, help="sizes to evaluate at (default: the PR case)")
    _json(p)
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument(
        "--layer",
        action="store_true",
        help="the whole-layer audit: every experts class and all-to-all kind of the curated cases",
    )
    p.add_argument(
        "--releases",
        default=None,
        metavar="A..B|X,Y",
        help="with --layer or --sweep: releases to audit; A..B takes every release the registry offers between them",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="with --layer (or --sweep --releases): write layer-audit (sweep-audit).json and .md here",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="every batched-experts class over a grid of D, local experts, T, (K, I), activations, "
        "quantization, num_dispatchers unset and EPLB (docs/vllm-sources.md)",
    )
    p.add_argument(
        "--junit",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --sweep: write JUnit XML, one testcase per (class, point group)",
    )
    p.add_argument(
        "--classes",
        default=None,
        metavar="NAME[,NAME]",
        help="with --sweep: only these experts classes (a pull request's, say); the gate judges those alone",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        metavar="S",
        help="CPU seconds for the whole audit or sweep (default 8 and 60: a hostile tree's bound); raise "
        "it for a tree you trust",
    )
    _wide(p)
    p.set_defaults(func=commands["vllm audit"], parser=p)

    p = vsub.add_parser(
        "diff",
        help="what a change does to the MoE workspace: every experts class over the sweep "
        "grid and the reference deployments, BASE against HEAD (docs/vllm-ci.md)",
    )
    p.add_argument("base", metavar="BASE", help="a release X.Y.Z, a wheel file or a source tree directory")
    p.add_argument("head", metavar="HEAD", help="a release X.Y.Z, a wheel file or a source tree directory")
    p.add_argument(
        "--references",
        type=Path,
        default=None,
        metavar="FILE",
        help="reference deployments (YAML: `vllm serve` lines and GPUs; default: "
        "harness/defaults/reference-deployments.yaml)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=1.0,
        metavar="PCT",
        help="a regression is a growth (or a KV cache loss) past this percentage (default 1)",
    )
    _json(p)
    p.add_argument("--junit", type=Path, default=None, metavar="FILE", help="write JUnit XML")
    p.add_argument("--markdown", type=Path, default=None, metavar="FILE", help="write the pull-request comment")
    p.add_argument("--cache-dir", type=Path, default=None, help=_CACHE_HELP)
    p.add_argument("--budget-s", type=float, default=None, metavar="S", help="CPU seconds for each side's sweep")
    p.set_defaults(func=commands["vllm diff"], parser=p)
