"""A real CPU run under a budget where legacy OOMs: every rendering shows the OOM a user would paste into an issue.

scenarios/smoke-cpu-budget.yaml gives 45 MB to the harness's tensors: legacy's second 16 MiB workspace block does
not fit beside its first, fixed's 8 MiB does. The accountant refuses it exactly, so the bytes are the same on any
machine: asked for 16,777,216 B, held 16,777,216 B, budget 45,000,000 B.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_utils import run_cli_inproc
from test_report_html import check_in_browser, chromium  # noqa: F401 (the session's browser fixture)

from harness.core.units import human_bytes

ASKED, BUDGET = 16 * 2**20, 45_000_000
MESSAGE = "CPU budget exceeded: Tried to allocate 16.00 MiB (16777216 bytes) for ws2"


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("oom") / "run"
    result = run_cli_inproc("run", "smoke-cpu-budget", "--out", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The terminal summary too: the OOM line under the table.
    assert "legacy OOM at stage workspace on rank(s) 0, 1: asked for 16,777,216 B (16.0 MiB)" in result.stdout
    return run_dir


@pytest.mark.slow
def test_the_record_keeps_the_oom_and_what_it_held(budget_run: Path) -> None:
    report = json.loads((budget_run / "report.json").read_text())
    legacy = [e for r in report["ranks"] for e in r["policies"] if e["policy"] == "legacy"]
    assert [e["status"] for e in legacy] == ["oom", "oom"]
    for e in legacy:
        oom = e["oom"]
        assert (oom["stage"], oom["requested_bytes"], oom["allocated_bytes"], oom["budget_bytes"]) == (
            "workspace", ASKED, ASKED, BUDGET)
        assert oom["message"].startswith(MESSAGE)
    assert report["exit_code"] == 0  # legacy's OOM is what the scenario expects


@pytest.mark.slow
def test_report_md_shows_the_oom_and_the_budget(budget_run: Path) -> None:
    text = (budget_run / "report.md").read_text()
    assert "# memory budget: 45,000,000 B (42.9 MiB) from memory.budget_gb 0.045" in text
    section = text.split("### OOMs (2 rank x policy)")[1].split("###")[0]
    row = next(line for line in section.splitlines() if line.startswith("| legacy"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # free: the budget less every tensor the harness held when the second block was asked for (weights, comm
    # buffers, the first block), as the record has it: less than the block, which is why it did not fit
    report = json.loads((budget_run / "report.json").read_text())
    free = {e["oom"]["free_bytes"] for r in report["ranks"] for e in r["policies"] if e["policy"] == "legacy"}
    assert len(free) == 1 and 0 <= (free_bytes := free.pop()) < ASKED
    assert cells[:7] == ["legacy", "0, 1", "workspace", "16,777,216 B (16.0 MiB)", "16,777,216 B (16.0 MiB)",
                         f"{free_bytes:,} B ({human_bytes(free_bytes)})", "45,000,000 B (42.9 MiB)"]
    assert cells[7].startswith(MESSAGE)
    # Padded columns: every line of a table has its pipes at the same offsets.
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert len({tuple(i for i, ch in enumerate(line) if ch == "|") for line in table}) == 1


@pytest.mark.slow
def test_junit_carries_the_oom_and_times(budget_run: Path) -> None:
    root = ET.parse(budget_run / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert float(suite.get("time")) > 0 and float(root.get("time")) == pytest.approx(float(suite.get("time")))
    cases = suite.findall("testcase")
    assert all(c.get("time") is not None for c in cases)
    expectation = [c for c in cases if c.get("name") == "expectation" and c.get("classname").endswith(".legacy")]
    assert len(expectation) == 2
    for case in expectation:
        out = case.find("system-out").text
        assert "legacy OOM at stage workspace" in out and "asked for 16,777,216 B" in out
        assert "budget 45,000,000 B" in out and MESSAGE in out
    correctness = [c for c in cases if c.get("name") == "correctness" and c.get("classname").endswith(".fixed")]
    assert all(float(c.get("time")) > 0 for c in correctness)  # the check's own seconds
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["memory.budget_bytes"] == str(BUDGET)


@pytest.mark.slow
def test_report_html_shows_the_oom_and_the_cpu_budget_line(budget_run: Path) -> None:
    text = (budget_run / "report.html").read_text()
    section = text.split('id="ooms"')[1].split("</table>")[0]
    assert "16,777,216 B (16.0 MiB)" in section and "45,000,000 B (42.9 MiB)" in section and MESSAGE in section
    assert "no memory budget in this scenario" not in text
    assert "the red line is the memory budget (42.9 MiB) less the harness&#x27;s other tensors" in text
    assert "memory budget: 45,000,000 B" in text.split('id="header">')[1]


@pytest.mark.slow
@pytest.mark.browser
def test_budget_report_in_chromium(chromium: str, tmp_path: Path, budget_run: Path) -> None:
    report = json.loads((budget_run / "report.json").read_text())
    shot = check_in_browser(chromium, tmp_path, budget_run, report, "report-cpu-budget-oom.png", 2)
    assert shot.exists()


def test_human_bytes_never_prints_an_exponent() -> None:
    assert human_bytes(1.82e3 * 2**30) == "1.78 TiB"
    assert human_bytes(60129542144) == "56.0 GiB"
    assert human_bytes(8 * 2**20) == "8.00 MiB"
    assert human_bytes(512) == "512 B"
    assert human_bytes(None) == "n/a"
    assert all("e+" not in human_bytes(10.0**k) for k in range(0, 16))


def test_a_matrix_report_lists_each_cell_oom(tmp_path: Path) -> None:
    from report_records import read_md, write_run

    from harness.report.matrix import collect_matrix
    from harness.scenario.matrix import load_matrix
    from harness.scenario.sections import REPO_DIR

    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    first, second = matrix.cells()
    write_run(tmp_path / first.name, first.scenario, device_kind="cpu")
    write_run(tmp_path / second.name, second.scenario, device_kind="cpu",
              overrides={r: {"legacy": {"status": "oom"}} for r in range(second.scenario.parallel.num_ranks)})
    collect_matrix(tmp_path, matrix.cells(), matrix=matrix)
    section = read_md(tmp_path / "report.md").split("### OOMs (")[1]
    rows = [line for line in section.splitlines() if line.startswith(f"| {second.name} | legacy |")]
    assert len(rows) == 1 and "CUDA out of memory. Tried to allocate" in rows[0]
    assert f"| {first.name} |" not in section.split("\n\n")[1]  # the cell without an OOM has no row
