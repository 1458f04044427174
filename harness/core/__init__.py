"""The shared vocabulary: what every other package speaks, so none of them needs another.

Owns: the workspace contract of the batched-experts format (`contract`: sizing policies, SizingArgs, shapes and
bytes, docs/design.md), the typed and versioned records that cross processes and files (`records`), the progress
events that share their header (`events`), the version and hardware probes stamped into them (`environment`),
the exit codes (`exits`) and the error hierarchy mapped to them (`errors`), the `harness` logger and the one
error line (`log`), text made safe for one line (`text`), the console (`console`), byte units and their formatting
(`units`), the memory roundings (`rounding`), every comm buffer's shape (`comm_buffers`), the write probe and
process check before outputs (`files`), and the backends a scenario can name, with what each supports
(`backends`).

May import: nothing from harness. Everything else may import it.
"""
