"""Device side: what vLLM 0.26.0's CUDA-graph memory profile (gpu_model_runner.py profile_cudagraph_memory) spends,
graph by graph. Stdlib + torch + vLLM; reuses results/h200/profile-peak/probe.py's fork-per-startup driver.

    python3 probe_graphs.py LIST.json DEADLINE_S CONFIGS_DIR

For each startup a forked child starts the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0). While
profile_cudagraph_memory runs, torch.cuda.CUDAGraph is replaced by a subclass that keeps the captured graph
(keep_graph=True) so that capture_end can count its nodes by type (libcuda cuGraphGetNodes, cuGraphNodeGetType)
before instantiating it itself; free memory (cudaMemGetInfo) is read at capture_begin, before instantiate and after
it. Each _dummy_run (warm-up and capture) is bracketed the same way. With "history": true in the spec, the CUDA
caching allocator's history (segments included) is recorded over profile_run and over profile_cudagraph_memory, and
both traces are written compact (probe.py's form) with a summary of profile_run's peak. The child exits when
determine_available_memory returns: $OUT/NAME/graphs.json.
"""

import ctypes
import gzip
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "profile-peak"))
import probe  # noqa: E402  (the fork-per-startup driver and the trace helpers)

NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 8: "ext_sem_signal", 9: "ext_sem_wait", 10: "mem_alloc", 11: "mem_free",
              12: "batch_mem_op", 13: "conditional"}


def child(spec, log, configs):
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(spec.get("env", {}))
    root = os.path.join(probe.CACHES, spec["name"])
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    # "fresh": empty vLLM, Inductor and Triton caches; "triton:TAG": those of TAG's Triton kernels, the rest fresh
    cache = spec.get("cache", "fresh")
    triton = os.path.join(probe.CACHES, cache.split(":", 1)[1], "triton") if cache.startswith("triton:") else None
    os.environ.update({"VLLM_CACHE_ROOT": os.path.join(root, "vllm"),
                       "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
                       "TRITON_CACHE_DIR": triton or os.path.join(root, "triton")})
    dest = os.path.join(probe.OUT, spec["name"])
    os.makedirs(dest, exist_ok=True)
    history = bool(spec.get("history"))
    try:
        import torch
        from vllm import LLM
        from vllm.v1.worker import gpu_model_runner, gpu_worker

        cuda = ctypes.CDLL("libcuda.so.1")
        events = []

        def free():
            torch.cuda.synchronize()
            return torch.cuda.mem_get_info()[0]

        def nodes_of(raw):
            n = ctypes.c_size_t(0)
            rc = cuda.cuGraphGetNodes(ctypes.c_void_p(raw), None, ctypes.byref(n))
            if rc:
                return {"error": rc}
            arr = (ctypes.c_void_p * n.value)()
            cuda.cuGraphGetNodes(ctypes.c_void_p(raw), arr, ctypes.byref(n))
            hist = {}
            for node in arr:
                t = ctypes.c_int(-1)
                cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
                name = NODE_TYPES.get(t.value, str(t.value))
                hist[name] = hist.get(name, 0) + 1
            return {"total": n.value, "types": hist}

        base_graph = torch.cuda.CUDAGraph

        class KeptGraph(base_graph):
            def __new__(cls, keep_graph=False):
                return super().__new__(cls, True)

            def __init__(self, keep_graph=False):  # the binding's own __init__ takes keep_graph
                super().__init__(True)

            def capture_begin(self, *a, **k):
                events.append({"ev": "capture_begin", "free": free(), "alloc": torch.cuda.memory_reserved()})
                return super().capture_begin(*a, **k)

            def capture_end(self):
                super().capture_end()
                f0 = free()
                reserved = torch.cuda.memory_reserved()
                try:
                    nodes = nodes_of(self.raw_cuda_graph())
                except RuntimeError as e:
                    nodes = {"error": str(e)[:200]}
                self.instantiate()
                f1 = free()
                events.append({"ev": "capture_end", "free_before_instantiate": f0, "free_after": f1,
                               "instantiate": f0 - f1, "reserved": reserved, "nodes": nodes})

        runner_cls = gpu_model_runner.GPUModelRunner
        orig_dummy = runner_cls._dummy_run
        orig_profile_graphs = runner_cls.profile_cudagraph_memory
        orig_profile_run = runner_cls.profile_run
        traces = {}

        def dummy_run(self, num_tokens, *a, **k):
            mode = k.get("cudagraph_runtime_mode")
            before = free()
            events.append({"ev": "dummy_run", "tokens": num_tokens, "mode": getattr(mode, "name", str(mode)),
                           "capturing": bool(k.get("is_graph_capturing")), "free": before,
                           "reserved": torch.cuda.memory_reserved()})
            out = orig_dummy(self, num_tokens, *a, **k)
            after = free()
            events.append({"ev": "dummy_run_end", "tokens": num_tokens, "free": after, "drop": before - after,
                           "reserved": torch.cuda.memory_reserved()})
            return out

        def record(on):
            if on:
                torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                         max_entries=3_000_000)
            else:
                torch.cuda.memory._record_memory_history(enabled=None)

        def profile_run(self, *a, **k):
            if history:
                record(True)
            try:
                return orig_profile_run(self, *a, **k)
            finally:
                if history:
                    torch.cuda.synchronize()
                    traces["profile_run"] = torch.cuda.memory._snapshot()
                    record(False)

        def profile_graphs(self, *a, **k):
            torch.cuda.CUDAGraph = KeptGraph
            events.append({"ev": "profile_cudagraph_memory", "free": free(),
                           "reserved": torch.cuda.memory_reserved()})
            if history:
                record(True)
            try:
                result = orig_profile_graphs(self, *a, **k)
            finally:
                torch.cuda.CUDAGraph = base_graph
                if history:
                    torch.cuda.synchronize()
                    traces["graphs"] = torch.cuda.memory._snapshot()
                    record(False)
            events.append({"ev": "profile_cudagraph_memory_end", "free": free(), "result": result})
            return result

        runner_cls._dummy_run = dummy_run
        runner_cls.profile_cudagraph_memory = profile_graphs
        runner_cls.profile_run = profile_run
        orig_dam = gpu_worker.Worker.determine_available_memory

        def dam(self):
            result = orig_dam(self)
            out = {"name": spec["name"], "spec": spec, "torch": torch.__version__, "events": events,
                   "logged_torch_peak_increase": getattr(self, "peak_activation_memory", None),
                   "cudagraph_memory_estimate": getattr(self, "cudagraph_memory_estimate", None)}
            with open(os.path.join(dest, "graphs.json"), "w") as f:
                json.dump(out, f)
            for key, snap in traces.items():
                dev = torch.cuda.current_device()
                tr = snap["device_traces"]
                c = probe.compact(tr[dev] if dev < len(tr) else tr[0])
                with gzip.open(os.path.join(dest, f"trace-{key}.json.gz"), "wt") as f:
                    json.dump(c, f)
                if key == "profile_run":
                    s = probe.summarize(c, 0, 0, out["logged_torch_peak_increase"])
                    with open(os.path.join(dest, "summary-profile_run.json"), "w") as f:
                        json.dump(s, f, indent=1)
            print("PROBE-DONE", flush=True)
            return result

        gpu_worker.Worker.determine_available_memory = dam
        LLM(model=os.path.join(configs, spec["config"]), load_format="dummy", skip_tokenizer_init=True,
            **spec.get("kwargs", {}))
        print("VERIFY-READY", flush=True)
    except BaseException as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        print(f"VERIFY-FAILED {type(e).__name__}: {e}", flush=True)
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    probe.child = child  # run_one forks probe.child
    t = time.time()
    probe.main()
    print(f"graphs probe done at {time.time() - t:.0f}s", flush=True)
