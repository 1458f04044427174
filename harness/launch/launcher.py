"""The Launcher protocol: what the driver (harness.launch.run) calls on the local and the Ray launcher."""

from __future__ import annotations

from typing import Literal, Protocol

from harness.launch.contract import ClusterResources, LaunchOutcome, LaunchPlan
from harness.launch.sink import RunSink


class Launcher(Protocol):
    @property
    def name(self) -> Literal["local", "ray"]: ...

    def resources(self) -> ClusterResources: ...

    def launch(self, plan: LaunchPlan, sink: RunSink) -> LaunchOutcome: ...

    def close(self) -> None: ...
