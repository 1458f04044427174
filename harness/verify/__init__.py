"""`harness verify`: real vLLM's own startup figures beside `harness plan`'s prediction.

    record.py    StartupRecord: what a vLLM startup printed (the format of tests/data/startup_logs and
                 tests/data/real_startups), typed and versioned
    logparse.py  a startup log's text into figures, backends, the model runner and vLLM's own error line
    compare.py   the plan beside the record, line by line, with the difference of each and a tolerance
    launch.py    starting vLLM itself (the one place the project executes vLLM code), bounded and cleaned up
    cli.py       the command

May import: harness.core, harness.scenario, harness.sizing.
"""
