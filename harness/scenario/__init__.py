"""Scenarios are pure data: reading them safely, the schema, the model presets and the expansion of matrices.

Owns: `source` (bounded reading: regular files only, size, UTF-8, a YAML loader that limits nesting, aliases,
integer digits and refuses duplicate keys), `limits` (every input limit, and bounded formatting of values for
messages), `schema` (the pydantic Scenario; every check that needs no GPU), `sections` and `deployment` (its
sections, one model each), `presets` (model shapes from their configs),
`dotted` (the one setter of dotted keys), `matrix` (a matrix file -> valid cells and the skipped ones, "N of M
valid", the cell count capped first), `fit` (can a machine with these resources run it: a reason or None, from
resources given as data), `fields` and `doc` (the schema reference, limits included).

May import: harness.core. Validation never touches a GPU (docs/design.md, conventions).
"""
