"""The live set of a batched-experts class: the views its apply() takes of workspace13 and workspace2.

    cls.apply(output, hidden_states, w1, w2, ..., workspace13, workspace2, ...)
        --Tracer walks the AST statement by statement--> every `_resize_cache(workspaceX[.view(dtype)], shape)`
        that the method, or a parsed helper it hands the workspace to, takes; each view needs prod(shape) elements
        of the buffer's dtype from the buffer's start (vLLM's own `_resize_cache` asserts exactly that).

The tracer is the interpreter of interpreter.py in a tolerant mode: what it cannot follow (a kernel launch, a
torch call, a flag only known on a GPU) becomes an opaque value, a statement that needs one is skipped and the
names it binds become unknown, and a condition it cannot decide has both branches traced with their views marked
undecided. Nothing is guessed into a view: a shape that depends on an unknown value is not recorded, and a whole
workspace handed to code the tracer cannot follow (a library kernel that sizes its own scratch) makes that buffer's
live set "not derived". A `raise` or a failed `assert` on a decided path is the class refusing the point.

    trace_apply(program, cls, attributes, arguments)  -> ViewTrace (views, escapes, refusal)
    trace_constructor(program, cls, attributes, kwargs) -> the refusal of __init__, or None
    trace_to_assert(program, cls, attributes, kwargs, assert, operand) -> the operand's value at an assert of
        __init__ that is reached on a decided path, the refusal met before it, or why neither
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from harness.sizing.vllm_source.interpreter import (
    _STATEMENTS,
    DEFAULT_BUDGET,
    FORMAT_ENUM_STANDIN,
    AssertFailed,
    BoundMethod,
    Budget,
    Builtin,
    ClassObject,
    DType,
    FakeTensor,
    Function,
    Instance,
    Interpreter,
    MissingAttribute,
    Program,
    StandIn,
    SuperProxy,
    Unevaluable,
)

RESIZE_HELPER = "_resize_cache"
_MISSING = object()
SHAPE_ATTRIBUTES = frozenset({"shape", "size", "dtype", "ndim", "dim", "numel"})  # read a buffer, use none of it
WORKSPACES = ("workspace13", "workspace2")


class Opaque(StandIn):
    """Something the tracer cannot follow (a kernel, a torch call, a platform flag): it can be passed along and
    called, never computed with."""


class WorkspaceTensor(FakeTensor):
    """A workspace buffer (whole) or a view of it, in the dtype it is viewed in."""

    def __init__(self, buffer: str, shape: tuple[int, ...], dtype: DType, *, whole: bool) -> None:
        super().__init__(shape, dtype)
        self.buffer = buffer
        self.whole = whole


_T = TypeVar("_T")


class TokenCounts(FakeTensor):
    """expert_tokens_meta.expert_num_tokens: (E,) counts, each at most `bound` (the M slots an expert holds in the
    batched format). An element reads as its bound: the largest view apply() can take for that expert."""

    def __init__(self, shape: tuple[int, ...], dtype: DType, bound: int) -> None:
        super().__init__(shape, dtype)
        self.bound = bound


@dataclass(frozen=True)
class View:
    buffer: str  # "workspace13" | "workspace2"
    shape: tuple[int, ...]
    itemsize: int
    line: int | None
    decided: bool  # False: under a condition the tracer could not decide

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass
class ViewTrace:
    views: list[View] = field(default_factory=list)
    escapes: dict[str, str] = field(default_factory=dict)  # buffer -> where it went whole
    refusal: str | None = None  # the raise or failed assert the method reached on a decided path
    error: str | None = None  # the trace itself stopped (budget), nothing is derived

    def need_bytes(self, buffer: str) -> int | None:
        """The bytes of buffer the decided views need; None when not derived (escaped, or no decided view while
        undecided ones exist)."""
        if self.error or buffer in self.escapes:
            return None
        decided = [v.nbytes for v in self.views if v.buffer == buffer and v.decided]
        undecided = [v for v in self.views if v.buffer == buffer and not v.decided]
        if not decided and undecided:
            return None
        return max(decided, default=0)

    def why_not_derived(self, buffer: str) -> str:
        if self.error:
            return self.error
        if buffer in self.escapes:
            return self.escapes[buffer]
        return f"{buffer} is viewed only under conditions the tracer could not decide"


def _permuted(tensor: FakeTensor, dims: tuple) -> FakeTensor:
    """Tensor.permute: the same elements, the dims reordered; a whole workspace stays whole (a kernel entry below
    may size what is written into it)."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    if sorted(d for d in dims if isinstance(d, int)) != list(range(len(tensor.shape))):
        raise Unevaluable(f"permutes a tensor of {len(tensor.shape)} dims with {dims}")
    shape = tuple(tensor.shape[d] for d in dims)
    if isinstance(tensor, WorkspaceTensor):
        return WorkspaceTensor(tensor.buffer, shape, tensor.dtype, whole=True)
    return FakeTensor(shape, tensor.dtype)


def _grouped_gemm_nt_masked(tracer: Tracer, args: list, kwargs: dict) -> bool:
    """flashinfer_cutedsl_grouped_gemm_nt_masked(a, b, c, masked_m, ...): C[m, n, l] = A[m, k, l] · B[n, k, l]^T,
    written into c "in logical [m, n, l]" (vLLM's flashinfer_cutedsl_batched_moe.py): c needs m x n x l elements,
    n the rows of B. A workspace handed as c is sized by that; True when it could be."""
    if len(args) < 3:
        return False
    b, c = args[1], args[2]
    weight = b[0] if isinstance(b, (tuple, list)) and b else b
    if not isinstance(c, WorkspaceTensor) or not c.whole or not isinstance(weight, FakeTensor) or len(c.shape) != 3:
        return False
    shape = (c.shape[0], weight.shape[0], c.shape[2])
    tracer.trace.views.append(View(c.buffer, shape, c.dtype.itemsize, tracer.line, tracer.undecided == 0))
    return True


def _reads_first_argument(tracer: Tracer, args: list, kwargs: dict) -> bool:
    """A kernel that only reads its first argument (silu_and_mul_scaled_nvfp4_experts_quantize(x, masked_m, scale):
    x is the gate-up output a GEMM wrote, quantized into new tensors): a workspace passed there is not written."""
    return (
        bool(args)
        and isinstance(args[0], WorkspaceTensor)
        and not any(isinstance(v, WorkspaceTensor) for v in (*args[1:], *kwargs.values()))
    )


# Kernels the tracer knows the output of, by the name the release calls them: each returns True when it accounted
# for every workspace passed to it (nothing escapes then).
KERNELS = {
    "flashinfer_cutedsl_grouped_gemm_nt_masked": _grouped_gemm_nt_masked,
    "silu_and_mul_scaled_nvfp4_experts_quantize": _reads_first_argument,
}


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Receivers whose attributes the tracer reads as the interpreter does (an attribute they lack is opaque).
_PLAIN_RECEIVERS = frozenset({Instance, StandIn, ClassObject, DType})


class Tracer(Interpreter):
    """The interpreter, tolerant of what it cannot follow, recording the workspace views (module docstring)."""

    def __init__(self, program: Program, budget: Budget = DEFAULT_BUDGET) -> None:
        super().__init__(program, budget)
        self.trace = ViewTrace()
        self.undecided = 0
        self.line: int | None = None

    # --- values the tracer holds ---------------------------------------------------------------------------

    def _truth(self, value: object) -> bool:
        if isinstance(value, Opaque):
            raise Unevaluable(f"tests the truth of {value.path}, which the tracer does not follow")
        return super()._truth(value)

    def _compare(self, op: ast.cmpop, left: object, right: object) -> bool:
        for side in (left, right):
            if isinstance(side, Opaque):
                raise Unevaluable(f"compares {side.path}, which the tracer does not follow")
        return super()._compare(op, left, right)

    def _resolve_global(self, file: str, name: str) -> object:
        if name == "FusedMoEActivationFormat":
            # modular_kernel.py defines it as an Enum of 1-tuples; the importing files see the stand-in's strings.
            return FORMAT_ENUM_STANDIN
        try:
            return super()._resolve_global(file, name)
        except MissingAttribute:
            raise
        except Unevaluable as error:
            if self._over_budget():
                raise
            return Opaque(f"{name} ({error.reason})")

    def _subscript(self, container: object, key: object) -> object:
        if isinstance(container, TokenCounts) and isinstance(key, int):
            bound = container.bound
            return StandIn("a token count", item=Builtin("Tensor.item", lambda interp: bound))
        return super()._subscript(container, key)

    def _reshaped(self, tensor: FakeTensor, args: tuple) -> FakeTensor:
        """Tensor.view/reshape of an input tensor (not a workspace): the shape, with one -1 inferred."""
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            args = tuple(args[0])
        if len(args) == 1 and isinstance(args[0], DType):
            return FakeTensor(tensor.shape, args[0])
        if not args or not all(isinstance(d, int) and not isinstance(d, bool) for d in args):
            raise Unevaluable("views an input tensor in a shape the tracer cannot compute")
        total, known = math.prod(tensor.shape), math.prod(d for d in args if d != -1)
        if list(args).count(-1) > 1 or known == 0 or (-1 in args and total % known):
            raise Unevaluable("views an input tensor in a shape that does not divide its elements")
        shape = tuple(total // known if d == -1 else d for d in args)
        if math.prod(shape) != total:
            raise Unevaluable(f"views an input tensor of {total} elements as {shape}")
        return FakeTensor(shape, tensor.dtype)

    def get_attribute(self, value: object, name: str) -> object:
        if type(value) in _PLAIN_RECEIVERS and not name.startswith("__"):  # none of the cases below
            try:
                return super().get_attribute(value, name)
            except MissingAttribute as error:
                return Opaque(f".{name} ({error.reason})")
        if isinstance(value, SuperProxy) and name == "__init__":
            return self._super_init(value)
        if name.startswith("__"):
            return super().get_attribute(value, name)  # refuses dunders, as the interpreter does
        if isinstance(value, WorkspaceTensor) and name == "view":
            return Builtin("Tensor.view", lambda interp, *args, **kwargs: self._view(value, args, kwargs))
        if type(value) is FakeTensor and name in ("view", "reshape"):
            return Builtin(f"Tensor.{name}", lambda interp, *args: self._reshaped(value, args))
        if (
            isinstance(value, FakeTensor)
            and name == "permute"
            and (type(value) is FakeTensor or (isinstance(value, WorkspaceTensor) and value.whole))
        ):
            return Builtin("Tensor.permute", lambda interp, *dims: _permuted(value, dims))
        if isinstance(value, WorkspaceTensor) and value.whole and name not in SHAPE_ATTRIBUTES:
            # .permute, .reshape, .narrow, ...: the buffer goes on in a form the tracer does not size.
            self.trace.escapes.setdefault(
                value.buffer,
                f"{value.buffer} is used as .{name}(...) at line {self.line}, which the tracer does not size",
            )
            return Opaque(f"{value.buffer}.{name}")
        if isinstance(value, Opaque):
            return Opaque(f"{value.path}.{name}")
        try:  # as for _PLAIN_RECEIVERS
            return super().get_attribute(value, name)
        except MissingAttribute as error:
            return Opaque(f".{name} ({error.reason})")

    def _super_init(self, proxy: SuperProxy) -> object:
        """super().__init__: the next __init__ in the receiver's MRO after the caller's class."""
        mro = self.program.mro(proxy.receiver.cls)
        keys = [c.key for c in mro]
        after = mro[keys.index(proxy.owner.key) + 1 :] if proxy.owner.key in keys else []
        for owner in after:
            binding = self.program.class_binding(owner, "__init__")
            if binding is not None and isinstance(binding.node, ast.FunctionDef):
                return BoundMethod(Function(owner.file, binding.node, owner, "method"), proxy.receiver)
        return Opaque("super().__init__ (a base outside the parsed files)")

    def _view(self, tensor: WorkspaceTensor, args: tuple, kwargs: dict) -> WorkspaceTensor:
        dtype = kwargs.get("dtype", args[0] if len(args) == 1 else None)
        if not isinstance(dtype, DType) or (args and kwargs):
            raise Unevaluable(f"views {tensor.buffer} other than as another dtype")
        elements = math.prod(tensor.shape) * tensor.dtype.itemsize // dtype.itemsize
        return WorkspaceTensor(tensor.buffer, (elements,), dtype, whole=tensor.whole)

    def _call(self, callee, args, kwargs, node, frame):
        if isinstance(callee, Function) and callee.name == RESIZE_HELPER and callee.owner is None:
            return self._resize(list(args) + list(kwargs.values()))
        if isinstance(callee, Opaque):
            kernel = KERNELS.get(callee.path.split(" ", 1)[0])
            if kernel is not None and kernel(self, list(args), kwargs):
                return Opaque(f"the result of {callee.path}")
            for value in (*args, *kwargs.values()):
                if isinstance(value, WorkspaceTensor) and value.whole:
                    self.trace.escapes.setdefault(
                        value.buffer, f"{value.buffer} is handed whole to {callee.path} (line {self.line})"
                    )
            return Opaque(f"the result of {callee.path}")
        return super()._call(callee, args, kwargs, node, frame)

    def _assign(self, target, value, frame) -> None:
        if isinstance(value, Opaque) and isinstance(target, (ast.Tuple, ast.List)):
            # `a, b = kernel(...)`: each name holds a part of what the tracer does not follow.
            for element in target.elts:
                inner = element.value if isinstance(element, ast.Starred) else element
                self._assign(inner, Opaque(f"{value.path}[...]"), frame)
            return
        super()._assign(target, value, frame)

    def _resize(self, args: list) -> object:
        if len(args) != 2:
            raise Unevaluable(f"calls {RESIZE_HELPER} with {len(args)} arguments")
        tensor, shape = args
        if isinstance(shape, int):
            shape = (shape,)
        if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) for d in shape):
            raise Unevaluable(f"{RESIZE_HELPER} to a shape the tracer cannot compute")
        shape = tuple(int(d) for d in shape)
        if isinstance(tensor, WorkspaceTensor):
            self.trace.views.append(View(tensor.buffer, shape, tensor.dtype.itemsize, self.line, self.undecided == 0))
            return WorkspaceTensor(tensor.buffer, shape, tensor.dtype, whole=False)
        if isinstance(tensor, FakeTensor):
            return FakeTensor(shape, tensor.dtype)
        return Opaque(f"a {RESIZE_HELPER} view")

    # --- statements ----------------------------------------------------------------------------------------

    def _over_budget(self) -> bool:
        return self.steps > self.budget.max_steps

    def _exec(self, node: ast.stmt, frame) -> object:
        previous = self.line
        self.line = getattr(node, "lineno", previous)
        try:
            if isinstance(node, ast.If):
                return self._traced_if(node, frame)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # A nested def (a callback handed to a kernel): never run, but it can be passed along.
                frame.locals[node.name] = Opaque(f"the nested {node.name} (line {node.lineno})")
                return None
            try:
                return self._visit(node, frame, _STATEMENTS)  # Interpreter._exec
            except _Refused:
                raise
            except Unevaluable as error:
                if self._over_budget() or "nested deeper" in error.reason or "calls nested" in error.reason:
                    raise
                refused = isinstance(node, ast.Raise) or isinstance(error, AssertFailed)
                if refused and self.undecided == 0:
                    raise _Refused(str(error)) from None
                self._forget(node, frame, error)
                return None
        finally:
            self.line = previous

    def _traced_if(self, node: ast.If, frame) -> object:
        try:
            test = self._truth(self._eval(node.test, frame))
        except Unevaluable as error:
            if self._over_budget():
                raise
            self.undecided += 1
            before = dict(frame.locals)
            after = []
            try:
                for branch in (node.body, node.orelse):
                    frame.locals = dict(before)
                    self._exec_block(branch, frame)  # a return in either branch is not taken as the result
                    after.append(frame.locals)
            finally:
                self.undecided -= 1
                frame.locals = after[0] if after else before
            self._forget(node, frame, error)
            if len(after) == 2:
                # A name both branches bind to the same plain value keeps it (num = M on either path, say).
                for name, value in after[0].items():
                    other = after[1].get(name, _MISSING)
                    if isinstance(value, (int, str, tuple)) and type(other) is type(value) and other == value:
                        frame.locals[name] = value
            return None
        return self._exec_block(node.body if test else node.orelse, frame)

    def _forget(self, node: ast.stmt, frame, error: Unevaluable) -> None:
        """The names a skipped statement binds are unknown from here on; a whole workspace it uses went where the
        tracer cannot see how much of it is used (an assert only reads)."""
        loaded, stored = _statement_names(node)
        if not isinstance(node, (ast.Assert, ast.If)):
            for name in loaded:
                value = frame.locals.get(name)
                if isinstance(value, WorkspaceTensor) and value.whole:
                    self.trace.escapes.setdefault(
                        value.buffer,
                        f"{value.buffer} is used at line {self.line} in code the tracer cannot follow ({error})",
                    )
        for name in stored:
            # Opaque, not missing: it can still be handed on (to a helper that sizes its views from other arguments),
            # never computed with.
            frame.locals[name] = Opaque(f"{name} (not computed: {error.reason})")


# The names each statement reads and binds, by the node's id (the node kept with them, see interpreter._DEF_FACTS).
_NAMES: dict[int, tuple[ast.stmt, tuple[str, ...], tuple[str, ...]]] = {}


def _statement_names(node: ast.stmt) -> tuple[tuple[str, ...], tuple[str, ...]]:
    found = _NAMES.get(id(node))
    if found is not None and found[0] is node:
        return found[1], found[2]
    if len(_NAMES) >= 1 << 15:
        _NAMES.clear()
    names = [inner for inner in ast.walk(node) if isinstance(inner, ast.Name)]
    loaded = tuple(dict.fromkeys(n.id for n in names if not isinstance(n.ctx, ast.Store)))
    stored = tuple(dict.fromkeys(n.id for n in names if isinstance(n.ctx, ast.Store)))
    _NAMES[id(node)] = (node, loaded, stored)
    return loaded, stored


def trace_apply(
    program: Program,
    cls: object,
    attributes: Mapping[str, object],
    arguments: Mapping[str, object],
    *,
    budget: Budget = DEFAULT_BUDGET,
) -> ViewTrace:
    """cls.apply(**arguments) traced on a stand-in self; parameters not in arguments are opaque."""
    tracer = Tracer(program, budget)
    try:
        instance = tracer.instance(cls, attributes)
        method = tracer.get_attribute(instance, "apply")
        if not isinstance(method, BoundMethod):
            tracer.trace.error = "apply is not a method of the class"
            return tracer.trace
        kwargs = _by_parameter(method.function, arguments)
        tracer.call(method, (), kwargs)
    except _Refused as refusal:
        tracer.trace.refusal = refusal.reason
    except (Unevaluable, RecursionError) as error:
        tracer.trace.error = f"apply could not be traced: {error}"
    return tracer.trace


def trace_constructor(
    program: Program, cls: object, attributes: Mapping[str, object], kwargs: Mapping[str, object]
) -> str | None:
    """The raise or failed assert cls.__init__(**kwargs) reaches on a decided path; None when it reaches none."""
    tracer = Tracer(program)
    try:
        instance = tracer.instance(cls, attributes)
        init = _init_function(program, cls)
        if init is not None:
            tracer.call(BoundMethod(init, instance), (), _by_parameter(init, kwargs))
    except _Refused as refusal:
        return refusal.reason
    except (Unevaluable, RecursionError):
        return None
    return None


class _Reached(Exception):  # not an Unevaluable: no statement of the tracer swallows it
    def __init__(self, value: object = None, why: str | None = None) -> None:
        super().__init__(why)
        self.value, self.why = value, why


class _AssertProbe(Tracer):
    """The tracer, stopping at one assert of __init__ with the value of one of its operands there."""

    def __init__(self, program: Program, target: ast.Assert, operand: ast.expr) -> None:
        super().__init__(program)
        self.target, self.operand = target, operand

    def _exec(self, node: ast.stmt, frame) -> object:
        if node is not self.target:
            return super()._exec(node, frame)
        if self.undecided:
            raise _Reached(why="only under a condition the tracer could not decide")
        try:
            value = self._eval(self.operand, frame)
        except Unevaluable as error:
            raise _Reached(why=f"{ast.unparse(self.operand)} does not evaluate there: {error}") from None
        if isinstance(value, Opaque):
            raise _Reached(why=f"{ast.unparse(self.operand)} is {value.path} there, which the tracer does not follow")
        raise _Reached(value)


@dataclass(frozen=True)
class AssertOperand:
    """What cls.__init__(**kwargs) does on its way to one assert: reaches it on a decided path with the operand's
    value (known), refuses before it (refusal: the raise or failed assert), or neither (why)."""

    known: bool = False
    value: object = None
    refusal: str | None = None
    why: str = ""


def trace_to_assert(program: Program, cls: object, attributes: Mapping[str, object], kwargs: Mapping[str, object],
                    target: ast.Assert, operand: ast.expr) -> AssertOperand:  # fmt: skip
    """cls.__init__(**kwargs) traced up to `target` (an assert of an __init__ it runs); operand, an expression of
    that assert, is evaluated there."""
    tracer = _AssertProbe(program, target, operand)
    try:
        instance = tracer.instance(cls, attributes)
        init = _init_function(program, cls)
        if init is None:
            return AssertOperand(why="no parsed __init__")
        tracer.call(BoundMethod(init, instance), (), _by_parameter(init, kwargs))
    except _Reached as reached:
        return AssertOperand(known=True, value=reached.value) if reached.why is None else AssertOperand(why=reached.why)
    except _Refused as refusal:
        return AssertOperand(refusal=refusal.reason)
    except (Unevaluable, RecursionError) as error:
        return AssertOperand(why=f"__init__ stops before it: {error}")
    return AssertOperand(why="__init__ does not reach it at this point")


def init_parameter_default(program: Program, cls: object, name: str) -> str | None:
    """`None` when cls.__init__ (through its parsed bases) takes `name` with a default of None; else why not."""
    init = _init_function(program, cls)
    if init is not None:
        owner, spec = init.owner, init.node.args
        positional = [*spec.posonlyargs, *spec.args]
        defaults = dict(
            zip([a.arg for a in positional[len(positional) - len(spec.defaults) :]], spec.defaults, strict=True)
        )
        defaults.update({a.arg: d for a, d in zip(spec.kwonlyargs, spec.kw_defaults, strict=True) if d is not None})
        if name not in {a.arg for a in (*positional, *spec.kwonlyargs)}:
            return f"{owner.name}.__init__ takes no {name}"
        default = defaults.get(name)
        if isinstance(default, ast.Constant) and default.value is None:
            return None
        return f"{owner.name}.__init__ requires {name}"
    return f"no parsed __init__ takes {name}"


def _init_function(program: Program, cls: object) -> Function | None:
    """The __init__ the class runs (the interpreter does not read dunders by attribute, so it is looked up here)."""
    for owner in program.mro(cls):
        binding = program.class_binding(owner, "__init__")
        if binding is not None and isinstance(binding.node, ast.FunctionDef):
            return Function(owner.file, binding.node, owner, "method")
    return None


def _by_parameter(function: Function, arguments: Mapping[str, object]) -> dict[str, object]:
    """Keyword arguments for a method's parameters: the given ones, opaque for the rest without a default."""
    spec = function.node.args
    positional = [*spec.posonlyargs, *spec.args]
    with_default = {a.arg for a in positional[len(positional) - len(spec.defaults) :]}
    with_default |= {a.arg for a, d in zip(spec.kwonlyargs, spec.kw_defaults, strict=True) if d is not None}
    names = [a.arg for a in (*positional[1:], *spec.kwonlyargs)]
    return {
        name: arguments[name] if name in arguments else Opaque(f"the argument {name}")
        for name in names
        if name in arguments or name not in with_default
    }
