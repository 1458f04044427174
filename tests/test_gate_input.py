"""Scenario input that YAML 1.1 or a float would silently read as something else is refused in one line."""

from __future__ import annotations

import copy

import pytest

from harness.scenario.schema import ScenarioError, parse_scenario
from harness.scenario.source import parse_yaml
from scenario_utils import TINY


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "parallel:\n  num_ranks: 020\n",
            "parallel.num_ranks: '020' is a YAML 1.1 octal number (read as 16), not 20; quote it or write the decimal",
        ),
        (
            "launch:\n  rank_timeout_s: 1:30.5\n",
            "launch.rank_timeout_s: '1:30.5' is a YAML 1.1 base-60 number (read as "
            "90.5); quote it or write the decimal",
        ),
        ("seed: 1:30\n", "seed: '1:30' is a YAML 1.1 base-60 number (read as 90)"),
        (
            "base: &b {num_ranks: 2}\nparallel:\n  <<: *b\n  num_ranks: 4\n",
            "parallel: a merge key (<<); allowed: each key written out",
        ),
    ],
)
def test_yaml_1_1_surprises_and_merge_keys_are_refused(text: str, says: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_yaml(text, path="s.yaml")
    assert str(info.value).startswith("s.yaml: ") and says in str(info.value) and "\n" not in str(info.value)


def test_decimals_zero_hex_and_quoted_forms_still_read() -> None:
    assert parse_yaml("a: 20\nb: 0\nc: 0x1f\nd: '020'\ne: 1.5\nf: -3\n", path="s.yaml") == {
        "a": 20,
        "b": 0,
        "c": 31,
        "d": "020",
        "e": 1.5,
        "f": -3,
    }


@pytest.mark.parametrize("budget_gb", [4.9e-324, 1e-6, 0.001])
def test_a_budget_below_one_mib_is_refused(budget_gb: float) -> None:
    data = copy.deepcopy(TINY)
    data["memory"] = {"budget_gb": budget_gb}
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, path="s.yaml")
    assert f"memory.budget_gb {budget_gb!r} is {int(budget_gb * 1e9)} bytes; allowed: at least 1048576 bytes" in str(
        info.value
    )
    data["memory"] = {"budget_gb": 0.0011}
    assert parse_scenario(data, path="s.yaml").memory.budget_bytes == 1_100_000


def test_look_alike_keys_are_escaped_in_messages() -> None:
    data = copy.deepcopy(TINY)
    data["m\u043edel"] = data.pop("model")  # a Cyrillic o
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, path="s.yaml")
    assert "unknown key 'm\\u043edel'" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        parse_yaml("name: a\nn\u0430me: b\nname: c\n", path="s.yaml")  # the third repeats the first
    assert "duplicate key 'name'" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        parse_yaml("n\u0430me: a\nn\u0430me: b\n", path="s.yaml")
    assert "duplicate key 'n\\u0430me'" in str(info.value)
