"""status.json: the verdict of one run or matrix directory, small and machine-readable, beside its reports.

    RunStatus          the typed, versioned model: exit code, status, reason, run id, generation
    status_of()        a report's status (what collect writes with report.json, of the same generation)
    read_status()      status.json read back, contained and bounded; StatusError (one line) when it cannot be

Why: `ray job submit` turns a job's exit code 2 into 1, so CI reading the job's code cannot tell a regression
from an infrastructure error. The results directory keeps the real 0/1/2; `harness status DIR` gives it back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from harness.core.exits import EXIT_ERROR
from harness.report.load import read_contained
from harness.report.model import Report

STATUS_FILE = "status.json"
STATUS_SCHEMA_VERSION = 1
MAX_STATUS_BYTES = 64 * 1024


class RunStatus(BaseModel):
    """The verdict collect made, as status.json holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    schema_version: Literal[1] = STATUS_SCHEMA_VERSION
    record_kind: Literal["status"] = "status"
    kind: Literal["run", "matrix"]
    run_id: str | None
    generation: str  # the generation of the report.json written with it
    status: Literal["OK", "FAILED"]
    exit_code: Literal[0, 1, 2]
    exit_reason: str

    @field_validator("exit_code", mode="before")
    @classmethod
    def _a_code_not_a_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # JSON's false is 0 to Python: an exit code is a number
            raise ValueError(f"{str(value).lower()} is not an exit code; allowed: 0, 1, 2")
        return value

    @model_validator(mode="after")
    def _status_is_its_code(self) -> RunStatus:
        if (self.status == "OK") != (self.exit_code == 0):
            raise ValueError(f"status {self.status} with exit code {self.exit_code}; allowed: OK with 0, FAILED with "
                             "1 or 2")
        return self


class StatusError(Exception):
    """status.json missing, unreadable or not one; the message says which and why, in one line."""


def status_of(report: Report) -> RunStatus:
    return RunStatus(kind=report.kind, run_id=report.run_id, generation=report.generation, status=report.status,
                     exit_code=report.exit_code if report.exit_code in (0, 1, 2) else EXIT_ERROR,  # type: ignore[arg-type]
                     exit_reason=report.exit_reason)


def status_text(report: Report) -> str:
    return json.dumps(status_of(report).model_dump(mode="json"), indent=1) + "\n"


def read_status(directory: Path) -> RunStatus:
    path = Path(directory) / STATUS_FILE
    raw = read_contained(Path(directory).resolve(), path, limit=MAX_STATUS_BYTES)
    if isinstance(raw, tuple):
        why = "missing" if raw[0] == "missing" else raw[1]
        raise StatusError(f"{path}: {why}; run `harness collect {directory}` to write it")
    try:
        data = json.loads(raw.decode("utf-8"))
        version = data.get("schema_version") if isinstance(data, dict) else None
        if isinstance(version, int) and not isinstance(version, bool) and version > STATUS_SCHEMA_VERSION:
            raise StatusError(f"{path}: schema version {version} is newer than this harness reads "
                              f"({STATUS_SCHEMA_VERSION}); upgrade the harness")
        return RunStatus.model_validate(data)
    except StatusError:
        raise
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "status"
        raise StatusError(f"{path}: not a status file: {where}: {first['msg']}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StatusError(f"{path}: corrupt: {type(exc).__name__}") from None
