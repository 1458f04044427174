"""`harness bench`: the harness's own cost against raw kernels and raw collectives, and its CPU-side costs.

May import: harness.core, harness.scenario, harness.sizing, harness.rank, harness.launch, harness.report.
"""
