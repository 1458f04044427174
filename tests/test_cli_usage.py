"""The command layer's own refusals and help: one line with a suggestion, exit 2; every argument explained."""

from __future__ import annotations

import argparse

import pytest
from cli_utils import run_cli_inproc

from harness.cli import build_parser

PR_CASE = "scenarios/deepseek-v3-dp32-pr55579.yaml"


@pytest.mark.parametrize(("args", "says"), [
    ((), "harness: error: the following arguments are required: command; see `harness --help`"),
    (("rnu",), "harness: error: argument command: invalid choice: 'rnu' (choose from 'plan', 'verify', 'scenarios', 'run', "
               "'collect', 'compare', 'status', 'bench', 'schema', 'vllm'); did you mean 'run'? See `harness --help`."),
    (("plan",), "harness: error: plan needs a scenario, or `-- vllm serve MODEL FLAGS` after the options; see "
                "`harness plan --help`"),
    (("plan", PR_CASE, "--jsn"),
     "harness plan: error: unrecognized arguments: --jsn; did you mean '--json'? See `harness plan --help`."),
    (("run", "--num-ranks", "two"),
     "harness run: error: argument --num-ranks: invalid int value: 'two'; see `harness run --help`"),
    (("run", "--launcher", "rey"),
     "harness run: error: argument --launcher: invalid choice: 'rey' (choose from 'local', 'ray'); "
     "did you mean 'ray'? See `harness run --help`."),
    (("compare", "results/a"),
     "harness compare: error: the following arguments are required: current; see `harness compare --help`"),
    (("vllm", "adit"),
     "harness vllm: error: argument vllm_command: invalid choice: 'adit' (choose from 'audit', 'diff'); "
     "did you mean 'audit'? See `harness vllm --help`."),
    (("vllm", "audit", "--vllm-version", "0.30.0", "--vllm-src", "x"),
     "harness vllm audit: error: argument --vllm-src: not allowed with argument --vllm-version; "
     "see `harness vllm audit --help`"),
])
def test_usage_errors_are_one_line_with_a_suggestion(args, says):
    result = run_cli_inproc(*args)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [says]
    assert result.stdout == ""


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _parsers(child)
    return found


def test_every_argument_of_every_command_has_help():
    parsers = _parsers(build_parser())
    assert {p.prog for p in parsers} >= {"harness", "harness run", "harness vllm audit", "harness compare"}
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p in parsers for a in p._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()
    ]
    assert missing == []


@pytest.mark.parametrize("command", ["run", "collect", "compare", "bench", "vllm audit"])
def test_help_names_every_option(command):
    result = run_cli_inproc(*command.split(), "--help")
    assert result.returncode == 0
    assert result.stdout.startswith(f"usage: harness {command}")
    assert result.stderr == ""


def test_collect_of_a_missing_directory_says_where_runs_are(tmp_path):
    result = run_cli_inproc("collect", str(tmp_path / "no-such-run"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"harness: error: {tmp_path / 'no-such-run'}: no such run directory; `harness run` writes them under "
        "results/ (or --out), each holding run.json and ranks/"
    ]
