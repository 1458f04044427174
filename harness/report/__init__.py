"""From rank records to verdicts: collect, the renderings, the regression gate.

Owns: `collect` (the face: load, build, write one run), `load` (contained, bounded reading of run.json and
ranks/*.json into typed records), `checks` (the verdict rules: expectation, correctness, memory, baseline, the exit
code; the only place a verdict is made), `build` (records -> the typed report of `model`), `write` (report.json,
report.md, junit.xml, report.html, atomic, one generation), `markdown` (Markdown, JUnit, console summary), `html`
(self-contained HTML with plots: the run page, over `html_base`'s shared figures and cells and `html_matrix`'s
matrix page), `compare` (the gate against a baseline, exit 0/1/2) and `matrix` (one report
over a matrix's cells).

May import: harness.core, harness.scenario, harness.sizing. Never the data path or the launchers: a report is
made from records alone.
"""
