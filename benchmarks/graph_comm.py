"""symm-mem's dispatch + combine eager and replayed from a CUDA graph, on 2 GPUs: how much of the round is the host.

    PYTHONPATH=. python3 benchmarks/graph_comm.py SCENARIO [--iters N] [--out FILE.json]

Builds each rank as `harness run` does (harness.rank.lifecycle.setup_rank) with comm symm-mem on 2 ranks, times
N eager rounds (CUDA events, medians), captures one round in a CUDA graph and times N replays, and checks that a
replay's combined output equals the eager one bit for bit (symm-mem's path has no atomics, so it is
deterministic). symm-mem reads nothing on the host and has fixed shapes, which is what capture needs; whether
the round captures is what this finds out. A development measurement: `harness bench` replays graphs itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.rank.combine import combine
from harness.rank.dispatch import dispatch
from harness.launch.run import scenario_kernels
from harness.rank.distributed import RankInfo, free_port, init_rank, shutdown_rank
from harness.rank.lifecycle import setup_rank
from harness.scenario.dotted import set_dotted
from harness.scenario.schema import load_scenario, parse_scenario


def _median_us(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _rank(rank: int, port: int, data: dict, kernels, iters: int, queue) -> None:
    info = RankInfo(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, comm_backend="nccl",
                    device_type="cuda", device_index=rank)
    result: dict = {"rank": rank}
    try:
        device = init_rank(info)
        scenario = parse_scenario(data, path=data["name"])
        setup = setup_rank(scenario, info, device, Path("/tmp"), 0, kernels=kernels)
        comm, L = setup.buffers, setup.layout
        E, M, K = L.num_local_experts, L.max_slots_per_expert, L.hidden_size
        gen = torch.Generator(device=device).manual_seed(rank)
        expert_out = torch.randn((E, M, K), device=device, generator=gen).to(torch.bfloat16)
        out = torch.empty((setup.tokens.shape[0], K), dtype=torch.bfloat16, device=device)

        def round_() -> None:
            handle = dispatch(setup.tokens, setup.routing, L, comm, setup.quantize)
            out.copy_(combine(expert_out, handle, L, comm))

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                round_()
        torch.cuda.current_stream().wait_stream(side)
        result["eager_us"] = _median_us(round_, iters)
        eager_out = out.clone()
        graph = torch.cuda.CUDAGraph()
        try:
            dist.barrier()
            with torch.cuda.graph(graph):
                round_()
            torch.cuda.synchronize()
            out.zero_()
            result["graph_us"] = _median_us(graph.replay, iters)
            result["replay_equals_eager"] = bool(torch.equal(out, eager_out))
        except Exception as exc:  # noqa: BLE001 - the finding is whether capture works at all
            result["capture_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        result.update(comm=comm.name, tokens=int(setup.tokens.shape[0]), E=E, M=M, K=K, top_k=L.top_k)
    except Exception:  # noqa: BLE001
        result["error"] = traceback.format_exc()[-2000:]
    queue.put(result)
    try:
        shutdown_rank()
    except Exception:  # noqa: BLE001
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print("graph_comm: needs 2 CUDA GPUs", file=sys.stderr)
        return 2
    data = load_scenario(args.scenario).model_dump(mode="json")
    for key, value in {"parallel.num_ranks": 2, "device": "cuda", "comm": "symm-mem"}.items():
        set_dotted(data, key, value)
    for key in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
        os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    kernels = scenario_kernels(parse_scenario(data, path=data["name"]))  # once, here, as `harness run`'s driver does
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    # Daemons, ended after a bounded wait: on 2 x H200 the ranks printed their results and then did not exit
    # (shutdown after NVSHMEM use), which held the parent until the step's timeout.
    procs = [ctx.Process(target=_rank, args=(r, port, data, kernels, args.iters, queue), daemon=True) for r in range(2)]
    for proc in procs:
        proc.start()
    results = sorted((queue.get(timeout=600) for _ in procs), key=lambda r: r["rank"])
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)} x 2, scenario {args.scenario}")
    for r in results:
        print(json.dumps(r))
    if args.out:
        args.out.write_text(json.dumps({"scenario": args.scenario, "torch": torch.__version__, "ranks": results},
                                       indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
