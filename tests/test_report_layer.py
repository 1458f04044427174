"""The layer in the run report: the components a rank recorded, the layer model's bytes, the device's, and the
verdicts; the exit code follows the scenario's layer.expect.

The records are what a rank of scenarios/vllm-57894-eplb-deepep-ll.yaml writes on an H200: the predictions are
the layer model's own (harness.sizing.layer.run_predictions), measured as allocated (NVML within rounding)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.core.records import ComponentMemory, rank_record_path, read_record, write_record
from harness.report.collect import collect
from harness.report.model import RunReport
from harness.scenario.schema import load_scenario
from harness.sizing.layer import run_predictions
from report_records import read_md, write_run

RDMA_BYTES = 38_168_170_112  # vLLM #57894: DeepEP's buffer for 448 experts, over its 32 GiB cap


def _layer_run(run_dir: Path, scenario) -> Path:
    write_run(run_dir, scenario)
    predicted = run_predictions(scenario)
    path = rank_record_path(run_dir, 0)
    record = read_record(path)
    components = [
        ComponentMemory(
            name=name,
            predicted_bytes=p.bytes,
            prediction_source=p.source,
            allocated_bytes=p.bytes,
            step_allocated_bytes=p.bytes,
            measured_delta_bytes=p.bytes + 2 * 2**20,
            reserved_delta_bytes=p.bytes,
            within_rounding=True,
        )
        for name, p in predicted.items()
    ]
    write_record(path, record.model_copy(update={"components": components}))
    return run_dir


def test_the_layer_model_predicts_the_issue_buffer():
    assert run_predictions(load_scenario("vllm-57894-eplb-deepep-ll"))["deepep-rdma"].bytes == RDMA_BYTES


def test_over_cap_as_expected_passes_and_every_rendering_shows_it(tmp_path: Path):
    run_dir = _layer_run(tmp_path / "run", load_scenario("vllm-57894-eplb-deepep-ll"))
    result = collect(run_dir)
    report = result.report
    assert isinstance(report, RunReport)
    rdma = next(c for c in report.components if c.name == "deepep-rdma")
    assert (rdma.predicted_bytes, rdma.verdicts, rdma.expected_verdicts, rdma.expectation) == (
        RDMA_BYTES,
        ["over-cap"],
        ["over-cap"],
        "pass",
    )
    assert (
        rdma.measured_bytes is not None and rdma.measured_bytes.max == RDMA_BYTES + 2 * 2**20 and rdma.within_rounding
    )
    workspace_expectation = [c for c in report.components if c.name == "workspace"]
    assert not workspace_expectation  # the run allocates no "workspace" component: plan's verdict, not the run's
    assert result.exit_code == 0, result.report.exit_reason

    md = read_md(run_dir / "report.md")
    row = next(line for line in md.split("### Layer components")[1].splitlines() if "| deepep-rdma |" in line)
    assert "| 38,168,170,112 B (35.5 GiB) |" in row and "| over-cap | over-cap | pass: DeepEP refuses a buffer" in row
    assert row.split("|")[10].strip().endswith("expected over-cap")
    assert "34,359,738,351 B (32.0 GiB)" in row  # DeepEP's cap beside it
    html = (run_dir / "report.html").read_text()
    section = html.split('id="components"')[1].split("</table>")[0]
    assert "38,168,170,112 B (35.5 GiB)" in section and "over-cap" in section and "expert-weights" in section
    assert (
        "DeepEP refuses a buffer of 38,168,170,112 B"
        in json.loads((run_dir / "report.json").read_text())["components"][2]["detail"]
    )


def test_an_expectation_the_run_does_not_meet_exits_1(tmp_path: Path):
    scenario = load_scenario("vllm-57894-eplb-deepep-ll")
    layer = scenario.layer.model_copy(update={"expect": {"0.33.0": {"deepep-rdma": ["consistent"]}}})
    run_dir = _layer_run(tmp_path / "run", scenario.model_copy(update={"layer": layer}))
    result = collect(run_dir)
    assert result.exit_code == 1
    assert "layer deepep-rdma: " in result.report.exit_reason
    assert "expected consistent, the run finds over-cap" in result.report.exit_reason
    assert "| fail: " in read_md(run_dir / "report.md").split("### Layer components")[1]


def test_a_verdict_only_a_release_decides_is_shown_not_judged(tmp_path: Path):
    scenario = load_scenario("vllm-57894-eplb-deepep-ll")
    layer = scenario.layer.model_copy(update={"expect": {"0.33.0": {"deepep-rdma": ["under-sized"]}}})
    run_dir = _layer_run(tmp_path / "run", scenario.model_copy(update={"layer": layer}))
    result = collect(run_dir)
    report = result.report
    assert isinstance(report, RunReport)
    rdma = next(c for c in report.components if c.name == "deepep-rdma")
    assert rdma.expectation == "skip" and "harness plan --vllm-version" in rdma.detail
    assert result.exit_code == 0
