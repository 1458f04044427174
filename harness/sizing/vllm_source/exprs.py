"""A small interpreter for expressions and plain functions read from a release, over the AST (never `exec`).

It knows what the layer readers meet in vLLM's sizing code: integer arithmetic, comparisons, conditionals,
tuples, `max`/`min`/`int`, attribute reads of stand-in objects, and calls of functions or methods parsed from
the release whose bodies are assignments, `if`, `assert` and `return`. Anything else raises Unevaluated with
the construct and the line, and the caller reports the component as not evaluated. A step budget and an
integer size bound keep a hostile tree from looping or allocating.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

MAX_STEPS = 20_000
MAX_INT_BITS = 96  # bytes of any real buffer fit in 64 bits; more means a runaway expression
MAX_CALL_DEPTH = 16


class Unevaluated(Exception):
    """The expression needs something outside the subset, or failed; the message says what and where."""


@dataclass
class Budget:
    """Steps left for one evaluation; shared by nested calls."""

    steps: int = MAX_STEPS
    depth: int = 0

    def spend(self, node: ast.AST) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise Unevaluated(f"ran out of its step budget ({MAX_STEPS}) at line {getattr(node, 'lineno', '?')}")


@dataclass
class StandIn:
    """An object the release's code reads attributes of: `moe`, `self`, `envs`, `all2all_manager`, ...

    `methods` finds a method's definition by name (the release's own code, interpreted on call).
    """

    path: str
    attributes: dict[str, object] = field(default_factory=dict)
    methods: Callable[[str], ast.FunctionDef | None] | None = None

    def read(self, name: str, node: ast.AST) -> object:
        if name.startswith("__"):
            raise Unevaluated(f"reads {self.path}.{name} at line {node.lineno}, which is not allowed")
        if name in self.attributes:
            return self.attributes[name]
        if self.methods is not None:
            method = self.methods(name)
            if method is not None:
                return _BoundMethod(self, method)
        raise Unevaluated(f"reads {self.path}.{name} at line {node.lineno}, which the stand-in does not carry")


@dataclass(frozen=True)
class _BoundMethod:
    owner: StandIn
    function: ast.FunctionDef


@dataclass(frozen=True)
class HostFunction:
    """A function of the harness standing in for a library call (e.g. DeepEP's size hint); records its calls."""

    name: str
    function: Callable[..., object]
    calls: list[dict[str, object]] = field(default_factory=list, compare=False)


@dataclass(frozen=True)
class ParsedFunction:
    """A module-level function of a release file, callable by the interpreter."""

    function: ast.FunctionDef
    globals: Mapping[str, object]


_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Div: operator.truediv, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
}  # fmt: skip
_COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}  # fmt: skip
_BUILTINS: dict[str, Callable[..., object]] = {"max": max, "min": min, "int": int, "abs": abs, "bool": bool}
_CONSTRUCTORS: dict[str, object] = {"dict": dict}


def evaluate(node: ast.expr, names: Mapping[str, object], budget: Budget | None = None) -> object:
    """The value of one expression with `names` bound."""
    return _eval(node, dict(names), budget or Budget())


def call_function(
    function: ast.FunctionDef, arguments: Mapping[str, object], names: Mapping[str, object], budget: Budget
) -> object:
    """Run a plain function body with its parameters bound by name (defaults when literal)."""
    budget.depth += 1
    if budget.depth > MAX_CALL_DEPTH:
        raise Unevaluated(f"calls nest deeper than {MAX_CALL_DEPTH} at line {function.lineno}")
    try:
        scope = dict(names)
        scope.update(_bind_parameters(function, arguments))
        result = _run_block(function.body, scope, budget)
        return None if result is _NO_RETURN else result
    finally:
        budget.depth -= 1


_NO_RETURN = object()


def _bind_parameters(function: ast.FunctionDef, arguments: Mapping[str, object]) -> dict[str, object]:
    params = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    positional = [*function.args.posonlyargs, *function.args.args]
    with_defaults = positional[len(positional) - len(function.args.defaults):]
    defaults = {p.arg: d for p, d in zip(with_defaults, function.args.defaults)}
    defaults.update({p.arg: d for p, d in zip(function.args.kwonlyargs, function.args.kw_defaults) if d is not None})
    bound: dict[str, object] = {}
    for param in params:
        if param.arg in arguments:
            bound[param.arg] = arguments[param.arg]
        elif param.arg in defaults:
            try:
                bound[param.arg] = ast.literal_eval(defaults[param.arg])
            except (ValueError, TypeError, SyntaxError):
                raise Unevaluated(f"{function.name}: parameter {param.arg!r} has a non-literal default") from None
        else:
            raise Unevaluated(f"{function.name}: no value for parameter {param.arg!r}")
    return bound


def _run_block(statements: list[ast.stmt], scope: dict[str, object], budget: Budget) -> object:
    for statement in statements:
        budget.spend(statement)
        if isinstance(statement, ast.Return):
            return None if statement.value is None else _eval(statement.value, scope, budget)
        if isinstance(statement, ast.Assign):
            value = _eval(statement.value, scope, budget)
            for target in statement.targets:
                _assign(target, value, scope)
        elif isinstance(statement, ast.AnnAssign):
            if statement.value is not None:
                _assign(statement.target, _eval(statement.value, scope, budget), scope)
        elif isinstance(statement, ast.AugAssign):
            name = _name_of(statement.target)
            scope[name] = _binary(statement.op, scope.get(name), _eval(statement.value, scope, budget), statement)
        elif isinstance(statement, ast.If):
            branch = statement.body if _eval(statement.test, scope, budget) else statement.orelse
            result = _run_block(branch, scope, budget)
            if result is not _NO_RETURN:
                return result
        elif isinstance(statement, ast.Assert):
            if not _eval(statement.test, scope, budget):
                raise Unevaluated(f"failed the assert at line {statement.lineno}")
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        elif isinstance(statement, ast.Pass):
            continue
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            # Only a module the caller already stands in for may be imported; nothing is ever loaded.
            bound = [a.asname or a.name.split(".")[0] for a in statement.names]
            missing = [name for name in bound if name not in scope]
            if missing:
                raise Unevaluated(f"imports {', '.join(missing)} at line {statement.lineno}, which has no stand-in")
        else:
            raise Unevaluated(f"has a {type(statement).__name__} statement at line {statement.lineno}")
    return _NO_RETURN


def _assign(target: ast.expr, value: object, scope: dict[str, object]) -> None:
    if isinstance(target, ast.Name):
        scope[target.id] = value
        return
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)):
        if len(target.elts) != len(value):
            raise Unevaluated(f"unpacks {len(value)} values into {len(target.elts)} names at line {target.lineno}")
        for element, item in zip(target.elts, value):
            _assign(element, item, scope)
        return
    raise Unevaluated(f"assigns to a {type(target).__name__} at line {target.lineno}")


def _name_of(target: ast.expr) -> str:
    if isinstance(target, ast.Name):
        return target.id
    raise Unevaluated(f"augments a {type(target).__name__} at line {target.lineno}")


def _eval(node: ast.expr, scope: dict[str, object], budget: Budget) -> object:
    budget.spend(node)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in scope:
            return scope[node.id]
        if node.id in _BUILTINS:
            return _BUILTINS[node.id]
        if node.id in _CONSTRUCTORS:
            return _CONSTRUCTORS[node.id]
        raise Unevaluated(f"uses the name {node.id!r} at line {node.lineno}, which has no stand-in")
    if isinstance(node, ast.Attribute):
        owner = _eval(node.value, scope, budget)
        if isinstance(owner, StandIn):
            return owner.read(node.attr, node)
        raise Unevaluated(f"reads .{node.attr} of a {type(owner).__name__} at line {node.lineno}")
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(element, scope, budget) for element in node.elts)
    if isinstance(node, ast.BinOp):
        return _binary(node.op, _eval(node.left, scope, budget), _eval(node.right, scope, budget), node)
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, scope, budget)
        if isinstance(node.op, ast.USub) and _is_number(operand):
            return -operand  # type: ignore[operator]
        if isinstance(node.op, ast.Not):
            return not operand
        raise Unevaluated(f"applies {type(node.op).__name__} at line {node.lineno}")
    if isinstance(node, ast.BoolOp):
        return _bool_op(node, scope, budget)
    if isinstance(node, ast.Compare):
        return _compare(node, scope, budget)
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, scope, budget) else node.orelse, scope, budget)
    if isinstance(node, ast.Call):
        return _call(node, scope, budget)
    raise Unevaluated(f"uses a {type(node).__name__} expression at line {getattr(node, 'lineno', '?')}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _binary(op: ast.operator, left: object, right: object, node: ast.AST) -> object:
    function = _BINARY.get(type(op))
    if function is None or not (_is_number(left) and _is_number(right)):
        raise Unevaluated(
            f"computes {type(left).__name__} {type(op).__name__} {type(right).__name__} at line {node.lineno}"
        )
    if isinstance(op, ast.LShift) and right > MAX_INT_BITS:  # type: ignore[operator]
        raise Unevaluated(f"shifts by {right} at line {node.lineno}")
    try:
        result = function(left, right)
    except ZeroDivisionError:
        raise Unevaluated(f"divides by zero at line {node.lineno}") from None
    if isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
        raise Unevaluated(f"makes an integer of {result.bit_length()} bits at line {node.lineno}")
    return result


def _bool_op(node: ast.BoolOp, scope: dict[str, object], budget: Budget) -> object:
    value: object = None
    for operand in node.values:
        value = _eval(operand, scope, budget)
        if isinstance(node.op, ast.And) and not value:
            return value
        if isinstance(node.op, ast.Or) and value:
            return value
    return value


def _compare(node: ast.Compare, scope: dict[str, object], budget: Budget) -> bool:
    left = _eval(node.left, scope, budget)
    for op, comparator in zip(node.ops, node.comparators):
        right = _eval(comparator, scope, budget)
        function = _COMPARE.get(type(op))
        if function is None:
            raise Unevaluated(f"compares with {type(op).__name__} at line {node.lineno}")
        if not function(left, right):
            return False
        left = right
    return True


def _call(node: ast.Call, scope: dict[str, object], budget: Budget) -> object:
    target = _eval(node.func, scope, budget)
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise Unevaluated(f"calls with *args or **kwargs at line {node.lineno}")
    positional = [_eval(a, scope, budget) for a in node.args]
    keywords = {k.arg: _eval(k.value, scope, budget) for k in node.keywords if k.arg is not None}
    if target is dict:
        if positional:
            raise Unevaluated(f"calls dict with positional arguments at line {node.lineno}")
        return keywords
    if isinstance(target, HostFunction):
        target.calls.append(dict(keywords))
        return target.function(*positional, **keywords)
    if target in _BUILTINS.values():
        if keywords or not all(_is_number(p) for p in positional):
            raise Unevaluated(f"calls {getattr(target, '__name__', target)} on non-numbers at line {node.lineno}")
        return target(*positional)  # type: ignore[operator]
    if isinstance(target, _BoundMethod):
        function = target.function
        params = [p.arg for p in [*function.args.posonlyargs, *function.args.args]]
        if _is_staticmethod(function):
            return call_function(function, dict(zip(params, positional)) | keywords, {}, budget)
        arguments = dict(zip(params[1:], positional)) | keywords
        arguments[params[0]] = target.owner
        return call_function(function, arguments, {}, budget)
    if isinstance(target, ParsedFunction):
        params = [p.arg for p in [*target.function.args.posonlyargs, *target.function.args.args]]
        return call_function(target.function, dict(zip(params, positional)) | keywords, target.globals, budget)
    raise Unevaluated(f"calls a {type(target).__name__} at line {node.lineno}")


def _is_staticmethod(function: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
