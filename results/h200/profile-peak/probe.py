"""Device side: what is live at the peak of vLLM's profile run. Stdlib + torch + vLLM only.

    python3 probe.py LIST.json DEADLINE_S CONFIGS_DIR

For each startup of LIST (name, config, kwargs, env, cache), a forked child starts vLLM's engine in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, so the worker runs in the child), wraps the worker's
determine_available_memory so that the model runner's profile_run runs under the CUDA caching allocator's history
(torch.cuda.memory._record_memory_history, python stacks), and, when determine_available_memory returns, writes
$OUT/NAME/summary.json (the peak replayed from the allocator's trace, what was live there with the frames that made
it and their source lines, the peak per phase) and $OUT/NAME/trace.json.gz (the compact trace, frames deduplicated),
copies the generated (torch.compile) source files the top frames name, and exits: the KV cache and the CUDA graphs
are not made. `cache`: "fresh" gives the startup empty vLLM, Inductor and Triton caches of its own; "reuse:TAG"
shares the caches of the earlier startups of that tag (a warm repeat).
"""

import gzip
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import time

T0 = time.time()
OUT = os.environ.get("OUT", "/tmp/out")
LOGS = os.path.expanduser("~/probe-logs")
CACHES = os.path.expanduser("~/probe-caches")
os.makedirs(LOGS, exist_ok=True)
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")
FIGURE = re.compile(r"Model loading took|torch peak memory|non KV cache memory|Using .* backend|model runner|"
                    r"ModelRunner|Estimated CUDA graph|compile|Compil|V2")
TOP = 40


def gpu_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=False).stdout
        return int(out.split()[0])
    except Exception:  # noqa: BLE001
        return -1


# ---------------------------------------------------------------- the trace: compact form and replay

def compact(trace):
    """The trace's events as [action, addr, size, stack id] with a table of stacks and one of frames."""
    frames, frame_ids, stacks, stack_ids, events = [], {}, [], {}, []
    contexts, context_ids = [], {}
    for e in trace:
        ctx = str(e.get("compile_context") or "")[:300]
        if ctx not in context_ids:
            context_ids[ctx] = len(contexts)
            contexts.append(ctx)
        key = []
        for f in e.get("frames") or []:
            fk = (f.get("filename", "?"), int(f.get("line", 0)), f.get("name", "?"))
            if fk not in frame_ids:
                frame_ids[fk] = len(frames)
                src = linecache.getline(fk[0], fk[1]).strip()[:240] if fk[1] > 0 else ""
                frames.append([fk[0], fk[1], fk[2], src])
            key.append(frame_ids[fk])
        key = tuple(key)
        if key not in stack_ids:
            stack_ids[key] = len(stacks)
            stacks.append(list(key))
        events.append([e.get("action"), int(e.get("addr", 0)), int(e.get("size", 0)), stack_ids[key],
                       context_ids[ctx]])
    return {"frames": frames, "stacks": stacks, "events": events, "contexts": contexts}


COMPILE_NAMES = ("benchmark", "bench", "autotune", "precompile", "compile_fx", "fx_codegen_and_compile",
                 "convert_frame", "_compile", "standalone_compile", "compile_to_module", "run_and_save")


def phase_of(c, sid):
    names = [(c["frames"][f][0], c["frames"][f][2]) for f in c["stacks"][sid]]
    if any(n == "_dummy_sampler_run" for _, n in names):
        return "sampler"
    if any(("_inductor" in fn or "_dynamo" in fn) and any(k in n for k in COMPILE_NAMES) for fn, n in names):
        return "compile"
    if any("triton/runtime/autotuner" in fn for fn, _ in names):
        return "compile"
    return "forward"


def replay(c, stop=None):
    """Running sum of allocated bytes over the trace (alloc +, free_requested -); the peak and its index, and per
    phase the largest sum reached at one of its own allocations. With `stop`, the live allocations after event
    `stop` (addr -> event index)."""
    cur, best, best_i = 0, 0, -1
    per_phase = {}
    live = {}
    for i, (act, addr, size, sid, _ctx) in enumerate(c["events"]):
        if act == "alloc":
            cur += size
            live[addr] = i
            ph = phase_of(c, sid)
            if cur > per_phase.get(ph, (0, -1))[0]:
                per_phase[ph] = (cur, i)
        elif act == "free_requested":
            cur -= size
            live.pop(addr, None)
        if cur > best:
            best, best_i = cur, i
        if stop is not None and i == stop:
            return live
    return best, best_i, per_phase


def frames_text(c, sid, limit=22):
    out = []
    for f in c["stacks"][sid][:limit]:
        fn, line, name, src = c["frames"][f]
        short = fn.split("site-packages/")[-1]
        out.append(f"{short}:{line} {name} | {src}")
    return out


def live_at(c, idx, top=TOP):
    live = replay(c, stop=idx)
    rows = []
    for _addr, i in live.items():
        _, _, size, sid, ctx = c["events"][i]
        rows.append({"bytes": size, "event": i, "phase": phase_of(c, sid), "context": c["contexts"][ctx],
                     "frames": frames_text(c, sid)})
    rows.sort(key=lambda r: -r["bytes"])
    total = sum(r["bytes"] for r in rows)
    return {"live_total": total, "n_live": len(rows), "top": rows[:top]}


def summarize(c, base, peak_stat, logged):
    best, best_i, per_phase = replay(c)
    out = {"base_allocated": base, "peak_allocated_stat": peak_stat, "peak_increase_stat": peak_stat - base,
           "peak_increase_trace": best, "peak_event": best_i, "n_events": len(c["events"]),
           "logged_torch_peak_increase": logged}
    if best_i >= 0:
        sid = c["events"][best_i][3]
        out["peak_alloc_frames"] = frames_text(c, sid, 40)
        out["at_peak"] = live_at(c, best_i)
    out["phases"] = {}
    for ph, (v, i) in per_phase.items():
        out["phases"][ph] = {"max_running": v, "event": i, "frames": frames_text(c, c["events"][i][3], 30),
                             "live": live_at(c, i, 15)}
    return out


def generated_files(c, summary):
    """Source files named by the top frames that are not an installed package's (torch.compile's output)."""
    names = []
    rows = list(summary.get("at_peak", {}).get("top", []))
    for ph in summary.get("phases", {}).values():
        rows += ph["live"]["top"]
    for r in rows:
        for fr in r["frames"]:
            fn = fr.split(":")[0]
            if "site-packages" in fn or "/usr/lib" in fn or not fn.endswith(".py"):
                continue
            for f in c["frames"]:
                if f[0].endswith(fn) and f[0] not in names:
                    names.append(f[0])
    return names[:8]


# ---------------------------------------------------------------- the child: one startup

def child(spec, log, configs):
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(spec.get("env", {}))
    cache = spec.get("cache", "fresh")
    tag = spec["name"] if cache == "fresh" else cache.split(":", 1)[1]
    root = os.path.join(CACHES, tag)
    if cache == "fresh":
        shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    os.environ.update({"VLLM_CACHE_ROOT": os.path.join(root, "vllm"),
                       "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
                       "TRITON_CACHE_DIR": os.path.join(root, "triton")})
    dest = os.path.join(OUT, spec["name"])
    os.makedirs(dest, exist_ok=True)
    try:
        import torch
        from vllm import LLM
        from vllm.v1.worker import gpu_worker

        orig_dam = gpu_worker.Worker.determine_available_memory

        def dam(self):
            runner = self.model_runner
            orig_pr = runner.profile_run
            state = {}

            def profile_run(*a, **k):
                torch.cuda.synchronize()
                state["base"] = torch.cuda.memory_allocated()
                state["peak_before"] = torch.cuda.max_memory_allocated()
                try:
                    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                             max_entries=3_000_000, compile_context=True)
                except TypeError:
                    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                             max_entries=3_000_000)
                t = time.time()
                try:
                    return orig_pr(*a, **k)
                finally:
                    torch.cuda.synchronize()
                    state["profile_s"] = round(time.time() - t, 1)
                    state["peak"] = torch.cuda.max_memory_allocated()
                    state["snap"] = torch.cuda.memory._snapshot()
                    torch.cuda.memory._record_memory_history(enabled=None)

            runner.profile_run = profile_run
            result = orig_dam(self)
            dev = torch.cuda.current_device()
            traces = state["snap"]["device_traces"]
            c = compact(traces[dev] if dev < len(traces) else traces[0])
            logged = getattr(self, "peak_activation_memory", None)
            s = summarize(c, state["base"], state["peak"], logged)
            s.update(name=spec["name"], spec=spec, runner=type(runner).__module__, profile_s=state["profile_s"],
                     peak_before_profile=state["peak_before"], torch=torch.__version__)
            files = generated_files(c, s)
            s["generated_files"] = files
            os.makedirs(os.path.join(dest, "src"), exist_ok=True)
            for i, fn in enumerate(files):
                try:
                    if os.path.getsize(fn) < 600_000:
                        shutil.copy(fn, os.path.join(dest, "src", f"{i}_{os.path.basename(fn)}"))
                except OSError:
                    pass
            with open(os.path.join(dest, "summary.json"), "w") as f:
                json.dump(s, f, indent=1)
            with gzip.open(os.path.join(dest, "trace.json.gz"), "wt") as f:
                json.dump(c, f)
            print(f"PROBE-DONE logged={logged} trace={s['peak_increase_trace']} stat={s['peak_increase_stat']}",
                  flush=True)
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


def killgroup(pid):
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        end = time.time() + wait
        while time.time() < end:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def run_one(spec, deadline, configs):
    log = os.path.join(LOGS, spec["name"] + ".log")
    if os.path.exists(log):
        os.remove(log)  # an earlier log's marker must not end this one
    start = time.time()
    pid = os.fork()
    if pid == 0:
        child(spec, log, configs)
    marker = re.compile(r"PROBE-DONE|VERIFY-READY|VERIFY-FAILED")
    status = "timeout"
    limit = min(start + spec.get("timeout", 300), deadline)
    while time.time() < limit:
        done, _code = os.waitpid(pid, os.WNOHANG)
        try:
            with open(log, errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        m = marker.search(text)
        if m:
            status = "failed" if "FAILED" in m.group(0) else "done"
            break
        if done:
            status = "exited"
            break
        time.sleep(0.5)
    wall = time.time() - start
    killgroup(pid)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    end = time.time() + 40
    while gpu_used_mib() > 1500 and time.time() < end:
        time.sleep(1)
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    dest = os.path.join(OUT, spec["name"])
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "log.txt"), "w") as f:
        keep = [ln[:600] for ln in lines if FIGURE.search(ln)]
        f.write("\n".join(keep[:300] + ["----- tail"] + [ln[:600] for ln in lines[-80:]]) + "\n")
    return {"name": spec["name"], "status": status, "wall_s": round(wall, 1), "t_offset_s": round(start - T0, 1)}


def main():
    with open(sys.argv[1]) as f:
        specs = json.load(f)
    deadline = T0 + float(sys.argv[2])
    configs = os.path.abspath(sys.argv[3])
    os.makedirs(OUT, exist_ok=True)
    import torch
    import vllm  # noqa: F401  (imported once; each startup is a fork of this process)

    with open(os.path.join(OUT, "machine.json"), "w") as f:
        json.dump({"vllm": vllm.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
                   "python": sys.version, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                          "--format=csv,noheader"], capture_output=True, text=True,
                                         check=False).stdout.strip()}, f)
    index = open(os.path.join(OUT, "index.jsonl"), "a")  # noqa: SIM115
    for spec in specs:
        left = deadline - time.time()
        if left < spec.get("need", 45):
            index.write(json.dumps({"name": spec["name"], "status": f"skipped, {left:.0f}s left"}) + "\n")
            continue
        rec = run_one(spec, deadline, configs)
        index.write(json.dumps(rec) + "\n")
        index.flush()
        print(json.dumps(rec), flush=True)
    print(f"probe done at {time.time() - T0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
