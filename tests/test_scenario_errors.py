"""Bad scenario files: every message names the file, the field, the bad value and what is allowed.

Each case goes through the library (load_scenario raises ScenarioError) and the real CLI (`harness plan FILE`
exits 2 with the same message on stderr and no traceback).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_utils import REPO_DIR, harness_env, run_cli_inproc

from harness.scenario.schema import ScenarioError, load_scenario
from harness.scenario.sections import SCENARIOS_DIR

GOOD = """\
model:
  preset: deepseek-v3
parallel:
  num_dispatchers: 32
  num_local_experts: 16
  max_tokens_per_rank: 256
"""


@dataclass(frozen=True, kw_only=True)
class BadCase:
    id: str
    text: str | None  # None: the file is not created
    says: tuple[str, ...]  # the field, the value and what is allowed, each a fragment of the message


CASES = [
    BadCase(
        id="unknown-top-level-key",
        text=GOOD + "polices: [legacy]\n",
        says=("unknown key 'polices'", "allowed here: bench, comm, deployment, description, device, expect", "policies"),
    ),
    BadCase(
        id="unknown-nested-key",
        text=GOOD.replace("  num_dispatchers: 32", "  num_dispatcher: 32\n  num_dispatchers: 32"),
        says=("unknown key 'parallel.num_dispatcher'",
              "allowed here: max_tokens_per_rank, num_dispatchers, num_local_experts, num_ranks"),
    ),
    BadCase(
        id="missing-field",
        text=GOOD.replace("  max_tokens_per_rank: 256\n", ""),
        says=("missing field 'parallel.max_tokens_per_rank'", "integer > 0", "T, per-dispatcher token capacity"),
    ),
    BadCase(
        id="missing-section",
        text=GOOD.replace("model:\n  preset: deepseek-v3\n", ""),
        says=("missing field 'model'", "mapping; `harness schema` lists its fields"),
    ),
    BadCase(
        id="wrong-type",
        text=GOOD.replace("num_dispatchers: 32", 'num_dispatchers: "many"'),
        says=("parallel.num_dispatchers", "(got 'many')", "valid integer"),
    ),
    BadCase(
        id="zero-size",
        text=GOOD.replace("max_tokens_per_rank: 256", "max_tokens_per_rank: 0"),
        says=("parallel.max_tokens_per_rank", "(got 0)", "greater than 0"),
    ),
    BadCase(
        id="negative-size",
        text=GOOD.replace("num_local_experts: 16", "num_local_experts: -1"),
        says=("parallel.num_local_experts", "(got -1)", "greater than 0"),
    ),
    BadCase(
        id="experts-do-not-divide",
        text=GOOD.replace("num_dispatchers: 32", "num_dispatchers: 24").replace("  num_local_experts: 16\n", ""),
        says=("model.num_experts (256)", "parallel.num_dispatchers (24)",
              "set parallel.num_local_experts (at least 11 for D=24)", "choose D from 1, 2, 4, 8, 16, 32, 64, 128, 256"),
    ),
    BadCase(
        id="top-k-above-experts",
        text="model:\n  preset: mixtral-8x7b\n  top_k: 9\nparallel:\n  num_dispatchers: 1\n  max_tokens_per_rank: 16\n",
        says=("model.top_k (9)", "model.num_experts (8)", "allowed: 1..8"),
    ),
    BadCase(
        id="fewer-dispatchers-than-ranks",
        text=GOOD.replace("num_dispatchers: 32", "num_dispatchers: 2\n  num_ranks: 4"),
        says=("parallel.num_dispatchers (2)", "parallel.num_ranks (4)", "D >= P"),
    ),
    BadCase(
        id="unknown-preset",
        text=GOOD.replace("preset: deepseek-v3", "preset: deepseek-v4"),
        says=("model.preset", "'deepseek-v4'", "allowed: deepseek-r1, deepseek-v3, kimi-k2"),
    ),
    BadCase(
        id="unknown-policy",
        text=GOOD + "policies: [legacy, fixd]\n",
        says=("policies", "'fixd'", "allowed: legacy, fixed, lower-bound, vllm==X.Y.Z"),
    ),
    BadCase(
        id="unknown-backend",
        text=GOOD + "experts_backend: cutlass\n",
        says=("experts_backend", "(got 'cutlass')", "'auto', 'reference', 'torch-cutlass' or 'vllm-ops'"),
    ),
    BadCase(
        id="outcome-for-absent-policy",
        text=GOOD + "policies: [fixed]\nexpect:\n  outcomes: {legacy: oom}\n",
        says=("expect.outcomes names ['legacy']", "not in policies ['fixed']"),
    ),
    BadCase(
        id="yaml-syntax-error",
        text=GOOD.replace("num_dispatchers: 32", "num_dispatchers: [32"),
        says=("YAML syntax error at line 5, column 20", "expected ',' or ']'",
              "while parsing a flow sequence that starts at line 4, column 20"),
    ),
    BadCase(id="file-does-not-exist", text=None, says=("no such scenario file",)),
    BadCase(id="empty-file", text="", says=("the file is empty", "YAML mapping with at least model: and parallel:")),
    BadCase(
        id="list-not-mapping",
        text="- model\n- parallel\n",
        says=("a scenario is a YAML mapping of keys", "got a YAML list: ['model', 'parallel']"),
    ),
]


def _write(tmp_path: Path, case: BadCase) -> Path:
    path = tmp_path / f"{case.id}.yaml"
    if case.text is not None:
        path.write_text(case.text)
    return path


def test_the_good_file_is_good(tmp_path):
    # Every case is one edit away from this file, so each message is about that edit alone.
    scenario = load_scenario(_write(tmp_path, BadCase(id="good", text=GOOD, says=())))
    assert scenario.num_local_experts == 16


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_scenario_message(tmp_path, case):
    path = _write(tmp_path, case)
    with pytest.raises(ScenarioError) as excinfo:
        load_scenario(path)
    message = str(excinfo.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message, f"one problem, one line: {message}"
    for fragment in case.says:
        assert fragment in message, f"{fragment!r} not in {message!r}"

    result = run_cli_inproc("plan", str(path))
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr == f"harness: error: {message}\n"
    assert "Traceback" not in result.stderr


def test_every_problem_is_reported_at_once(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(GOOD.replace("num_dispatchers: 32", "num_dispatchers: 0") + "bogus: 1\n")
    with pytest.raises(ScenarioError) as excinfo:
        load_scenario(path)
    lines = str(excinfo.value).splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert any("parallel.num_dispatchers" in line and "(got 0)" in line for line in lines)
    assert any("unknown key 'bogus'" in line for line in lines)


def test_plan_takes_a_matrix_file_and_plans_every_cell() -> None:
    result = run_cli_inproc("plan", "scenarios/matrix/cpu-ci.yaml")
    assert result.returncode == 0, result.stderr
    assert "matrix cpu-ci (cpu-ci.yaml): 2 of 2 valid cells" in result.stdout
    assert "cell K512-I256_D2_T128:" in result.stdout and "cell K512-I256_D4_T128:" in result.stdout
    assert "missing field" not in result.stdout + result.stderr
    data = json.loads(run_cli_inproc("plan", "scenarios/matrix/cpu-ci.yaml", "--json").stdout)
    assert [c["cell"] for c in data["cells"]] == ["K512-I256_D2_T128", "K512-I256_D4_T128"]
    assert data["cells"][1]["sizing"]["D"] == 4 and data["skipped"] == []


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_mistyped_name_gets_a_suggestion_without_importing_torch(command: str) -> None:
    # -X importtime lists every module imported: a refusal must come before torch (and any rank).
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", command, "smoek"], cwd=REPO_DIR,
                            env=harness_env(), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    message = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert message == [f"harness: error: smoek: no such scenario file (looked in . and {SCENARIOS_DIR}); did you "
                       "mean 'smoke'? `harness scenarios` lists them"]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "harness.rank.lifecycle" not in imported


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_name_longer_than_a_file_name_is_one_line(command: str) -> None:
    result = run_cli_inproc(command, "n" * 300)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "no such scenario file" in result.stderr
