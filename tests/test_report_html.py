"""report.html: numbers equal report.json, plots are real PNGs, checked in the page and in a headless Chromium."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.report.collect import collect
from harness.report.markdown import GIB, MIB
from harness.report.matrix import collect_matrix
from harness.report.model import parse_report
from harness.scenario.matrix import load_matrix
from harness.scenario.sections import REPO_DIR
from report_records import make_scenario, write_run

TESTS_DIR = Path(__file__).resolve().parent
ARTIFACTS_DIR = TESTS_DIR / "artifacts"  # git-ignored; CI keeps it as a build artifact
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class _Page(HTMLParser):
    """The numeric cells (data-json, data-value, shown text) and the <img> sources of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, str, str]] = []
        self.images: list[str] = []
        self._open: list[tuple[str, str]] = []
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "img":
            self.images.append(attributes.get("src") or "")
        if tag == "td" and "data-json" in attributes:
            self._open.append((attributes["data-json"] or "", attributes.get("data-value") or ""))
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._open:
            pointer, value = self._open.pop()
            self.cells.append((pointer, value, "".join(self._text).strip()))


def parse_page(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def resolve_pointer(data: dict, pointer: str):
    """The value at a JSON pointer ("/policies/0/workspace_delta_bytes/avg") of report.json's data."""
    value = data
    for part in pointer.strip("/").split("/"):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def assert_shown_equals_report(page: _Page, report: dict) -> int:
    """Every numeric cell's data-value is report.json's value, and its text is that value at display precision."""
    from harness.report.markdown import byte_unit

    unit, _ = byte_unit(parse_report(report, where="report.json"))
    scale = GIB if unit == "GiB" else MIB
    assert page.cells, "no numeric cells in the page"
    for pointer, raw, text in page.cells:
        value = resolve_pointer(report, pointer)
        assert json.loads(raw) == value, pointer
        shown = float(text)
        if pointer.endswith("baseline_bytes"):  # MiB with one decimal, whatever the table's unit
            assert shown == pytest.approx(value / MIB, abs=0.051), (pointer, text, value)
        elif "bytes" in pointer:  # .4g of GiB or MiB: within half a unit of the fourth significant digit
            assert shown == pytest.approx(value / scale, rel=6e-4, abs=1e-12), (pointer, text, value)
        elif "error" in pointer:  # .3g
            assert shown == pytest.approx(value, rel=6e-3), (pointer, text, value)
        elif "tflops" in pointer or "gbps" in pointer:  # .4g
            assert shown == pytest.approx(value, rel=6e-4), (pointer, text, value)
        elif isinstance(value, int):
            assert shown == value, (pointer, text, value)
        elif "_us" in pointer:  # times (.1f)
            assert shown == pytest.approx(value, abs=0.051), (pointer, text, value)
        else:  # ratios (.2f)
            assert shown == pytest.approx(value, abs=0.0051), (pointer, text, value)
    return len(page.cells)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def assert_real_pngs(page: _Page, expected: int) -> None:
    assert len(page.images) == expected
    for src in page.images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        data = base64.b64decode(src[len(prefix) :], validate=True)
        width, height = png_size(data)
        assert width >= 400 and height >= 300 and len(data) > 10_000, (width, height, len(data))


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """4 GPU ranks under a memory budget that leaves ~2.9 MiB for a workspace: legacy (4 MiB) OOMs as expected."""
    scenario = make_scenario(
        parallel={"num_dispatchers": 8, "num_ranks": 4, "num_local_experts": 4, "max_tokens_per_rank": 32},
        policies=["legacy", "fixed", "lower-bound"],
        memory={"budget_gb": 1.003},
        expect={"outcomes": {"legacy": "oom", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
    )
    overrides = {rank: {"legacy": {"status": "oom"}} for rank in range(4)}
    run_dir = write_run(tmp_path_factory.mktemp("html") / "run", scenario, overrides=overrides)
    return run_dir, collect(run_dir).report.model_dump(mode="json")


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    scenario = make_scenario(
        parallel={"num_dispatchers": 4, "num_ranks": 2, "num_local_experts": 4, "max_tokens_per_rank": 32}
    )
    run_dir = write_run(tmp_path_factory.mktemp("cpu") / "run", scenario, device_kind="cpu")
    return run_dir, collect(run_dir).report.model_dump(mode="json")


@pytest.fixture(scope="module")
def matrix_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    matrix_dir = tmp_path_factory.mktemp("matrix")
    first, second = matrix.cells()
    write_run(matrix_dir / first.name, first.scenario, device_kind="cpu")
    write_run(matrix_dir / second.name, second.scenario, device_kind="cpu", failed_ranks={0: "died: exit code -9"})
    return matrix_dir, collect_matrix(matrix_dir, matrix.cells(), matrix=matrix).report.model_dump(mode="json")


def test_page_numbers_equal_report_json(run_report: tuple[Path, dict]) -> None:
    run_dir, _report = run_report
    page = parse_page((run_dir / "report.html").read_text())
    # 3 policies x 15 numeric columns less the n/a cells, plus the baselines and the per-rank table
    assert assert_shown_equals_report(page, json.loads((run_dir / "report.json").read_text())) > 60
    assert_real_pngs(page, 2)


def test_page_marks_oom_budget_other_and_outcome(run_report: tuple[Path, dict]) -> None:
    run_dir, report = run_report
    text = (run_dir / "report.html").read_text()
    assert f'<meta name="harness-generation" content="{report["generation"]}">' in text
    assert "oom (expected oom): pass" in text and '<td class="oom">oom (expected oom): pass</td>' in text
    assert "OOM marked in red; the red line is the memory budget (957 MiB) less the baseline in use" in text
    assert "the red line is the memory budget" in text.split('id="plot-breakdown"')[1]
    note = text.split('id="other-note">')[1].split("</p>")[0]
    assert "CUDA context" in note and "NCCL" in note and "caching allocator" in note
    assert 'id="baselines"' in text and "each GPU&#x27;s memory" in text


def test_cpu_page_says_cpu_memory(cpu_report: tuple[Path, dict]) -> None:
    run_dir, _ = cpu_report
    text = (run_dir / "report.html").read_text()
    header = text.split('id="header">')[1].split("</pre>")[0]
    assert "each rank&#x27;s CPU memory" in header and "GPU" not in header
    assert "CPU memory is sized for D" in text and "GPU memory" not in text
    assert "the interpreter" in text.split('id="other-note">')[1].split("</p>")[0]
    assert "no memory budget in this scenario" in text


def test_matrix_page_numbers_equal_report_json(matrix_report: tuple[Path, dict]) -> None:
    matrix_dir, _report = matrix_report
    text = (matrix_dir / "report.html").read_text()
    assert "the interpreter" in text.split('id="other-note">')[1].split("</p>")[0]  # a CPU matrix: RSS, not NVML
    page = parse_page(text)
    assert_shown_equals_report(page, json.loads((matrix_dir / "report.json").read_text()))
    assert_real_pngs(page, 2)


# ---------------------------------------------------------------------------------------------------------------
# A real headless Chromium from Debian's packages


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        installer = subprocess.run(
            ["bash", str(TESTS_DIR / "install_browser.sh")], capture_output=True, text=True, timeout=900
        )
        if installer.returncode == 3:
            pytest.skip(f"chromium is not installed and cannot be: {installer.stderr.strip()}")
        assert installer.returncode == 0, f"tests/install_browser.sh failed:\n{installer.stdout}\n{installer.stderr}"
        path = shutil.which("chromium")
    assert path is not None
    return path


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )


def check_in_browser(
    chromium: str, tmp_path: Path, report_dir: Path, report: dict, shot_name: str, num_images: int
) -> Path:
    url = (report_dir / "report.html").resolve().as_uri()
    dumped = run_chromium(chromium, tmp_path / "profile-dom", "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    page = parse_page(dumped.stdout)
    assert assert_shown_equals_report(page, report) > 10
    assert_real_pngs(page, num_images)
    assert report["status"] in dumped.stdout and f"(exit {report['exit_code']})" in dumped.stdout

    ARTIFACTS_DIR.mkdir(exist_ok=True)
    shot = ARTIFACTS_DIR / shot_name
    shot.unlink(missing_ok=True)
    taken = run_chromium(
        chromium, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,2600", "--hide-scrollbars", url
    )
    assert taken.returncode == 0, taken.stderr[-2000:]
    width, height = png_size(shot.read_bytes())
    assert (width, height) == (1280, 2600) and shot.stat().st_size > 50_000
    print(f"screenshot: {shot}")
    return shot


@pytest.mark.browser
def test_run_report_in_chromium(chromium: str, tmp_path: Path, run_report: tuple[Path, dict]) -> None:
    run_dir, report = run_report
    check_in_browser(chromium, tmp_path, run_dir, report, "report-run.png", 2)


@pytest.mark.browser
def test_matrix_report_in_chromium(chromium: str, tmp_path: Path, matrix_report: tuple[Path, dict]) -> None:
    matrix_dir, report = matrix_report
    check_in_browser(chromium, tmp_path, matrix_dir, report, "report-matrix.png", 2)


@pytest.fixture(scope="module")
def large_matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """80 cells of one rank (D x T x K), one of them failing a check: past every cap of the matrix page."""
    from harness.scenario.matrix import matrix_from_data

    tmp = tmp_path_factory.mktemp("large")
    base = {
        "model": {"hidden_size": 128, "intermediate_size": 64, "num_experts": 16, "top_k": 1},
        "parallel": {"num_dispatchers": 1, "num_ranks": 1, "max_tokens_per_rank": 16},
        "policies": ["legacy", "fixed", "lower-bound"],
        "device": "cpu",
        "expect": {"outcomes": {"legacy": "fit", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
    }
    axes = {
        "parallel.num_dispatchers": [1, 2, 4, 8, 16],
        "parallel.max_tokens_per_rank": [16, 32, 64, 128],
        "model.hidden_size": [128, 256, 512, 1024],
    }
    matrix = matrix_from_data({"matrix": {"name": "large", "base": base, "axes": axes}}, tmp / "large.yaml")
    cells = matrix.cells()
    assert len(cells) == 80
    matrix_dir = tmp / "matrix"
    for cell in cells:
        overrides = {0: {"fixed": {"max_rel_error": 0.5}}} if cell is cells[-1] else None
        write_run(matrix_dir / cell.name, cell.scenario, device_kind="cpu", overrides=overrides)
    return matrix_dir, collect_matrix(matrix_dir, cells, matrix=matrix).report.model_dump(mode="json")


def test_a_large_matrix_page_is_bounded(large_matrix: tuple[Path, dict]) -> None:
    from harness.report.html_matrix import CELL_ROWS_MAX
    from harness.report.markdown import MATRIX_ROWS_MAX

    matrix_dir, report = large_matrix
    text = (matrix_dir / "report.html").read_text()
    page = parse_page(text)
    assert_shown_equals_report(page, json.loads((matrix_dir / "report.json").read_text()))
    assert_real_pngs(page, 3)  # workspace against D (bands), the heatmaps, the breakdown: not one per cell
    assert 'id="plot-heatmaps"' in text and 'id="plot-workspace-vs-d"' in text
    cells_table = text.split("<h2>Cells (79 of 80 passed)</h2>")[1].split("</table>")[0]
    assert cells_table.count("<tr>") == 1 + CELL_ROWS_MAX  # the header row and the capped rows
    failing = report["cells"][-1]["name"]
    assert cells_table.index(failing) < cells_table.index(report["cells"][0]["name"])  # the failing cell first
    assert "16 more cells in report.json and the cells&#x27; own reports." in text
    policy_rows = text.split('id="policy-table"')[1].split("</table>")[0]
    shown = -(-MATRIX_ROWS_MAX // 3)  # whole cells, three policies each, until the rows reach the cap
    assert f"... {(80 - shown) * 3} more rows ({80 - shown} cells) in report.json" in policy_rows
    assert "the first 24 of 240" in text
    md = (matrix_dir / "report.md").read_text()
    assert "... and 16 more cells in report.json" in md and "in 64 of 80 cells:" in md
    assert len(md) < 60_000 and len(text) < 1_500_000


def test_a_matrix_cell_page_draws_no_figure(large_matrix: tuple[Path, dict]) -> None:
    matrix_dir, report = large_matrix
    cell_page = (matrix_dir / report["cells"][0]["name"] / "report.html").read_text()
    assert parse_page(cell_page).images == [] and 'id="plots-in-matrix"' in cell_page
    cell_report = json.loads((matrix_dir / report["cells"][0]["name"] / "report.json").read_text())
    assert assert_shown_equals_report(parse_page(cell_page), cell_report) > 10


@pytest.mark.browser
def test_large_matrix_report_in_chromium(chromium: str, tmp_path: Path, large_matrix: tuple[Path, dict]) -> None:
    matrix_dir, report = large_matrix
    check_in_browser(chromium, tmp_path, matrix_dir, report, "report-matrix-large.png", 3)
