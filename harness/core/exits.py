"""Exit codes shared by every command, report and gate: 0 ok, 1 a check or expectation failed, 2 an error."""

EXIT_OK = 0  # every check passed
EXIT_FAILED = 1  # a check, an expectation or a regression gate failed
EXIT_ERROR = 2  # bad input, a missing or corrupt record, an infrastructure failure
