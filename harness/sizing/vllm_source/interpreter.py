"""Evaluate a release's sizing methods by walking their AST: nothing read from a release is ever executed.

    SourceTree (evaluate.py): parsed files, class MROs, module-level bindings        (the Program below)
    Interpreter(program).call(Function, stand-in self, arguments)
        --walks ast nodes--> a value built only from int, float, bool, None, str, tuple, list, dict, range
                             and the stand-ins of this module (StandIn, DType, Activation, FakeTensor)
    outside the subset, or over a budget --> Unevaluable(reason, file, line)

There is no exec, eval or compile of release text. Every operation is implemented here for the value types above,
so release code cannot reach a Python object that this module did not hand it: attribute reads go through
`Interpreter.get_attribute` (no dunders, only the stand-ins' own fields and the release's own classes), calls
go to the release's functions (interpreted) or to BUILTINS (pure, bounded implementations).

The subset is what the sizing methods of vLLM 0.22-0.33 use, and a little around it: arithmetic, comparisons,
boolean and conditional expressions, if/for/while, local assignment (tuple unpacking, augmented), tuples, lists
and dicts, comprehensions over known sequences, f-strings of plain values, return, assert, attribute reads on the
stand-ins and on the release's own classes (methods, properties, staticmethods, classmethods, super()), calls to
max/min/int/abs/round_up/cdiv/... and to module-level helpers. Anything else (imports, lambdas, try, with, raise,
dunders, attributes of unknown objects, ...) raises Unevaluable naming the node type and line.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast


@dataclass(frozen=True)
class Budget:
    """Limits of one evaluation (one top-level call); each one bounds time or memory whatever the code does."""

    max_steps: int = 100_000  # AST nodes evaluated, plus one per item of every sequence built
    max_int: int = 1 << 64  # |int| and |float| stay below this
    max_items: int = 64  # items of a tuple, list or dict that is built, or of a range made into one
    max_nodes: int = 1024  # containers and items in one value, counting shared parts each time they appear
    max_depth: int = 8  # containers nested in one value
    max_chars: int = 4096  # characters of a string that is built
    max_call_depth: int = 32  # nested calls of the release's functions
    max_nesting: int = 150  # nested AST nodes under evaluation, across calls (bounds Python's own stack)


DEFAULT_BUDGET = Budget()


class Unevaluable(Exception):
    """The code needs something outside the evaluated subset or budget; str() is the reason with file and line."""

    def __init__(self, reason: str, *, file: str | None = None, line: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.file = file
        self.line = line

    def locate(self, file: str, line: int | None) -> None:
        if self.file is None and line is not None:
            self.file, self.line = file, line

    def __str__(self) -> str:
        where = f" ({Path(self.file).name} line {self.line})" if self.file else ""
        return f"{self.reason}{where}"


class MissingAttribute(Unevaluable):
    """An attribute the stand-in or the class does not carry; `getattr(x, name, default)` and `hasattr` see it."""


class AssertFailed(Unevaluable):
    """An `assert` of the release evaluated to false."""


# --- stand-in values -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DType:
    """A torch dtype by name and element size; enough for code that picks or compares dtypes."""

    name: str
    itemsize: int

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class Activation(str):
    """An activation that is both the string older releases pass and the MoEActivation member newer ones pass."""

    @property
    def value(self) -> str:
        return str(self)

    @property
    def name(self) -> str:
        return str(self).upper()

    @property
    def is_gated(self) -> bool:
        return not str(self).endswith("_no_mul")

    def without_mul(self) -> Activation:
        return Activation(str(self).removesuffix("_no_mul") + "_no_mul")


class FakeTensor:
    """Shape and dtype of a tensor argument (older releases pass `a` and `aq` to workspace_shapes)."""

    def __init__(self, shape: tuple[int, ...], dtype: DType) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)


class StandIn:
    """A named bag of attributes (the stand-in config, torch, an enum); reading anything else names its path."""

    def __init__(self, path: str, **attributes: object) -> None:
        self.path = path
        self.attributes = dict(attributes)

    def __repr__(self) -> str:
        return f"<stand-in {self.path}>"


class StandInEnum:
    """MoEActivation: a member NAME is the activation whose value is name.lower(), as in vLLM's enum."""

    path = "MoEActivation"

    def __repr__(self) -> str:
        return "<stand-in MoEActivation>"


@dataclass(frozen=True)
class Builtin:
    """A function of this module that release code may call; `pytype` makes it usable with isinstance."""

    name: str
    fn: Callable[..., object]
    pytype: type | tuple[type, ...] | None = None

    def __repr__(self) -> str:
        return f"<builtin {self.name}>"


# --- the release's own objects, as the interpreter holds them --------------------------------------------------

FUNCTION, METHOD, STATIC, CLASSMETHOD, PROPERTY, CACHED_PROPERTY = (
    "function", "method", "staticmethod", "classmethod", "property", "cached_property"
)  # fmt: skip


@dataclass(frozen=True)
class Function:
    """A def of the release: module-level (owner None) or in a class body (owner a ParsedClass)."""

    file: str
    node: ast.FunctionDef
    owner: Any = None
    kind: str = FUNCTION

    @property
    def name(self) -> str:
        return self.node.name


_T = TypeVar("_T")


@dataclass(frozen=True)
class BoundMethod:
    function: Function
    receiver: object


@dataclass(frozen=True)
class ClassObject:
    """A class of the release (a ParsedClass); calling it is outside the subset."""

    cls: Any

    def __repr__(self) -> str:
        return f"<class {self.cls.name}>"


class Instance:
    """The stand-in `self`: an instance of a release class whose attributes the caller provides."""

    def __init__(self, cls: Any, attributes: Mapping[str, object]) -> None:
        self.cls = cls
        self.attributes = dict(attributes)
        self.cached: dict[str, object] = {}

    def __repr__(self) -> str:
        return f"<stand-in self of {self.cls.name}>"


@dataclass(frozen=True)
class SuperProxy:
    owner: Any  # the class whose method called super()
    receiver: Instance | ClassObject


@dataclass(frozen=True)
class ModuleObject:
    """A parsed module of the release bound to a name (`import ...modular_kernel as mk`)."""

    module: str


@dataclass(frozen=True)
class Binding:
    """What a name is bound to at module level or in a class body, as read from the AST."""

    kind: str  # "function" | "class" | "value" | "import" | "module"
    node: ast.AST | None = None
    file: str = ""
    cls: Any = None  # for "class"
    module: str = ""  # for "import" / "module"
    original: str = ""  # for "import"


class Program(Protocol):
    """What the interpreter needs to know about the parsed release (SourceTree provides it)."""

    def global_binding(self, file: str, name: str) -> Binding | None: ...

    def module_file(self, module: str) -> str | None: ...

    def mro(self, cls: Any) -> list[Any]: ...

    def class_binding(self, cls: Any, name: str) -> Binding | None: ...

    def standin_import(self, module: str, name: str) -> object | None: ...


# --- control flow inside the interpreter -----------------------------------------------------------------------


class _Return:
    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


_BREAK = object()
_CONTINUE = object()


class _Missing:
    """A parameter default that could not be evaluated: reading the parameter raises the reason."""

    def __init__(self, error: Unevaluable) -> None:
        self.error = error


@dataclass
class _Frame:
    function: Function | None
    file: str
    locals: dict[str, object] = field(default_factory=dict)
    local_names: frozenset[str] = frozenset()
    first_argument: object = None  # self or cls, for super()
    class_scope: Any = None  # the class whose body an attribute's value is written in: it sees the earlier ones


_PLAIN_TYPES = (int, float, bool, str, type(None))


class Interpreter:
    """One evaluation: a step budget, module-level values computed on first use, then discarded."""

    def __init__(self, program: Program, budget: Budget = DEFAULT_BUDGET) -> None:
        self.program = program
        self.budget = budget
        self.steps = 0
        self.nesting = 0
        self.call_depth = 0
        self._globals: dict[tuple[str, str], object] = {}
        self._resolving: set[tuple[str, str]] = set()
        self._shapes: dict[int, tuple[object, int, int]] = {}  # id -> (container, node count, depth)
        self._lookups: dict[tuple[int, str], tuple[Any, Binding] | None] = {}  # (id of a class, name) -> _lookup

    # --- entry points ------------------------------------------------------------------------------------------

    def instance(self, cls: Any, attributes: Mapping[str, object]) -> Instance:
        """A stand-in self of cls; attribute values are checked to be values this interpreter can hold."""
        for name, value in attributes.items():
            self.check_value(value, what=f"stand-in attribute {name}")
        return Instance(cls, attributes)

    def call(self, callee: object, args: Iterable[object] = (), kwargs: Mapping[str, object] | None = None) -> object:
        for value in (*args, *(kwargs or {}).values()):
            self.check_value(value, what="argument")
        return self._call(callee, list(args), dict(kwargs or {}), None, None)

    def evaluate_in(self, function: Function, args: Iterable[object], kwargs: Mapping[str, object],
                    prelude: Iterable[ast.stmt], expression: ast.expr) -> object:  # fmt: skip
        """An expression of function's body with its parameters bound (args, kwargs, the defaults) after the prelude,
        statements of the body before it, each run where it evaluates (an assignment to a plain name that does not
        evaluate leaves the name unbound). Nothing but the prelude and the expression is run."""
        args = list(args)
        for value in (*args, *kwargs.values()):
            self.check_value(value, what="argument")
        frame = _Frame(function, function.file, {}, cached_local_names(function.node))
        self._bind_arguments(function, args, dict(kwargs), frame)
        if args:
            frame.first_argument = args[0]
        for statement in prelude:
            if isinstance(statement, ast.Assign) and all(isinstance(t, ast.Name) for t in statement.targets):
                try:
                    self._exec_block([statement], frame)
                except Unevaluable as error:
                    if any(limit in str(error) for limit in ("budget", "nested deeper", "nests deeper")):
                        raise
        return self._eval(expression, frame)

    # --- budget and value checks -------------------------------------------------------------------------------

    def charge(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > self.budget.max_steps:
            raise Unevaluable(f"exceeded the step budget of {self.budget.max_steps} evaluated AST nodes")

    def check_value(self, value: _T, *, what: str = "a value") -> _T:
        """value when it is within the size budget and of a type the interpreter holds; else Unevaluable."""
        budget = self.budget
        exact = type(value)
        if exact is int and -budget.max_int < value < budget.max_int:  # type: ignore[operator]
            return value
        if exact in _HELD_EXACT or value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if -budget.max_int < value < budget.max_int:
                return value
            raise Unevaluable(f"{what} is an integer of {value.bit_length()} bits, over the size budget of 64 bits")
        if isinstance(value, float):
            if math.isfinite(value) and abs(value) < budget.max_int:
                return value
            raise Unevaluable(f"{what} is a float outside the size budget (finite, below 2^64): {value!r}")
        if isinstance(value, str):
            if len(value) <= budget.max_chars:
                return value
            raise Unevaluable(f"{what} is a string of {len(value)} characters, over the budget of {budget.max_chars}")
        if isinstance(value, range):
            return value  # O(1) in memory; iterating it is charged per item, materialising it is checked
        if isinstance(value, (tuple, list, dict)):
            if len(value) <= budget.max_items:
                return value
            kind = type(value).__name__
            raise Unevaluable(f"{what} is a {kind} of {len(value)} items, over the budget of {budget.max_items}")
        if isinstance(value, _HELD_TYPES):
            return value
        raise Unevaluable(f"{what} is a {type(value).__name__}, which the evaluator does not hold")

    def _sized(self, value: _T) -> _T:
        """Charge for what a new value holds, then check it; used on every value an operation builds."""
        if isinstance(value, (tuple, list, dict)):
            self.charge(len(value))
            self.check_value(value)
            self.node_count(value)
        elif isinstance(value, str):
            self.charge(len(value) // 64)
        return self.check_value(value)

    def node_count(self, value: object) -> int:
        """Containers and items in value, shared parts counted each time (what repr or == would walk).

        Containers are never changed once built (the subset has no list mutation), so the count of each is
        computed once, from its items' counts, and kept; a value over max_nodes or max_depth is refused.
        """
        if not isinstance(value, (tuple, list, dict)):
            return 1
        known = self._shapes.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        count, depth = 1, 1
        for item in items:
            count += self.node_count(item)
            if isinstance(item, (tuple, list, dict)):
                depth = max(depth, 1 + self._shapes[id(item)][2])
        if count > self.budget.max_nodes:
            raise Unevaluable(f"builds a value of {count} nodes, over the size budget of {self.budget.max_nodes}")
        if depth > self.budget.max_depth:
            raise Unevaluable(f"nests containers {depth} deep, over the size budget of {self.budget.max_depth}")
        self._shapes[id(value)] = (value, count, depth)  # holding value keeps its id from being reused
        return count

    # --- statements --------------------------------------------------------------------------------------------

    def _exec_block(self, body: list[ast.stmt], frame: _Frame) -> object:
        for statement in body:
            signal = self._exec(statement, frame)
            if signal is not None:
                return signal
        return None

    def _exec(self, node: ast.stmt, frame: _Frame) -> object:
        return self._visit(node, frame, _STATEMENTS)

    def _visit(self, node: ast.AST, frame: _Frame, handlers: dict[type, Any] | None = None) -> object:
        """One step: charged to the budget, nesting bounded, an error located at the node's file and line.
        handlers: those of statements or (None) of expressions."""
        self.steps += 1
        if self.steps > self.budget.max_steps:
            self.charge(0)  # raises the step budget's error
        self.nesting += 1
        try:
            handler = (handlers if handlers is not None else _EXPRESSIONS).get(type(node))
            if handler is None:
                raise _outside(node, frame)
            if self.nesting > self.budget.max_nesting:
                raise Unevaluable(f"code nested deeper than {self.budget.max_nesting} AST nodes")
            return handler(self, node, frame)
        except Unevaluable as error:
            error.locate(frame.file, getattr(node, "lineno", None))
            raise
        finally:
            self.nesting -= 1

    def _stmt_expr(self, node: ast.Expr, frame: _Frame) -> None:
        if isinstance(node.value, ast.Constant):
            return None  # a docstring or a bare constant does nothing
        self._eval(node.value, frame)
        return None

    def _stmt_pass(self, node: ast.Pass, frame: _Frame) -> None:
        return None

    def _stmt_assign(self, node: ast.Assign, frame: _Frame) -> None:
        value = self._eval(node.value, frame)
        for target in node.targets:
            self._assign(target, value, frame)
        return None

    def _stmt_ann_assign(self, node: ast.AnnAssign, frame: _Frame) -> None:
        if node.value is not None:
            self._assign(node.target, self._eval(node.value, frame), frame)
        return None

    def _stmt_aug_assign(self, node: ast.AugAssign, frame: _Frame) -> None:
        target = node.target
        if isinstance(target, ast.Name):
            current = self._eval(ast.Name(id=target.id, ctx=ast.Load()), frame)
        elif isinstance(target, ast.Attribute):
            current = self.get_attribute(self._eval(target.value, frame), target.attr)
        else:
            raise _outside(target, frame)
        value = self._binary(node.op, current, self._eval(node.value, frame))
        self._assign(target, value, frame)
        return None

    def _stmt_return(self, node: ast.Return, frame: _Frame) -> _Return:
        return _Return(None if node.value is None else self._eval(node.value, frame))

    def _stmt_if(self, node: ast.If, frame: _Frame) -> object:
        branch = node.body if self._truth(self._eval(node.test, frame)) else node.orelse
        return self._exec_block(branch, frame)

    def _stmt_for(self, node: ast.For, frame: _Frame) -> object:
        for item in self._iterate(self._eval(node.iter, frame)):
            self.charge()
            self._assign(node.target, item, frame)
            signal = self._exec_block(node.body, frame)
            if signal is _BREAK:
                return None
            if isinstance(signal, _Return):
                return signal
        return self._exec_block(node.orelse, frame)

    def _stmt_while(self, node: ast.While, frame: _Frame) -> object:
        # Bounded by the step budget: every test and every statement of the body is charged.
        while self._truth(self._eval(node.test, frame)):
            signal = self._exec_block(node.body, frame)
            if signal is _BREAK:
                return None
            if isinstance(signal, _Return):
                return signal
        return self._exec_block(node.orelse, frame)

    def _stmt_break(self, node: ast.Break, frame: _Frame) -> object:
        return _BREAK

    def _stmt_continue(self, node: ast.Continue, frame: _Frame) -> object:
        return _CONTINUE

    def _stmt_assert(self, node: ast.Assert, frame: _Frame) -> None:
        if self._truth(self._eval(node.test, frame)):
            return None
        message = ""
        if node.msg is not None:
            try:
                text = self._eval(node.msg, frame)
                message = text if isinstance(text, str) else repr(text) if isinstance(text, _PLAIN_TYPES) else ""
            except Unevaluable:
                message = ""  # the failed assert is the reason; a message we cannot render does not change it
        raise AssertFailed("failed an assert" + (f": {message}" if message else ""))

    def _stmt_import(self, node: ast.Import | ast.ImportFrom, frame: _Frame) -> None:
        if isinstance(node, ast.ImportFrom):
            name = "." * node.level + (node.module or "")
        else:
            name = ", ".join(alias.name for alias in node.names)
        raise Unevaluable(f"imports {name} at call time, which needs vLLM itself")

    def _stmt_delete(self, node: ast.Delete, frame: _Frame) -> None:
        """`del name, ...` unbinds local names (Python: reading one afterwards is an error, as here); deleting an
        attribute or an item changes a built object and stays outside the subset."""
        for target in node.targets:
            if not isinstance(target, ast.Name):
                raise Unevaluable(f"deletes {ast.unparse(target)}; only local names are deleted in the subset")
            if target.id not in frame.locals:
                raise Unevaluable(f"deletes the local name {target.id!r}, which is not bound")
            del frame.locals[target.id]
        return None

    def _stmt_raise(self, node: ast.Raise, frame: _Frame) -> None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = ast.unparse(exc) if isinstance(exc, (ast.Name, ast.Attribute)) else "an exception"
        raise Unevaluable(f"raises {name}")

    # --- assignment targets ------------------------------------------------------------------------------------

    def _assign(self, target: ast.expr, value: object, frame: _Frame) -> None:
        if isinstance(target, ast.Name):
            frame.locals[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            self._unpack(target, value, frame)
        elif isinstance(target, ast.Attribute):
            receiver = self._eval(target.value, frame)
            _check_name(target.attr)
            if not isinstance(receiver, Instance):
                raise Unevaluable(f"sets .{target.attr} on {_describe_value(receiver)}, which is outside the subset")
            if len(receiver.attributes) >= 4 * self.budget.max_items:
                raise Unevaluable("sets more attributes on self than the size budget allows")
            receiver.attributes[target.attr] = value
        elif isinstance(target, ast.Subscript):
            # Containers stay as built: that keeps them acyclic and their sizes known (see node_count).
            raise Unevaluable("assigns an item of a container; changing a built list or dict is outside the subset")
        else:
            raise _outside(target, frame)

    def _unpack(self, target: ast.Tuple | ast.List, value: object, frame: _Frame) -> None:
        items = _items(self, value)
        starred = [i for i, element in enumerate(target.elts) if isinstance(element, ast.Starred)]
        if not starred:
            if len(items) != len(target.elts):
                raise Unevaluable(f"unpacks {len(items)} values into {len(target.elts)} names")
            for element, item in zip(target.elts, items, strict=True):
                self._assign(element, item, frame)
            return
        star = starred[0]
        after = len(target.elts) - star - 1
        if len(items) < star + after:
            raise Unevaluable(f"unpacks {len(items)} values into at least {star + after} names")
        for element, item in zip(target.elts[:star], items[:star], strict=True):
            self._assign(element, item, frame)
        self._assign(cast(ast.Starred, target.elts[star]).value, items[star : len(items) - after], frame)
        for element, item in zip(target.elts[star + 1 :], items[len(items) - after :], strict=True):
            self._assign(element, item, frame)

    # --- expressions -------------------------------------------------------------------------------------------

    _eval = _visit  # an expression: one step, with the handlers of expressions (no call between them)

    def _expr_constant(self, node: ast.Constant, frame: _Frame) -> object:
        if not isinstance(node.value, _PLAIN_TYPES):
            raise Unevaluable(f"uses a {type(node.value).__name__} constant, which is outside the subset")
        return self.check_value(node.value, what="a constant")

    def _expr_name(self, node: ast.Name, frame: _Frame) -> object:
        name = node.id
        if name in frame.locals:
            value = frame.locals[name]
            if isinstance(value, _Missing):
                raise value.error
            return value
        if name in frame.local_names:
            raise Unevaluable(f"reads the local name {name!r} before it is assigned")
        if frame.class_scope is not None:
            binding = self.program.class_binding(frame.class_scope, name)
            if binding is not None and binding.kind == "value":
                return self._class_value(frame.class_scope, binding)
        return self.global_value(frame.file, name)

    def _expr_attribute(self, node: ast.Attribute, frame: _Frame) -> object:
        return self.get_attribute(self._eval(node.value, frame), node.attr)

    def _expr_binop(self, node: ast.BinOp, frame: _Frame) -> object:
        return self._binary(node.op, self._eval(node.left, frame), self._eval(node.right, frame))

    def _expr_unaryop(self, node: ast.UnaryOp, frame: _Frame) -> object:
        operand = self._eval(node.operand, frame)
        if isinstance(node.op, ast.Not):
            return not self._truth(operand)
        if not isinstance(operand, (int, float)):
            raise Unevaluable(f"applies {type(node.op).__name__} to {_describe_value(operand)}")
        if isinstance(node.op, ast.USub):
            return self.check_value(-operand)
        if isinstance(node.op, ast.UAdd):
            return self.check_value(+operand)
        if isinstance(operand, float):
            raise Unevaluable("applies ~ to a float")
        return self.check_value(~operand)

    def _expr_boolop(self, node: ast.BoolOp, frame: _Frame) -> object:
        value: object = None
        for operand in node.values:
            value = self._eval(operand, frame)
            truth = self._truth(value)
            if isinstance(node.op, ast.And) and not truth:
                return value
            if isinstance(node.op, ast.Or) and truth:
                return value
        return value

    def _expr_compare(self, node: ast.Compare, frame: _Frame) -> bool:
        left = self._eval(node.left, frame)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self._eval(comparator, frame)
            if not self._compare(op, left, right):
                return False
            left = right
        return True

    def _expr_ifexp(self, node: ast.IfExp, frame: _Frame) -> object:
        branch = node.body if self._truth(self._eval(node.test, frame)) else node.orelse
        return self._eval(branch, frame)

    def _expr_namedexpr(self, node: ast.NamedExpr, frame: _Frame) -> object:
        value = self._eval(node.value, frame)
        frame.locals[node.target.id] = value
        return value

    def _expr_tuple(self, node: ast.Tuple, frame: _Frame) -> tuple:
        return self._sized(tuple(self._elements(node.elts, frame)))

    def _expr_list(self, node: ast.List, frame: _Frame) -> list:
        return self._sized(self._elements(node.elts, frame))

    def _expr_dict(self, node: ast.Dict, frame: _Frame) -> dict:
        result: dict = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                mapping = self._eval(value_node, frame)
                if not isinstance(mapping, dict):
                    raise Unevaluable(f"unpacks {_describe_value(mapping)} into a dict")
                result.update(mapping)
            else:
                key = _hashable(self._eval(key_node, frame))
                result[key] = self._eval(value_node, frame)
            self.check_value(result)
        return self._sized(result)

    def _elements(self, nodes: list[ast.expr], frame: _Frame) -> list:
        items: list = []
        for element in nodes:
            if isinstance(element, ast.Starred):
                items.extend(_items(self, self._eval(element.value, frame)))
            else:
                items.append(self._eval(element, frame))
            if len(items) > self.budget.max_items:
                self.check_value(items)
        return items

    def _expr_subscript(self, node: ast.Subscript, frame: _Frame) -> object:
        return self._subscript(self._eval(node.value, frame), self._eval(node.slice, frame))

    def _expr_slice(self, node: ast.Slice, frame: _Frame) -> slice:
        parts = [None if part is None else self._eval(part, frame) for part in (node.lower, node.upper, node.step)]
        if not all(part is None or isinstance(part, int) for part in parts):
            raise Unevaluable("slices with something other than integers")
        return slice(*parts)

    def _expr_joinedstr(self, node: ast.JoinedStr, frame: _Frame) -> str:
        pieces = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                pieces.append(str(part.value))
                continue
            part = cast(ast.FormattedValue, part)  # a JoinedStr holds constants and formatted values only
            value = self._eval(part.value, frame)
            if part.format_spec is not None or part.conversion not in (-1, ord("r"), ord("s")):
                raise Unevaluable("formats an f-string field with a conversion or format spec")
            if not isinstance(value, (*_PLAIN_TYPES, DType)):
                raise Unevaluable(f"formats {_describe_value(value)} in an f-string")
            pieces.append(repr(value) if part.conversion == ord("r") else str(value))
            self.check_value("".join(pieces))
        return self._sized("".join(pieces))

    def _expr_comprehension(self, node: ast.ListComp | ast.GeneratorExp | ast.SetComp, frame: _Frame) -> object:
        items: list = []

        def collect(scope: _Frame) -> None:
            items.append(self._eval(node.elt, scope))
            self.check_value(items, what="a comprehension")

        self._comprehend(node.generators, frame, collect)
        # A generator is consumed at once: max(x for x in ...) and tuple(...) see the same items.
        return self._sized(tuple(items) if isinstance(node, ast.GeneratorExp) else items)

    def _expr_dictcomp(self, node: ast.DictComp, frame: _Frame) -> dict:
        result: dict = {}

        def collect(scope: _Frame) -> None:
            result[_hashable(self._eval(node.key, scope))] = self._eval(node.value, scope)
            self.check_value(result, what="a comprehension")

        self._comprehend(node.generators, frame, collect)
        return self._sized(result)

    def _comprehend(self, generators: list[ast.comprehension], frame: _Frame, collect) -> None:
        # The comprehension's own names live in a child scope, as in Python 3.
        scope = _Frame(frame.function, frame.file, dict(frame.locals), frame.local_names, frame.first_argument)

        def loop(index: int) -> None:
            if index == len(generators):
                collect(scope)
                return
            generator = generators[index]
            if generator.is_async:
                raise Unevaluable("uses an async comprehension")
            for item in self._iterate(self._eval(generator.iter, scope)):
                self.charge()
                self._assign(generator.target, item, scope)
                if all(self._truth(self._eval(test, scope)) for test in generator.ifs):
                    loop(index + 1)

        loop(0)

    def _expr_call(self, node: ast.Call, frame: _Frame) -> object:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "super" and not node.args and "super" not in frame.locals:
            return self._super(frame)
        callee = self._eval(node.func, frame)
        args = self._elements(node.args, frame)
        kwargs: dict[str, object] = {}
        for keyword in node.keywords:
            value = self._eval(keyword.value, frame)
            if keyword.arg is None:
                if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                    raise Unevaluable(f"unpacks {_describe_value(value)} as keyword arguments")
                kwargs.update(value)
            else:
                kwargs[keyword.arg] = value
        return self._call(callee, args, kwargs, node, frame)

    def _super(self, frame: _Frame) -> SuperProxy:
        function, receiver = frame.function, frame.first_argument
        if function is None or function.owner is None or not isinstance(receiver, (Instance, ClassObject)):
            raise Unevaluable("calls super() outside a method")
        return SuperProxy(function.owner, receiver)

    # --- operations ------------------------------------------------------------------------------------------

    def _truth(self, value: object) -> bool:
        if isinstance(value, (*_PLAIN_TYPES, tuple, list, dict, range)):
            return bool(value)
        if isinstance(value, _HELD_TYPES):
            return True  # objects are true, as in Python (none of the stand-ins defines __bool__ or __len__)
        raise Unevaluable(f"tests the truth of {_describe_value(value)}")

    def _binary(self, op: ast.operator, left: object, right: object) -> object:
        numbers = (int, float)
        if isinstance(left, numbers) and isinstance(right, numbers):
            return self.check_value(_arithmetic(op, left, right, self.budget))
        if isinstance(op, ast.Add) and type(left) is type(right) and isinstance(left, (str, tuple, list)):
            other: Any = right  # of left's type, checked above
            limit = self.budget.max_chars if isinstance(left, str) else self.budget.max_items
            if len(left) + len(other) > limit:
                raise Unevaluable(
                    f"concatenates {type(left).__name__}s to {len(left) + len(other)} items, over the size budget "
                    f"of {limit}"
                )
            return self._sized(left + other)
        if isinstance(op, ast.Mult) and isinstance(left, (str, tuple, list)) != isinstance(right, (str, tuple, list)):
            sequence: Any
            sequence, count = (left, right) if isinstance(left, (str, tuple, list)) else (right, left)
            if isinstance(count, int) and not isinstance(count, float):
                limit = self.budget.max_chars if isinstance(sequence, str) else self.budget.max_items
                if len(sequence) * max(count, 0) > limit:
                    raise Unevaluable(
                        f"repeats a {type(sequence).__name__} of {len(sequence)} items {count} times, over the "
                        f"size budget of {limit}"
                    )
                return self._sized(sequence * count)
        raise Unevaluable(
            f"applies {type(op).__name__} to {_describe_value(left)} and {_describe_value(right)}, "
            "which is outside the subset"
        )

    def _compare(self, op: ast.cmpop, left: object, right: object) -> bool:
        # Python compares containers item by item: charge what it walks.
        self.charge(self.node_count(left) + self.node_count(right) - 2)
        if isinstance(op, ast.Is):
            return left is right or (_is_singleton(left) and left == right and type(left) is type(right))
        if isinstance(op, ast.IsNot):
            return not self._compare(ast.Is(), left, right)
        if isinstance(op, (ast.In, ast.NotIn)):
            if not isinstance(right, (str, tuple, list, dict, range)):
                raise Unevaluable(f"tests membership in {_describe_value(right)}")
            found = bool(_run_plain(lambda: left in right))
            return found if isinstance(op, ast.In) else not found
        if isinstance(op, (ast.Eq, ast.NotEq)):
            equal = _run_plain(lambda: left == right)
            return bool(equal) if isinstance(op, ast.Eq) else not equal
        ordered = (int, float, str, tuple, list)
        if not (isinstance(left, ordered) and isinstance(right, ordered)):
            raise Unevaluable(f"orders {_describe_value(left)} and {_describe_value(right)}")
        a: Any = left  # Python decides whether the two order (a TypeError becomes Unevaluable)
        b: Any = right
        order = _ORDERINGS[type(op)]
        return bool(_run_plain(lambda: order(a, b)))

    def _subscript(self, container: object, key: object) -> object:
        if isinstance(container, (tuple, list, str, range)) and isinstance(key, (int, slice)):
            return self._sized(_run_plain(lambda: container[key]))
        if isinstance(container, dict):
            return _run_plain(lambda: container[_hashable(key)])
        raise Unevaluable(f"subscripts {_describe_value(container)} with {_describe_value(key)}")

    def _iterate(self, value: object) -> list | range:
        """The items of a sequence the interpreter holds; anything else is not iterated."""
        if isinstance(value, (tuple, list, str)):
            return list(value)
        if isinstance(value, dict):
            return list(value.keys())
        if isinstance(value, range):
            return value  # lazily: every iteration is charged a step, so a long range stops at the budget
        raise Unevaluable(f"iterates over {_describe_value(value)}")

    # --- names, attributes, calls ------------------------------------------------------------------------------

    def global_value(self, file: str, name: str) -> object:
        """A module-level name of file: its own def/class/assignment/import, then the stand-ins, then BUILTINS."""
        key = (file, name)
        if key in self._globals:
            return self._globals[key]
        if key in self._resolving:
            raise Unevaluable(f"the module-level name {name!r} is defined in terms of itself")
        self._resolving.add(key)
        try:
            value = self._resolve_global(file, name)
        finally:
            self._resolving.discard(key)
        self._globals[key] = value
        return value

    def _resolve_global(self, file: str, name: str) -> object:
        binding = self.program.global_binding(file, name)
        if binding is not None:
            value = self._from_binding(binding, name)
            if value is not _UNBOUND:
                return value
        if name in COMMON_GLOBALS:
            return COMMON_GLOBALS[name]
        if name in BUILTINS:
            return BUILTINS[name]
        raise Unevaluable(f"uses the name {name!r}, which is only defined when vLLM is imported")

    def _from_binding(self, binding: Binding, name: str) -> object:
        if binding.kind == "function":
            return Function(binding.file, cast(ast.FunctionDef, binding.node))
        if binding.kind == "class":
            return ClassObject(binding.cls)
        if binding.kind == "value":
            frame = _Frame(None, binding.file)
            return self._eval(cast(ast.expr, binding.node), frame)
        if binding.kind == "module":
            return ModuleObject(binding.module) if self.program.module_file(binding.module) else _UNBOUND
        if binding.kind == "import":
            return self._imported(binding.module, binding.original)
        if binding.kind == "conditional" and name not in COMMON_GLOBALS and name not in BUILTINS:
            raise Unevaluable(f"uses the name {name!r}, which the module binds only in a top-level if/try")
        if binding.kind == "conditional":
            return _UNBOUND
        raise Unevaluable(f"uses the name {name!r}, which the module binds in a way the evaluator does not follow")

    def _imported(self, module: str, original: str) -> object:
        standin = self.program.standin_import(module, original)
        if standin is not None:
            return standin
        file = self.program.module_file(module)
        if file is not None:
            return self.global_value(file, original)
        if original in PURE_HELPERS:
            return PURE_HELPERS[original]
        return _UNBOUND

    def get_attribute(self, value: object, name: str) -> object:
        _check_name(name)
        if isinstance(value, Instance):
            return self._instance_attribute(value, name)
        if isinstance(value, ClassObject):
            return self._class_attribute(value.cls, name, value)
        if isinstance(value, SuperProxy):
            return self._super_attribute(value, name)
        if isinstance(value, ModuleObject):
            found = self._imported(value.module, name)
            if found is _UNBOUND:
                raise MissingAttribute(f"reads {value.module}.{name}, which the parsed files do not define")
            return found
        return _standin_attribute(value, name)

    def _instance_attribute(self, instance: Instance, name: str) -> object:
        # Python: a method or property anywhere in the MRO wins over an instance attribute; a plain class attribute
        # loses to it. The stand-in attributes play the instance's __dict__.
        found = self._lookup(instance.cls, name)
        if found is not None and found[1].kind == "function":
            owner, binding = found
            return self._bind(Function(owner_file(owner), _def(binding), owner, _method_kind(_def(binding))), instance)
        if name in instance.attributes:
            return instance.attributes[name]
        if found is not None:
            return self._class_value(found[0], found[1])
        raise MissingAttribute(f"reads self.{name}, which the stand-in self does not carry")

    def _class_attribute(self, cls: Any, name: str, receiver: ClassObject) -> object:
        found = self._lookup(cls, name)
        if found is None:
            raise MissingAttribute(f"reads {cls.name}.{name}, which the class does not define")
        owner, binding = found
        if binding.kind == "function":
            return self._bind(Function(owner_file(owner), _def(binding), owner, _method_kind(_def(binding))), receiver)
        return self._class_value(owner, binding)

    def _super_attribute(self, proxy: SuperProxy, name: str) -> object:
        receiver_cls = proxy.receiver.cls
        mro = self.program.mro(receiver_cls)
        after = mro[[c.key for c in mro].index(proxy.owner.key) + 1 :] if proxy.owner in mro else []
        for owner in after:
            binding = self.program.class_binding(owner, name)
            if binding is None:
                continue
            if binding.kind == "function":
                function = Function(owner_file(owner), _def(binding), owner, _method_kind(_def(binding)))
                return self._bind(function, proxy.receiver)
            return self._class_value(owner, binding)
        raise MissingAttribute(f"reads super().{name}, which no parsed base class defines")

    def _class_value(self, owner: Any, binding: Binding) -> object:
        """A class attribute's value (`BLOCK = 128` in the class body), computed when first read."""
        return self._eval(cast(ast.expr, binding.node), _Frame(None, owner_file(owner), class_scope=owner))

    def _lookup(self, cls: Any, name: str) -> tuple[Any, Binding] | None:
        """The first class of cls's MRO that binds name, with the binding; kept for this evaluation (the program does
        not change during it, and cls, a class of the program, outlives it)."""
        key = (id(cls), name)
        if key in self._lookups:
            return self._lookups[key]
        found = None
        for owner in self.program.mro(cls):
            binding = self.program.class_binding(owner, name)
            if binding is not None:
                found = owner, binding
                break
        self._lookups[key] = found
        return found

    def _bind(self, function: Function, receiver: Instance | ClassObject) -> object:
        """What reading a def from a class gives: a bound method, the function, or the property's value."""
        kind = function.kind
        if kind == STATIC:
            return function
        if kind == CLASSMETHOD:
            return BoundMethod(function, receiver if isinstance(receiver, ClassObject) else ClassObject(receiver.cls))
        if isinstance(receiver, ClassObject):
            if kind in (PROPERTY, CACHED_PROPERTY):
                raise Unevaluable(f"reads the property {function.name} from the class, not an instance")
            return function
        if kind == PROPERTY:
            return self._call(function, [receiver], {}, None, None)
        if kind == CACHED_PROPERTY:
            if function.name not in receiver.cached:
                receiver.cached[function.name] = self._call(function, [receiver], {}, None, None)
            return receiver.cached[function.name]
        return BoundMethod(function, receiver)

    def _call(self, callee: object, args: list, kwargs: dict, node: ast.Call | None, frame: _Frame | None) -> object:
        if isinstance(callee, BoundMethod):
            return self._call(callee.function, [callee.receiver, *args], kwargs, node, frame)
        if isinstance(callee, Builtin):
            return self._sized(_run_plain(lambda: callee.fn(self, *args, **kwargs)))
        if isinstance(callee, Function):
            return self._call_function(callee, args, kwargs)
        if isinstance(callee, ClassObject):
            raise Unevaluable(f"constructs {callee.cls.name}, which is outside the subset")
        raise Unevaluable(f"calls {_describe_value(callee)}, which is outside the subset")

    def _call_function(self, function: Function, args: list, kwargs: dict) -> object:
        if self.call_depth >= self.budget.max_call_depth:
            raise Unevaluable(f"calls nested deeper than {self.budget.max_call_depth}")
        names = cached_local_names(function.node)
        frame = _Frame(function, function.file, {}, names)
        self._bind_arguments(function, args, kwargs, frame)
        if function.kind in (METHOD, CLASSMETHOD, PROPERTY, CACHED_PROPERTY) and args:
            frame.first_argument = args[0]
        self.call_depth += 1
        try:
            signal = self._exec_block(function.node.body, frame)
        finally:
            self.call_depth -= 1
        return signal.value if isinstance(signal, _Return) else None

    def _bind_arguments(self, function: Function, args: list, kwargs: dict, frame: _Frame) -> None:
        facts = def_facts(function.node)
        positional, defaults = facts.positional, facts.defaults
        bound = frame.locals
        for name, value in zip(positional, args, strict=False):
            bound[name] = value
        extra = args[len(positional) :]
        if extra and facts.vararg is None:
            raise Unevaluable(f"{function.name}() takes {len(positional)} positional arguments, got {len(args)}")
        if facts.vararg is not None:
            bound[facts.vararg] = tuple(extra)
        leftover: dict[str, object] = {}
        for name, value in kwargs.items():
            if name in bound and name not in facts.posonly:
                raise Unevaluable(f"{function.name}() got two values for {name!r}")
            if name in defaults or name in facts.keywords:
                bound[name] = value
            elif facts.kwarg is not None:
                leftover[name] = value
            else:
                raise Unevaluable(f"{function.name}() got an unexpected keyword argument {name!r}")
        if facts.kwarg is not None:
            bound[facts.kwarg] = leftover
        for name in facts.parameters:
            if name in bound:
                continue
            if name not in defaults:
                raise Unevaluable(f"{function.name}() is missing the argument {name!r}")
            bound[name] = self._default(function, defaults[name])

    def _default(self, function: Function, node: ast.expr) -> object:
        # Python evaluates defaults when the def runs; here, when a call needs one, in the def's module.
        try:
            return self._eval(node, _Frame(None, function.file))
        except Unevaluable as error:
            return _Missing(error)


_UNBOUND = object()
_ORDERINGS: dict[type, Callable[[Any, Any], object]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge
}  # fmt: skip


_STATEMENTS: dict[type, Callable[[Interpreter, Any, _Frame], object]] = {
    ast.Expr: Interpreter._stmt_expr,
    ast.Pass: Interpreter._stmt_pass,
    ast.Assign: Interpreter._stmt_assign,
    ast.AnnAssign: Interpreter._stmt_ann_assign,
    ast.AugAssign: Interpreter._stmt_aug_assign,
    ast.Return: Interpreter._stmt_return,
    ast.If: Interpreter._stmt_if,
    ast.For: Interpreter._stmt_for,
    ast.While: Interpreter._stmt_while,
    ast.Break: Interpreter._stmt_break,
    ast.Continue: Interpreter._stmt_continue,
    ast.Assert: Interpreter._stmt_assert,
    ast.Import: Interpreter._stmt_import,
    ast.ImportFrom: Interpreter._stmt_import,
    ast.Raise: Interpreter._stmt_raise,
    ast.Delete: Interpreter._stmt_delete,
}

_EXPRESSIONS: dict[type, Callable[[Interpreter, Any, _Frame], object]] = {
    ast.Constant: Interpreter._expr_constant,
    ast.Name: Interpreter._expr_name,
    ast.Attribute: Interpreter._expr_attribute,
    ast.BinOp: Interpreter._expr_binop,
    ast.UnaryOp: Interpreter._expr_unaryop,
    ast.BoolOp: Interpreter._expr_boolop,
    ast.Compare: Interpreter._expr_compare,
    ast.IfExp: Interpreter._expr_ifexp,
    ast.NamedExpr: Interpreter._expr_namedexpr,
    ast.Tuple: Interpreter._expr_tuple,
    ast.List: Interpreter._expr_list,
    ast.Dict: Interpreter._expr_dict,
    ast.Subscript: Interpreter._expr_subscript,
    ast.Slice: Interpreter._expr_slice,
    ast.JoinedStr: Interpreter._expr_joinedstr,
    ast.ListComp: Interpreter._expr_comprehension,
    ast.GeneratorExp: Interpreter._expr_comprehension,
    ast.DictComp: Interpreter._expr_dictcomp,
    ast.Call: Interpreter._expr_call,
}


def _outside(node: ast.AST, frame: _Frame) -> Unevaluable:
    return Unevaluable(f"uses {type(node).__name__}, which is outside the evaluated subset")


def _check_name(name: str) -> None:
    if name.startswith("__"):
        raise Unevaluable(f"reads the attribute {name}, and dunder attributes are outside the subset")


def _is_singleton(value: object) -> bool:
    return value is None or isinstance(value, bool)


def _hashable(key: object) -> object:
    if isinstance(key, (*_PLAIN_TYPES, DType)) or (
        isinstance(key, tuple) and all(isinstance(k, (*_PLAIN_TYPES, DType)) for k in key)
    ):
        return key
    raise Unevaluable(f"uses {_describe_value(key)} as a dict key")


def _describe_value(value: object) -> str:
    if isinstance(value, (Instance, ClassObject, StandIn, StandInEnum, Builtin, ModuleObject)):
        return repr(value)
    if isinstance(value, Function):
        return f"the function {value.name}"
    if isinstance(value, BoundMethod):
        return f"the method {value.function.name}"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _run_plain(operation: Callable[[], object]) -> object:
    """Run an operation on plain values; Python's own errors about them become the reason."""
    try:
        return operation()
    except Unevaluable:
        raise
    except (ArithmeticError, TypeError, ValueError, LookupError, AttributeError) as error:
        raise Unevaluable(f"raised {type(error).__name__}: {error}") from None


def _arithmetic(op: ast.operator, left: int | float, right: int | float, budget: Budget) -> int | float:
    """One arithmetic operation whose operands are within the budget; refuses what would blow up first."""
    kind = type(op)
    if kind is ast.Pow:
        _check_power(left, right, budget)
    if kind in (ast.LShift, ast.RShift) and isinstance(right, int) and right > 64:
        raise Unevaluable(f"shifts by {right} bits, over the size budget of 64 bits")
    operation = _ARITHMETIC.get(kind)
    if operation is None:
        raise Unevaluable(f"uses the operator {kind.__name__}, which is outside the subset")
    result = _run_plain(lambda: operation(left, right))
    if not isinstance(result, (int, float)):  # int and float operands make an int, a float or a complex
        raise Unevaluable("computes a complex number")
    return result


def _check_power(base: int | float, exponent: int | float, budget: Budget) -> None:
    if abs(base) <= 1 or exponent <= 0:
        return
    if exponent * math.log2(abs(base)) >= math.log2(budget.max_int):
        raise Unevaluable(f"computes {base!r} ** {exponent!r}, over the size budget of 2^64")


_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
    ast.BitAnd: lambda a, b: a & b,
    ast.BitOr: lambda a, b: a | b,
    ast.BitXor: lambda a, b: a ^ b,
}


# --- the functions and attributes release code may use ---------------------------------------------------------


def function_decorators(node: ast.FunctionDef) -> set[str]:
    """The decorator names that change how a def is read: staticmethod, classmethod, property, setter, ..."""
    names = set()
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Name):
            names.add(decorator.id)
        elif isinstance(decorator, ast.Attribute):
            names.add(decorator.attr)
    return names


def _def(binding: Binding) -> ast.FunctionDef:
    """The def a binding of kind "function" holds."""
    return cast(ast.FunctionDef, binding.node)


def _method_kind(node: ast.FunctionDef) -> str:
    return def_facts(node).kind


def owner_file(cls: Any) -> str:
    return cls.file


@dataclass(frozen=True)
class DefFacts:
    """What calling a def needs from its AST, read once: the names it binds and how its parameters take arguments."""

    local_names: frozenset[str]
    positional: tuple[str, ...]  # positional-only, then positional-or-keyword
    posonly: frozenset[str]
    keywords: frozenset[str]  # the parameters a keyword argument may name (not the positional-only ones)
    parameters: tuple[str, ...]  # positional, then keyword-only
    defaults: dict[str, ast.expr]  # parameter -> its default's expression
    vararg: str | None
    kwarg: str | None
    kind: str  # as a method: METHOD, STATIC, CLASSMETHOD, PROPERTY or CACHED_PROPERTY


def _read_def(function: ast.FunctionDef) -> DefFacts:
    spec = function.args
    positional = [*spec.posonlyargs, *spec.args]
    defaults = dict(
        zip([a.arg for a in positional[len(positional) - len(spec.defaults) :]], spec.defaults, strict=True)
    )
    defaults.update({a.arg: d for a, d in zip(spec.kwonlyargs, spec.kw_defaults, strict=True) if d is not None})
    decorators = function_decorators(function)
    kind = next((k for k in (STATIC, CLASSMETHOD, PROPERTY, CACHED_PROPERTY) if k in decorators), METHOD)
    return DefFacts(
        local_names=local_names(function), positional=tuple(a.arg for a in positional),
        posonly=frozenset(a.arg for a in spec.posonlyargs),
        keywords=frozenset(a.arg for a in (*spec.args, *spec.kwonlyargs)),
        parameters=tuple(a.arg for a in (*positional, *spec.kwonlyargs)), defaults=defaults,
        vararg=spec.vararg.arg if spec.vararg is not None else None,
        kwarg=spec.kwarg.arg if spec.kwarg is not None else None, kind=kind,
    )  # fmt: skip


# DefFacts of every def evaluated in this process, by the node's id; the node is kept with its facts so the id
# cannot be reused while the entry lives. Parsed trees live as long (evaluate.source_tree), so this holds little.
_DEF_FACTS: dict[int, tuple[ast.FunctionDef, DefFacts]] = {}
MAX_CACHED_FUNCTIONS = 1 << 15


def def_facts(function: ast.FunctionDef) -> DefFacts:
    found = _DEF_FACTS.get(id(function))
    if found is not None and found[0] is function:
        return found[1]
    if len(_DEF_FACTS) >= MAX_CACHED_FUNCTIONS:
        _DEF_FACTS.clear()
    facts = _read_def(function)
    _DEF_FACTS[id(function)] = (function, facts)
    return facts


def cached_local_names(function: ast.FunctionDef) -> frozenset[str]:
    return def_facts(function).local_names


def forget_function(function: ast.FunctionDef) -> None:
    """Drop a def made for one call (an expression wrapped as a function) from the cache, so it is not kept."""
    found = _DEF_FACTS.get(id(function))
    if found is not None and found[0] is function:
        del _DEF_FACTS[id(function)]


def local_names(function: ast.FunctionDef) -> frozenset[str]:
    """Names a def binds (its parameters and assignment targets): Python treats them as local everywhere in it."""
    spec = function.args
    names = {a.arg for a in (*spec.posonlyargs, *spec.args, *spec.kwonlyargs)}
    names.update(a.arg for a in (spec.vararg, spec.kwarg) if a is not None)
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda):
                names.add(node.name)
            continue  # their bodies are their own scopes
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return frozenset(names)


_STR_METHODS = frozenset({"lower", "upper", "startswith", "endswith", "removeprefix", "removesuffix", "strip"})
_ACTIVATION_FIELDS = frozenset({"value", "name", "is_gated"})


def _standin_attribute(value: object, name: str) -> object:
    """Attributes of the stand-ins and a few pure methods of plain values; anything else is Unevaluable."""
    if isinstance(value, StandIn):
        if name in value.attributes:
            return value.attributes[name]
        raise MissingAttribute(f"reads {value.path}.{name}, which the stand-in does not carry")
    if isinstance(value, StandInEnum):
        if name == "from_str":
            return Builtin("MoEActivation.from_str", lambda interp, text: Activation(_expect(text, str)))
        return Activation(name.lower())
    if isinstance(value, DType) and name in ("name", "itemsize"):
        return getattr(value, name)
    if isinstance(value, FakeTensor):
        return _tensor_attribute(value, name)
    if isinstance(value, Activation):
        if name in _ACTIVATION_FIELDS:
            return getattr(value, name)
        if name == "without_mul":
            return Builtin("without_mul", lambda interp: value.without_mul())
    if isinstance(value, str) and name in _STR_METHODS:
        method = getattr(str, name)
        return Builtin(f"str.{name}", lambda interp, *args: method(value, *(_expect(a, str) for a in args)))
    if isinstance(value, dict) and name in ("get", "keys", "values", "items"):
        return _dict_method(value, name)
    if isinstance(value, (tuple, list)) and name in ("index", "count"):
        method = getattr(value, name)
        return Builtin(f"{type(value).__name__}.{name}", lambda interp, item: method(item))
    raise MissingAttribute(f"reads .{name} of {_describe_value(value)}, which is outside the subset")


def _tensor_attribute(tensor: FakeTensor, name: str) -> object:
    if name in ("shape", "dtype", "ndim"):
        return getattr(tensor, name)
    if name == "size":
        return Builtin("Tensor.size", lambda interp, dim=None: tensor.size(_expect(dim, (int, type(None)))))
    if name in ("dim", "numel"):
        return Builtin(f"Tensor.{name}", lambda interp: getattr(tensor, name)())
    raise MissingAttribute(f"reads .{name} of a tensor argument, which the stand-in does not carry")


def _dict_method(mapping: dict, name: str) -> Builtin:
    if name == "get":
        return Builtin("dict.get", lambda interp, key, default=None: mapping.get(_hashable(key), default))
    return Builtin(f"dict.{name}", lambda interp: tuple(getattr(mapping, name)()))


def _expect(value: object, types: type | tuple[type, ...]) -> Any:
    if not isinstance(value, types) or (isinstance(value, bool) and types in (int, float)):
        raise Unevaluable(f"passes {_describe_value(value)} where the evaluator expects {types}")
    return value


def _items(interp: Interpreter, iterable: object) -> list:
    """All items of a sequence at once, charged by what comparing or copying them walks."""
    items = interp._iterate(iterable)
    if isinstance(items, range):
        if len(items) > interp.budget.max_items:
            raise Unevaluable(f"makes a range of {len(items)} items into a sequence, over {interp.budget.max_items}")
        items = list(items)
    interp.charge(sum(interp.node_count(item) for item in items))
    return items


def _numbers(interp: Interpreter, args: tuple, name: str) -> list:
    values = _items(interp, args[0]) if len(args) == 1 else list(args)
    if not values:
        raise Unevaluable(f"{name}() of an empty sequence")
    return values


def _max(interp: Interpreter, *args, **kwargs) -> object:
    if set(kwargs) - {"default"}:
        raise Unevaluable("max() with a key function is outside the subset")
    if len(args) == 1 and "default" in kwargs and not _items(interp, args[0]):
        return kwargs["default"]
    return max(_numbers(interp, args, "max"))


def _min(interp: Interpreter, *args, **kwargs) -> object:
    if set(kwargs) - {"default"}:
        raise Unevaluable("min() with a key function is outside the subset")
    if len(args) == 1 and "default" in kwargs and not _items(interp, args[0]):
        return kwargs["default"]
    return min(_numbers(interp, args, "min"))


def _int(interp: Interpreter, value: object = 0) -> int:
    if isinstance(value, str):
        if len(value) > 30:
            raise Unevaluable("int() of a string longer than 30 characters")
        return int(value)
    return int(_expect(value, (int, float)))


def _isinstance(interp: Interpreter, value: object, types: object) -> bool:
    options = types if isinstance(types, tuple) else (types,)
    for option in options:
        if isinstance(option, Builtin) and option.pytype is not None:
            if isinstance(value, option.pytype):
                return True
        elif isinstance(option, ClassObject):
            if isinstance(value, Instance) and option.cls.key in {c.key for c in interp.program.mro(value.cls)}:
                return True
        else:
            raise Unevaluable(f"isinstance() against {_describe_value(option)}")
    return False


def _getattr(interp: Interpreter, value: object, name: object, *default) -> object:
    try:
        return interp.get_attribute(value, _expect(name, str))
    except MissingAttribute:
        if default:
            return default[0]
        raise


def _hasattr(interp: Interpreter, value: object, name: object) -> bool:
    try:
        interp.get_attribute(value, _expect(name, str))
    except MissingAttribute:
        return False
    return True


def _range(interp: Interpreter, *args) -> range:
    for arg in args:
        _expect(arg, int)
    return range(*args)


def _round(value: object, digits: object) -> int | float:
    # round(5, -10**18) makes Python compute 10**(10**18) first: digits beyond a float's range mean nothing.
    ndigits = None if digits is None else _expect(digits, int)
    if ndigits is not None and abs(ndigits) > 400:
        raise Unevaluable(f"round() to {digits} digits; at most 400 either way")
    return round(_expect(value, (int, float)), ndigits)


def _cdiv(interp: Interpreter, a: object, b: object) -> int:
    return -(_expect(a, int) // -_expect(b, int))


def _round_up(interp: Interpreter, x: object, y: object) -> int:
    a, b = _expect(x, int), _expect(y, int)
    return ((a + b - 1) // b) * b


def _prod(interp: Interpreter, iterable: object, *, start: object = 1) -> object:
    result: Any = start
    for item in _items(interp, iterable):
        result = interp.check_value(_arithmetic(ast.Mult(), result, _expect(item, (int, float)), interp.budget))
    return result


def _sum(interp: Interpreter, iterable: object, start: object = 0) -> object:
    result: Any = start
    for item in _items(interp, iterable):
        result = interp.check_value(_arithmetic(ast.Add(), result, _expect(item, (int, float)), interp.budget))
    return result


def _pow(interp: Interpreter, base: object, exponent: object) -> object:
    return _arithmetic(ast.Pow(), _expect(base, (int, float)), _expect(exponent, (int, float)), interp.budget)


def _math_function(name: str) -> Builtin:
    function = getattr(math, name)
    return Builtin(f"math.{name}", lambda interp, *args: function(*(_expect(a, (int, float)) for a in args)))


MATH_STANDIN = StandIn(
    "math",
    prod=Builtin("math.prod", _prod),
    **{name: _math_function(name) for name in ("ceil", "floor", "gcd", "isqrt", "log2", "sqrt", "trunc")},
)

BUILTINS: dict[str, Builtin] = {
    "max": Builtin("max", _max),
    "min": Builtin("min", _min),
    "int": Builtin("int", _int, int),
    "float": Builtin("float", lambda interp, value=0.0: float(_expect(value, (int, float))), float),
    "bool": Builtin("bool", lambda interp, value=False: interp._truth(value), bool),
    "str": Builtin("str", lambda interp, value="": str(_expect(value, (*_PLAIN_TYPES, DType))), str),
    "abs": Builtin("abs", lambda interp, value: abs(_expect(value, (int, float)))),
    "round": Builtin("round", lambda interp, value, digits=None: _round(value, digits)),
    "divmod": Builtin(
        "divmod",
        lambda interp, a, b: tuple(
            interp.check_value(part) for part in divmod(_expect(a, (int, float)), _expect(b, (int, float)))
        ),
    ),
    "pow": Builtin("pow", _pow),
    "len": Builtin("len", lambda interp, value: len(_expect(value, (str, tuple, list, dict, range)))),
    "tuple": Builtin("tuple", lambda interp, iterable=(): tuple(_items(interp, iterable)), tuple),
    "list": Builtin("list", lambda interp, iterable=(): list(_items(interp, iterable)), list),
    "dict": Builtin("dict", lambda interp, **kwargs: dict(kwargs), dict),
    "sum": Builtin("sum", _sum),
    "any": Builtin("any", lambda interp, iterable: any(interp._truth(i) for i in _items(interp, iterable))),
    "all": Builtin("all", lambda interp, iterable: all(interp._truth(i) for i in _items(interp, iterable))),
    "range": Builtin("range", _range, range),
    "enumerate": Builtin(
        "enumerate", lambda interp, iterable, start=0: tuple(enumerate(_items(interp, iterable), _expect(start, int)))
    ),
    "zip": Builtin("zip", lambda interp, *iterables: tuple(zip(*(_items(interp, i) for i in iterables), strict=False))),
    "sorted": Builtin("sorted", lambda interp, iterable: sorted(_items(interp, iterable))),
    "reversed": Builtin("reversed", lambda interp, iterable: tuple(reversed(_items(interp, iterable)))),
    "isinstance": Builtin("isinstance", _isinstance),
    "getattr": Builtin("getattr", _getattr),
    "hasattr": Builtin("hasattr", _hasattr),
}

# vLLM's own pure integer helpers (vllm.utils.math_utils), by the names files import them under.
PURE_HELPERS: dict[str, Builtin] = {"cdiv": Builtin("cdiv", _cdiv), "round_up": Builtin("round_up", _round_up)}


def _dtype_table() -> dict[str, DType]:
    sizes = {
        "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8,
        "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e8m0fnu": 1,
        "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1,
    }  # fmt: skip
    return {name: DType(name, size) for name, size in sizes.items()}


DTYPES = _dtype_table()

TORCH_STANDIN = StandIn(
    "torch", dtype=Builtin("torch.dtype", lambda interp: None, DType),
    Tensor=Builtin("torch.Tensor", lambda interp: None, FakeTensor), **DTYPES,
)  # fmt: skip

FORMAT_ENUM_STANDIN = StandIn("FusedMoEActivationFormat", Standard="standard", BatchedExperts="batched_experts")

ACTIVATION_ENUM_STANDIN = StandInEnum()

COMMON_GLOBALS: dict[str, object] = {
    "torch": TORCH_STANDIN,
    "math": MATH_STANDIN,
    "FusedMoEActivationFormat": FORMAT_ENUM_STANDIN,
    "MoEActivation": ACTIVATION_ENUM_STANDIN,
}

_HELD_TYPES = (
    DType, Activation, FakeTensor, StandIn, StandInEnum, Builtin, Function, BoundMethod, ClassObject, Instance,
    SuperProxy, ModuleObject, slice, _Missing,
)  # fmt: skip
# Held types check_value passes at once: no subclass of theirs is sized (Activation is a str of the release's names).
_HELD_EXACT = frozenset({DType, FakeTensor, StandIn, StandInEnum, Builtin, Function, BoundMethod, ClassObject,
                         Instance, SuperProxy, ModuleObject})  # fmt: skip
