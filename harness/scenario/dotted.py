"""Dotted scenario keys ("parallel.num_ranks") on raw scenario data: the one setter and getter.

Matrix axes and overrides, `harness run`'s command-line overrides and the tests all set fields this way, so a
field that is not a mapping on the way reads the same everywhere.
"""

from __future__ import annotations

import copy
from typing import Any


class DottedKeyError(ValueError):
    """A dotted key whose parent on the way is a value, not a mapping."""


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """data["a"]["b"] = deepcopy(value) for key "a.b"; missing mappings on the way are created."""
    *parents, leaf = key.split(".")
    node = data
    for i, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise DottedKeyError(f"{'.'.join(parents[: i + 1])} is not a mapping; cannot set {key}")
        node = child
    node[leaf] = copy.deepcopy(value)


def get_dotted(data: dict[str, Any], key: str) -> Any:
    """data["a"]["b"] for key "a.b", or None when a part is missing."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
