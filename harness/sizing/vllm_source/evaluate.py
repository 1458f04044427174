"""Run a vLLM release's own `workspace_shapes` without importing vLLM.

    fused_moe/**.py --ast--> classes, bases, imports --> batched-experts classes
        (activation_format(s) returns ...BatchedExperts, directly or through a base parsed here)
    each class and its parsed bases --compile--> a stand-in class: methods only, annotations stripped
    stand-in class + stand-in self (num_dispatchers = D, max_num_tokens = T, moe_config, quant_config, ...)
        --call workspace_shapes(M, N, K, topk, ...), arguments matched by parameter name--> (ws13, ws2, out)

The methods run in a namespace of inert stand-ins (a `torch` that only knows dtypes, an activation enum, the
activation-format enum, `math`, a few pure helpers) with a reduced set of builtins and no `__import__`. Whatever
else a method reaches for is missing there, so the call fails and the class is reported as not evaluated, with
the name it needed; nothing is guessed.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import inspect
import math
from dataclasses import dataclass
from pathlib import Path

from harness.sizing.vllm_source.sources import FUSED_MOE_DIR, VllmSource, VllmSourceError
from harness.core.contract import Shape, SizingArgs

MODULAR_KERNEL_MODULE = "vllm.model_executor.layers.fused_moe.modular_kernel"
ACTIVATION_MODULE = "vllm.model_executor.layers.fused_moe.activation"
FORMAT_METHODS = ("activation_format", "activation_formats")
BATCHED_FORMAT = "BatchedExperts"


@dataclass(frozen=True)
class ParsedClass:
    """One class statement found in the parsed tree."""

    name: str
    file: str  # relative to the source root, e.g. vllm/model_executor/layers/fused_moe/experts/cutlass_moe.py
    node: ast.ClassDef

    @property
    def key(self) -> tuple[str, str]:
        return (self.file, self.name)


@dataclass(frozen=True)
class ParsedModule:
    """One parsed file with the names its imports bind."""

    file: str
    module: str  # dotted name
    tree: ast.Module
    imported_names: dict[str, tuple[str, str]]  # local name -> (module, original name)
    module_aliases: dict[str, str]  # local name -> module


@dataclass(frozen=True)
class Evaluation:
    """What one class's workspace_shapes returned for one set of sizing arguments, or why it could not run."""

    ws13: Shape | None
    ws2: Shape | None
    out: Shape | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.ws13 is not None


class SourceTree:
    """The fused-MoE package of one VllmSource, parsed once, with class lookup across its files."""

    def __init__(self, source: VllmSource) -> None:
        self.source = source
        self.modules: dict[str, ParsedModule] = {}
        self.unparsed: dict[str, str] = {}  # file -> why ast could not read it
        self.classes_by_name: dict[str, list[ParsedClass]] = {}
        self._file_by_module: dict[str, str] = {}
        fused_moe = source.fused_moe_dir
        if not fused_moe.is_dir():
            raise VllmSourceError(f"{source.label}: no fused-MoE package at {fused_moe}")
        for path in sorted(fused_moe.rglob("*.py")):
            self._parse(path)
        if not self.modules:
            raise VllmSourceError(f"{source.label}: none of the files under {fused_moe} could be parsed")
        self._built: dict[tuple[str, str], type] = {}
        self._namespaces: dict[str, dict] = {}
        self._resolving: set[tuple[str, str]] = set()

    def _parse(self, path: Path) -> None:
        file = path.relative_to(self.source.root).as_posix()
        module = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as error:
            self.unparsed[file] = f"{type(error).__name__}: {error}"
            return
        imported_names: dict[str, tuple[str, str]] = {}
        module_aliases: dict[str, str] = {}
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        module_aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _absolute_module(node, package)
                for alias in node.names:
                    # `from pkg import module as mk` binds a module; `from module import Class` binds a name.
                    imported_names[alias.asname or alias.name] = (base, alias.name)
                    module_aliases.setdefault(alias.asname or alias.name, f"{base}.{alias.name}")
        parsed = ParsedModule(file, module, tree, imported_names, module_aliases)
        self.modules[file] = parsed
        self._file_by_module[module] = file
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes_by_name.setdefault(node.name, []).append(ParsedClass(node.name, file, node))

    # --- class lookup --------------------------------------------------------------------------------------

    def _class_in_module(self, module: str, name: str) -> ParsedClass | None:
        file = self._file_by_module.get(module)
        if file is None:
            return None
        return next((c for c in self.classes_by_name.get(name, []) if c.file == file), None)

    def resolve_base(self, owner: ParsedClass, base: ast.expr) -> ParsedClass | None:
        """The parsed class a base expression names, following the owner file's imports; None when outside."""
        parsed = self.modules[owner.file]
        if isinstance(base, ast.Name):
            local = self._class_in_module(parsed.module, base.id)
            if local is not None:
                return local
            if base.id in parsed.imported_names:
                module, original = parsed.imported_names[base.id]
                found = self._class_in_module(module, original)
                if found is not None:
                    return found
                name = original
            else:
                name = base.id
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            module = parsed.module_aliases.get(base.value.id)
            if module is not None:
                found = self._class_in_module(module, base.attr)
                if found is not None:
                    return found
            name = base.attr
        else:
            return None
        # A re-export through a package __init__: accept the name only when one parsed class carries it.
        candidates = self.classes_by_name.get(name, [])
        return candidates[0] if len(candidates) == 1 else None

    def lineage(self, cls: ParsedClass) -> list[ParsedClass]:
        """cls and its parsed bases, depth first, left to right, each once."""
        seen: dict[tuple[str, str], ParsedClass] = {}

        def visit(current: ParsedClass) -> None:
            if current.key in seen:
                return
            seen[current.key] = current
            for base in current.node.bases:
                resolved = self.resolve_base(current, base)
                if resolved is not None:
                    visit(resolved)

        visit(cls)
        return list(seen.values())

    def find_method(self, cls: ParsedClass, name: str) -> tuple[ParsedClass, ast.FunctionDef] | None:
        for owner in self.lineage(cls):
            for node in owner.node.body:
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    return owner, node
        return None

    def batched_classes(self) -> list[ParsedClass]:
        """Every concrete class whose activation format is BatchedExperts, in file then line order."""
        found = []
        for classes in self.classes_by_name.values():
            for cls in classes:
                format_method = next(
                    (m for m in (self.find_method(cls, name) for name in FORMAT_METHODS) if m is not None), None
                )
                if format_method is None or not _returns_batched_format(format_method[1]):
                    continue
                sizing = self.find_method(cls, "workspace_shapes")
                if sizing is None or _is_abstract(sizing[1]):
                    continue
                found.append(cls)
        return sorted(found, key=lambda c: (c.file, c.node.lineno))

    def class_named(self, name: str) -> list[ParsedClass]:
        return list(self.classes_by_name.get(name, []))

    # --- evaluation ------------------------------------------------------------------------------------------

    def evaluate(self, cls: ParsedClass, args: SizingArgs) -> Evaluation:
        """Call cls.workspace_shapes on a stand-in self for these sizing arguments."""
        try:
            standin_class = self._build(cls)
        except Exception as error:  # noqa: BLE001 - the release's class body is arbitrary code
            return Evaluation(None, None, None, f"could not rebuild the class: {_describe(error)}")
        if inspect.getattr_static(standin_class, "workspace_shapes", None) is None:
            return Evaluation(None, None, None, "no workspace_shapes method survived rebuilding the class")
        try:
            instance = _standin_self(standin_class, args)
            method = instance.workspace_shapes  # bound, whether a method, staticmethod or classmethod
            result = method(**_call_arguments(inspect.signature(method), args))
        except Exception as error:  # noqa: BLE001 - the release's method is arbitrary code
            return Evaluation(None, None, None, f"workspace_shapes {_describe(error)}")
        return _normalize(result)

    def _build(self, cls: ParsedClass) -> type:
        """A real Python class with cls's methods, whose bases are the rebuilt parsed bases."""
        if cls.key in self._built:
            return self._built[cls.key]
        bases: list[type] = []
        for base in cls.node.bases:
            resolved = self.resolve_base(cls, base)
            if resolved is not None and resolved.key != cls.key:
                bases.append(self._build(resolved))
        if not bases:
            bases = [_StandInSelf]
        namespace = self._namespace(cls.file)
        base_names = []
        for index, base in enumerate(bases):
            base_names.append(f"__standin_base_{index}")
            namespace[base_names[-1]] = base
        node = ast.ClassDef(
            name=cls.name,
            bases=[ast.Name(id=name, ctx=ast.Load()) for name in base_names],
            keywords=[],
            body=[_strip(statement) for statement in cls.node.body if _keep_in_class(statement)] or [ast.Pass()],
            decorator_list=[],
        )
        if hasattr(ast.ClassDef, "_fields") and "type_params" in ast.ClassDef._fields:
            node.type_params = []
        ast.copy_location(node, cls.node)
        module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
        path = self.source.root / cls.file
        exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - methods only; see module doc
        built = namespace[cls.name]
        self._built[cls.key] = built
        return built

    def _namespace(self, file: str) -> dict:
        """Globals for one file's methods: inert stand-ins, literal constants and the file's own functions."""
        if file in self._namespaces:
            return self._namespaces[file]
        parsed = self.modules[file]
        namespace = _LazyGlobals(functools.partial(self._resolve_global, file))
        namespace.update({"__builtins__": SAFE_BUILTINS, "__name__": parsed.module})
        namespace.update(COMMON_GLOBALS)
        for local, module in parsed.module_aliases.items():
            if module == MODULAR_KERNEL_MODULE:
                namespace[local] = MODULAR_KERNEL_STANDIN
        for local, (module, original) in parsed.imported_names.items():
            if module == MODULAR_KERNEL_MODULE and hasattr(MODULAR_KERNEL_STANDIN, original):
                namespace[local] = getattr(MODULAR_KERNEL_STANDIN, original)
            elif module == ACTIVATION_MODULE and original == "MoEActivation":
                namespace[local] = ACTIVATION_ENUM_STANDIN
            elif original in PURE_HELPERS:
                namespace[local] = PURE_HELPERS[original]
        for statement in parsed.tree.body:
            if isinstance(statement, (ast.Assign, ast.AnnAssign)) and _literal_assignment(statement):
                _exec_statement(statement, namespace, self.source.root / file)
            elif isinstance(statement, ast.FunctionDef):
                function = _strip(statement)
                function.decorator_list = []
                try:
                    _exec_statement(function, namespace, self.source.root / file)
                except Exception:  # noqa: BLE001 - a helper we cannot define stays missing, and says so if used
                    namespace.pop(statement.name, None)
        self._namespaces[file] = namespace
        return namespace

    def _resolve_global(self, file: str, name: str) -> object:
        """A global the file's code uses on the fly: a class of the file, or a name imported from a parsed file.

        Raises KeyError when there is none, which Python turns into the NameError the reason reports.
        """
        key = (file, name)
        if key in self._resolving:
            raise KeyError(name)
        self._resolving.add(key)
        try:
            parsed = self.modules[file]
            own_class = self._class_in_module(parsed.module, name)
            if own_class is not None:
                return self._build(own_class)
            if name in parsed.imported_names:
                module, original = parsed.imported_names[name]
                target = self._file_by_module.get(module)
                if target is not None and target != file:
                    return self._namespace(target)[original]
            raise KeyError(name)
        finally:
            self._resolving.discard(key)


# --- the stand-ins -----------------------------------------------------------------------------------------------


class _LazyGlobals(dict):
    """Module globals that look up, on first use, what the file imports from the other parsed files.

    Python consults `__missing__` for globals that are a dict subclass; a KeyError falls through to builtins.
    """

    def __init__(self, resolve) -> None:
        super().__init__()
        self._resolve = resolve

    def __missing__(self, name: str) -> object:
        value = self._resolve(name)
        self[name] = value
        return value


class _Unavailable(AttributeError):
    """The stand-in lacks something the release's code asked for.

    An AttributeError, so that `getattr(obj, name, default)` and `hasattr` in the release behave as in vLLM.
    """


class _StandInSelf:
    """Root of every rebuilt class: a missing attribute names itself instead of a generic AttributeError."""

    def __getattr__(self, name: str):
        # Python lands here also when a property's getter raised AttributeError; run the getter again so the
        # message names what the property itself was missing.
        descriptor = inspect.getattr_static(type(self), name, None)
        if isinstance(descriptor, property) and descriptor.fget is not None:
            return descriptor.fget(self)
        raise _Unavailable(f"reads self.{name}, which the stand-in self does not carry")


class _StandInNamespace:
    """An attribute bag that names the path of whatever it lacks."""

    def __init__(self, path: str, **attributes) -> None:
        object.__setattr__(self, "_path", path)
        for name, value in attributes.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        raise _Unavailable(f"reads {self._path}.{name}, which the stand-in does not carry")

    def __repr__(self) -> str:
        return f"<stand-in {self._path}>"


@dataclass(frozen=True)
class _DType:
    """A torch dtype by name and element size; enough for code that picks or compares dtypes."""

    name: str
    itemsize: int

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class _Activation(str):
    """An activation that is both the string older releases pass and the enum member newer ones pass."""

    @property
    def value(self) -> str:
        return str(self)

    @property
    def name(self) -> str:
        return str(self).upper()

    @property
    def is_gated(self) -> bool:
        return not str(self).endswith("_no_mul")

    def without_mul(self) -> _Activation:
        return _Activation(str(self).removesuffix("_no_mul") + "_no_mul")


class _ActivationEnum:
    """MoEActivation: a member NAME is the activation whose value is name.lower(), as in vLLM's enum."""

    def __getattr__(self, name: str) -> _Activation:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Activation(name.lower())

    @staticmethod
    def from_str(text: str) -> _Activation:
        return _Activation(text)


class _FakeTensor:
    """Shape and dtype of a tensor argument (older releases pass `a` and `aq` to workspace_shapes)."""

    def __init__(self, shape: Shape, dtype: _DType) -> None:
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


def _dtype_table() -> dict[str, _DType]:
    sizes = {
        "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8,
        "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e8m0fnu": 1,
        "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1,
    }  # fmt: skip
    return {name: _DType(name, size) for name, size in sizes.items()}


DTYPES = _dtype_table()

TORCH_STANDIN = _StandInNamespace("torch", dtype=_DType, Tensor=_FakeTensor, **DTYPES)

FORMAT_ENUM_STANDIN = _StandInNamespace(
    "FusedMoEActivationFormat", Standard="standard", BatchedExperts="batched_experts"
)

MODULAR_KERNEL_STANDIN = _StandInNamespace(
    "mk",
    FusedMoEActivationFormat=FORMAT_ENUM_STANDIN,
    ExpertTokensMetadata=type(None),
)

ACTIVATION_ENUM_STANDIN = _ActivationEnum()


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def _round_up(x: int, y: int) -> int:
    return ((x + y - 1) // y) * y


# vLLM's own pure integer helpers (vllm.utils.math_utils), by the names files import them under.
PURE_HELPERS = {"cdiv": _cdiv, "round_up": _round_up}

COMMON_GLOBALS = {
    "torch": TORCH_STANDIN,
    "math": math,
    "FusedMoEActivationFormat": FORMAT_ENUM_STANDIN,
    "MoEActivation": ACTIVATION_ENUM_STANDIN,
    "__standin_cached_property": functools.cached_property,
}

_SAFE_BUILTIN_NAMES = (
    "abs all any bool dict divmod enumerate filter float getattr hasattr int isinstance issubclass len list map "
    "max min object pow property range repr reversed round set slice sorted staticmethod classmethod str sum "
    "super tuple type zip Exception ArithmeticError AssertionError AttributeError IndexError KeyError "
    "NotImplementedError RuntimeError TypeError ValueError ZeroDivisionError __build_class__"
).split()


def _blocked_import(name: str, *args, **kwargs):
    raise ImportError(f"imports {name} at call time, which needs vLLM itself")


SAFE_BUILTINS = {name: getattr(builtins, name) for name in _SAFE_BUILTIN_NAMES}
SAFE_BUILTINS["__import__"] = _blocked_import


def standin_attributes(args: SizingArgs) -> dict[str, object]:
    """What the stand-in self carries: the attributes batched-experts classes read in releases 0.22-0.33.

    Values describe the FP8 batched CUTLASS deployment of the sizing arguments.
    """
    bf16 = DTYPES[args.workspace_dtype] if args.workspace_dtype in DTYPES else DTYPES["bfloat16"]
    fp8 = DTYPES["float8_e4m3fn"]
    activation = _Activation(args.activation)
    moe_config = _StandInNamespace(
        "self.moe_config",
        num_local_experts=args.num_local_experts,
        num_experts=args.num_global_experts,
        num_logical_experts=args.num_global_experts,
        experts_per_token=args.top_k,
        hidden_dim=args.hidden_size,
        intermediate_size_per_partition=args.intermediate_size,
        in_dtype=bf16,
        max_num_tokens=args.max_tokens_per_rank,
        activation=activation,
    )
    quant_config = _StandInNamespace(
        "self.quant_config",
        quant_dtype=fp8,
        weight_quant_dtype=fp8,
        use_fp8_w8a8=True,
        use_int8_w8a8=False,
        use_int8_w8a16=False,
        use_int4_w4a16=False,
        use_mxfp4_w4a16=False,
        use_nvfp4_w4a4=False,
        ocp_mx_scheme=None,
        is_quantized=True,
        per_act_token_quant=True,
        per_out_ch_quant=True,
        block_shape=None,
        gemm1_clamp_limit=None,
    )
    return {
        "num_dispatchers": args.num_dispatchers,
        "max_num_tokens": args.max_tokens_per_rank,
        "max_experts_per_worker": args.num_local_experts,
        "moe_config": moe_config,
        "quant_config": quant_config,
        "out_dtype": bf16,
        # Older CutlassExpertsFp8 served both formats behind this flag; we ask for the batched one.
        "use_batched_format": True,
        "use_deep_ep_ll_nvfp4_dispatch": False,
    }


def _standin_self(cls: type, args: SizingArgs) -> object:
    instance = object.__new__(cls)
    for name, value in standin_attributes(args).items():
        # A property or method of that name in the release wins: it derives the value its own way.
        if hasattr(inspect.getattr_static(cls, name, None), "__get__"):
            continue
        object.__setattr__(instance, name, value)
    return instance


def _call_arguments(signature: inspect.Signature, args: SizingArgs) -> dict[str, object]:
    """workspace_shapes arguments by parameter name, across the signatures vLLM has used."""
    fp8 = DTYPES["float8_e4m3fn"]
    bf16 = DTYPES.get(args.workspace_dtype, DTYPES["bfloat16"])
    by_name = {
        "M": args.M,
        "N": args.N,
        "K": args.K,
        "topk": args.top_k,
        "top_k": args.top_k,
        "global_num_experts": args.num_global_experts,
        "local_num_experts": args.num_local_experts,
        "expert_tokens_meta": None,
        "activation": _Activation(args.activation),
        # Up to ~0.10 the batched classes read padded_M from aq.size(1) and the dtype from a.
        "a": _FakeTensor((args.max_tokens_per_rank, args.K), bf16),
        "aq": _FakeTensor((args.num_local_experts, args.M, args.K), fp8),
    }
    kwargs: dict[str, object] = {}
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in by_name:
            kwargs[parameter.name] = by_name[parameter.name]
        elif parameter.default is parameter.empty:
            raise _Unavailable(f"takes parameter {parameter.name!r}, which has no stand-in argument")
    return kwargs


# --- AST helpers -------------------------------------------------------------------------------------------------


def _absolute_module(node: ast.ImportFrom, package: str) -> str:
    if node.level == 0:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join(base + ([node.module] if node.module else []))


def _returns_batched_format(function: ast.FunctionDef) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and node.value is not None:
            for inner in ast.walk(node.value):
                if isinstance(inner, ast.Attribute) and inner.attr == BATCHED_FORMAT:
                    return True
                if isinstance(inner, ast.Name) and inner.id == BATCHED_FORMAT:
                    return True
    return False


def _is_abstract(function: ast.FunctionDef) -> bool:
    """A body of only a docstring, `...`, `pass` or `raise NotImplementedError`."""
    for statement in function.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue
        if isinstance(statement, ast.Pass):
            continue
        if isinstance(statement, ast.Raise):
            exc = statement.exc
            target = exc.func if isinstance(exc, ast.Call) else exc
            if isinstance(target, ast.Name) and target.id == "NotImplementedError":
                continue
        return False
    return True


_KEPT_DECORATORS = {"staticmethod", "classmethod", "property"}


def _keep_in_class(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.FunctionDef):
        return True
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        return _literal_assignment(statement)
    return False


def _literal_assignment(statement: ast.Assign | ast.AnnAssign) -> bool:
    if statement.value is None:
        return False
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    if not all(isinstance(target, ast.Name) for target in targets):
        return False
    try:
        ast.literal_eval(statement.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


class _AnnotationStripper(ast.NodeTransformer):
    """Drop annotations (they name vLLM types) and default values that are not literals."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:  # noqa: N802 - ast API
        node.returns = None
        for argument in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
            argument.annotation = None
        for extra in (node.args.vararg, node.args.kwarg):
            if extra is not None:
                extra.annotation = None
        node.args.defaults = [_literal_or_missing(d) for d in node.args.defaults]
        node.args.kw_defaults = [None if d is None else _literal_or_missing(d) for d in node.args.kw_defaults]
        node.decorator_list = [d for d in (_kept_decorator(d) for d in node.decorator_list) if d is not None]
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.stmt:  # noqa: N802 - ast API
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)


def _literal_or_missing(expression: ast.expr) -> ast.expr:
    try:
        ast.literal_eval(expression)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        # Evaluated when the class is built, so it must not need vLLM; it is used only if nothing is passed.
        return ast.copy_location(ast.Constant(value=None), expression)
    return expression


def _kept_decorator(decorator: ast.expr) -> ast.expr | None:
    if isinstance(decorator, ast.Name) and decorator.id in _KEPT_DECORATORS:
        return decorator
    if isinstance(decorator, ast.Name) and decorator.id == "cached_property":
        return ast.copy_location(ast.Name(id="__standin_cached_property", ctx=ast.Load()), decorator)
    if isinstance(decorator, ast.Attribute):
        if decorator.attr == "cached_property":
            return ast.copy_location(ast.Name(id="__standin_cached_property", ctx=ast.Load()), decorator)
        if decorator.attr in ("setter", "getter", "deleter") and isinstance(decorator.value, ast.Name):
            return decorator
    return None


def _strip(statement: ast.stmt) -> ast.stmt:
    return _AnnotationStripper().visit(copy.deepcopy(statement))


def _exec_statement(statement: ast.stmt, namespace: dict, path: Path) -> None:
    module = ast.fix_missing_locations(ast.Module(body=[_strip(statement)], type_ignores=[]))
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - literal constants and defs only


def _describe(error: BaseException) -> str:
    """`NameError: name 'x' is not defined (cutlass_moe.py line 480)`, pointing into the release's file."""
    where = ""
    traceback = error.__traceback__
    while traceback is not None:
        filename = traceback.tb_frame.f_code.co_filename
        if f"/{FUSED_MOE_DIR}/" in filename.replace("\\", "/"):
            where = f" ({Path(filename).name} line {traceback.tb_lineno})"
        traceback = traceback.tb_next
    if isinstance(error, NameError):
        name = getattr(error, "name", None)
        used = f"the name {name!r}" if name else str(error)
        return f"uses {used}, which is only defined when vLLM is imported{where}"
    if isinstance(error, ImportError):
        return f"{error}{where}"
    if isinstance(error, AssertionError):
        return f"failed an assert{where}" + (f": {error}" if str(error) else "")
    if isinstance(error, _Unavailable):
        return f"{error}{where}"
    return f"raised {type(error).__name__}: {error}{where}"


def _as_shape(value: object) -> Shape | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(int(v) for v in value)
    return None


def _normalize(result: object) -> Evaluation:
    """(ws13, ws2, out) from the three-tuple of today or the four-tuple (..., dtype) of older releases."""
    if not isinstance(result, tuple) or len(result) not in (3, 4):
        return Evaluation(None, None, None, f"workspace_shapes returned {result!r}, not (ws13, ws2, out[, dtype])")
    shapes = [_as_shape(value) for value in result[:3]]
    if any(shape is None for shape in shapes):
        return Evaluation(None, None, None, f"workspace_shapes returned non-integer shapes {result[:3]!r}")
    ws13, ws2, out = shapes
    return Evaluation(ws13, ws2, out)
