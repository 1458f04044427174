"""From rank records to verdicts: collect, the renderings, the regression gate.

Owns: `collect` (records -> the report and its checks), `markdown` (Markdown, JUnit, console summary), `html`
(self-contained HTML with plots), `compare` (the gate against a baseline, exit 0/1/2) and `matrix` (one report
over a matrix's cells).

May import: harness.core, harness.scenario, harness.sizing. Never the data path or the launchers: a report is
made from records alone.
"""
