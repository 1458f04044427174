"""The experts backend vLLM picks where `--moe-backend` is left out, read from the release's own selection code.

FP8 checkpoints (quant_method fp8) go through fused_moe/oracle/fp8.py `select_fp8_moe_backend`:

    _get_priority_backends      the list, then `_move_to_front(...)` under conditions on the platform, the
                                parallel config and the quantization keys (read here with ast, the conditions
                                evaluated on the GPU's compute capability, EP size and the checkpoint's scheme)
    allow_vllm_cutlass          the caller's keyword (quantization/fp8.py Fp8MoEMethod), else the parameter's
                                default; False removes VLLM_CUTLASS and BATCHED_VLLM_CUTLASS
    backend_to_kernel_cls       each backend's experts classes; the first class whose activation_format() is the
                                layout's (BatchedExperts under deepep_low_latency with DP > 1, else Standard) and
                                whose _supports_current_device() holds on the GPU is vLLM's pick

Nothing is imported or executed: the methods' return expressions are evaluated over a handful of platform
predicates (is_cuda, is_device_capability, is_device_capability_family, has_device_capability, ...). What a
method asks beyond those (an optional library being installed) comes from LIBRARIES, a documented table, and
the pick names every assumption it took. A pick the layer model does not size (FlashInfer's CUTLASS experts, say)
is named, and the plan takes the next backend in the release's order that it sizes, saying so.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass

from harness.sizing.release_defaults import Default
from harness.sizing.vllm_source.layer_source import ReleaseFiles, per_release

ORACLE_FILE = "vllm/model_executor/layers/fused_moe/oracle/fp8.py"
CALLER_FILE = "vllm/model_executor/layers/quantization/fp8.py"
# vLLM's Fp8MoeBackend -> the experts family the layer model sizes (harness.sizing.layer EXPERTS_CLASSES)
FAMILIES = {
    "TRITON": "triton", "BATCHED_TRITON": "triton", "DEEPGEMM": "deep_gemm", "BATCHED_DEEPGEMM": "deep_gemm",
    "VLLM_CUTLASS": "cutlass", "BATCHED_VLLM_CUTLASS": "cutlass",
}  # fmt: skip
# Libraries a `_supports_current_device` may ask for, as a CUDA install of vLLM has them (a table, named in the
# pick's source): FlashInfer is a dependency of vLLM's CUDA wheels; DeepGEMM comes with vLLM's CUDA images
# (tools/install_deepgemm.sh) and runs on Hopper and Blackwell; Humming is an optional extra, absent by default.
LIBRARIES: dict[str, tuple[object, str]] = {
    "has_flashinfer": (True, "FlashInfer: a dependency of vLLM's CUDA wheels"),
    "has_flashinfer_cutlass_fused_moe": (True, "FlashInfer: a dependency of vLLM's CUDA wheels"),
    "is_deep_gemm_supported": ("hopper-blackwell", "DeepGEMM: installed in vLLM's CUDA images, SM 9.0 and 10.x"),
    "has_deep_gemm": (True, "DeepGEMM: installed in vLLM's CUDA images"),
    "has_flashinfer_trtllm_fused_moe": (True, "FlashInfer: a dependency of vLLM's CUDA wheels"),
    "has_humming": (False, "Humming: an optional library, not installed with vLLM"),
}


@dataclass(frozen=True)
class Pick:
    backend: str | None  # vLLM's Fp8MoeBackend name
    experts_class: str | None
    family: str | None  # what the plan sizes: cutlass, deep_gemm, triton (None: no backend it sizes)
    source: str
    candidates: tuple[str, ...] = ()  # the backends in the order vLLM tries them (what it logs as "potential")


class _Unknown(Exception):
    pass


@dataclass(frozen=True)
class _Platform:
    capability: int  # 90 for 9.0
    ep_size: int
    batched: bool
    weight_key: str | None
    activation_key: str | None
    all2all: str


def _eval(node: ast.expr, p: _Platform, names: dict[str, object], assumed: list[str]) -> object:
    """A return expression of a selection method, over the platform predicates it may call."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, p, names, assumed) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, p, names, assumed)
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_eval(e, p, names, assumed) for e in node.elts)
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        if node.id.startswith("k") and node.id[1:2].isupper():  # a QuantKey constant: kFp8Static128BlockSym
            return node.id
        raise _Unknown(f"name {node.id}")
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = _eval(node.left, p, names, assumed), _eval(node.comparators[0], p, names, assumed)
        op = node.ops[0]
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
        if isinstance(op, ast.In):
            return left in right  # type: ignore[operator]
        if isinstance(op, ast.NotIn):
            return left not in right  # type: ignore[operator]
        if isinstance(op, ast.Gt) and isinstance(left, int) and isinstance(right, int):
            return left > right
        if isinstance(op, ast.GtE) and isinstance(left, int) and isinstance(right, int):
            return left >= right
        raise _Unknown(ast.unparse(node)[:80])
    if isinstance(node, ast.Attribute):
        attr = node.attr
        known: dict[str, object] = {"ep_size": p.ep_size, "use_deepep_v2_kernels": p.all2all == "deepep_v2",
                  "use_batched_activation_format": p.batched, "use_fi_nvl_two_sided_kernels": False,
                  "use_fi_nvl_one_sided_kernels": False,
                  "use_deepep_ll_kernels": p.batched and p.all2all == "deepep_low_latency",
                  "use_deepep_ht_kernels": p.ep_size > 1 and p.all2all == "deepep_high_throughput"}  # fmt: skip
        if attr in known:
            return known[attr]
        raise _Unknown(f"attribute {attr}")
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        args = [_eval(a, p, names, assumed) for a in node.args]
        arg = args[0] if args else None
        if isinstance(arg, tuple) and len(arg) == 2 and all(isinstance(x, int) for x in arg):
            arg = arg[0] * 10 + arg[1]  # has_device_capability((7, 5))
        if name in ("is_cuda", "is_cuda_alike"):
            return True
        if name == "supports_fp8":  # CudaPlatform.supports_fp8: compute capability 8.9 and up
            return p.capability >= 89
        if name in ("is_rocm", "is_xpu", "is_cpu", "is_tpu"):
            return False
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "rocm_aiter_ops":
            return False  # AITER: ROCm's kernels
        if name == "is_device_capability" and isinstance(arg, int):
            return p.capability == arg
        if name == "is_device_capability_family" and isinstance(arg, int):
            return p.capability // 10 == arg // 10
        if name == "has_device_capability" and isinstance(arg, int):
            return p.capability >= arg
        if name in LIBRARIES:
            value, why = LIBRARIES[name]
            assumed.append(f"{name}(): {why}")
            return p.capability // 10 in (9, 10) if value == "hopper-blackwell" else value
        raise _Unknown(f"call {name or ast.unparse(func)[:40]}()")
    raise _Unknown(ast.unparse(node)[:80])


def _function(module: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _backend_name(node: ast.expr, enum: str = "Fp8MoeBackend") -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == enum:
        return node.attr
    return None


def _priority(function: ast.FunctionDef, p: _Platform, assumed: list[str]) -> list[str]:
    """_get_priority_backends run on the platform: its list, then each `_move_to_front` whose condition holds."""
    order: list[str] = []
    keys: dict[str, object] = {"weight_key": p.weight_key, "activation_key": p.activation_key}

    def run(statements: list[ast.stmt]) -> None:
        for s in statements:
            if isinstance(s, ast.Assign) and isinstance(s.value, ast.List):
                order[:] = [b for b in (_backend_name(e) for e in s.value.elts) if b]
            elif isinstance(s, ast.If):
                run(s.body if _eval(s.test, p, keys, assumed) else s.orelse)
            elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and \
                    isinstance(s.value.func, ast.Name) and s.value.func.id == "_move_to_front":  # fmt: skip
                backend = _backend_name(s.value.args[-1])
                if backend in order:
                    order.insert(0, order.pop(order.index(backend)))

    run(function.body)
    return order


def _kernel_classes(function: ast.FunctionDef, enum: str = "Fp8MoeBackend") -> dict[str, list[str]]:
    """backend_to_kernel_cls: each `backend == Fp8MoeBackend.X` branch's returned classes."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            backend = _backend_name(node.test.comparators[0], enum)
            ret = next((s for s in node.body if isinstance(s, ast.Return)), None)
            if backend and ret is not None and isinstance(ret.value, ast.List):
                out[backend] = [e.id for e in ret.value.elts if isinstance(e, ast.Name)]
    return out


def _allow_cutlass(files: ReleaseFiles, select: ast.FunctionDef) -> tuple[bool, str]:
    caller = files.module(CALLER_FILE)
    for node in ast.walk(caller) if caller is not None else []:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "select_fp8_moe_backend":  # fmt: skip
            keyword = next((k for k in node.keywords if k.arg == "allow_vllm_cutlass"), None)
            if keyword is not None and isinstance(keyword.value, ast.Constant):
                return bool(keyword.value.value), f"{CALLER_FILE.removeprefix('vllm/')}:{node.lineno}"
    args = select.args
    defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults, strict=True)) \
        if args.defaults else {}  # fmt: skip
    default = defaults.get("allow_vllm_cutlass")
    if isinstance(default, ast.Constant):
        return bool(default.value), (
            f"{ORACLE_FILE.removeprefix('vllm/')}:{select.lineno} (the parameter's default; "
            f"the caller, {CALLER_FILE.removeprefix('vllm/')}, is not in this extraction)"
        )
    return True, "allow_vllm_cutlass not found"


def _removed_unless_cutlass(select: ast.FunctionDef) -> set[str]:
    for node in ast.walk(select):
        if isinstance(node, ast.If) and "allow_vllm_cutlass" in ast.unparse(node.test) and \
                isinstance(node.test, ast.UnaryOp) and not node.orelse:  # fmt: skip
            removed = {b for call in ast.walk(node) if isinstance(call, ast.Call) and
                       isinstance(call.func, ast.Attribute) and call.func.attr == "remove"
                       for b in [_backend_name(call.args[0])] if b}  # fmt: skip
            if removed:
                return removed
    return set()


def _method_value(files: ReleaseFiles, class_name: str, method: str, p: _Platform, names: dict[str, object],
                  assumed: list[str]) -> object:  # fmt: skip
    """The value a static selection method of the class (or a base) returns, for a body of assignments, ifs and
    returns."""
    tree = files.tree
    classes = tree.class_named(class_name)
    if not classes:
        raise _Unknown(f"no class {class_name} in fused_moe/")
    parts = _fallback_parts(files, class_name)
    if parts:  # FallbackExperts: each of its classes must support it (experts/fallback.py)
        return all(_method_value(files, c, method, p, names, assumed) for c in parts)
    found = tree.find_method(classes[0], method)
    if found is None:
        raise _Unknown(f"{class_name} has no {method}")
    scope = dict(names)

    def run(statements: list[ast.stmt]) -> tuple[bool, object]:
        for s in statements:
            if isinstance(s, ast.Return) and s.value is not None:
                return True, _eval(s.value, p, scope, assumed)
            if isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name) and isinstance(s.op, ast.Add) and \
                    s.target.id in scope:  # fmt: skip
                scope[s.target.id] = tuple(scope[s.target.id]) + tuple(_eval(s.value, p, scope, assumed))  # type: ignore[arg-type]
            elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None:
                scope[s.target.id] = _eval(s.value, p, scope, assumed)
            elif isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                if (isinstance(s.value, ast.Attribute) and s.value.attr == "current_platform") or \
                        (isinstance(s.value, ast.Name) and s.value.id == "current_platform"):  # fmt: skip
                    continue
                scope[s.targets[0].id] = _eval(s.value, p, scope, assumed)
            elif isinstance(s, ast.If):
                done, value = run(s.body if _eval(s.test, p, scope, assumed) else s.orelse)
                if done:
                    return done, value
            elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
                continue  # a docstring
            elif isinstance(s, ast.ImportFrom | ast.Import | ast.Pass):
                continue
            else:
                raise _Unknown(f"{class_name}.{method}: {ast.unparse(s)[:60]}")
        return False, None

    done, value = run(found[1].body)
    if not done:
        raise _Unknown(f"{class_name}.{method} returns nothing")
    return value


def _fallback_parts(files: ReleaseFiles, class_name: str) -> list[str]:
    """The classes a FallbackExperts subclass combines: its own get_clses() return tuple; [] for other classes."""
    classes = files.tree.class_named(class_name)
    cls = next((c for c in classes if c.node.name == class_name), None)
    method = next((n for n in cls.node.body if isinstance(n, ast.FunctionDef) and n.name == "get_clses"), None) \
        if cls is not None else None  # fmt: skip
    for node in ast.walk(method) if method is not None else []:
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            return [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    return []


def _activation_format(files: ReleaseFiles, class_name: str) -> str:
    parts = _fallback_parts(files, class_name)
    if parts:
        return _activation_format(files, parts[0])
    classes = files.tree.class_named(class_name)
    found = files.tree.find_method(classes[0], "activation_format") if classes else None
    if found is not None:
        for node in ast.walk(found[1]):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Attribute):
                return node.value.attr
    raise _Unknown(f"{class_name}.activation_format")


@per_release
def pick_fp8(files: ReleaseFiles, *, capability: int, ep_size: int, batched: bool, block: bool,
             all2all: str) -> Pick | None:  # fmt: skip
    """vLLM's FP8 experts backend for the layout, or None when the release has no FP8 oracle."""
    module = files.module(ORACLE_FILE)
    if module is None:
        return None
    priority, select, kernels = (_function(module, n) for n in ("_get_priority_backends", "select_fp8_moe_backend",
                                                                 "backend_to_kernel_cls"))  # fmt: skip
    if priority is None or select is None or kernels is None:
        return None
    weight, activation = ("kFp8Static128BlockSym", "kFp8Dynamic128Sym") if block else \
        ("kFp8StaticTensorSym", "kFp8DynamicTensorSym")  # fmt: skip
    p = _Platform(capability=capability, ep_size=ep_size, batched=batched, weight_key=weight,
                  activation_key=activation, all2all=all2all)  # fmt: skip
    assumed: list[str] = []
    try:
        order = _priority(priority, p, assumed)
    except _Unknown as error:
        return Pick(None, None, None, f"{ORACLE_FILE.removeprefix('vllm/')}:{priority.lineno} _get_priority_backends "
                    f"not evaluated ({error})")  # fmt: skip
    allow, allow_where = _allow_cutlass(files, select)
    removed = set() if allow else _removed_unless_cutlass(select)
    classes = _kernel_classes(kernels)
    wanted = "BatchedExperts" if batched else "Standard"
    passed: list[str] = []
    for backend in order:
        if backend in removed:
            passed.append(f"{backend} (allow_vllm_cutlass=False, {allow_where})")
            continue
        for cls in classes.get(backend, []):
            try:
                form = _activation_format(files, cls)
                if form != wanted:
                    why = f"{form} format"
                elif not _method_value(files, cls, "_supports_current_device", p, {}, assumed):
                    why = "not on this GPU"
                elif not _supported_or_assumed(files, cls, p, assumed):
                    why = "not this quantization or parallel config"
                else:
                    pick = _pick(backend, cls, priority, order, passed, assumed)
                    return dataclasses.replace(pick, candidates=tuple(b for b in order if b not in removed))
            except _Unknown as error:
                why = f"not evaluated: {error}"
            passed.append(f"{backend} {cls} ({why})")
    return Pick(None, None, None, f"{ORACLE_FILE.removeprefix('vllm/')}:{priority.lineno}: no backend found; passed "
                f"{'; '.join(passed)}")  # fmt: skip


def _supported_or_assumed(files: ReleaseFiles, cls: str, p: _Platform, assumed: list[str]) -> bool:
    """_supports_quant_scheme and _supports_parallel_config where they evaluate; taken as supported otherwise
    (named in the pick's source)."""
    keys: dict[str, object] = {"weight_key": p.weight_key, "activation_key": p.activation_key}
    for method, names in (("_supports_quant_scheme", keys), ("_supports_parallel_config", {})):
        try:
            if not _method_value(files, cls, method, p, names, assumed):
                return False
        except _Unknown as error:
            assumed.append(f"{cls}.{method} taken as supported ({error})")
    return True


def _pick(backend: str, cls: str, priority: ast.FunctionDef, order: list[str], passed: list[str],
          assumed: list[str]) -> Pick:  # fmt: skip
    text = (f"{ORACLE_FILE.removeprefix('vllm/')}:{priority.lineno} select_fp8_moe_backend: vLLM picks {backend} "
            f"({cls}) in the order {', '.join(order[:order.index(backend) + 1])}")  # fmt: skip
    if passed:
        text += f"; passed: {'; '.join(passed)}"
    if assumed:
        text += f"; assumed: {'; '.join(dict.fromkeys(assumed))}"
    return Pick(backend, cls, FAMILIES.get(backend), text)


def default_backend(facts, files: ReleaseFiles | None, *, gpu, tp: int, dp: int, ep: bool, all2all: str,
                    fallback: Default) -> Default:  # fmt: skip
    """The `moe_backend` default of a deployment: what the release's selection picks for an FP8 MoE checkpoint on
    the GPU (a harness.sizing.gpus row, or None: compute capability 9.0 assumed); `fallback` (the table's family)
    for an unquantized model, a release without the oracle or no release at hand, and, named, where vLLM's pick is
    one the plan does not size."""
    from harness.sizing.release_defaults import uses_batched_dp_moe

    if files is None or facts.quant_method != "fp8" or not facts.is_moe:
        return fallback
    major, minor = gpu.capability if gpu is not None else (9, 0)
    where = f"{gpu.name if gpu is not None else 'GPU'}: compute capability {major}.{minor}" + \
        ("" if gpu is not None else " assumed")  # fmt: skip
    pick = pick_fp8(files, capability=major * 10 + minor, ep_size=tp * dp if ep else 1,
                    batched=uses_batched_dp_moe(all2all, ep, dp), block=facts.weight_block_size is not None,
                    all2all=all2all)  # fmt: skip
    if pick is None:
        return fallback
    if pick.family is None:
        return Default(fallback.value, f"{fallback.source}, as {pick.experts_class or 'the pick'} is not sized by "
                       f"the plan; {pick.source} ({where})")  # fmt: skip
    return Default(pick.family, f"{pick.source} ({where})")


@per_release
def cutlass_refusal(files: ReleaseFiles) -> str | None:
    """Why the release refuses `--moe-backend cutlass` for an FP8 checkpoint (Fp8MoEMethod passes
    allow_vllm_cutlass=False and select_fp8_moe_backend raises on an explicit CUTLASS backend), or None."""
    module = files.module(ORACLE_FILE)
    select = _function(module, "select_fp8_moe_backend") if module is not None else None
    if select is None:
        return None
    allow, where = _allow_cutlass(files, select)
    if allow:
        return None
    for node in ast.walk(select):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args and \
                isinstance(node.exc.args[0], ast.Constant) and "CUTLASS" in str(node.exc.args[0].value):  # fmt: skip
            return (f"refused: {node.exc.args[0].value!s} ({ORACLE_FILE.removeprefix('vllm/')}:{node.lineno}; "
                    f"allow_vllm_cutlass=False, {where})")  # fmt: skip
    return None


MXFP4_ORACLE_FILE = "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"


@per_release
def mxfp4_triton_monolithic(files: ReleaseFiles) -> str | None:
    """Where the release's TRITON MXFP4 backend tries a monolithic experts class first, that class and where it is
    read ("OAITritonMxfp4ExpertsMonolithic (fused_moe/oracle/mxfp4.py:249)"); else None. A monolithic class
    (FusedMoEExpertsMonolithic) is one kernel call that allocates its own buffers: no modular workspace."""
    module = files.module(MXFP4_ORACLE_FILE)
    kernels = _function(module, "backend_to_kernel_cls") if module is not None else None
    if kernels is None:
        return None
    classes = _kernel_classes(kernels, "Mxfp4MoeBackend").get("TRITON", [])
    if not classes:
        return None
    first = next((c for c in files.tree.class_named(classes[0]) if c.node.name == classes[0]), None)
    if first is None or not any(ast.unparse(b).endswith("FusedMoEExpertsMonolithic") for b in first.node.bases):
        return None
    line = next(
        (
            n.lineno
            for n in ast.walk(kernels)
            if isinstance(n, ast.Return)
            and isinstance(n.value, ast.List)
            and any(isinstance(e, ast.Name) and e.id == classes[0] for e in n.value.elts)
        ),
        kernels.lineno,
    )
    return f"{classes[0]} ({MXFP4_ORACLE_FILE.removeprefix('vllm/model_executor/layers/')}:{line})"
