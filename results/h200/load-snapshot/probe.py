"""Device side: one real vLLM 0.26.0 startup in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with torch's allocator
history on; after load_model, every live block is matched to the model's parameters/buffers/tensor attributes and
the rest listed with their Python stacks; around profile_run, the allocator trace is replayed to find the peak and
what was live at it (beyond what was live before the profile).

    python3 .gpuwork/probe.py NAME  -> $OUT/NAME.probe.json, $OUT/NAME.log
"""

import json
import os
import sys
import time
import traceback

NAME = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "/tmp/out")
SPEC = json.load(open(os.path.join(HERE, "specs.json")))[NAME.split("@")[0]]
os.environ.update(SPEC["env"])
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
RESULT = {"name": NAME, "spec": SPEC}


def save():
    with open(os.path.join(OUT, NAME + ".probe.json"), "w") as f:
        json.dump(RESULT, f, indent=1)


import torch  # noqa: E402

torch.cuda.memory._record_memory_history(max_entries=3_000_000, context="all", stacks="python")


def frames_of(fr, n=10):
    out = []
    for x in fr or []:
        fn = x.get("filename", "")
        if "/vllm/" in fn or "/torch/" in fn or "triton_kernels" in fn or "/triton/" in fn:
            out.append(f"{fn.split('site/')[-1]}:{x.get('line')}:{x.get('name')}")
        if len(out) >= n:
            break
    return out


def live_blocks(snap):
    blocks = []
    for seg in snap["segments"]:
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                blocks.append((addr, b["size"], b.get("requested_size", b["size"]), b.get("frames", [])))
            addr += b["size"]
    return blocks


def analyze_load(model):
    snap = torch.cuda.memory._snapshot()
    owners = {}
    for n, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        if t.is_cuda:
            s = t.untyped_storage()
            owners.setdefault(s.data_ptr(), []).append((n, list(t.shape), str(t.dtype), s.nbytes()))
    for mn, m in model.named_modules():
        objs = [(mn + "." + k, v) for k, v in vars(m).items()]
        qm = getattr(m, "quant_method", None)
        if qm is not None:
            objs += [(mn + ".quant_method." + k, v) for k, v in vars(qm).items()]
        for k, v in objs:
            if isinstance(v, torch.Tensor) and v.is_cuda:
                s = v.untyped_storage()
                owners.setdefault(s.data_ptr(), []).append(("attr:" + k, list(v.shape), str(v.dtype), s.nbytes()))
            elif hasattr(v, "storage") and hasattr(getattr(v, "storage", None), "data"):  # triton_kernels Tensor
                d = v.storage.data
                if isinstance(d, torch.Tensor) and d.is_cuda:
                    s = d.untyped_storage()
                    owners.setdefault(s.data_ptr(), []).append(("tk:" + k, list(d.shape), str(d.dtype), s.nbytes()))
    owned, unowned, per = 0, [], []
    for addr, size, req, fr in live_blocks(snap):
        if addr in owners:
            owned += size
            per.append({"size": size, "req": req, "owners": owners[addr][:3]})
        else:
            unowned.append({"addr": addr, "size": size, "req": req, "frames": frames_of(fr, 14)})
    RESULT["load"] = {"allocated": torch.cuda.memory_allocated(), "owned_block_bytes": owned,
                      "unowned_bytes": sum(u["size"] for u in unowned), "unowned": unowned, "owned": per}
    save()


def trace_of(snap):
    tr = snap.get("device_traces", [[]])
    return tr[torch.cuda.current_device()] if tr else []


PROFILE = {}


def before_profile():
    snap = torch.cuda.memory._snapshot()
    PROFILE["n0"] = len(trace_of(snap))
    PROFILE["base"] = {a: s for a, s, _, _ in live_blocks(snap)}
    PROFILE["alloc0"] = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()


def after_profile():
    peak = torch.cuda.max_memory_allocated()
    snap = torch.cuda.memory._snapshot()
    tr = trace_of(snap)
    n0 = PROFILE["n0"]
    res = {"alloc0": PROFILE["alloc0"], "max_allocated": peak, "trace_len": len(tr), "n0": n0}
    if len(tr) >= 3_000_000 - 10:
        res["wrapped"] = True
    live = dict(PROFILE["base"])
    cur = sum(live.values())
    info = {}
    best, best_i = cur, n0 - 1
    events = tr[n0:] if len(tr) > n0 else tr
    for i, e in enumerate(events):
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = e["size"]
            info[e["addr"]] = (e.get("frames") or [], i)
            cur += e["size"]
        elif a == "free_completed":
            cur -= live.pop(e["addr"], 0)
        if cur > best:
            best, best_i = cur, i
    # live at the peak: replay again up to best_i
    live = dict(PROFILE["base"])
    info = {}
    for i, e in enumerate(events[: best_i + 1]):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            info[e["addr"]] = (e.get("frames") or [], i)
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    new = [(s, a) for a, s in live.items() if a not in PROFILE["base"] or a in info]
    new.sort(reverse=True)
    res["peak_replayed"] = best
    res["peak_index"] = best_i
    res["peak_frames"] = frames_of(events[best_i].get("frames"), 20) if 0 <= best_i < len(events) else []
    res["new_at_peak_bytes"] = sum(s for s, _ in new)
    res["new_at_peak"] = [{"size": s, "at": info.get(a, ([], -1))[1], "frames": frames_of(info.get(a, ([], -1))[0], 12)}
                          for s, a in new[:60]]
    # the largest live sets just before/after: the timeline of the current total at 200 points
    RESULT["profile"] = res
    save()


def patch():
    import vllm.v1.worker.gpu_model_runner as v1
    import vllm.v1.worker.gpu.model_runner as v2

    for cls in (v1.GPUModelRunner, v2.GPUModelRunner):
        orig_load = cls.load_model

        def load_model(self, *a, _o=orig_load, **k):
            r = _o(self, *a, **k)
            try:
                analyze_load(self.model)
            except Exception:
                RESULT["load_error"] = traceback.format_exc()
                save()
            return r

        cls.load_model = load_model
        if hasattr(cls, "profile_run"):
            orig_prof = cls.profile_run

            def profile_run(self, *a, _o=orig_prof, **k):
                try:
                    before_profile()
                except Exception:
                    RESULT["profile_error0"] = traceback.format_exc()
                r = _o(self, *a, **k)
                try:
                    after_profile()
                except Exception:
                    RESULT["profile_error"] = traceback.format_exc()
                    save()
                return r

            cls.profile_run = profile_run


def main():
    t = time.time()
    patch()
    from vllm import LLM

    try:
        LLM(model=os.path.join(HERE, "configs", NAME.split("@")[0]), load_format="dummy", skip_tokenizer_init=True,
            **SPEC["kwargs"])
        RESULT["status"] = "ready"
    except BaseException:
        RESULT["status"] = "failed"
        RESULT["error"] = traceback.format_exc()[-4000:]
    RESULT["wall_s"] = round(time.time() - t, 1)
    save()
    print("PROBE-DONE", NAME, RESULT["status"], RESULT["wall_s"], flush=True)
    os._exit(0)


main()
