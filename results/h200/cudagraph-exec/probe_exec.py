"""Device side: the driver memory that instantiated CUDA graphs take, as free memory (cudaMemGetInfo) sees it.

Each experiment runs in a fresh process: G graphs captured one after another into one shared private pool (as
vLLM's profile_cudagraph_memory does), each of K kernel nodes that allocate nothing (in-place on a preallocated
tensor), the free-memory drop recorded after each capture (torch.cuda.graph's exit instantiates the graph).

    python3 probe_exec.py            # all experiments, JSON to $OUT/exec.json
    python3 probe_exec.py ONE KIND G K
"""

import json
import os
import subprocess
import sys
import time


def one(kind: str, graphs: int, nodes: int) -> dict:
    import torch

    torch.cuda.init()
    x = torch.zeros(1 << 20, device="cuda")
    a = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(256, 2048, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    pool = torch.cuda.graph_pool_handle()

    def body():
        for _ in range(nodes):
            if kind == "add":
                x.add_(1.0)
            else:  # a cuBLAS GEMM into a preallocated output
                torch.mm(a, b, out=c)

    with torch.cuda.stream(stream):  # warm-up: cuBLAS handle and workspace, kernels loaded
        body()
    torch.cuda.synchronize()

    def free() -> int:
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0]

    kept = []
    start = free()
    drops = []
    for _ in range(graphs):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=stream):
            body()
        kept.append(g)
        drops.append(start - free())
    return {"kind": kind, "graphs": graphs, "nodes": nodes, "cumulative_drop": drops}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "ONE":
        print(json.dumps(one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return
    plan = [("add", 300, 1), ("add", 200, 16), ("add", 100, 64), ("add", 40, 256), ("add", 12, 1024),
            ("add", 4, 4096), ("mm", 200, 16), ("mm", 40, 256)]
    out = {"t0": time.time(), "experiments": []}
    import torch

    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["gpu"] = torch.cuda.get_device_name(0)
    out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, check=False).stdout.strip()
    for kind, g, k in plan:
        r = subprocess.run([sys.executable, __file__, "ONE", kind, str(g), str(k)], capture_output=True, text=True,
                           timeout=120, check=False)
        try:
            out["experiments"].append(json.loads(r.stdout.strip().splitlines()[-1]))
        except Exception:  # noqa: BLE001
            out["experiments"].append({"kind": kind, "graphs": g, "nodes": k, "error": r.stderr[-2000:]})
    dest = os.path.join(os.environ.get("OUT", "/tmp"), "exec.json")
    with open(dest, "w") as f:
        json.dump(out, f)
    for e in out["experiments"]:
        d = e.get("cumulative_drop")
        print(e["kind"], e["graphs"], e["nodes"], (d[0] >> 10, d[len(d) // 2] >> 10, d[-1] >> 10) if d else e)


if __name__ == "__main__":
    main()
