"""`harness bench`: the harness's own cost against raw kernels and raw collectives, and its CPU-side costs.

    command      the `harness bench` command (a BenchRequest): the ranks through harness.launch.run.run_ranks,
                 CPU costs, aggregate, write bench.json / bench.md
    rank         the rank side: setup and warm-up as `harness run`, then per policy allocate -> prepare ->
                 iterate (variants interleaved round by round) -> judge
    raw_kernels  the raw experts kernels (vLLM ops, torch grouped GEMM, the reference math)
    raw_comm     the raw all_to_all_single of dispatch's and combine's payloads
    cpu_costs    plan latency, time to the first rank ready, the collector on 1024 records
    aggregate    per-policy aggregates over ranks and the scenario's thresholds
    markdown     bench.md
    records      the typed records: per rank, the report, bench.json

May import: harness.core, harness.scenario, harness.sizing, harness.rank, harness.launch, harness.report.
"""
