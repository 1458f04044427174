"""One rank's lifecycle and its data path, which mirrors vLLM's modular kernel:

    [route] -> [quant + dispatch] -> [experts: GEMM1 -> silu_and_mul -> quant -> GEMM2] -> [combine]
    route.py   quant.py, dispatch.py   experts/ (one module per backend), views of the     combine.py
                                       policy's workspace buffers (core.contract)
               comm/ (one module per comm backend: symm-mem, nccl, gloo) under dispatch and combine

around them: `distributed` (RankInfo, the one rendezvous init_rank, `agree`: every rank takes the same branch
after a step that failed on some), `memory` (NVML, allocator, RSS, budgets, OOM snapshots), `timing` (CUDA events,
median/min/max), `check` (the correctness check: one checked pass whose stage hooks compare each stage with the
reference applied to the previous stage's actual output, naming the first that diverges) and `lifecycle` (set up
and warm up once, then baseline / allocate / iterate / measure / check / judge per policy, the record so far after
each; returns the rank's RankRecord).

Letters (docs/design.md): T tokens per rank, D dispatchers, M = T*D slots per expert, E local experts,
K hidden size, I intermediate size (N = 2I).

May import: harness.core, harness.scenario, harness.sizing.
"""
