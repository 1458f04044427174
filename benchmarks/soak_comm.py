"""Soak a comm backend: many checked dispatch + combine rounds on real ranks (harness.rank.soak).

    PYTHONPATH=. python3 benchmarks/soak_comm.py SCENARIO [--comm C] [--ranks P] [--rounds N] [--set KEY=VALUE ...]
                                                [--seed S] [--graph [--delay-cycles N]] [--out FILE.json]

Builds each rank as `harness run` does (harness.rank.lifecycle.setup_rank), on GPUs (one per rank, NCCL group)
when the scenario's device is cuda and on gloo ranks otherwise, then runs N rounds with fresh inputs and routing
each, checking counts, every slot, every returned partial and the output on every rank. Prints one line per rank
and writes the SoakRecords; exit 0 when no round failed, 1 when one did, 2 on bad arguments. A development tool
for faults too rare for one test run; tests/test_soak.py runs it on gloo ranks. --graph replays each round from
CUDA graphs (symm-mem, nccl), every rank at its capacity, with per-rank GPU sleeps of N cycles (harness.rank.soak).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
import uuid
from pathlib import Path

import torch
import torch.multiprocessing as mp

from harness.launch.run import scenario_kernels
from harness.rank.distributed import RankInfo, free_port, init_rank, shutdown_rank
from harness.rank.lifecycle import setup_rank
from harness.rank.soak import soak
from harness.scenario.dotted import set_dotted
from harness.scenario.schema import ScenarioError, load_scenario, parse_scenario

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _rank(
    info: RankInfo, data: dict, kernels, rounds: int, seed: int, run_id: str, graph: bool, delay_cycles: int, queue
) -> None:
    try:
        device = init_rank(info)
        setup = setup_rank(parse_scenario(data, path=data["name"]), info, device, Path("/tmp"), 0, kernels=kernels)
        record = soak(setup, rounds=rounds, seed=seed, run_id=run_id, graph=graph, delay_cycles=delay_cycles)
        queue.put((info.rank, record.model_dump(mode="json")))
    except Exception:  # noqa: BLE001 - the rank's failure goes back to the parent
        queue.put((info.rank, {"error": traceback.format_exc()[-3000:]}))
    with contextlib.suppress(Exception):
        shutdown_rank()


def run_soak(
    data: dict, *, rounds: int, seed: int, timeout_s: float, graph: bool = False, delay_cycles: int = 0
) -> list[dict]:
    """Run the soak on the scenario's ranks in spawned processes; each rank's SoakRecord (or {"error": ...})."""
    scenario = parse_scenario(data, path=data["name"])
    P = scenario.parallel.num_ranks
    kernels = scenario_kernels(scenario)  # once, here, as `harness run`'s driver does
    cuda = scenario.device == "cuda" or (scenario.device == "auto" and torch.cuda.is_available())
    for key, value in NO_MULTICAST.items():
        os.environ.setdefault(key, value)
    ctx = mp.get_context("spawn")
    queue, port, run_id = ctx.Queue(), free_port(), uuid.uuid4().hex[:12]
    procs = []
    for rank in range(P):
        info = RankInfo(
            rank=rank,
            world_size=P,
            master_addr="127.0.0.1",
            master_port=port,
            comm_backend="nccl" if cuda else "gloo",
            device_type="cuda" if cuda else "cpu",
            device_index=rank if cuda else 0,
            collective_timeout_s=min(timeout_s, 120.0),
        )
        # daemons, ended after a bounded wait: ranks that used NVSHMEM have been seen not to exit after shutdown
        procs.append(
            ctx.Process(
                target=_rank, args=(info, data, kernels, rounds, seed, run_id, graph, delay_cycles, queue), daemon=True
            )
        )
        procs[-1].start()
    results: dict[int, dict] = {}
    try:
        for _ in range(P):
            rank, record = queue.get(timeout=timeout_s)
            results[rank] = record
    except Exception:  # noqa: BLE001 - a rank that never answered is reported as such
        pass
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    return [results.get(r, {"error": f"rank {r} sent no result within {timeout_s:.0f} s"}) for r in range(P)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario")
    p.add_argument("--comm", default=None, help="auto, symm-mem, nccl or gloo (default: the scenario's)")
    p.add_argument("--ranks", type=int, default=None, help="physical ranks (default: the scenario's)")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted scenario override")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the ranks")
    p.add_argument("--graph", action="store_true", help="replay each round from CUDA graphs (symm-mem on GPUs)")
    p.add_argument("--delay-cycles", type=int, default=20_000_000, help="graph mode: rank r sleeps r x N cycles")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        data = load_scenario(args.scenario).model_dump(mode="json")
        overrides = [item.split("=", 1) for item in args.set]
        if args.comm:
            overrides.append(["comm", args.comm])
        if args.ranks:
            overrides.append(["parallel.num_ranks", str(args.ranks)])
        for key, value in overrides:
            set_dotted(data, key, json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value)
        parse_scenario(data, path=data["name"])
    except (ScenarioError, ValueError) as exc:
        print(f"soak_comm: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.delay_cycles < 0:
        print(f"soak_comm: --delay-cycles {args.delay_cycles}: must be >= 0", file=sys.stderr)
        return 2
    records = run_soak(
        data,
        rounds=args.rounds,
        seed=args.seed,
        timeout_s=args.timeout,
        graph=args.graph,
        delay_cycles=args.delay_cycles,
    )
    for r in records:
        if "error" in r:
            print(f"error: {r['error']}")
        else:
            print(
                f"rank {r['rank']}: {r['comm']} ({r['row_kernels']}, {r['mode']}), {r['rounds']} rounds, "
                f"{r['rounds_failed']} "
                f"failed, {r['slots_checked']} slots and {r['tokens_checked']} tokens checked, {r['wall_s']:.1f} s"
            )
            for f in r["faults"]:
                print(f"  round {f['round']} ({f['kind']}) {f['check']}: {f['detail']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "scenario": args.scenario,
                    "overrides": args.set,
                    "comm": args.comm,
                    "rounds": args.rounds,
                    "seed": args.seed,
                    "ranks": records,
                },
                indent=1,
            )
        )
    return 0 if all("error" not in r and r["rounds_failed"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
