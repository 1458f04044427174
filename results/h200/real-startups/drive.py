"""Device side: real vLLM startups one after another, each in its own process group, each result appended to
$OUT/startups.jsonl as soon as it ends. Stdlib only; vLLM is imported once here and each startup is a fork.

    python3 .verify/drive.py .verify/startups.json DEADLINE_S
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "/tmp/out")
STATE = os.path.expanduser("~/verify-state")
LOGS = os.path.expanduser("~/verify-logs")
os.makedirs(STATE, exist_ok=True)
os.makedirs(LOGS, exist_ok=True)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")

FIGURES = re.compile(
    r"Model loading took|non KV cache memory|Profiling CUDA graph memory|Estimated CUDA graph|"
    r"Estimated .* CUDA graph memory|CUDA graph pool|"
    r"Available KV cache|GPU KV cache size|Maximum concurrency|Graph capturing finished|Using .* backend"
)
KEEP = re.compile(
    r"Model loading took|non KV cache memory|torch peak memory|non-torch|Estimated CUDA graph|CUDA graph|"
    r"Available KV cache|GPU KV cache size|Maximum concurrency|backend|Backend|Defaulting|model runner|"
    r"ModelRunner|Memory profiling|torch.compile|Graph capturing|init engine|Initializing a V1|non-default args|"
    r"Requested memory|Free memory|cudagraph|KV cache|kv_cache|max_num_batched|max_num_seqs|chunked prefill|"
    r"Chunked prefill|quantiz|Quantiz|fp8|FP8|Fp8|mxfp4|MXFP4|Mxfp4|Marlin|Triton|triton|FlashAttention|"
    r"FlashMLA|MLA|sliding|Sliding|hybrid|Hybrid|block_size|block size|dtype|Resolved architecture|"
    r"Loading weights|Loading model|profil|Profil|capture|Capture|workspace|Workspace|WARNING|ERROR|Error|"
    r"V2|v2 |version|Version|Automatically|automatically|Overriding|overriding|Setting|Using"
)


def gpu_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=False).stdout
        return int(out.split()[0])
    except Exception:  # noqa: BLE001  (no nvidia-smi, or no number: unknown)
        return -1


def gpu_info():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"nvidia-smi failed: {e}"


def child(spec, log):
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(spec.get("env", {}))
    model = os.path.join(HERE, "configs", spec["config"])
    try:
        if spec["entry"] == "llm":
            from vllm import LLM

            t = time.time()
            LLM(model=model, load_format="dummy", skip_tokenizer_init=True, **spec.get("kwargs", {}))
            print(f"VERIFY-READY {time.time() - t:.1f}", flush=True)
        else:
            sys.argv = ["vllm", "serve", model, "--load-format", "dummy", "--skip-tokenizer-init",
                        "--port", "18123", *spec.get("args", [])]
            from vllm.entrypoints.cli.main import main

            main()
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


def run_one(spec, deadline):
    log = os.path.join(LOGS, spec["name"] + ".log")
    start = time.time()
    pid = os.fork()
    if pid == 0:
        child(spec, log)
    marker = re.compile(r"VERIFY-READY|VERIFY-FAILED|Application startup complete|Starting vLLM API server")
    status, rc = "timeout", None
    limit = min(start + spec.get("timeout", 400), deadline)
    while time.time() < limit:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(code)
            status = "ready" if rc == 0 else "failed"
            break
        try:
            with open(log, errors="replace") as f:
                text = f.read()
            m = marker.search(text)
            if m:
                status = "failed" if "FAILED" in m.group(0) else "ready"
                break
        except OSError:
            pass
        time.sleep(0.5)
    wall = time.time() - start
    killgroup(pid)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    drain_end = min(time.time() + 40, deadline + 8)
    used = gpu_used_mib()
    while used > 1500 and time.time() < drain_end:
        time.sleep(1)
        used = gpu_used_mib()
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    keep = [ln[:1500] for ln in lines if KEEP.search(ln)]
    if len(keep) > 400:  # the middle goes, except the figures' own lines (a per-layer DEBUG flood once cut them)
        keep = keep[:200] + [ln for ln in keep[200:-200] if FIGURES.search(ln)] + keep[-200:]
    rec = {"name": spec["name"], "spec": spec, "status": status, "rc": rc, "wall_s": round(wall, 1),
           "gpu_used_after_mib": used, "lines": keep, "tail": [ln[:1500] for ln in lines[-60:]],
           "n_lines": len(lines), "t_offset_s": round(start - T0, 1)}
    return rec


def main():
    with open(sys.argv[1]) as f:
        specs = json.load(f)
    budget = float(sys.argv[2])
    deadline = T0 + budget
    os.makedirs(OUT, exist_ok=True)
    out = open(os.path.join(OUT, "startups.jsonl"), "a")  # noqa: SIM115  (appended to as each startup ends)
    tail = open(os.path.join(OUT, "tail.log"), "a")  # noqa: SIM115
    import importlib.metadata as md

    def ver(name):
        try:
            return md.version(name)
        except Exception:  # noqa: BLE001
            return None

    t = time.time()
    import torch
    import vllm
    from vllm import LLM  # noqa: F401  (imported once; each startup is a fork of this process)

    header = {"name": "_machine", "gpu": gpu_info(), "gpu_used_mib": gpu_used_mib(), "vllm": vllm.__version__,
              "torch": torch.__version__, "transformers": ver("transformers"), "triton": ver("triton"), "python": sys.version,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "import_s": round(time.time() - t, 1),
              "cuda": torch.version.cuda}
    out.write(json.dumps(header) + "\n")
    out.flush()
    for spec in specs:
        done_flag = os.path.join(STATE, spec["name"])
        if os.path.exists(done_flag):
            continue
        left = deadline - time.time()
        if left < spec.get("need", 60):
            tail.write(f"skip {spec['name']}: {left:.0f}s left\n")
            continue
        rec = run_one(spec, deadline)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        tail.write(f"== {spec['name']} {rec['status']} {rec['wall_s']}s\n")
        if rec["status"] != "ready":
            tail.write("\n".join(rec["tail"][-25:]) + "\n")
        tail.flush()
        open(done_flag, "w").close()
    tail.write(f"driver done at {time.time() - T0:.0f}s\n")


if __name__ == "__main__":
    main()
