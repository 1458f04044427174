"""Small scenarios for tests, built as data and validated by the real schema."""

from __future__ import annotations

import copy
from typing import Any

from harness.scenario.dotted import set_dotted
from harness.scenario.schema import Scenario, parse_scenario

TINY: dict[str, Any] = {
    "name": "tiny",
    "model": {"hidden_size": 64, "intermediate_size": 32, "num_experts": 16, "top_k": 2},
    "parallel": {"num_dispatchers": 2, "num_ranks": 2, "num_local_experts": 8, "max_tokens_per_rank": 16},
    "policies": ["legacy", "fixed"],
    "experts_backend": "reference",
    "device": "cpu",
    "iterations": 2,
    "warmup": 0,
}


def tiny(**overrides: Any) -> Scenario:
    """TINY with dotted overrides: tiny(**{"parallel.num_ranks": 4})."""
    data = copy.deepcopy(TINY)
    for dotted, value in overrides.items():
        set_dotted(data, dotted, value)
    return parse_scenario(data, path="<test>")
