"""One error hierarchy, mapped to exit codes in harness.cli.main: every refusal is one line from one place."""

from __future__ import annotations

from pathlib import Path

import pytest

import harness.cli
from harness.cli import main
from harness.core.errors import BadInput, CheckFailed, HarnessError, InfrastructureError
from harness.core.log import ERROR_PREFIX, LogLevelError
from harness.core.records import RecordError
from harness.launch.contract import LaunchError
from harness.report.compare_metrics import CompareError
from harness.report.status import StatusError
from harness.scenario.matrix import MatrixError
from harness.scenario.source import ScenarioError
from harness.sizing.model_config import ModelConfigError
from harness.sizing.serve_args import ServeArgsError
from harness.sizing.vllm_source.cache import CacheError
from harness.sizing.vllm_source.sources import VllmSourceError

HARNESS_DIR = Path(__file__).resolve().parent.parent / "harness"


@pytest.mark.parametrize(
    ("error", "kind", "code"),
    [
        (ScenarioError, BadInput, 2),
        (MatrixError, BadInput, 2),
        (ServeArgsError, BadInput, 2),
        (ModelConfigError, BadInput, 2),
        (CompareError, BadInput, 2),
        (LogLevelError, BadInput, 2),
        (VllmSourceError, InfrastructureError, 2),
        (CacheError, InfrastructureError, 2),
        (RecordError, InfrastructureError, 2),
        (StatusError, InfrastructureError, 2),
        (LaunchError, InfrastructureError, 2),
        (CheckFailed, CheckFailed, 1),
    ],
)
def test_each_error_has_its_kind_and_exit_code(error: type[HarnessError], kind: type[HarnessError], code: int) -> None:
    assert issubclass(error, kind) and issubclass(error, HarnessError)
    assert error("x").exit_code == code


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (BadInput("--gpu 'X' is not a known GPU; allowed: H200-141GB"), 2),
        (InfrastructureError("cache entry /c was made from another wheel"), 2),
        (CheckFailed("2 regression(s)"), 1),
        (ScenarioError("smoek: no such scenario file"), 2),
    ],
)
def test_main_shows_an_error_in_one_line_and_exits_with_its_code(
    raised: HarnessError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def command(ns: object) -> int:
        print("what the command printed before")
        raise raised

    monkeypatch.setattr(harness.cli, "cmd_schema", command)
    assert main(["schema"]) == code
    captured = capsys.readouterr()
    assert captured.out == "what the command printed before\n"
    assert captured.err == f"harness: error: {raised}\n"


def test_main_shows_errors_even_when_quiet(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def command(ns: object) -> int:
        raise BadInput("--junit goes with --sweep")

    monkeypatch.setattr(harness.cli, "cmd_schema", command)
    assert main(["-qqq", "schema"]) == 2
    assert capsys.readouterr().err == "harness: error: --junit goes with --sweep\n"


def test_the_error_prefix_is_written_in_one_place() -> None:
    places = [
        f"{path.relative_to(HARNESS_DIR.parent)}:{number}"
        for path in sorted(HARNESS_DIR.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ERROR_PREFIX.strip() in line
    ]
    assert len(places) == 1 and places[0].startswith("harness/core/log.py:"), places
