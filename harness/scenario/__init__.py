"""Scenarios are pure data: the schema, the model presets and the expansion of regression matrices.

Owns: `schema` (the pydantic Scenario; every check that needs no GPU), `presets` (model shapes, DESIGN.md §9),
`matrix` (a matrix file -> valid cells and the skipped ones, "N of M valid") and `doc` (the schema reference).

May import: harness.core. Validation never touches a GPU (STYLE.md guideline 5).
"""
