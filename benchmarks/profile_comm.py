"""Where dispatch and combine spend their time, kernel by kernel, on one rank (P = 1 emulating the scenario's D).

    PYTHONPATH=. python3 benchmarks/profile_comm.py SCENARIO [--comm nccl|gloo] [--iters N] [--out FILE.json]

Builds the rank exactly as `harness run` does (harness.rank.lifecycle.setup_rank) in a one-rank group, warms the
path up, then runs N dispatch + combine rounds under torch.profiler and prints:
  - each sub-stage's median (the same marks `harness bench` reports);
  - the kernels (or CPU ops, without a GPU) that took the most device time, with their share of the total.
--out writes the same as JSON. This is a development tool: `harness bench` is the measurement of record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from harness.launch.run import scenario_kernels
from harness.rank.combine import combine
from harness.rank.comm import Stages
from harness.rank.dispatch import dispatch
from harness.rank.distributed import RankInfo, free_port, init_rank, shutdown_rank
from harness.rank.lifecycle import setup_rank
from harness.rank.timing import StageTimer
from harness.scenario.dotted import set_dotted
from harness.scenario.schema import load_scenario, parse_scenario


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario")
    p.add_argument("--comm", default=None, help="comm backend (default: nccl on a GPU, gloo on CPU)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--top", type=int, default=25, help="kernels to list")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    cuda = torch.cuda.is_available()
    data = load_scenario(args.scenario).model_dump(mode="json")
    # The experts of the scenario's P ranks on one (the harness's --num-ranks 1 keeps the experts per rank fixed
    # only where P is 1 already).
    num_local = data["parallel"]["num_local_experts"] * data["parallel"]["num_ranks"]
    for key, value in {
        "parallel.num_ranks": 1,
        "parallel.num_local_experts": num_local,
        "device": "cuda" if cuda else "cpu",
        "comm": args.comm or ("nccl" if cuda else "gloo"),
        "experts_backend": "reference" if not cuda else data["experts_backend"],
    }.items():
        set_dotted(data, key, value)
    scenario = parse_scenario(data, path=args.scenario)
    info = RankInfo(
        rank=0,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=free_port(),
        comm_backend="nccl" if cuda else "gloo",
        device_type="cuda" if cuda else "cpu",
    )
    device = init_rank(info)
    try:
        setup = setup_rank(scenario, info, device, Path("/tmp"), 0, kernels=scenario_kernels(scenario))
        comm, L = setup.buffers, setup.layout
        E, M, K = L.num_local_experts, L.max_slots_per_expert, L.hidden_size
        expert_out = torch.randn((E, M, K), device=device).to(torch.bfloat16)

        def one_round(stages: Stages) -> None:
            handle = dispatch(setup.tokens, setup.routing, L, comm, setup.quantize, stages=stages)
            combine(expert_out, handle, L, comm, stages=stages)

        for _ in range(3):
            one_round(Stages())
        timer, samples = StageTimer(device), dict[str, list[float]]()
        for _ in range(args.iters):
            one_round(Stages(timer))
            for name, us in timer.elapsed_us().items():
                samples.setdefault(name, []).append(us)
        medians = {name: statistics.median(values) for name, values in samples.items()}
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.iters):
                one_round(Stages())
            if cuda:
                torch.cuda.synchronize()
        averages = prof.key_averages()
        cpu_events = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
        cpu_us = sum(e.self_cpu_time_total for e in averages) / args.iters
        cpu_top = [
            {
                "name": e.key[:80],
                "calls_per_round": e.count / args.iters,
                "cpu_us_per_round": e.self_cpu_time_total / args.iters,
            }
            for e in cpu_events[:12]
        ]
        attr = "self_device_time_total" if cuda else "self_cpu_time_total"
        # On a GPU only the kernels and copies themselves (an aten op's row repeats its kernels' time).
        kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
        events = [e for e in averages if getattr(e, attr, 0) > 0 and (not cuda or e.device_type == kind)]
        events.sort(key=lambda e: getattr(e, attr), reverse=True)
        total = sum(getattr(e, attr) for e in events) or 1
        kernels = [
            {
                "name": e.key[:110],
                "calls_per_round": e.count / args.iters,
                "us_per_round": getattr(e, attr) / args.iters,
                "share": getattr(e, attr) / total,
            }
            for e in events[: args.top]
        ]
    finally:
        dist.barrier()
        shutdown_rank()
    print(
        f"{scenario.name}: comm {comm.name}, {setup.tokens.shape[0]} tokens, E={E}, M={M}, K={K}, "
        f"top_k={L.top_k}, device {torch.cuda.get_device_name(device) if cuda else 'cpu'}, torch {torch.__version__}"
    )
    print("sub-stage medians (us): " + ", ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    print(f"host time in torch ops: {cpu_us:.1f} us per round; the most:")
    for e in cpu_top:
        print(f"  {e['cpu_us_per_round']:9.1f} us {e['calls_per_round']:5.1f} calls  {e['name']}")
    print(f"{'us/round':>10} {'calls':>6} {'share':>6}  kernel")
    for k in kernels:
        print(f"{k['us_per_round']:10.1f} {k['calls_per_round']:6.1f} {k['share']:6.1%}  {k['name']}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "scenario": scenario.name,
                    "comm": comm.name,
                    "torch": torch.__version__,
                    "stages_us": medians,
                    "host_us_per_round": cpu_us,
                    "host_ops": cpu_top,
                    "kernels": kernels,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
