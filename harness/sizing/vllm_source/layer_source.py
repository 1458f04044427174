"""Read, from a release's own files, what sizes the EP MoE layer's buffers: without importing or exec'ing vLLM.

    vllm/envs.py                                   VLLM_DEEPEP_BUFFER_SIZE_MB's default (os.getenv(NAME, "1024"))
    fused_moe/layer.py                             FusedMoEConfig(num_experts=...): do redundant experts count?
    fused_moe/all2all_utils.py                     the `all_to_all_args` of the DeepEP low-latency branch, the
                                                   DeepEPLLPrepareAndFinalize(...) arguments, use_fp8_dispatch
    distributed/device_communicators/all2all.py    DeepEP{LL,HT}All2AllManager._make_all2all_kwargs: the Buffer's
                                                   num_nvl_bytes and num_rdma_bytes (DeepEP's size hint)
    fused_moe/prepare_finalize/deepep_ll.py        the low_latency_dispatch call
    an experts class's apply()                     the views it takes of workspace13 / workspace2: its live set

Each value comes back as a Read: the value, or None with the reason, and the file and line it came from. The
expressions run in harness.sizing.vllm_source.interpreter (the audit's AST interpreter, budgeted): an expression
is wrapped as `def <expression>(names...): return EXPR` in its own file's module scope, so the release's module
functions and constants resolve as they would in vLLM.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import math
import sys
from collections.abc import Callable, Hashable, Iterator
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard, TypeVar

from harness.sizing.vllm_source.evaluate import ParsedClass, SourceTree, source_tree
from harness.sizing.vllm_source.interpreter import (
    Builtin,
    Function,
    Interpreter,
    StandIn,
    Unevaluable,
    forget_function,
)
from harness.sizing.vllm_source.sources import FUSED_MOE_DIR, VllmSource

ENVS_FILE = "vllm/envs.py"
ALL2ALL_FILE = "vllm/distributed/device_communicators/all2all.py"
LAYER_FILE = f"{FUSED_MOE_DIR}/layer.py"
MAX_FILE_BYTES = 4 * 2**20  # the largest of these files is ~150 KB; a bigger one is not what we think it is

LL_MANAGER = "DeepEPLLAll2AllManager"
HT_MANAGER = "DeepEPHTAll2AllManager"
LL_PREPARE_FINALIZE = "DeepEPLLPrepareAndFinalize"
BUFFER_ENV = "VLLM_DEEPEP_BUFFER_SIZE_MB"


@dataclass(frozen=True)
class SourceRef:
    """Where a value was read: a file below vllm/, a line, and the expression as written."""

    file: str
    line: int
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Read:
    """One value read from a release, or why it could not be."""

    value: object
    ref: SourceRef | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason

    @staticmethod
    def failed(reason: str, ref: SourceRef | None = None) -> Read:
        return Read(value=None, ref=ref, reason=reason)


class ReleaseFiles:
    """The parsed files of one VllmSource, each parsed once; a file that is absent or unreadable is None."""

    def __init__(self, source: VllmSource, tree: SourceTree | None = None) -> None:
        self.source = source
        self._parsed: dict[str, ast.Module | None] = {}
        self._tree = tree
        self._reads: dict[tuple, object] = {}  # per_release: what was read once, by function and arguments

    @property
    def tree(self) -> SourceTree:
        """The fused-MoE package as the interpreter's program (module bindings, classes, MROs)."""
        if self._tree is None:
            self._tree = source_tree(self.source)  # the process's one parse of a release (evaluate.source_tree)
        return self._tree

    def module(self, file: str) -> ast.Module | None:
        """A file's AST: the tree's own parse for fused_moe/ files, else parsed here (regular files, size cap)."""
        parsed = self.tree.modules.get(file)
        if parsed is not None:
            return parsed.tree
        if file not in self._parsed:
            self._parsed[file] = _parse(self.source.root / file)
        return self._parsed[file]

    def fused_moe_files(self) -> list[str]:
        key = ("fused_moe_files",)
        if key not in self._reads:
            directory = self.source.root / FUSED_MOE_DIR
            self._reads[key] = sorted(p.relative_to(self.source.root).as_posix() for p in directory.rglob("*.py"))
        return list(self._reads[key])  # type: ignore[call-overload]

    def find_class(self, name: str, files: list[str] | None = None) -> tuple[str, ast.ClassDef] | None:
        for file in files if files is not None else [*self.fused_moe_files(), ALL2ALL_FILE]:
            module = self.module(file)
            for node in module.body if module is not None else []:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    return file, node
        return None


def release_files(source: VllmSource) -> ReleaseFiles:
    """The parsed files of a source, with what was read of them (per_release): one per process for what cannot change
    (a release or wheel extraction, as evaluate.source_tree keeps its tree), so plans of the same release (a layout
    search, a matrix, `harness plan` over several serve lines) parse each file once; a new one for a tree users edit."""
    if source.kind in ("release", "wheel"):
        return _shared_release_files(source)
    return ReleaseFiles(source, source_tree(source))


@functools.lru_cache(maxsize=8)
def _shared_release_files(source: VllmSource) -> ReleaseFiles:
    return ReleaseFiles(source)


_Read = TypeVar("_Read")


def per_release(function: Callable[..., _Read]) -> Callable[..., _Read]:
    """Read once per ReleaseFiles: a release's files do not change, so a read of the same arguments gives the same
    value (a layout search asks each of them for hundreds of layouts)."""

    @functools.wraps(function)
    def once(files: ReleaseFiles, *args: Hashable, **kwargs: Hashable) -> _Read:
        key = (function.__name__, args, tuple(sorted(kwargs.items())))
        if key not in files._reads:
            files._reads[key] = function(files, *args, **kwargs)
        return files._reads[key]  # type: ignore[return-value]

    return once


def _parse(path: Path) -> ast.Module | None:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return None


def ref(file: str, node: ast.AST) -> SourceRef:
    code = ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__
    return SourceRef(file=file.removeprefix("vllm/"), line=getattr(node, "lineno", 0), code=_shorten(code))


def _shorten(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _walk_calls(node: ast.AST) -> Iterator[ast.Call]:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            yield inner


def _mentions(node: ast.AST, *, name: str | None = None, attr: str | None = None) -> bool:
    for inner in ast.walk(node):
        if name is not None and isinstance(inner, ast.Name) and inner.id == name:
            return True
        if attr is not None and isinstance(inner, ast.Attribute) and inner.attr == attr:
            return True
    return False


def run_expression(
    files: ReleaseFiles,
    file: str,
    expression: ast.expr,
    names: dict[str, object],
    *,
    self_of: tuple[ParsedClass, dict[str, object]] | None = None,
) -> object:
    """expression's value in file's module scope with `names` bound (and `self` an instance of a parsed class
    carrying the given attributes); raises Unevaluable with the reason."""
    interpreter = Interpreter(files.tree)
    bound = dict(names)
    if self_of is not None:
        bound["self"] = interpreter.instance(self_of[0], self_of[1])
    arguments = ast.arguments(posonlyargs=[], args=[ast.arg(arg=name) for name in bound], vararg=None,
                              kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])  # fmt: skip
    node = ast.FunctionDef(name="<expression>", args=arguments, body=[ast.Return(value=expression)],
                           decorator_list=[], returns=None)  # fmt: skip
    if sys.version_info >= (3, 12):
        node.type_params = []
    ast.fix_missing_locations(ast.copy_location(node, expression))
    try:
        return interpreter.call(Function(file, node), (), bound)
    except RecursionError:
        raise Unevaluable("nests deeper than Python's own stack allows") from None
    finally:
        forget_function(node)  # made for this call: the interpreter's cache need not keep it


# --- envs.py --------------------------------------------------------------------------------------------------------


@per_release
def env_default(files: ReleaseFiles, name: str) -> Read:
    """The default an env var takes in this release: the literal second argument of os.getenv(NAME, ...)."""
    module = files.module(ENVS_FILE)
    if module is None:
        return Read.failed(f"the release has no readable {ENVS_FILE}")
    for call in _walk_calls(module):
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "getenv" and len(call.args) >= 2:
            key, default = call.args[0], call.args[1]
            if isinstance(key, ast.Constant) and key.value == name:
                if isinstance(default, ast.Constant) and isinstance(default.value, str):
                    try:
                        return Read(value=int(default.value), ref=ref(ENVS_FILE, call))
                    except ValueError:
                        why = f"{name}'s default {default.value!r} is not an integer"
                        return Read.failed(why, ref(ENVS_FILE, call))
                return Read.failed(f"{name}'s default is not a literal", ref(ENVS_FILE, call))
    return Read.failed(f"{ENVS_FILE} does not read {name} with os.getenv")


# --- layer.py: what FusedMoEConfig.num_experts is -------------------------------------------------------------------


@per_release
def moe_num_experts(files: ReleaseFiles, *, num_routed_experts: int, num_redundant_experts: int) -> Read:
    """The value layer.py passes as FusedMoEConfig(num_experts=...) for a model of num_routed_experts with EPLB's
    num_redundant_experts: followed back through the assignments of the building function (and one helper call)."""
    module = files.module(LAYER_FILE)
    if module is None:
        return Read.failed(f"the release has no readable {LAYER_FILE}")
    parents = _parents(module)
    for call in _walk_calls(module):
        if not _mentions(call.func, name="FusedMoEConfig"):
            continue
        keyword = next((k for k in call.keywords if k.arg == "num_experts"), None)
        if keyword is None:
            continue
        function = _enclosing_function(call, parents)
        where = ref(LAYER_FILE, keyword.value)
        names: dict[str, object] = {
            "num_experts": num_routed_experts,
            "num_redundant_experts": num_redundant_experts,
            "n_shared_experts": None,
            "fuse_shared_experts": False,
        }
        try:
            value = _slice_value(files, keyword.value, call.lineno, function, parents, names)
        except Unevaluable as error:
            return Read.failed(f"FusedMoEConfig(num_experts={where.code}) {error}", where)
        return Read(value=value, ref=where)
    return Read.failed(f"{LAYER_FILE} builds no FusedMoEConfig(num_experts=...)")


def _parents(module: ast.Module) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(module) for child in ast.iter_child_nodes(parent)}


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.FunctionDef | None:
    current = parents.get(node)
    while current is not None and not isinstance(current, ast.FunctionDef):
        current = parents.get(current)
    return current


def _slice_value(
    files: ReleaseFiles,
    expression: ast.expr,
    before_line: int,
    function: ast.FunctionDef | None,
    parents: dict[ast.AST, ast.AST],
    names: dict[str, object],
    depth: int = 0,
) -> object:
    """Evaluate expression, binding each free name (or self.attr) to the value of its last assignment before
    before_line in the function (or anywhere in the class for self.attr), recursively. A name unpacked from a
    module-level helper's tuple (`a, b, c = determine_expert_counts(...)`) is followed into that helper's return
    expression, with its parameters bound to the call's arguments: only what the value depends on is read."""
    if depth > 8:
        raise Unevaluable("follows assignments more than 8 deep")
    scope = dict(names)
    self_attributes: dict[str, object] = {}
    for inner in ast.walk(expression):
        if isinstance(inner, ast.Name) and inner.id not in scope and function is not None:
            assignment = _last_assignment(function, inner.id, before_line)
            if assignment is not None:
                target, value = assignment
                helper = _helper_element(files, target, value, inner.id)
                if helper is not None:
                    scope[inner.id] = _slice_helper(files, helper, value, function, parents, names, depth)
                    continue
                result = _slice_value(files, value, value.lineno, function, parents, names, depth + 1)
                scope.update(_unpack(target, result, inner.id))
        elif _is_self_attribute(inner) and function is not None:
            cls = parents.get(function)
            in_class = _self_assignment(cls, inner.attr) if isinstance(cls, ast.ClassDef) else None
            if in_class is not None:
                owner, value = in_class
                self_attributes[inner.attr] = _slice_value(files, value, value.lineno, owner, parents, names,
                                                           depth + 1)  # fmt: skip
    if self_attributes:
        scope["self"] = StandIn("self", **self_attributes)
    return run_expression(files, LAYER_FILE, expression, scope)


def _helper_element(files: ReleaseFiles, target: ast.expr, value: ast.expr,
                    name: str) -> tuple[ast.FunctionDef, ast.expr] | None:  # fmt: skip
    """(helper, the expression it returns at name's position) for `..., name, ... = helper(...)`, where helper is
    a module-level function of layer.py with a single `return (tuple)`; None otherwise."""
    if not (isinstance(target, ast.Tuple) and isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return None
    module = files.module(LAYER_FILE)
    helper = next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == value.func.id), None) \
        if module is not None else None  # fmt: skip
    if helper is None:
        return None
    returns = [n for n in ast.walk(helper) if isinstance(n, ast.Return)]
    position = next((i for i, e in enumerate(target.elts) if isinstance(e, ast.Name) and e.id == name), None)
    if len(returns) != 1 or not isinstance(returns[0].value, ast.Tuple) or position is None:
        return None
    elements = returns[0].value.elts
    return (helper, elements[position]) if len(elements) == len(target.elts) else None


def _slice_helper(files: ReleaseFiles, helper: tuple[ast.FunctionDef, ast.expr], call: ast.expr,
                  caller: ast.FunctionDef | None, parents: dict[ast.AST, ast.AST], names: dict[str, object],
                  depth: int) -> object:  # fmt: skip
    function, element = helper
    assert isinstance(call, ast.Call)
    params = [a.arg for a in function.args.args]
    arguments = dict(zip(params, call.args, strict=False)) | {k.arg: k.value for k in call.keywords if k.arg}
    bound: dict[str, object] = {}
    free = {n.id for n in ast.walk(element) if isinstance(n, ast.Name)}
    needed = set(free)
    for inner in ast.walk(function):  # the helper's own assignments to those names may need more parameters
        if isinstance(inner, ast.Assign) and any(_binds(t, n) for t in inner.targets for n in free):
            needed |= {n.id for n in ast.walk(inner.value) if isinstance(n, ast.Name)}
    for param in needed & set(arguments):
        bound[param] = _slice_value(files, arguments[param], call.lineno, caller, parents, names, depth + 1)
    return _slice_value(files, element, element.lineno, function, parents, bound, depth + 1)


def _is_self_attribute(node: ast.AST) -> TypeGuard[ast.Attribute]:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _last_assignment(function: ast.FunctionDef, name: str, before_line: int) -> tuple[ast.expr, ast.expr] | None:
    found = None
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and node.lineno < before_line:
            for target in node.targets:
                if _binds(target, name) and (found is None or node.lineno > found[1].lineno):
                    found = (target, node.value)
    return found


def _binds(target: ast.expr, name: str) -> bool:
    if isinstance(target, ast.Name):
        return target.id == name
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_binds(element, name) for element in target.elts)
    return False


def _unpack(target: ast.expr, value: object, name: str) -> dict[str, object]:
    if isinstance(target, ast.Name):
        return {target.id: value}
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, tuple) and len(value) == len(target.elts):
        out: dict[str, object] = {}
        for element, item in zip(target.elts, value, strict=False):
            if _binds(element, name):
                out.update(_unpack(element, item, name))
        return out
    raise Unevaluable(f"cannot unpack the value of {name!r} at line {target.lineno}")


def _self_assignment(cls: ast.ClassDef, attr: str) -> tuple[ast.FunctionDef, ast.expr] | None:
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(method):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if _is_self_attribute(target) and target.attr == attr:
                        return method, node.value
    return None


# --- the DeepEP low-latency branch of the prepare/finalize factory --------------------------------------------------


@dataclass(frozen=True)
class Branch:
    """The factory's `elif moe.use_deepep_ll_kernels:` branch: where it is and what it passes."""

    file: str
    node: ast.If
    handle_args: dict[str, ast.expr]  # the all_to_all_args keywords
    prepare_finalize_args: dict[str, ast.expr]  # DeepEPLLPrepareAndFinalize(...) keywords
    use_fp8_dispatch: ast.expr | None


@per_release
def deepep_ll_branch(files: ReleaseFiles) -> Branch | None:
    """The first branch in fused_moe/ whose test reads `.use_deepep_ll_kernels` and that builds all_to_all_args."""
    for file in files.fused_moe_files():
        module = files.module(file)
        if module is None:
            continue
        for node in ast.walk(module):
            if isinstance(node, ast.If) and _mentions(node.test, attr="use_deepep_ll_kernels"):
                branch = _branch(file, node)
                if branch is not None:
                    return branch
    return None


def _branch(file: str, node: ast.If) -> Branch | None:
    handle_args: dict[str, ast.expr] = {}
    prepare_finalize_args: dict[str, ast.expr] = {}
    use_fp8: ast.expr | None = None
    for statement in node.body:
        for inner in ast.walk(statement):
            if (
                isinstance(inner, ast.Assign)
                and any(_binds(t, "all_to_all_args") for t in inner.targets)
                and isinstance(inner.value, ast.Call)
                and _mentions(inner.value.func, name="dict")
            ):
                handle_args = {k.arg: k.value for k in inner.value.keywords if k.arg}
            if isinstance(inner, ast.Assign) and any(_binds(t, "use_fp8_dispatch") for t in inner.targets):
                use_fp8 = inner.value
            if isinstance(inner, ast.Call) and _mentions(inner.func, name=LL_PREPARE_FINALIZE):
                prepare_finalize_args = {k.arg: k.value for k in inner.keywords if k.arg}
    if not handle_args:
        return None
    return Branch(file, node, handle_args, prepare_finalize_args, use_fp8)


def module_constant(files: ReleaseFiles, file_suffix: str, name: str) -> object:
    """A module-level value of the fused_moe file ending in file_suffix, as the interpreter evaluates it;
    Unevaluable when absent or computed outside the subset."""
    for file in files.fused_moe_files():
        if file.endswith(file_suffix) and files.tree.global_binding(file, name) is not None:
            return Interpreter(files.tree).global_value(file, name)
    raise Unevaluable(f"no module-level {name} in fused_moe/**/{file_suffix}")


def evaluate_in(files: ReleaseFiles, file: str, expression: ast.expr, names: dict[str, object]) -> Read:
    where = ref(file, expression)
    try:
        return Read(value=run_expression(files, file, expression, names), ref=where)
    except Unevaluable as error:
        return Read.failed(f"{where.code}: {error}", where)


# --- all2all.py: the managers' Buffer arguments ---------------------------------------------------------------------


@dataclass
class ManagerKwargs:
    """What DeepEP{LL,HT}All2AllManager._make_all2all_kwargs returns, run on stand-ins, and where it is."""

    ref: SourceRef | None
    kwargs: dict[str, object] = field(default_factory=dict)
    size_hint_calls: list[dict[str, object]] = field(default_factory=list)  # arguments vLLM passed DeepEP
    reason: str = ""


def manager_kwargs(
    files: ReleaseFiles,
    manager: str,
    *,
    arguments: dict[str, object],
    self_attributes: dict[str, object],
    env_values: dict[str, object],
    size_hint: Callable[..., int],
) -> ManagerKwargs:
    """Run the manager's own _make_all2all_kwargs on stand-ins. Its `import deep_ep` is dropped and `deep_ep` and
    `envs` become parameters: DeepEP's size hint is the harness's formula (recording vLLM's arguments), envs holds
    env_values."""
    found = files.find_class(manager, [ALL2ALL_FILE])
    if found is None:
        return ManagerKwargs(ref=None, reason=f"{ALL2ALL_FILE} has no class {manager}")
    file, cls = found
    method = _method(cls, "_make_all2all_kwargs")
    if method is None:
        return ManagerKwargs(ref=None, reason=f"{manager} has no _make_all2all_kwargs in {file}")
    where = SourceRef(file=file.removeprefix("vllm/"), line=method.lineno, code=f"{manager}._make_all2all_kwargs")
    calls: list[dict[str, object]] = []

    def hint(interpreter: object, **kwargs: object) -> int:
        calls.append(dict(kwargs))
        return size_hint(**kwargs)

    buffer = StandIn("deep_ep.Buffer", get_low_latency_rdma_size_hint=Builtin("get_low_latency_rdma_size_hint", hint))
    if not method.args.args:
        return ManagerKwargs(ref=where, reason=f"{manager}._make_all2all_kwargs takes no self")
    self_name = method.args.args[0].arg
    bound = {**arguments, self_name: StandIn(f"{manager} self", **self_attributes),
             "deep_ep": StandIn("deep_ep", Buffer=buffer), "envs": StandIn("envs", **env_values)}  # fmt: skip
    try:
        function = _with_standin_modules(method, ("deep_ep", "envs"))
        result = Interpreter(files.tree).call(Function(file, function), (), bound)
    except (Unevaluable, RecursionError) as error:
        return ManagerKwargs(ref=where, reason=f"{manager}._make_all2all_kwargs {error}")
    if not isinstance(result, dict):
        return ManagerKwargs(ref=where, reason=f"{manager}._make_all2all_kwargs returned {type(result).__name__}")
    return ManagerKwargs(ref=where, kwargs=result, size_hint_calls=calls)


@functools.lru_cache(maxsize=64)  # one copy per manager method (a parsed tree's node: kept as long as the tree)
def _with_standin_modules(method: ast.FunctionDef, modules: tuple[str, ...]) -> ast.FunctionDef:
    """A copy of method whose imports of `modules` are gone and which takes them as keyword-only parameters."""
    copy = deepcopy(method)
    copy.body = [
        statement for statement in copy.body
        if not (isinstance(statement, ast.Import) and all(a.name in modules and not a.asname for a in statement.names))
    ] or [ast.Pass()]  # fmt: skip
    copy.args.kwonlyargs += [ast.arg(arg=name) for name in modules]
    copy.args.kw_defaults += [None for _ in modules]
    return ast.fix_missing_locations(copy)


def dispatch_call(files: ReleaseFiles) -> SourceRef | None:
    """The low_latency_dispatch call of DeepEPLLPrepareAndFinalize, for the dispatch output's source."""
    found = files.find_class(LL_PREPARE_FINALIZE)
    if found is None:
        return None
    file, cls = found
    for call in _walk_calls(cls):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "low_latency_dispatch":
            return ref(file, call)
    return None


def quant_call(files: ReleaseFiles) -> SourceRef | None:
    """Where DeepEPLLPrepareAndFinalize quantizes a bf16 receive into the experts' dtype (moe_kernel_quantize_input)."""
    found = files.find_class(LL_PREPARE_FINALIZE)
    if found is None:
        return None
    file, cls = found
    for call in _walk_calls(cls):
        if _mentions(call.func, name="moe_kernel_quantize_input"):
            return ref(file, call)
    return None


# --- an experts class's live set: the views apply() takes of its workspaces -----------------------------------------


@dataclass(frozen=True)
class View:
    buffer: str  # "workspace13" or "workspace2"
    shape: tuple[int, ...]
    ref: SourceRef

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class LiveSet:
    """The views an experts class's apply() takes of its two workspace buffers, and the ones not evaluated."""

    views: tuple[View, ...]
    unevaluated: tuple[str, ...]

    def needed_elements(self, buffer: str) -> int:
        return max((v.num_elements for v in self.views if v.buffer == buffer), default=0)


WORKSPACE_PARAMS = ("workspace13", "workspace2")


def apply_views(
    files: ReleaseFiles, cls: ParsedClass, names: dict[str, object], self_attributes: dict[str, object]
) -> LiveSet:
    """Evaluate every `_resize_cache(workspace13|workspace2, shape)` in the apply() that cls resolves to, with
    `names` bound for the shapes' letters, apply's own straight-line assignments, and `self` an instance of cls."""
    found = files.tree.find_method(cls, "apply")
    if found is None:
        return LiveSet((), ("no apply method",))
    owner, function = found
    scope = dict(names)
    views: list[View] = []
    unevaluated: list[str] = []
    self_of = (cls, self_attributes)
    # apply's own assignments (cache2_dim = self.adjust_N_for_activation(N, activation), ...) bind names the
    # views use; one that needs a tensor simply stays unbound.
    assignments = sorted((n for n in ast.walk(function) if isinstance(n, ast.Assign)), key=lambda n: n.lineno)
    for statement in assignments:
        target = statement.targets[0] if len(statement.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id not in names:
            with contextlib.suppress(Unevaluable):
                scope[target.id] = run_expression(files, owner.file, statement.value, scope, self_of=self_of)
    for call in _walk_calls(function):
        if not (_mentions(call.func, name="_resize_cache") and len(call.args) == 2):
            continue
        buffer = call.args[0]
        if not (isinstance(buffer, ast.Name) and buffer.id in WORKSPACE_PARAMS):
            continue
        where = ref(owner.file, call)
        try:
            shape = run_expression(files, owner.file, call.args[1], scope, self_of=self_of)
        except Unevaluable as error:
            unevaluated.append(f"{where}: {error}")
            continue
        if not (isinstance(shape, tuple) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
            unevaluated.append(f"{where}: the view's shape is {shape!r}")
            continue
        views.append(View(buffer=buffer.id, shape=shape, ref=where))
    return LiveSet(tuple(views), tuple(unevaluated))
