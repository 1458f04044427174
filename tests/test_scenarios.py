"""The scenario files: each states what it expects of every policy, and its header quotes today's plan."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from harness.scenario.schema import load_scenario
from harness.scenario.sections import SCENARIOS_DIR
from harness.sizing.plan import make_plan

SCENARIO_PATHS = sorted(SCENARIOS_DIR.glob("*.yaml"))
# "# `harness plan`: legacy 112 GiB (120259084288 B), fixed 3.5 GiB (3758096384 B), lower-bound 3.5 GiB; 32x."
PLAN_LINE = re.compile(r"^# `harness plan`: legacy .*? \((\d+) B\), fixed .*? \((\d+) B\), .*; (\d+)x\.$", re.MULTILINE)


def test_the_model_and_budget_scenarios_are_here():
    names = {p.name for p in SCENARIO_PATHS}
    assert {
        "deepseek-v3-dp32-pr55579-h100-budget.yaml",
        "deepseek-v3-dp32-pr55579-ballast.yaml",
        "deepseek-v3-dp64-default-tokens.yaml",
        "kimi-k2-dp32.yaml",
        "qwen3-235b-a22b-dp16.yaml",
        "mixtral-8x22b-dp8.yaml",
        "smoke-8ranks.yaml",
    } <= names


@pytest.mark.parametrize("path", SCENARIO_PATHS, ids=lambda p: p.name)
def test_scenario_states_its_expectations(path: Path):
    scenario = load_scenario(path)
    raw = yaml.safe_load(path.read_text())
    assert scenario.name == path.stem
    assert scenario.description, "a one-line description for `harness scenarios`"
    assert set(scenario.expect.outcomes) == set(scenario.policies), "an expected outcome for every policy"
    assert "memory_tolerance_pct" in raw["expect"], "the tolerance is stated, not defaulted"


@pytest.mark.parametrize("path", SCENARIO_PATHS, ids=lambda p: p.name)
def test_scenario_header_quotes_the_plan(path: Path):
    match = PLAN_LINE.search(path.read_text())
    assert match, f"{path.name}: no '# `harness plan`: legacy ... (N B), fixed ... (N B), ...; Nx.' line"
    legacy_bytes, fixed_bytes, ratio = map(int, match.groups())
    rows = {row.shapes.policy: row.shapes.total_bytes for row in make_plan(load_scenario(path))}
    assert (legacy_bytes, fixed_bytes) == (rows["legacy"], rows["fixed"])
    assert ratio == rows["legacy"] // rows["fixed"]


def test_ballast_and_budget_cases_separate_the_policies():
    # The two memory-pressure variants of the PR case expect exactly the OOM the double count causes.
    for name in ("deepseek-v3-dp32-pr55579-h100-budget", "deepseek-v3-dp32-pr55579-ballast"):
        scenario = load_scenario(name)
        assert scenario.expect.outcomes["legacy"] == "oom"
        assert scenario.expect.outcomes["fixed"] == "fit"
    assert load_scenario("deepseek-v3-dp32-pr55579-h100-budget").memory.budget_gpu == "H100-80GB"
    assert load_scenario("deepseek-v3-dp32-pr55579-ballast").memory.ballast_bytes == 60 * 10**9


def test_packaged_default_scenarios_equal_the_scenario_files():
    """harness/defaults/ ships the embedded defaults with a non-editable install; they must not drift."""
    from harness.scenario.sections import REPO_DIR

    for name in ("smoke.yaml", "deepseek-v3-dp32-pr55579.yaml"):
        packaged = REPO_DIR / "harness" / "defaults" / name
        assert packaged.read_text() == (REPO_DIR / "scenarios" / name).read_text(), (
            f"copy scenarios/{name} to harness/defaults/{name}"
        )
