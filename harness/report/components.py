"""The layer's buffers in the run report: each component the ranks allocated (RankRecord.components), the layer
model's bytes for it, what the ranks allocated and their device showed, the verdicts a run can judge, and the
scenario's expectation on them.

A run judges what its own bytes decide: DeepEP's cap on the RDMA buffer (num_rdma_bytes / 16 < INT_MAX, just under
32 GiB), so a buffer DeepEP would refuse is `over-cap` here as in `harness plan --vllm-version`. Verdicts that
depend on what a vLLM release asks for (double-count, under-sized, over-allocated) need the release's source; they
stay `harness plan`'s, and an expectation of them is shown, not judged.

Expectations come from the scenario's layer.expect (release -> component -> verdicts): the run's release when the
scenario names it, else the verdicts every listed release agrees on. An expectation the run's verdicts do not meet
is a failed check: the run exits 1.

Other component kinds plug in through COMPONENT_FOLDS: a fold takes each record as the collector reads it and
returns ComponentReports of its kind (a deployment's buffers, say), judged the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from harness.report.model import Aggregate, CheckOutcome, ComponentReport

RUN_JUDGED = {"deepep-rdma": {"over-cap", "consistent"}}  # component -> the verdicts a run decides


def _release_of(versions: Any) -> str | None:
    """X.Y.Z of the vLLM release the run read or ran, when a version label names one."""
    if versions is None:
        return None
    for label in (versions.vllm_kernels, versions.vllm_source):
        match = re.search(r"\b(\d+\.\d+\.\d+)\b", label or "")
        if match:
            return match.group(1)
    return None


def expected_verdicts(expect: dict[str, dict[str, list[str]]], name: str, release: str | None) -> list[str] | None:
    """The scenario's verdicts for `name`: its release's, else what every release that names it agrees on."""
    if release is not None and name in expect.get(release, {}):
        return sorted(expect[release][name])
    found = {tuple(sorted(components[name])) for components in expect.values() if name in components}
    return list(found.pop()) if len(found) == 1 else None


def judge(name: str, verdicts: list[str], expected: list[str] | None) -> tuple[CheckOutcome, str]:
    """pass/fail where the run decides every expected verdict; skip, saying why, where it does not."""
    if expected is None:
        return "skip", ""
    decided = RUN_JUDGED.get(name)
    if decided is None or not set(expected) <= decided:
        return "skip", f"expected {', '.join(expected)}: needs the release's source (`harness plan --vllm-version`)"
    if set(verdicts) & decided == set(expected):
        return "pass", f"expected {', '.join(expected)}"
    return "fail", f"expected {', '.join(expected)}, the run finds {', '.join(verdicts)}"


class LayerFold:
    """The layer's components over ranks, folded record by record (a 1024-rank run keeps one entry per component,
    not one per rank), in the order the first record listed them."""

    kind = "layer"

    def __init__(self) -> None:
        self.first: dict[str, Any] = {}  # name -> the first rank's ComponentMemory
        self.measured: dict[str, list[int]] = {}  # name -> [min, max, sum, count] of the device's delta
        self.within: dict[str, bool] = {}

    def add(self, record: Any) -> None:
        for c in record.components:
            self.first.setdefault(c.name, c)
            m = self.measured.setdefault(c.name, [c.measured_delta_bytes, c.measured_delta_bytes, 0, 0])
            m[0], m[1] = min(m[0], c.measured_delta_bytes), max(m[1], c.measured_delta_bytes)
            m[2], m[3] = m[2] + c.measured_delta_bytes, m[3] + 1
            self.within[c.name] = self.within.get(c.name, True) and c.within_rounding

    def reports(self, scenario: Any, versions: Any) -> list[ComponentReport]:
        from harness.sizing import deepep

        expect = scenario.layer.expect if scenario is not None else {}
        release = _release_of(versions)
        out = []
        for name, first in self.first.items():
            low, high, total, count = self.measured[name]
            verdicts, cap, detail = ["consistent"], None, ""
            if name == "deepep-rdma":
                cap = deepep.RDMA_CAP_BYTES
                if not deepep.rdma_bytes_fit(first.predicted_bytes):
                    verdicts = ["over-cap"]
                    detail = (
                        f"DeepEP refuses a buffer of {first.predicted_bytes:,} B: num_rdma_bytes / 16 must "
                        f"stay under INT_MAX ({cap:,} B at most)"
                    )
            expected = expected_verdicts(expect, name, release)
            outcome, why = judge(name, verdicts, expected)
            out.append(
                ComponentReport(
                    kind=self.kind,
                    name=name,
                    predicted_bytes=first.predicted_bytes,
                    source=first.prediction_source,
                    allocated_bytes=first.allocated_bytes,
                    measured_bytes=Aggregate(min=low, avg=total / count, max=high, num_ranks=count),
                    within_rounding=self.within[name],
                    cap_bytes=cap,
                    verdicts=verdicts,
                    expected_verdicts=expected,
                    expectation=outcome,
                    detail="; ".join(t for t in (detail, why) if t),
                )
            )
        return out


# Each kind of component a run report shows: a fold with add(record) and reports(scenario, versions). A
# deployment's buffers plug in here with a fold of their own.
COMPONENT_FOLDS: list[Callable[[], Any]] = [LayerFold]


class ComponentFold:
    """Every kind's fold at once: what harness.report.build.RunFold feeds each record to."""

    def __init__(self) -> None:
        self.folds = [make() for make in COMPONENT_FOLDS]

    def add(self, record: Any) -> None:
        for fold in self.folds:
            fold.add(record)

    def reports(self, scenario: Any, versions: Any) -> list[ComponentReport]:
        return [c for fold in self.folds for c in fold.reports(scenario, versions)]


def component_failures(components: list[ComponentReport]) -> list[str]:
    """One line per component whose expectation failed, for the exit reason."""
    return [f"{c.kind} {c.name}: {c.detail}" for c in components if c.expectation == "fail"]
