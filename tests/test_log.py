"""The harness's log: one `harness` logger hierarchy on stderr, its level from -v/-q and HARNESS_LOG_LEVEL; results on
stdout whatever the level."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.log import LOG_LEVEL_ENV, LogLevelError, configure, error_line, level_from, parse_level
from harness.report.matrix import collect_matrix
from harness.scenario.matrix import load_matrix
from harness.scenario.sections import REPO_DIR
from report_records import write_run


@pytest.mark.parametrize(
    ("verbose", "quiet", "env", "level"),
    [
        (0, 0, None, logging.INFO),
        (1, 0, None, logging.DEBUG),
        (3, 0, None, logging.DEBUG),  # no lower than DEBUG
        (0, 1, None, logging.WARNING),
        (0, 2, None, logging.ERROR),
        (0, 5, None, logging.ERROR),  # errors are always shown
        (0, 0, "warning", logging.WARNING),
        (1, 0, "WARNING", logging.INFO),  # -v goes one level below the variable's
        (0, 1, "debug", logging.INFO),
        (0, 0, "30", logging.WARNING),
    ],
)
def test_the_level_comes_from_the_flags_and_the_variable(verbose: int, quiet: int, env: str | None, level: int) -> None:
    assert level_from(verbose=verbose, quiet=quiet, env=env) == level


@pytest.mark.parametrize("text", ["loud", "0", "99", "-10", "info!"])
def test_a_bad_level_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(LogLevelError) as refused:
        parse_level(text)
    assert str(refused.value) == (
        f"{LOG_LEVEL_ENV} {text!r} is not a log level; allowed: debug, info, warning, error or a number 1-50"
    )


@pytest.fixture(autouse=True)
def _restore_the_level() -> Iterator[None]:
    before = logging.getLogger("harness").level
    yield
    configure(before)


def test_records_of_the_hierarchy_go_to_stderr_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    configure(logging.INFO)
    log = logging.getLogger("harness.some.module")
    log.debug("not shown at INFO")
    log.info("collecting cell 1/2: a")
    log.warning("--out x: taken over")
    log.error("no such file")
    logging.getLogger("elsewhere").warning("another library's record is not the harness's")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "collecting cell 1/2: a",
        "harness: --out x: taken over",
        error_line("no such file"),
    ]
    assert error_line("no such file") == "harness: error: no such file"
    configure(logging.ERROR)
    log.warning("hidden at ERROR")
    log.error("shown")
    assert capsys.readouterr().err == "harness: error: shown\n"


@pytest.fixture
def matrix_dir(tmp_path: Path) -> Path:
    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    for cell in matrix.cells():
        write_run(tmp_path / cell.name, cell.scenario, device_kind="cpu")
    collect_matrix(tmp_path, matrix.cells(), matrix=matrix)
    return tmp_path


def test_quiet_drops_the_progress_and_keeps_the_result(
    matrix_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    cells = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml").cells()
    code = main(["collect", str(matrix_dir)])
    loud = capsys.readouterr()
    progress = [f"collecting cell {i}/{len(cells)}: {c.name}" for i, c in enumerate(cells, 1)]
    assert [line for line in loud.err.splitlines() if line.startswith("collecting cell")] == progress
    assert main(["-q", "collect", str(matrix_dir)]) == code
    quiet = capsys.readouterr()
    assert "collecting cell" not in quiet.err and quiet.out == loud.out
    monkeypatch.setenv(LOG_LEVEL_ENV, "warning")
    assert main(["collect", str(matrix_dir)]) == code
    assert "collecting cell" not in capsys.readouterr().err
    assert main(["-v", "collect", str(matrix_dir)]) == code  # -v below the variable's warning: info again
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("collecting cell")] == progress
    assert logging.getLogger("harness").level == logging.INFO  # main gave back the level it found


def test_a_bad_variable_is_bad_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(LOG_LEVEL_ENV, "loud")
    assert main(["schema"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"harness: error: {LOG_LEVEL_ENV} 'loud' is not a log level; allowed: debug, info, warning, error or a "
        "number 1-50\n"
    )
