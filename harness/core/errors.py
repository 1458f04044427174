"""One error hierarchy for what a command refuses or fails at: harness.cli.main shows it as one line
(harness.core.log.error_line: the error prefix, then the message) and exits with the error's code.

    HarnessError            exit 2
      BadInput              exit 2: a flag, a file, a scenario, a variable that cannot be used as given
      InfrastructureError   exit 2: the machine, a cache, a download, a set of records failed
      CheckFailed           exit 1: a check, an expectation or a gate failed

The message is the whole line after the prefix: it names the field, the value and what is allowed. Each module's
own error (ScenarioError, VllmSourceError, ...) derives from one of these, so a command lets it reach main.
"""

from __future__ import annotations

from harness.core.exits import EXIT_ERROR, EXIT_FAILED


class HarnessError(Exception):
    """A refusal or failure the command reports in one line, exiting with `exit_code`. `details`: lines shown
    indented under it, one per cause (each escaped on its own), where one line cannot name every cause."""

    exit_code: int = EXIT_ERROR

    def __init__(self, *args: object, details: tuple[str, ...] = ()) -> None:
        super().__init__(*args)
        self.details = details


class BadInput(HarnessError):
    """What the caller gave cannot be used (exit 2)."""


class InfrastructureError(HarnessError):
    """The machine, a cache, a download or the records failed (exit 2): never read as a regression."""


class CheckFailed(HarnessError):
    """A check, an expectation or a gate failed (exit 1)."""

    exit_code = EXIT_FAILED
