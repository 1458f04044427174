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

WNA16 checkpoints (AWQ, GPTQ, compressed-tensors W4A16 / W8A16) go through the format's get_quant_method and
fused_moe/oracle/int_wna16.py `select_wna16_moe_backend` (pick_wna16):

    get_quant_method            check_moe_marlin_supports_layer (quantization/utils/marlin_utils.py, run on the
                                layer's K, I per GPU and group) picks the Marlin MoE method or the MoeWNA16 one
    select_wna16_moe_backend    the method's call: its weight key, quantization config, may_have_zp / _bias and
                                allow_tile_padding; then _get_priority_backends, each backend's
                                _backend_incompatibility_reason (0.29.0 on) and its classes' is_supported_config
                                (format, device, activation, weight key, parallel config); the pick logs
                                _make_log_backend's line ("Using 'MARLIN' WNA16 MoE backend.")
    no oracle (0.19.0)          the MoE method runs fused_marlin_moe in its own apply(): no modular experts class

Nothing is imported or executed: the methods' bodies (assignments, ifs, returns) and the module functions they call
are evaluated over a handful of platform predicates (is_cuda, is_device_capability, is_device_capability_family,
has_device_capability, ...) and stand-ins for the layer and the checkpoint's config. What a method asks beyond
those (an optional library being installed) comes from LIBRARIES, a documented table, and the pick names every
assumption it took. A pick the layer model does not size (FlashInfer's CUTLASS experts, say) is named, and the plan
takes the next backend in the release's order that it sizes (FP8) or the Triton experts (WNA16), saying so.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
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
    logged: str = ""  # the line vLLM logs for its pick ("Using 'MARLIN' WNA16 MoE backend."), where read


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


ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
              ast.Mod: lambda a, b: a % b, ast.FloorDiv: lambda a, b: a // b}  # fmt: skip
# Enum classes whose members the selection code compares: a member reads as its name (lower case where the enum's
# values are: compressed-tensors' strategies and activation orderings are str enums of lower-case values).
ENUMS: dict[str, Callable[[str], str]] = {
    "Fp8MoeBackend": str, "WNA16MoEBackend": str, "MoEActivation": str, "QuantizationStrategy": str.lower,
    "ActivationOrdering": str.lower,
}  # fmt: skip
MAX_CALL_DEPTH = 8  # a release function calling another (check_moe_marlin_supports_layer -> ..._config)
MAX_CALLS = 64  # release functions one evaluation may call in all (a hostile tree's fan-out stays bounded)


@dataclass(frozen=True, eq=False)
class _Obj:
    """A stand-in for an object the selection code reads attributes of: the layer, its FusedMoEConfig, the
    checkpoint's quantization config (its class name, for isinstance, and the attributes the plan knows)."""

    kind: str
    attributes: dict[str, object]

    def get(self, name: str) -> object:
        if name not in self.attributes:
            raise _Unknown(f"attribute {self.kind}.{name}")
        return self.attributes[name]


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Unknown(f"{value!r} is not an integer")
    return value


def _eval(node: ast.expr, p: _Platform, names: dict[str, object], assumed: list[str]) -> object:
    """A return expression of a selection method, over the platform predicates it may call."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BoolOp):  # as Python evaluates it: an operand after the deciding one is not read
        conjunction = isinstance(node.op, ast.And)
        for operand in node.values:
            if bool(_eval(operand, p, names, assumed)) != conjunction:
                return not conjunction
        return conjunction
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, p, names, assumed)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_int(_eval(node.operand, p, names, assumed))
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, p, names, assumed) else node.orelse, p, names, assumed)
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        a, b = _int(_eval(node.left, p, names, assumed)), _int(_eval(node.right, p, names, assumed))
        if isinstance(node.op, ast.Mod | ast.FloorDiv) and b == 0:
            raise _Unknown(f"{ast.unparse(node)[:60]}: division by zero")
        return ARITHMETIC[type(node.op)](a, b)
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
        if isinstance(op, ast.Lt) and isinstance(left, int) and isinstance(right, int):
            return left < right
        if isinstance(op, ast.LtE) and isinstance(left, int) and isinstance(right, int):
            return left <= right
        if isinstance(op, ast.Is | ast.IsNot) and (left is None or right is None or isinstance(left, bool)):
            return (left is right) == isinstance(op, ast.Is)
        raise _Unknown(ast.unparse(node)[:80])
    if isinstance(node, ast.Attribute):
        attr = node.attr
        if isinstance(node.value, ast.Name) and node.value.id in ENUMS and node.value.id not in names:
            return ENUMS[node.value.id](attr)  # an enum member: its name (WNA16MoEBackend.MARLIN -> "MARLIN")
        if isinstance(node.value, ast.Name | ast.Attribute):
            try:
                owner = _eval(node.value, p, names, assumed)
            except _Unknown:
                owner = None
            if isinstance(owner, _Obj):
                return owner.get(attr)
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
        if isinstance(func, ast.Name) and func.id not in names and name in ("isinstance", "getattr") and \
                len(node.args) >= 2:  # fmt: skip
            owner = _eval(node.args[0], p, names, assumed)
            if not isinstance(owner, _Obj):
                raise _Unknown(f"{ast.unparse(node)[:60]} of something the plan does not model")
            if name == "isinstance":  # the classes as written (imported inside the function, never evaluated)
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                return owner.kind in {ast.unparse(k).rsplit(".", 1)[-1] for k in kinds}
            key = _eval(node.args[1], p, names, assumed)
            if not isinstance(key, str):
                raise _Unknown(ast.unparse(node)[:60])
            if key in owner.attributes or len(node.args) < 3:
                return owner.get(key)
            return _eval(node.args[2], p, names, assumed)
        args = [_eval(a, p, names, assumed) for a in node.args]
        if name in LIBRARIES:  # the table's documented answer, before a release function of that name is run
            value, why = LIBRARIES[name]
            assumed.append(f"{name}(): {why}")
            return p.capability // 10 in (9, 10) if value == "hopper-blackwell" else value
        if isinstance(func, ast.Name) and isinstance(names.get(func.id), _Function):
            keywords = {k.arg: _eval(k.value, p, names, assumed) for k in node.keywords if k.arg is not None}
            return names[func.id](args, keywords)  # type: ignore[operator]
        if isinstance(func, ast.Name) and func.id not in names and name in ("max", "min") and args and \
                all(isinstance(a, int) for a in args):  # fmt: skip
            return max(args) if name == "max" else min(args)  # type: ignore[type-var]
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
        raise _Unknown(f"call {name or ast.unparse(func)[:40]}()")
    raise _Unknown(ast.unparse(node)[:80])


def _function(module: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _backend_name(node: ast.expr, enum: str = "Fp8MoeBackend") -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == enum:
        return node.attr
    return None


def _priority(function: ast.FunctionDef, p: _Platform, assumed: list[str], enum: str = "Fp8MoeBackend") -> list[str]:
    """_get_priority_backends run on the platform: its list, then each `_move_to_front` whose condition holds, up to
    the return (of that list, or of a list of its own: `if current_platform.is_cpu(): return [...CPU]`). A return
    of anything else (the list passed through a function of another file) is not evaluated."""
    order: list[str] = []
    keys: dict[str, object] = {"weight_key": p.weight_key, "activation_key": p.activation_key}

    def run(statements: list[ast.stmt]) -> bool:
        for s in statements:
            if isinstance(s, ast.Assign) and isinstance(s.value, ast.List):
                order[:] = [b for b in (_backend_name(e, enum) for e in s.value.elts) if b]
            elif isinstance(s, ast.If):
                if run(s.body if _eval(s.test, p, keys, assumed) else s.orelse):
                    return True
            elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and \
                    isinstance(s.value.func, ast.Name) and s.value.func.id == "_move_to_front":  # fmt: skip
                backend = _backend_name(s.value.args[-1], enum)
                if backend in order:
                    order.insert(0, order.pop(order.index(backend)))
            elif isinstance(s, ast.Return) and s.value is not None:
                if isinstance(s.value, ast.List):
                    order[:] = [b for b in (_backend_name(e, enum) for e in s.value.elts) if b]
                elif not isinstance(s.value, ast.Name):
                    raise _Unknown(f"{function.name} returns {ast.unparse(s.value)[:60]}, which is not evaluated")
                return True
        return False

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
    scope = {**functions_of(files, found[0].file, p, assumed), **names}  # the module's functions it may call
    done, value = _run(found[1].body, scope, p, assumed, f"{class_name}.{method}")
    if not done:
        raise _Unknown(f"{class_name}.{method} returns nothing")
    return value


def _run(statements: list[ast.stmt], scope: dict[str, object], p: _Platform, assumed: list[str],
         where: str) -> tuple[bool, object]:  # fmt: skip
    """A function body of assignments, ifs, asserts and returns, run over the platform predicates: (returned, the
    value). Anything else (a loop, a call for its effect) is not evaluated; an assert is taken to hold (vLLM's hold
    in a deployment that starts) and a logger call is passed over."""
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
            done, value = _run(s.body if _eval(s.test, p, scope, assumed) else s.orelse, scope, p, assumed, where)
            if done:
                return done, value
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            continue  # a docstring
        elif isinstance(s, ast.ImportFrom | ast.Import | ast.Pass | ast.Assert) or (isinstance(s, ast.Expr) and \
                isinstance(s.value, ast.Call) and ast.unparse(s.value.func).startswith("logger.")):  # fmt: skip
            continue
        else:
            raise _Unknown(f"{where}: {ast.unparse(s)[:60]}")
    return False, None


class _Function:
    """A module-level function of a release file, called from selection code: its body run by _run with its
    parameters bound (defaults that are constants too) and the file's own functions and the functions it imports
    from the release's other files callable in turn, MAX_CALL_DEPTH deep and MAX_CALLS in all (`calls`: the
    count left, shared by the functions one evaluation reaches)."""

    def __init__(self, files: ReleaseFiles, file: str, node: ast.FunctionDef, p: _Platform, assumed: list[str],
                 depth: int = 0, calls: list[int] | None = None) -> None:  # fmt: skip
        self.files, self.file, self.node, self.p, self.assumed, self.depth = files, file, node, p, assumed, depth
        self.calls = calls if calls is not None else [MAX_CALLS]

    @property
    def where(self) -> str:
        return f"{self.file.removeprefix('vllm/')}:{self.node.lineno}"

    def __call__(self, args: list[object], keywords: dict[str, object]) -> object:
        if self.depth >= MAX_CALL_DEPTH:
            raise _Unknown(f"calls nested deeper than {MAX_CALL_DEPTH} ({self.node.name})")
        if self.calls[0] <= 0:
            raise _Unknown(f"calls more than {MAX_CALLS} functions ({self.node.name})")
        self.calls[0] -= 1
        parameters = [a.arg for a in (*self.node.args.posonlyargs, *self.node.args.args)]
        if len(args) > len(parameters):
            raise _Unknown(f"{self.node.name}() given {len(args)} arguments")
        scope: dict[str, object] = functions_of(self.files, self.file, self.p, self.assumed, self.depth + 1,
                                                self.calls)  # fmt: skip
        defaults = self.node.args.defaults
        for name, default in zip(parameters[len(parameters) - len(defaults) :], defaults, strict=True):
            if isinstance(default, ast.Constant):
                scope[name] = default.value
        for name, keyword_default in zip((a.arg for a in self.node.args.kwonlyargs), self.node.args.kw_defaults,
                                         strict=True):  # fmt: skip
            if isinstance(keyword_default, ast.Constant):
                scope[name] = keyword_default.value
        scope.update(zip(parameters, args, strict=False))
        scope.update(keywords)
        missing = [name for name in parameters if name not in scope]
        if missing:
            raise _Unknown(f"{self.node.name}() without {missing[0]}")
        done, value = _run(self.node.body, scope, self.p, self.assumed, f"{self.where} {self.node.name}")
        if not done:
            raise _Unknown(f"{self.node.name}() returns nothing")
        return value


def functions_of(files: ReleaseFiles, file: str, p: _Platform, assumed: list[str],
                 depth: int = 0, calls: list[int] | None = None) -> dict[str, object]:  # fmt: skip
    """The functions code in `file` may call: the file's own module-level ones and those it imports by name from
    another file of the release (`from vllm.a.b import f`: vllm/a/b.py's f, where the release's files hold it)."""
    module = files.module(file)
    found: dict[str, object] = {}
    calls = calls if calls is not None else [MAX_CALLS]
    for node in module.body if module is not None else []:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = _Function(files, file, node, p, assumed, depth, calls)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm.") and not node.level:
            other_file = node.module.replace(".", "/") + ".py"
            other = files.module(other_file) if other_file != file else None
            for alias in node.names:
                defined = [n for n in other.body if isinstance(n, ast.FunctionDef) and n.name == alias.name] \
                    if other is not None else []  # fmt: skip
                target = defined[-1] if defined else None  # the last definition, as importing the module binds it
                if target is not None:
                    found[alias.asname or alias.name] = _Function(files, other_file, target, p, assumed, depth,
                                                                  calls)  # fmt: skip
    return found


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


# --- WNA16 (AWQ, GPTQ, compressed-tensors W4A16 / W8A16) MoE checkpoints ------------------------------------------

WNA16_ORACLE_FILE = "vllm/model_executor/layers/fused_moe/oracle/int_wna16.py"
QUANT_DIR = "vllm/model_executor/layers/quantization"
CT_DIR = f"{QUANT_DIR}/compressed_tensors"
MARLIN_UTILS_FILE = f"{QUANT_DIR}/utils/marlin_utils.py"
MOE_WNA16_FILE = f"{QUANT_DIR}/moe_wna16.py"
WNA16_SCHEMES = ("awq", "gptq", "wna16")
# vLLM's WNA16MoEBackend -> the experts family the layer model sizes (harness.sizing.layer EXPERTS_CLASSES)
WNA16_FAMILIES = {"MARLIN": "marlin", "BATCHED_MARLIN": "marlin", "TRITON": "triton"}
KERNEL_CALLS = ("fused_marlin_moe", "fused_experts")  # what a MoE method without the oracle runs in its apply()


@dataclass(frozen=True)
class Wna16Route:
    """Where a checkpoint format's MoE method is read: `callers`, the file whose get_quant_method builds it (the
    first the release has: auto_awq.py from 0.24.0, awq_marlin.py before); `methods`, where the method asks the
    oracle (select_wna16_moe_backend) or, before the oracle, runs its kernel; `fallback`, the method it builds where
    check_moe_marlin_supports_layer says Marlin cannot run the layer; `config`/`fallback_config`, the class of the
    quantization config those methods pass the oracle (its isinstance checks)."""

    callers: tuple[str, ...]
    methods: tuple[str, ...]
    fallback: tuple[str, ...]
    config: str
    fallback_config: str


WNA16_ROUTES = {
    "awq": Wna16Route((f"{QUANT_DIR}/auto_awq.py", f"{QUANT_DIR}/awq_marlin.py"),
                      (f"{QUANT_DIR}/auto_awq.py", f"{QUANT_DIR}/awq_marlin.py"), (MOE_WNA16_FILE,),
                      "AutoAWQConfig", "MoeWNA16Config"),
    "gptq": Wna16Route((f"{QUANT_DIR}/auto_gptq.py", f"{QUANT_DIR}/gptq_marlin.py"),
                       (f"{QUANT_DIR}/auto_gptq.py", f"{QUANT_DIR}/gptq_marlin.py"), (MOE_WNA16_FILE,),
                       "AutoGPTQConfig", "MoeWNA16Config"),
    "wna16": Wna16Route((f"{CT_DIR}/compressed_tensors_moe/compressed_tensors_moe.py",
                         f"{CT_DIR}/compressed_tensors_moe.py"),
                        (f"{CT_DIR}/compressed_tensors_moe/compressed_tensors_moe_wna16_marlin.py",
                         f"{CT_DIR}/compressed_tensors_moe/compressed_tensors_moe_wna16.py",
                         f"{CT_DIR}/compressed_tensors_moe.py"),
                        (f"{CT_DIR}/compressed_tensors_moe/compressed_tensors_moe_wna16.py",
                         f"{CT_DIR}/compressed_tensors_moe.py"),
                        "QuantizationArgs", "QuantizationArgs"),
}  # fmt: skip


@dataclass(frozen=True)
class Wna16Checkpoint:
    """What the WNA16 selection code reads of a checkpoint and its MoE layer (per GPU)."""

    scheme: str  # awq, gptq, wna16 (compressed-tensors pack-quantized)
    bits: int
    group_size: int  # -1: per channel
    symmetric: bool
    act_order: bool  # GPTQ desc_act, compressed-tensors actorder "group"
    hidden_size: int  # FusedMoEConfig.hidden_dim
    intermediate_size: int  # FusedMoEConfig.intermediate_size_per_partition_unpadded
    router_weight_on_input: bool = False  # the layer's apply_router_weight_on_input (Llama-4)


def wna16_checkpoint(facts, *, tp: int, dp: int, ep: bool) -> Wna16Checkpoint | None:
    """The model's routed experts as a WNA16 checkpoint, or None when they are not one (another format, or left
    unquantized by its ignore list)."""
    q = facts.quant
    if q is None or q.scheme not in WNA16_SCHEMES or not facts.is_moe:
        return None
    layer = facts.moe_layers[0] if facts.moe_layers else 0
    if not q.quantizes(f"model.layers.{layer}.mlp.experts", expert=True):
        return None
    return Wna16Checkpoint(scheme=q.scheme, bits=q.bits, group_size=q.group_size if q.group_size > 0 else -1,
                           symmetric=q.symmetric, act_order=q.act_order, hidden_size=facts.hidden_size,
                           intermediate_size=facts.moe_intermediate_size // (1 if ep else tp * dp),
                           router_weight_on_input=facts.architecture.startswith("Llama4"))  # fmt: skip


def _wna16_scope(ck: Wna16Checkpoint, config: str) -> dict[str, object]:
    """The names a WNA16 MoE method's code reads, as the checkpoint and the layer give them: the layer, its
    FusedMoEConfig, the quantization config (of class `config`) and the method's own `self`."""
    moe = _Obj("FusedMoEConfig", {"hidden_dim": ck.hidden_size, "moe_backend": "auto", "is_act_and_mul": True,
                                  "intermediate_size_per_partition_unpadded": ck.intermediate_size})  # fmt: skip
    by_config: dict[str, dict[str, object]] = {
        "AutoAWQConfig": {"group_size": ck.group_size, "zero_point": not ck.symmetric, "weight_bits": ck.bits},
        "AutoGPTQConfig": {"group_size": ck.group_size, "desc_act": ck.act_order, "is_sym": ck.symmetric,
                           "weight_bits": ck.bits},
        "QuantizationArgs": {"group_size": ck.group_size if ck.group_size > 0 else None, "num_bits": ck.bits,
                             "symmetric": ck.symmetric, "actorder": "group" if ck.act_order else None,
                             "strategy": "group" if ck.group_size > 0 else "channel"},
        "MoeWNA16Config": {"group_size": ck.group_size, "has_zp": not ck.symmetric, "weight_bits": ck.bits},
    }  # fmt: skip
    attributes = by_config[config]
    quant = _Obj(config, attributes)
    layer = _Obj("RoutedExperts", {"hidden_size": ck.hidden_size, "moe_config": moe,
                                   "intermediate_size_per_partition": ck.intermediate_size,
                                   "apply_router_weight_on_input": ck.router_weight_on_input})  # fmt: skip
    me = _Obj("self", {**attributes, "quant_config": quant, "weight_quant": quant, "moe": moe,
                       "symmetric": ck.symmetric, "num_bits": ck.bits})  # fmt: skip
    return {"self": me, "layer": layer, "moe": moe, "config": moe, "moe_config": moe, "quant_config": quant,
            "weight_quant": quant, "group_size": ck.group_size, "is_actorder": ck.act_order}  # fmt: skip


def _short(file: str) -> str:
    return file.removeprefix("vllm/model_executor/layers/")


def _first_call(module: ast.AST | None, *names: str) -> ast.Call | None:
    """The first call (in the file's order) of a function of one of these names, called by name or attribute."""
    calls = [n for n in ast.walk(module) if isinstance(n, ast.Call) and
             (n.func.id if isinstance(n.func, ast.Name) else n.func.attr if isinstance(n.func, ast.Attribute)
              else "") in names] if module is not None else []  # fmt: skip
    return min(calls, key=lambda c: (c.lineno, c.col_offset), default=None)


def _unread(text: str, assumed: list[str] | None = None) -> Pick:
    return Pick(None, None, None, text + (f"; assumed: {'; '.join(dict.fromkeys(assumed))}" if assumed else ""))


@per_release
def pick_wna16(files: ReleaseFiles, *, capability: int, ep_size: int, batched: bool, all2all: str,
               checkpoint: Wna16Checkpoint) -> Pick:  # fmt: skip
    """vLLM's experts class for a WNA16 MoE checkpoint on the GPU and layout, as the release's own code picks it:
    the format's get_quant_method (check_moe_marlin_supports_layer: the Marlin method or the MoeWNA16 fallback),
    then select_wna16_moe_backend (fused_moe/oracle/int_wna16.py: _get_priority_backends, each backend's
    _backend_incompatibility_reason where the release has it, backend_to_kernel_cls and each class's
    is_supported_config). A Pick without a family says why the selection was not read, or why what vLLM runs is no
    modular experts class (a release whose MoE methods call fused_marlin_moe themselves)."""
    route = WNA16_ROUTES[checkpoint.scheme]
    p = _Platform(capability=capability, ep_size=ep_size, batched=batched, weight_key=None, activation_key=None,
                  all2all=all2all)  # fmt: skip
    assumed: list[str] = []
    caller = next((f for f in route.callers if files.module(f) is not None), None)
    if caller is None:
        return _unread(f"the release's files hold none of {', '.join(_short(f) for f in route.callers)}")
    steps: list[str] = []
    methods, config = route.methods, route.config
    check = _first_call(files.module(caller), "check_moe_marlin_supports_layer")
    if check is not None:
        scope = {**functions_of(files, caller, p, assumed), **_wna16_scope(checkpoint, route.config)}
        where = f"{_short(caller)}:{check.lineno}"
        if not isinstance(scope.get("check_moe_marlin_supports_layer"), _Function):
            return _unread(f"{where} check_moe_marlin_supports_layer: its file ({_short(MARLIN_UTILS_FILE)}) is not "
                           "in this release's files")  # fmt: skip
        try:
            marlin = bool(_eval(check, p, scope, assumed))
        except _Unknown as error:
            return _unread(f"{where} check_moe_marlin_supports_layer not evaluated ({error})")
        steps.append(f"{where} check_moe_marlin_supports_layer: {marlin} for K={checkpoint.hidden_size}, "
                     f"I={checkpoint.intermediate_size}, group {checkpoint.group_size}")  # fmt: skip
        if not marlin:
            methods, config = route.fallback, route.fallback_config
    found = next(((f, c) for f in methods if (c := _first_call(files.module(f), "select_wna16_moe_backend"))), None)
    if found is None:
        kernel = next(((f, c) for f in (*methods, caller) if (c := _first_call(files.module(f), *KERNEL_CALLS))), None)
        runs = f" ({_short(kernel[0])}:{kernel[1].lineno} calls {ast.unparse(kernel[1].func)}())" if kernel else ""
        held = [_short(f) for f in methods if files.module(f) is not None]
        return _unread("; ".join([*steps, f"no select_wna16_moe_backend in {', '.join(held) or 'its files'}: "
                                  f"the MoE method runs its kernel in its own apply(){runs}, not a modular experts "
                                  "class"]))  # fmt: skip
    return _wna16_oracle(files, p, checkpoint, found, config, steps, assumed)


def _wna16_oracle(files: ReleaseFiles, p: _Platform, checkpoint: Wna16Checkpoint, found: tuple[str, ast.Call],
                  config: str, steps: list[str], assumed: list[str]) -> Pick:  # fmt: skip
    module = files.module(WNA16_ORACLE_FILE)
    oracle = _short(WNA16_ORACLE_FILE)
    functions = ("_get_priority_backends", "select_wna16_moe_backend", "backend_to_kernel_cls")
    priority, select, kernels = (_function(module, n) if module is not None else None for n in functions)
    if priority is None or select is None or kernels is None:
        return _unread(f"{oracle}: the release has no {' / '.join(functions)}", assumed)
    file, call = found
    caller = f"{_short(file)}:{call.lineno}"
    scope: dict[str, object] = {**functions_of(files, WNA16_ORACLE_FILE, p, assumed),
                                **_wna16_scope(checkpoint, config)}  # fmt: skip
    try:
        arguments = _bind(select, call, scope, p, assumed, caller)
        order = _priority(priority, p, assumed, "WNA16MoEBackend")
    except _Unknown as error:
        return _unread(f"{oracle}:{select.lineno} select_wna16_moe_backend (called at {caller}) not evaluated: "
                       f"{error}", assumed)  # fmt: skip
    classes = _kernel_classes(kernels, "WNA16MoEBackend")
    # the automatic choice: the loop over the priority list (an explicit --moe-backend takes another branch)
    loop = next((n for n in ast.walk(select) if isinstance(n, ast.For) and isinstance(n.target, ast.Name) and
                 _first_call(n, "backend_to_kernel_cls")), None)  # fmt: skip
    if loop is None or not isinstance(loop.target, ast.Name):
        return _unread(f"{oracle}:{select.lineno} select_wna16_moe_backend has no loop over the backends", assumed)
    variable = loop.target.id
    reason_call = _first_call(loop, "_backend_incompatibility_reason")
    passed: list[str] = []
    for backend in order:
        if reason_call is not None:
            try:
                why = _eval(reason_call, p, {**scope, **arguments, variable: backend}, assumed)
            except _Unknown as error:
                return _unread(f"{oracle}:{reason_call.lineno} _backend_incompatibility_reason({backend}) not "
                               f"evaluated ({error}); passed: {'; '.join(passed) or '-'}", assumed)  # fmt: skip
            if why is not None:
                passed.append(f"{backend} ({why})")
                continue
        for cls in classes.get(backend, []):
            supported, why = _wna16_supports(files, cls, p, arguments.get("weight_key"), caller, assumed)
            if supported is None:
                return _unread(f"{oracle}:{select.lineno} select_wna16_moe_backend: {backend} {cls} not evaluated "
                               f"({why}); passed: {'; '.join(passed) or '-'}", assumed)  # fmt: skip
            if supported:
                logged = _logged(module, select, backend)  # type: ignore[arg-type]
                text = (f"{oracle}:{select.lineno} select_wna16_moe_backend (called at {caller}): vLLM picks "
                        f"{backend} ({cls}) in the order {', '.join(order[:order.index(backend) + 1])}")  # fmt: skip
                text += f', logging "{logged}"' if logged else ""
                text += "".join(f"; {step}" for step in steps)
                text += f"; passed: {'; '.join(passed)}" if passed else ""
                text += f"; assumed: {'; '.join(dict.fromkeys(assumed))}" if assumed else ""
                return Pick(backend, cls, WNA16_FAMILIES.get(backend), text, tuple(order), logged)
            passed.append(f"{backend} {cls} ({why})")
    return _unread(f"{oracle}:{select.lineno} select_wna16_moe_backend: no backend found; passed "
                   f"{'; '.join(passed)}", assumed)  # fmt: skip


def _bind(select: ast.FunctionDef, call: ast.Call, scope: dict[str, object], p: _Platform, assumed: list[str],
          caller: str) -> dict[str, object]:  # fmt: skip
    """select_wna16_moe_backend's parameters as the method's call passes them, evaluated over the checkpoint (the
    parameter's default where the call leaves it out). The weight key is a QuantKey constant's name where the call
    names one (kInt4Static); one the method builds (QuantKey(quant_type, scale)) is None, named in `assumed`."""
    parameters = [a.arg for a in select.args.args]
    given = dict(zip(parameters, call.args, strict=False))
    given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
    defaults = dict(zip(parameters[len(parameters) - len(select.args.defaults) :], select.args.defaults, strict=True))
    bound: dict[str, object] = {}
    for name in parameters:
        node = given.get(name, defaults.get(name))
        if node is None:
            raise _Unknown(f"the call at {caller} gives no {name}")
        if name == "weight_key":
            key = node.id if isinstance(node, ast.Name) and node.id.startswith("k") and node.id[1:2].isupper() else None
            bound[name] = key
            if key is None:
                assumed.append(f"the weight key {ast.unparse(node)} ({caller}) is built by the method, not read: "
                               "each class's _supports_quant_scheme taken as supported")  # fmt: skip
        elif name in ("config", "moe_config", "moe"):
            bound[name] = scope["moe"]
        else:
            bound[name] = _eval(node, p, scope, assumed)
    return bound


def _wna16_supports(files: ReleaseFiles, cls: str, p: _Platform, weight_key: object, caller: str,
                    assumed: list[str]) -> tuple[bool | None, str]:  # fmt: skip
    """is_supported_config of one class for the layout (modular_kernel.py FusedMoEExperts): the activation format,
    the device, the activation (SiLU), the weight key with a bf16 activation, the parallel config. False when one
    check is False (it is a conjunction); None when the format or the device is not evaluated; a quantization,
    activation or parallel check that is not evaluated is taken as holding and named."""
    wanted = "BatchedExperts" if p.batched else "Standard"
    checks: list[tuple[str, str, dict[str, object], bool]] = [
        ("_supports_current_device", "not on this GPU", {}, False),
        ("_supports_activation", "not the SiLU activation", {"activation": "SILU"}, False),
        ("_supports_quant_scheme", "not this weight key", {"weight_key": weight_key, "activation_key": None},
         weight_key is None),
        ("_supports_parallel_config", "not this parallel config", {}, False),
    ]  # fmt: skip
    unknown: list[str] = []
    try:
        form = _activation_format(files, cls)
        if form != wanted:
            return False, f"{form} format"
    except _Unknown as error:
        unknown.append(f"activation_format: {error}")
    for method, why, names, skip in checks:
        if skip:
            continue
        try:
            if not _method_value(files, cls, method, p, names, assumed):
                return False, why
        except _Unknown as error:
            if method == "_supports_current_device":
                unknown.append(f"{method}: {error}")
            else:
                assumed.append(f"{cls}.{method} taken as supported ({error})")
    if unknown:
        return None, "; ".join(unknown)
    return True, ""


def _logged(module: ast.Module, select: ast.FunctionDef, backend: str) -> str:
    """The line select_wna16_moe_backend logs for its pick: its _make_log_backend's f-string with the backend's
    value (the WNA16MoEBackend member's, read from the enum); "" where the release writes it otherwise."""
    maker = next((n for n in ast.walk(select) if isinstance(n, ast.FunctionDef) and n.name == "_make_log_backend"),
                 None)  # fmt: skip
    returned = next((n.value for n in ast.walk(maker) if isinstance(n, ast.Return)), None) if maker else None
    enum = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "WNA16MoEBackend"), None)
    values = {t.id: a.value.value for a in (enum.body if enum else []) if isinstance(a, ast.Assign)
              and isinstance(a.value, ast.Constant) for t in a.targets if isinstance(t, ast.Name)}  # fmt: skip
    if not isinstance(returned, ast.JoinedStr) or backend not in values:
        return ""
    parts = []
    for value in returned.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue) and ast.unparse(value.value) == "backend.value":
            parts.append(str(values[backend]))
        else:
            return ""
    return "".join(parts)


def default_backend(facts, files: ReleaseFiles | None, *, gpu, tp: int, dp: int, ep: bool, all2all: str,
                    fallback: Default) -> Default:  # fmt: skip
    """The `moe_backend` default of a deployment: what the release's selection picks for an FP8 or a WNA16 (AWQ,
    GPTQ, compressed-tensors W4A16) MoE checkpoint on the GPU (a harness.sizing.gpus row, or None: compute capability
    9.0 assumed); `fallback` (the table's family) for an unquantized model, a release without the oracle or no
    release at hand, and, named, where vLLM's pick is one the plan does not size or its selection is not read."""
    from harness.sizing.release_defaults import uses_batched_dp_moe

    checkpoint = wna16_checkpoint(facts, tp=tp, dp=dp, ep=ep)
    if files is None or (facts.quant_method != "fp8" and checkpoint is None) or not facts.is_moe:
        return fallback
    major, minor = gpu.capability if gpu is not None else (9, 0)
    where = f"{gpu.name if gpu is not None else 'GPU'}: compute capability {major}.{minor}" + \
        ("" if gpu is not None else " assumed")  # fmt: skip
    if checkpoint is not None:
        batched = uses_batched_dp_moe(all2all, ep, dp)
        wna16 = pick_wna16(files, capability=major * 10 + minor, ep_size=tp * dp if ep else 1, all2all=all2all,
                           batched=batched, checkpoint=checkpoint)  # fmt: skip
        if wna16.family is not None:
            return Default(wna16.family, f"{wna16.source} ({where})")
        kept = fallback.value if fallback.value != "triton" else "the batched Triton experts (BatchedTritonExperts)" \
            if batched else "the Triton WNA16 experts (TritonWNA16Experts)"  # fmt: skip
        why = f"vLLM's pick {wna16.experts_class} is not sized by the plan; {wna16.source}" if wna16.experts_class \
            else f"vLLM's experts class is not read: {wna16.source}"  # fmt: skip
        return Default(fallback.value, f"table: {kept} ({why}; {where})")
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
