"""The `harness` command as a user runs it: the real CLI (in this process, and once as `python -m harness`), exit
codes and output checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_utils import REPO_DIR, harness_env, run_cli_inproc, run_harness

from harness.scenario.schema import Scenario, load_scenario
from harness.scenario.doc import REGENERATE, schema_markdown

PR_CASE = "scenarios/deepseek-v3-dp32-pr55579.yaml"
FIXED_BYTES, LEGACY_BYTES = 3758096384, 120259084288  # 3.5 GiB and 112 GiB
SCENARIO_FILES = sorted(p.name for p in (REPO_DIR / "scenarios").glob("*.yaml"))


def test_plan_prints_the_pr_case():
    result = run_cli_inproc("plan", PR_CASE)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "legacy 112 GiB (32x fixed); fixed 3.5 GiB (1x fixed); lower-bound 3.5 GiB (1x fixed)" in out
    assert "T=256 D=32 M=8192 E=16 K=7168 I=2048 N=4096 top_k=8 bfloat16" in out
    legacy_row = next(line for line in out.splitlines() if "legacy" in line and "(16, 262144, 7168)" in line)
    assert "112" in legacy_row and "32.00" in legacy_row
    assert "D=32 is emulated on 1 physical rank(s)" in out


def test_plan_of_a_small_scenario_reads_in_mib():
    # smoke's workspaces are 8 and 32 MiB: "0.007812 GiB" was what the plan printed before.
    result = run_cli_inproc("plan", "smoke")
    assert result.returncode == 0, result.stderr
    assert "legacy 32 MiB (4x fixed); fixed 8 MiB (1x fixed); lower-bound 8 MiB (1x fixed)" in result.stdout
    assert "GiB" not in result.stdout


def test_plan_json_gives_bytes_as_ints():
    result = run_harness("plan", PR_CASE, "--json")  # `python -m harness` itself, the module's entry point
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["scenario"] == "deepseek-v3-dp32-pr55579"
    assert plan["sizing"] == {"T": 256, "D": 32, "M": 8192, "E": 16, "K": 7168, "I": 2048, "N": 4096, "top_k": 8,
                              "activation": "silu", "workspace_dtype": "bfloat16"}
    totals = {p["name"]: p["total_bytes"] for p in plan["policies"]}
    assert totals == {"legacy": LEGACY_BYTES, "fixed": FIXED_BYTES, "lower-bound": FIXED_BYTES}
    assert all(type(p["total_bytes"]) is int for p in plan["policies"])
    ratios = {p["name"]: p["ratio_to_fixed"] for p in plan["policies"]}
    assert ratios["legacy"] == 32.0


def test_plan_finds_a_scenario_by_name_from_any_directory(tmp_path):
    result = run_cli_inproc("plan", "deepseek-v3-dp32-pr55579", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["policies"][1]["total_bytes"] == FIXED_BYTES


@pytest.mark.parametrize("name", SCENARIO_FILES)
def test_every_scenario_file_plans(name):
    result = run_cli_inproc("plan", f"scenarios/{name}", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    fixed = next(p for p in plan["policies"] if p["name"] == "fixed")["total_bytes"]
    legacy = next(p for p in plan["policies"] if p["name"] == "legacy")["total_bytes"]
    assert legacy == plan["sizing"]["D"] * fixed


def test_scenarios_lists_every_file_with_its_summary():
    result = run_cli_inproc("scenarios")
    assert result.returncode == 0, result.stderr
    for name in SCENARIO_FILES:
        assert name in result.stdout
        description = load_scenario(REPO_DIR / "scenarios" / name).description
        assert description and " ".join(description.split()[:4]) in result.stdout, name
    assert "INVALID" not in result.stdout


def test_scenarios_json():
    result = run_cli_inproc("scenarios", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["scenarios"]
    assert [row["file"] for row in rows] == SCENARIO_FILES
    for row in rows:
        scenario = load_scenario(REPO_DIR / "scenarios" / row["file"])
        assert row["summary"] == (scenario.description or scenario.summary())


def test_schema_prints_markdown_with_every_top_level_field():
    result = run_cli_inproc("schema")
    assert result.returncode == 0, result.stderr
    assert result.stdout == schema_markdown()
    assert result.stdout.startswith("# Scenario file reference\n")
    for name in Scenario.model_fields:
        assert f"| `{name}` |" in result.stdout, name
    assert "| `parallel.max_tokens_per_rank` | integer > 0, <= 262144 | **required** |" in result.stdout
    assert "one of `uniform`, `skewed`, `worst-case`" in result.stdout


def test_committed_schema_doc_is_current():
    committed = (REPO_DIR / "docs" / "scenario-schema.md").read_text()
    assert committed == schema_markdown(), f"docs/scenario-schema.md is stale: regenerate it with `{REGENERATE}`"


COMMANDS = ("plan", "verify", "scenarios", "run", "collect", "compare", "status", "bench", "schema", "vllm")


def test_help_shows_usage_and_every_command():
    result = run_cli_inproc("--help")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: harness ")
    assert "{" + ",".join(COMMANDS) + "}" in result.stdout  # argparse's choices, in the order they are declared
    # One line per command under "positional arguments": its name, then its summary.
    listed = re.findall(r"^    (\S+) +\S", result.stdout, flags=re.MULTILINE)
    assert listed == list(COMMANDS), result.stdout


def _installed_entry_point() -> str | None:
    beside = Path(sys.executable).with_name("harness")
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("harness")


def test_installed_entry_point_runs_plan():
    entry = _installed_entry_point()
    if entry is None:
        pytest.skip("the harness console script is not installed (pip install -e . installs it)")
    result = subprocess.run([entry, "plan", PR_CASE, "--json"], cwd=REPO_DIR, env=harness_env(),
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    totals = {p["name"]: p["total_bytes"] for p in json.loads(result.stdout)["policies"]}
    assert (totals["legacy"], totals["fixed"]) == (LEGACY_BYTES, FIXED_BYTES)
