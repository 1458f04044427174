"""Non-torch device memory (used by the device less torch's reserved) before and after the first GEMM through cuBLAS,
in fresh processes: what cuBLAS's handle and loaded kernels add outside torch's allocator."""
import json, os, subprocess, sys

CASE = r'''
import json, sys, torch
def nt():
    torch.cuda.synchronize(); free, total = torch.cuda.mem_get_info()
    return (total - free) - torch.cuda.memory_reserved()
x = torch.empty(1, device="cuda"); out = {"ctx": nt()}
kind = sys.argv[1]
a = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16); b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
out["after_alloc"] = nt()
if kind in ("bf16", "both"):
    (a @ b); out["after_bf16_gemm"] = nt()
    (a @ b.t()); out["after_second_bf16_gemm"] = nt()
if kind in ("fp8", "both"):
    af = a.to(torch.float8_e4m3fn); bf = b.to(torch.float8_e4m3fn).t()
    s = torch.ones((), device="cuda")
    torch._scaled_mm(af, bf, scale_a=s, scale_b=s, out_dtype=torch.bfloat16); out["after_scaled_mm"] = nt()
if kind == "handle":
    torch.cuda.current_blas_handle(); out["after_handle"] = nt()
    (a @ b); out["after_bf16_gemm"] = nt()
if kind == "silu":
    torch.nn.functional.silu(a); out["after_elementwise"] = nt()
print(json.dumps({k: round(v / 2**20, 1) for k, v in out.items()}))
'''
res = {}
for kind in ("silu", "handle", "bf16", "fp8", "both"):
    r = subprocess.run([sys.executable, "-c", CASE, kind], capture_output=True, text=True)
    res[kind] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else r.stderr[-500:]
    print(kind, res[kind], flush=True)
import torch
res["torch"] = torch.__version__; res["cuda"] = torch.version.cuda; res["gpu"] = torch.cuda.get_device_name()
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "cublas-nontorch.json"), "w"), indent=1)
