"""Device side: one real vLLM 0.26.0 startup in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), the CUDA caching
allocator's history recorded over profile_run and over profile_cudagraph_memory; both analysed here into a small JSON
(no trace leaves the machine). The process exits when profile_cudagraph_memory returns (or after profile_run when
the startup is eager, or with PROBE_PROFILE_ONLY set): no KV cache, no real capture.

    python3 probe.py NAME UTIL [eager]  -> $OUT/NAME.json, $OUT/NAME.log

profile_run: per-phase allocated/peak at each _dummy_run / _dummy_sampler_run boundary; the trace replayed to its
peak (from the live blocks when recording began); the blocks live at the peak that were not live before, grouped by
their Python stack (vllm/torch frames). profile_cudagraph_memory: at each _warmup_and_capture and _dummy_run
boundary, free memory (cudaMemGetInfo), this process's used memory (NVML), reserved and allocated bytes, and the
trace's events between boundaries: segment allocs/frees (with stacks) and the blocks allocated and still live at the
interval's end, grouped by stack.
"""

import json
import os
import sys
import time
import traceback

NAME, UTIL = sys.argv[1], float(sys.argv[2])
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "/tmp/out")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
os.environ["VLLM_LOGGING_LEVEL"] = "DEBUG"
with open(os.path.join(HERE, os.environ.get("PROBE_KWARGS", "kwargs.json"))) as f_:
    KW = dict(json.load(f_)[NAME])
os.environ.update(KW.pop("_env", {}))  # a probe's own settings (PROBE_GC_FIRST, ...) beside its keyword arguments
R = {"name": NAME, "kwargs": KW, "util": UTIL, "pid": os.getpid(), "t0": time.time()}


def save():
    with open(os.path.join(OUT, NAME + ".json"), "w") as f:
        json.dump(R, f, indent=1, default=str)  # a compile's symbolic sizes are written as text


import torch  # noqa: E402

try:
    import pynvml

    pynvml.nvmlInit()
    NVH = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception:  # noqa: BLE001
    NVH = None


def nvml_procs():
    if NVH is None:
        return None
    try:
        return {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(NVH)}
    except Exception as e:  # noqa: BLE001
        return str(e)[:100]


def fr(frames, n=14):
    out = []
    for x in frames or []:
        fn = x.get("filename", "")
        if any(k in fn for k in ("/vllm/", "/torch/", "triton_kernels", "/triton/", "deep_gemm", "flash_attn",
                                 "fla/", "/fla")):
            out.append(f"{fn.split('site/')[-1]}:{x.get('line')}:{x.get('name')}")
        if len(out) >= n:
            break
    return out


def point(tag, **extra):
    torch.cuda.synchronize()
    f, _ = torch.cuda.mem_get_info()
    p = {"tag": tag, "t_us": time.time_ns() // 1000, "free": f, "reserved": torch.cuda.memory_reserved(),
         "allocated": torch.cuda.memory_allocated(), "max_allocated": torch.cuda.max_memory_allocated(),
         "nvml": nvml_procs()}
    p.update(extra)
    return p


def live_blocks(snap):
    out = {}
    for seg in snap["segments"]:
        a = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out[a] = b["size"]
            a += b["size"]
    return out


def rec(on):
    if on:
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=4_000_000)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def trace(snap):
    tr = snap.get("device_traces") or [[]]
    d = torch.cuda.current_device()
    return tr[d] if d < len(tr) else tr[0]


def group(items, n=40):
    """items: (size, frames) -> groups by stack, largest first."""
    g = {}
    for size, frames in items:
        k = "|".join(frames[:8])
        e = g.setdefault(k, {"bytes": 0, "n": 0, "sizes": {}, "frames": frames[:12]})
        e["bytes"] += size
        e["n"] += 1
        e["sizes"][size] = e["sizes"].get(size, 0) + 1
    out = sorted(g.values(), key=lambda e: -e["bytes"])[:n]
    for e in out:
        e["sizes"] = sorted(e["sizes"].items(), key=lambda kv: -kv[0] * kv[1])[:6]
    return out


def analyse_profile(base, events):
    live = dict(base)
    cur = sum(live.values())
    start = cur
    best, bi = cur, -1
    for i, e in enumerate(events):
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
        elif a == "free_completed":
            cur -= live.pop(e["addr"], 0)
        if cur > best:
            best, bi = cur, i
    live, info, requested = dict(base), {}, set()
    for e in events[: bi + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            info[e["addr"]] = e
            requested.discard(e["addr"])
        elif e["action"] == "free_requested":
            requested.add(e["addr"])
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
            info.pop(e["addr"], None)
            requested.discard(e["addr"])
    pending = [(live[a], fr(info[a].get("frames"))) for a in live if a in info and a in requested]
    new = [(live[a], fr(info[a].get("frames"))) for a in live if a in info]
    # what stays live across the whole profile (allocated in it, never freed)
    return {"start_live": start, "peak_replayed": best, "peak_over_start": best - start, "peak_index": bi,
            "n_events": len(events), "peak_event_frames": fr(events[bi].get("frames"), 20) if bi >= 0 else [],
            "new_at_peak_bytes": sum(s for s, _ in new), "new_at_peak": group(new, 50),
            "pending_free_at_peak_bytes": sum(s for s, _ in pending), "pending_free_at_peak": group(pending, 20)}


def seg_of(segs, addr):
    for a, size, pool, stream in segs:
        if a <= addr < a + size:
            return (size, str(pool), stream)
    return None


def live_by_segment(allocs, segs):
    """Still-live blocks of an interval, each with the segment (size, pool, stream) it sits in at the end."""
    out = []
    for addr, (size, frames, stream) in sorted(allocs.items(), key=lambda kv: -kv[1][0])[:60]:
        out.append({"addr": addr, "size": size, "stream": stream, "segment": seg_of(segs, addr), "frames": frames[:8]})
    return out


def analyse_intervals(events, points, snap=None):
    """Split events by the boundary points' times; per interval: segment allocs/frees and blocks still live."""
    ts = [p["t_us"] for p in points]
    segs = [(x["address"], x["total_size"], x.get("segment_pool_id"), x["stream"]) for x in (snap or {}).get("segments", [])]
    out = []
    j = 0
    for k in range(len(points) - 1):
        lo, hi = ts[k], ts[k + 1]
        seg_a, seg_f, allocs, freed, seg_list, seg_freed = [], [], {}, 0, [], []
        while j < len(events) and events[j].get("time_us", 0) < lo:
            j += 1
        jj = j
        while jj < len(events) and events[jj].get("time_us", 0) < hi:
            e = events[jj]
            a = e["action"]
            if a == "segment_alloc":
                seg_a.append((e["size"], fr(e.get("frames"))))
                seg_list.append((e["addr"], e["size"], e.get("stream", 0)))
            elif a in ("segment_free", "segment_unmap"):
                seg_f.append(e["size"])
                seg_freed.append((e["addr"], e["size"]))
            elif a == "alloc":
                allocs[e["addr"]] = (e["size"], fr(e.get("frames")), e.get("stream", 0))
            elif a == "free_completed":
                if allocs.pop(e["addr"], None) is None:
                    freed += e["size"]
            jj += 1
        out.append({"from": points[k]["tag"], "to": points[k + 1]["tag"], "n_events": jj - j,
                    "segment_alloc_bytes": sum(s for s, _ in seg_a), "segment_allocs": group(seg_a, 20),
                    "segment_free_bytes": sum(seg_f), "segment_frees": len(seg_f),
                    "freed_older_bytes": freed,
                    "still_live_bytes": sum(v[0] for v in allocs.values()),
                    "still_live": group([(v[0], v[1]) for v in allocs.values()], 25),
                    "streams": sorted({v[2] for v in allocs.values()}),
                    "segments_made": seg_list[:200], "segments_freed": seg_freed[:200],
                    "live_by_segment": live_by_segment(allocs, segs)})
    return out


def garbage_report():
    """One collection with DEBUG_SAVEALL: what Python's cycle collector finds unreachable now, the CUDA tensors among
    it (unique storages) and what in the garbage refers to the large ones (frames by code location)."""
    import collections
    import gc

    gc.set_debug(gc.DEBUG_SAVEALL)
    a0 = torch.cuda.memory_allocated()
    n = gc.collect()
    objs = list(gc.garbage)
    gc.garbage.clear()
    gc.set_debug(0)
    ids = {id(o) for o in objs}
    types = collections.Counter(type(o).__name__ for o in objs).most_common(30)
    cuda, holders = {}, collections.Counter()
    for o in objs:
        try:
            is_cuda_tensor = isinstance(o, torch.Tensor) and o.is_cuda
        except ReferenceError:
            continue
        if is_cuda_tensor:
            st_ = o.untyped_storage()
            cuda[st_.data_ptr()] = (st_.nbytes(), list(o.shape), str(o.dtype))
            if st_.nbytes() >= 8 << 20:
                for r in gc.get_referrers(o):
                    if id(r) not in ids:
                        continue
                    if type(r).__name__ == "frame":
                        holders[f"frame {r.f_code.co_filename.split('/')[-1]}:{r.f_code.co_name}:{r.f_lineno}"] += 1
                    elif isinstance(r, dict):
                        holders[f"dict({','.join(list(map(str, r.keys()))[:6])})"] += 1
                    else:
                        holders[type(r).__name__] += 1
    frames = collections.Counter(f"{o.f_code.co_filename.split('/')[-1]}:{o.f_code.co_name}:{o.f_lineno}"
                                 for o in objs if type(o).__name__ == "frame").most_common(40)
    funcs = collections.Counter(getattr(o, "__qualname__", "?") for o in objs
                                if type(o).__name__ in ("function", "method", "builtin_function_or_method"))
    del objs
    gc.collect()
    torch.cuda.synchronize()
    return {"collected": n, "types": types, "cuda_bytes": sum(v[0] for v in cuda.values()),
            "cuda_tensors": sorted(cuda.values(), key=lambda v: -v[0])[:40], "holders": holders.most_common(40),
            "frames": frames, "functions": funcs.most_common(30), "freed_bytes": a0 - torch.cuda.memory_allocated()}


def gc_experiment(run):
    """The profile run again under three collector settings; its peak over its start in each, and what a collection
    finds after the run with the collector off."""
    import gc

    out = {}

    def once(label):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t = time.time()
        run()
        torch.cuda.synchronize()
        out[label] = {"peak_over_start": torch.cuda.max_memory_allocated() - base,
                      "end_over_start": torch.cuda.memory_allocated() - base, "s": round(time.time() - t, 2),
                      "gc_counts": list(gc.get_count())}

    gc.collect()
    once("again")
    import types

    import vllm.v1.worker.gpu_model_runner as v1

    gc.collect()
    gc.disable()
    # profile_run ends in gc.collect(): skipped here, so that what the cycles held is still there to report
    v1.gc = types.SimpleNamespace(collect=lambda *a: 0, freeze=gc.freeze, unfreeze=gc.unfreeze)
    try:
        once("collector_off")
        out["collector_off"]["garbage"] = garbage_report()
    finally:
        v1.gc = gc
        gc.enable()
    gc.collect()
    gc.freeze()
    old = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        once("collector_frequent")
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
    return out


FIRST = {"on": False, "at_attention": [], "saved_gc": None}


def block_states():
    """The allocator's blocks by state now (no synchronisation): active_pending_free blocks wait on stream events."""
    snap = torch.cuda.memory._snapshot()
    by, pending = {}, []
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            by[b["state"]] = by.get(b["state"], 0) + b["size"]
            if b["state"] == "active_pending_free" and b["size"] >= 8 << 20:
                pending.append(b["size"])
    return {"states": by, "pending_free_blocks": sorted(pending, reverse=True)[:20]}


def large_tensor_holders(min_bytes=64 << 20):
    """Every Python tensor object on the GPU of at least min_bytes, and what refers to it (frames by code location,
    two levels up for containers)."""
    import gc

    def name(r):
        t = type(r).__name__
        if t == "frame":
            return f"frame {r.f_code.co_filename.split('/')[-1]}:{r.f_code.co_name}:{r.f_lineno}"
        if t == "cell":
            return "cell"
        return t

    from torch._subclasses.fake_tensor import is_fake

    out = []
    seen = set()
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.nn.Parameter) or not isinstance(o, torch.Tensor) or is_fake(o) or not o.is_cuda:
                continue
            st_ = o.untyped_storage()
            nbytes, ptr = st_.nbytes(), st_.data_ptr()
        except Exception:  # noqa: BLE001
            continue
        if nbytes < min_bytes or (ptr, id(o)) in seen:
            continue
        seen.add((ptr, id(o)))
        refs = []
        for r in gc.get_referrers(o):
            if (r is out or isinstance(r, list) and len(r) > 100000
                    or type(r).__name__ == "frame" and r.f_code.co_name == "large_tensor_holders"):
                continue
            up = [name(rr) for rr in gc.get_referrers(r)[:6]] if isinstance(r, (list, tuple, dict)) else []
            refs.append({"by": name(r), "up": up})
        out.append({"bytes": nbytes, "ptr": ptr, "shape": list(o.shape), "dtype": str(o.dtype), "refs": refs[:8]})
    return out[:40]


def describe(o):
    """A short name for an object met on the way up from a tensor to what keeps it."""
    t = type(o).__name__
    try:
        if t == "frame":
            return f"frame {o.f_code.co_filename.split('/')[-1]}:{o.f_code.co_name}:{o.f_lineno}"
        if t == "traceback":
            f = o.tb_frame
            return f"traceback {f.f_code.co_filename.split('/')[-1]}:{f.f_code.co_name}:{o.tb_lineno}"
        if isinstance(o, BaseException):
            return f"exception {t}: {str(o)[:160]}"
        if isinstance(o, dict) and "__builtins__" in o:
            return f"globals of {o.get('__name__')}"
        if isinstance(o, dict):
            return f"dict {len(o)} keys {[str(k)[:40] for k in list(o)[:6]]}"
        if isinstance(o, (list, tuple, set)):
            return f"{t} len {len(o)}"
        if t in ("function", "method", "builtin_function_or_method"):
            return f"{t} {getattr(o, '__qualname__', '?')}"
        if t == "cell":
            return "cell"
        if t == "module":
            return f"module {o.__name__}"
        if isinstance(o, torch.Tensor):
            return f"tensor {list(o.shape)} {o.dtype}"
        return f"{type(o).__module__}.{type(o).__qualname__}"
    except Exception:  # noqa: BLE001
        return t


def holder_chains(min_bytes=64 << 20, levels=7, width=60):
    """Every non-parameter CUDA tensor of at least min_bytes and what keeps it, up to `levels` referrers: one pass
    over the collector's objects a level (gc.get_referents), then each frame on a running stack (every thread) whose
    locals name it. Finished frames kept by something keep their locals, and the collector sees them; running frames'
    locals it does not, hence the second look."""
    import gc
    import threading

    from torch._subclasses.fake_tensor import is_fake

    t0 = time.time()
    objs = gc.get_objects()
    tensors = {}
    for o in objs:
        try:
            if isinstance(o, torch.nn.Parameter) or not isinstance(o, torch.Tensor) or is_fake(o) or not o.is_cuda:
                continue
            st_ = o.untyped_storage()
            if st_.nbytes() >= min_bytes:
                tensors[id(o)] = o
        except Exception:  # noqa: BLE001
            continue
    mine = {id(objs), id(tensors)}
    nodes = dict(tensors)
    parents: dict = {}
    current = dict(tensors)
    extra: dict = {}
    for _ in range(levels):
        found = {}
        for o in objs:
            if id(o) in mine:
                continue
            try:
                refs = gc.get_referents(o)
            except Exception:  # noqa: BLE001
                continue
            for r in refs:
                if id(r) in current:
                    parents.setdefault(id(r), []).append(id(o))
                    if id(o) not in nodes:
                        found[id(o)] = o
        for k, v in list(found.items())[:400]:
            extra.setdefault(k, describe(v))
        # big containers (module dicts, the collector's own lists) are where a chain stops being informative
        current = {k: v for k, v in list(found.items())[:width]
                   if not (isinstance(v, (list, dict)) and len(v) > 5000) and type(v).__name__ != "module"
                   and not (isinstance(v, dict) and "__builtins__" in v)}
        nodes.update(current)
        if not current:
            break
    names = {**extra, **{k: describe(v) for k, v in nodes.items()}}
    frames = {}
    thread_names = {t.ident: t.name for t in threading.enumerate()}
    for tid, f in sys._current_frames().items():
        depth = 0
        while f is not None and depth < 200:
            if f.f_code.co_name not in ("holder_chains",):
                try:
                    for k, v in f.f_locals.items():
                        if id(v) in tensors:
                            frames.setdefault(id(v), []).append(
                                f"{thread_names.get(tid, tid)}: {describe(f)} local {k}")
                except Exception:  # noqa: BLE001
                    pass
            f, depth = f.f_back, depth + 1

    def paths(k, seen, depth):
        ps = parents.get(k, [])
        if not ps or depth >= levels:
            return [[]]
        out = []
        for p in ps[:6]:
            if p in seen or p not in nodes:
                out.append([names.get(p, "(not followed)")])
                continue
            for rest in paths(p, seen | {p}, depth + 1)[:6]:
                out.append([names[p]] + rest)
        return out[:24]

    out = []
    for k, t in sorted(tensors.items(), key=lambda kv: -kv[1].untyped_storage().nbytes()):
        st_ = t.untyped_storage()
        out.append({"bytes": st_.nbytes(), "ptr": st_.data_ptr(), "shape": list(t.shape), "dtype": str(t.dtype),
                    "running_frames": frames.get(k, [])[:8], "chains": paths(k, {k}, 0)[:24]})
    del objs
    return {"seconds": round(time.time() - t0, 2), "threads": sorted(map(str, thread_names.values())),
            "tensors": out[:40]}


def garbage_at_high():
    """At a high point: what a full collection would free, kept (DEBUG_SAVEALL) and described, then freed: the young
    generations' collection first, then the full one, each with the CUDA bytes it released."""
    import gc

    out = {}
    a0 = torch.cuda.memory_allocated()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        out["young_found"] = gc.collect(1)
        young = list(gc.garbage)
        gc.garbage.clear()
        out["full_found"] = gc.collect(2)
        found = young + list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    import weakref

    found = [o for o in found if not isinstance(o, (weakref.ProxyType, weakref.CallableProxyType))]
    kinds: dict = {}
    for o in found:
        kinds[type(o).__name__] = kinds.get(type(o).__name__, 0) + 1
    # the innermost frames of the garbage (no other garbage frame has them as f_back), each with its callers and
    # with what in the garbage refers to it: where the cycle closes
    gframes = [o for o in found if type(o).__name__ == "frame"]
    backs = {id(f.f_back) for f in gframes if f.f_back is not None}
    in_garbage = {id(o) for o in found}
    leaves = []
    for f in gframes:
        if id(f) in backs:
            continue
        chain, g = [], f
        while g is not None and len(chain) < 60:
            chain.append(describe(g))
            g = g.f_back
        holders = [describe(r) for r in gc.get_referrers(f) if id(r) in in_garbage][:10]
        local_kinds = sorted({f"{k}:{type(v).__name__}" for k, v in f.f_locals.items()})[:40]
        leaves.append({"chain": chain, "held_by": holders, "locals": local_kinds})
    out["leaf_frames"] = leaves[:12]
    excs = []
    for o in found:
        if isinstance(o, BaseException):
            tb, inner = o.__traceback__, None
            while tb is not None:
                inner, tb = tb, tb.tb_next
            excs.append({"exception": describe(o), "raised_at": describe(inner) if inner else None,
                         "held_by": [describe(r) for r in gc.get_referrers(o) if id(r) in in_garbage][:8]})
    out["exception_detail"] = excs[:20]
    out["kinds"] = sorted(kinds.items(), key=lambda kv: -kv[1])[:25]
    out["frames"] = sorted({describe(o) for o in found if type(o).__name__ == "frame"})[:80]
    out["exceptions"] = [describe(o) for o in found if isinstance(o, BaseException)][:20]
    out["tracebacks"] = sorted({describe(o) for o in found if type(o).__name__ == "traceback"})[:40]
    out["cuda_tensors"] = [(list(o.shape), str(o.dtype), o.untyped_storage().nbytes()) for o in found
                           if isinstance(o, torch.Tensor) and not isinstance(o, torch.nn.Parameter)
                           and getattr(o, "is_cuda", False) and o.untyped_storage().nbytes() >= 1 << 20][:40]
    out["young_in_garbage"] = len(young)
    del young, found
    a1 = torch.cuda.memory_allocated()
    gc.collect()
    out["freed_bytes"] = a0 - torch.cuda.memory_allocated()
    out["freed_before_release"] = a0 - a1
    return out



def watch_first_compiles():
    """Dynamo's compiles in the engine's first profile run (PROBE_WATCH=1): each one's code name, wall time and
    thread, whether Inductor's Triton compiles went to its subprocess pool (AsyncCompile.use_process_pool), and for
    vLLM's grouped_topk every exception raised or handled in any thread while it compiles (sys.monitoring), so that
    a run that keeps the first MoE call's frames and one that does not can be compared event by event."""
    import threading

    import torch._dynamo.convert_frame as cf
    from torch._inductor.async_compile import AsyncCompile

    W = FIRST.setdefault("watch", {"compiles": [], "pool": [], "events": {}, "order": []})
    orig_pool = AsyncCompile.use_process_pool.__func__

    def use_process_pool(cls):
        r = orig_pool(cls)
        if FIRST["on"] and len(W["pool"]) < 400:
            W["pool"].append((round(time.time() - R["t0"], 3), bool(r), W.get("in", None)))
        return r

    AsyncCompile.use_process_pool = classmethod(use_process_pool)
    orig_compile = cf._compile
    mon = getattr(sys, "monitoring", None)  # Python 3.12 on

    def note(kind, code, offset, exc):
        if not W.get("watching"):
            return
        key = (f"{kind} {type(exc).__module__}.{type(exc).__qualname__} at "
               f"{code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_name} "
               f"[{threading.current_thread().name}]")
        if key not in W["events"]:
            if len(W["order"]) >= 600:
                return
            W["order"].append(key)
            W["events"][key] = [0, str(exc)[:160]]
        W["events"][key][0] += 1

    def _compile(code, *a, **k):
        if not FIRST["on"]:
            return orig_compile(code, *a, **k)
        watch = code.co_name == "grouped_topk"
        tool = None
        if watch and mon is not None:
            E = mon.events
            tool = next((i for i in range(6) if mon.get_tool(i) is None), None)
            if tool is not None:
                mon.use_tool_id(tool, "probe")
                mon.register_callback(tool, E.RAISE, lambda c, o, e: note("raise", c, o, e))
                mon.register_callback(tool, E.EXCEPTION_HANDLED, lambda c, o, e: note("handled", c, o, e))
                mon.register_callback(tool, E.RERAISE, lambda c, o, e: note("reraise", c, o, e))
                mon.set_events(tool, E.RAISE | E.EXCEPTION_HANDLED | E.RERAISE)
                W["watching"] = True
        W["in"] = code.co_name
        t0 = time.time()
        err = None
        try:
            return orig_compile(code, *a, **k)
        except BaseException as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {str(e)[:200]}"
            raise
        finally:
            W["in"] = None
            if watch:
                W["after_compile"] = exceptions_by_generation()
            if tool is not None:
                W["watching"] = False
                mon.set_events(tool, 0)
                mon.free_tool_id(tool)
            W["compiles"].append({"code": code.co_name, "file": code.co_filename.rsplit("site-packages/", 1)[-1],
                                  "start": round(t0 - R["t0"], 3), "seconds": round(time.time() - t0, 3),
                                  "thread": threading.current_thread().name, "error": err,
                                  "threads": sorted(t.name for t in threading.enumerate())})

    cf._compile = _compile
    if os.environ.get("PROBE_FULL_GC_AFTER_COMPILE"):
        # the collection Dynamo runs when a compile ends (run_gc_after_compile: gc.collect(1)) made a full one
        import gc as gc_
        import types

        cf.gc = types.SimpleNamespace(collect=lambda *a: gc_.collect())
    if os.environ.get("PROBE_NO_GC_AFTER_COMPILE"):
        # no collection at all from here to the first run's high point: not Dynamo's closing one, no automatic one
        import gc as gc_
        import types

        cf.gc = types.SimpleNamespace(collect=lambda *a: 0)
        gc_.disable()


def exceptions_by_generation():
    """The fake-tensor fallback's exceptions still alive when a compile has returned (after Dynamo's closing
    collection), with the collector generation each is in: the young generations' collection frees a cycle of them
    only where no member has reached the oldest generation."""
    import gc

    out = []
    for gen in range(3):
        for o in gc.get_objects(gen):
            name = type(o).__name__  # a weak proxy's isinstance raises once its referent is gone
            if name in ("UnsupportedOperatorException", "NotImplementedError"):
                out.append((gen, name, str(o)[:80]))
    return out[:20]


def first_run_collector(mode):
    """The engine's own (first) profile run under a collector setting: "off" (no automatic collection, and not the
    run's closing gc.collect(), so that what cycles held is reported after it) or "attention" (a full collection
    before every MLA attention call). Either way, allocated bytes are noted at every MLA attention call."""
    import gc
    import types

    import vllm.model_executor.layers.attention.mla_attention as mla
    import vllm.v1.worker.gpu_model_runner as v1

    orig = mla.MLAAttention.forward_impl

    def forward_impl(self_, *a, **k):
        if FIRST["on"] and mode == "high":
            # only the allocated bytes, unless they are over the low outcome's: then what keeps each large tensor
            a0 = torch.cuda.memory_allocated()
            entry = {"layer": getattr(self_, "layer_name", "?"), "allocated": a0}
            if a0 - FIRST["start"] > int(os.environ.get("PROBE_HIGH_BYTES", "3100000000")) and FIRST["scans"] < 1:
                FIRST["scans"] += 1
                try:
                    if not os.environ.get("PROBE_NO_CHAINS"):
                        entry["holders"] = holder_chains()
                except Exception:  # noqa: BLE001
                    entry["holders_error"] = traceback.format_exc()[-1500:]
                try:
                    entry["garbage"] = garbage_at_high()
                except Exception:  # noqa: BLE001
                    entry["garbage_error"] = traceback.format_exc()[-1500:]
            entry["gc_stats"] = [(g["collections"], g["collected"]) for g in gc.get_stats()]
            entry["gc_count"] = gc.get_count()
            FIRST["at_attention"].append(entry)
        elif FIRST["on"]:
            a0 = torch.cuda.memory_allocated()
            entry = {"layer": getattr(self_, "layer_name", "?"), "allocated": a0}
            entry.update(block_states())
            if os.environ.get("PROBE_HOLDERS") and len(FIRST["at_attention"]) >= 2:
                try:
                    entry["held_by"] = large_tensor_holders()
                except Exception:  # noqa: BLE001
                    entry["held_by_error"] = traceback.format_exc()[-800:]
            FIRST["at_attention"].append(entry)
            freed, n = 0, None
            if mode == "attention":
                n = gc.collect()
                freed = a0 - torch.cuda.memory_allocated()
            entry.update(collected=n, freed_bytes=freed)
        return orig(self_, *a, **k)

    mla.MLAAttention.forward_impl = forward_impl
    if mode == "high":
        FIRST["collections"] = []

        def collected(phase, info):
            # every collection of the first run: its generation, what it found, and the CUDA bytes it released
            if not FIRST["on"]:
                return
            if phase == "start":
                FIRST["_before"] = torch.cuda.memory_allocated()
                return
            freed = FIRST.get("_before", 0) - torch.cuda.memory_allocated()
            if info["generation"] >= 1 or freed or info["collected"] > 1000:
                FIRST["collections"].append({"gen": info["generation"], "collected": info["collected"],
                                             "freed_bytes": freed, "attention_calls": len(FIRST["at_attention"]),
                                             "t": round(time.time() - R["t0"], 3)})
        gc.callbacks.append(collected)
    if os.environ.get("PROBE_WATCH") and "watch" not in FIRST:
        watch_first_compiles()
    FIRST["on"] = True
    FIRST["start"] = torch.cuda.memory_allocated()
    FIRST["scans"] = 0
    if mode == "off":
        gc.collect()
        gc.disable()
        FIRST["saved_gc"] = v1.gc
        v1.gc = types.SimpleNamespace(collect=lambda *a: 0, freeze=gc.freeze, unfreeze=gc.unfreeze)


def end_first_run(mode):
    import gc

    import vllm.v1.worker.gpu_model_runner as v1

    FIRST["on"] = False
    out = {"mode": mode, "at_attention": FIRST["at_attention"][:64]}
    if mode == "high":
        out["collections"] = FIRST["collections"][:400]
    if "watch" in FIRST:
        w = FIRST["watch"]
        out["watch"] = {"compiles": w["compiles"][:200], "pool": w["pool"], "after_compile": w.get("after_compile"),
                        "events": [(k, *w["events"][k]) for k in w["order"]]}
    if mode == "off":
        out["allocated_before_collection"] = torch.cuda.memory_allocated()
        out["garbage"] = garbage_report()
        out["allocated_after_collection"] = torch.cuda.memory_allocated()
        v1.gc = FIRST["saved_gc"]
        gc.enable()
    return out


def inductor_sources(analysis):
    """The `call` function of each Inductor output file named in the peak's stacks (its text is small)."""
    files = {}
    for g in analysis.get("new_at_peak", []):
        for f in g.get("frames", []):
            path = f.rsplit(":", 2)[0]
            if "inductor" in path and path.endswith(".py") and path not in files and os.path.exists(path):
                text = open(path).read()
                i = text.find("def call(")
                files[path] = text[i:i + 60000] if i >= 0 else text[-20000:]
    return files


def patch():
    import vllm.v1.worker.gpu_model_runner as v1

    cls = v1.GPUModelRunner
    st = {"phase": None, "points": []}

    def mark(tag, **k):
        if st["phase"] is not None:
            st["points"].append(point(tag, **k))

    for meth in ("_dummy_run", "_dummy_sampler_run", "_dummy_pooler_run", "_warmup_and_capture"):
        if not hasattr(cls, meth):
            continue
        orig = getattr(cls, meth)

        def w(self, *a, _o=orig, _m=meth, **k):
            n = a[0] if a and isinstance(a[0], int) else getattr(a[0], "num_tokens", None) if a else None
            mode = k.get("cudagraph_runtime_mode")
            mark(f"{_m}>", tokens=n, mode=getattr(mode, "name", str(mode)))
            r = _o(self, *a, **k)
            mark(f"{_m}<", tokens=n)
            return r

        setattr(cls, meth, w)

    orig_prof = cls.profile_run

    def profile_run(self, *a, **k):
        first_mode = os.environ.get("PROBE_GC_FIRST")
        if first_mode:
            first_run_collector(first_mode)
        torch.cuda.synchronize()
        rec(True)
        s0 = torch.cuda.memory._snapshot()
        base = live_blocks(s0)
        st["phase"] = "profile"
        st["points"] = [point("profile_run>")]
        torch.cuda.reset_peak_memory_stats()
        st["points"][0]["max_allocated"] = torch.cuda.max_memory_allocated()
        try:
            return _o_prof(self, *a, **k)
        finally:
            st["points"].append(point("profile_run<"))
            try:
                snap = torch.cuda.memory._snapshot()
                rec(False)
                ev = trace(snap)
                t0 = st["points"][0]["t_us"]
                R["profile"] = {"points": st["points"], "analysis": analyse_profile(base, ev),
                                "first_event_t": ev[0].get("time_us") if ev else None, "t0": t0}
            except Exception:  # noqa: BLE001
                R["profile_error"] = traceback.format_exc()
            st["phase"] = None
            if first_mode:
                R["first_run"] = end_first_run(first_mode)
                R["inductor_src"] = inductor_sources(R.get("profile", {}).get("analysis", {}))
            save()
            if first_mode == "high":
                a = R.get("profile", {}).get("analysis", {})
                print("PROBE-HIGH", NAME, a.get("peak_over_start"),
                      [e.get("holders", {}).get("seconds") for e in R["first_run"]["at_attention"] if "holders" in e],
                      flush=True)
                os._exit(0)
            if os.environ.get("PROBE_GC"):
                R["gc"] = gc_experiment(lambda: _o_prof(self, *a, **k))
                save()
                print("PROBE-GC", NAME, json.dumps({k_: v.get("peak_over_start") for k_, v in R["gc"].items()}),
                      flush=True)
                os._exit(0)
            if KW.get("enforce_eager") or os.environ.get("PROBE_PROFILE_ONLY"):
                print("PROBE-DONE", NAME, flush=True)
                os._exit(0)

    _o_prof = orig_prof
    cls.profile_run = profile_run

    orig_graphs = cls.profile_cudagraph_memory

    def profile_graphs(self, *a, **k):
        torch.cuda.synchronize()
        rec(True)
        tcal = time.time_ns() // 1000
        x = torch.empty(128, dtype=torch.float32, device="cuda")
        del x
        st["phase"] = "graphs"
        st["points"] = [point("profile_cudagraph_memory>")]
        if os.environ.get("PROBE_EVENTS"):
            s_start = torch.cuda.memory._snapshot()
            R["graphs_start_segments"] = [
                {"address": x["address"], "total_size": x["total_size"], "stream": x["stream"],
                 "pool": str(x.get("segment_pool_id")), "blocks": [(b["size"], b["state"]) for b in x["blocks"]]}
                for x in s_start["segments"]]
        result = None
        try:
            result = orig_graphs(self, *a, **k)
            return result
        finally:
            st["points"].append(point("profile_cudagraph_memory<"))
            try:
                snap = torch.cuda.memory._snapshot()
                rec(False)
                ev = trace(snap)
                cal = next((e.get("time_us") for e in ev if e["action"] == "alloc" and e["size"] == 512), None)
                shift = 0
                if cal is not None and abs(cal - tcal) > 1_000_000:
                    shift = cal - tcal
                    for p_ in st["points"]:
                        p_["t_us"] += shift
                if os.environ.get("PROBE_EVENTS"):
                    import gzip
                    rows = [[e["action"], e.get("addr"), e.get("size"), e.get("stream", 0), e.get("time_us"),
                             fr(e.get("frames"), 4)] for e in ev]
                    with gzip.open(os.path.join(OUT, NAME + ".events.json.gz"), "wt") as g_:
                        json.dump({"points": st["points"], "events": rows,
                                   "segments_end": [{"address": x["address"], "total_size": x["total_size"],
                                                     "stream": x["stream"], "pool": str(x.get("segment_pool_id")),
                                                     "blocks": [(b["size"], b["state"]) for b in x["blocks"]]}
                                                    for x in snap["segments"]]}, g_)
                R["graphs"] = {"clock": {"cal_event_us": cal, "cal_mark_us": tcal, "shift": shift},"points": st["points"], "result": result,
                               "intervals": analyse_intervals(ev, st["points"], snap),
                               "n_events": len(ev),
                               "first_event_t": ev[0].get("time_us") if ev else None,
                               "segments_end": [(s["address"], s["total_size"], s.get("segment_pool_id"), s["stream"])
                                                for s in snap["segments"]][:400]}
            except Exception:  # noqa: BLE001
                R["graphs_error"] = traceback.format_exc()
            st["phase"] = None
            save()
            print("PROBE-DONE", NAME, flush=True)
            os._exit(0)

    cls.profile_cudagraph_memory = profile_graphs


def main():
    patch()
    from vllm import LLM

    kw = dict(KW)
    kw["gpu_memory_utilization"] = UTIL
    try:
        LLM(model=os.path.join(HERE, "configs", NAME), load_format="dummy", skip_tokenizer_init=True, **kw)
        R["status"] = "ready"
    except BaseException:  # noqa: BLE001
        R["status"] = "failed"
        R["error"] = traceback.format_exc()[-4000:]
    R["wall_s"] = round(time.time() - R["t0"], 1)
    save()
    print("PROBE-END", NAME, R["status"], R["wall_s"], flush=True)
    os._exit(0)


main()
