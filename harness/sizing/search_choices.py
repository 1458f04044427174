"""The choices `harness plan --search` offers, in a module of their own: the command line builds its parser from
them without importing the deployment model (harness.sizing.search), which only a search needs."""

from __future__ import annotations

from typing import Literal

OBJECTIVES = ("kv-tokens", "concurrency", "min-gpus")
Objective = Literal["kv-tokens", "concurrency", "min-gpus"]
ALLOWANCES = ("kv-fp8",)
