"""Evaluate a vLLM release's own `workspace_shapes` without importing or executing any of it.

    fused_moe/**.py --ast.parse--> classes, bases, module-level bindings --> batched-experts classes
        (activation_format(s) returns ...BatchedExperts, directly or through a base parsed here)
    class + its parsed bases (C3 order) + stand-in self (num_dispatchers = D, max_num_tokens = T, moe_config, ...)
        --Interpreter (interpreter.py) walks workspace_shapes(M, N, K, topk, ...) and what it calls-->
        (ws13, ws2, out)

The release's text is only parsed: the interpreter evaluates the methods' AST nodes itself, over a small subset
of Python and within a step and size budget (interpreter.Budget). Whatever a method needs beyond the subset or
the stand-ins (a runtime flag, an import, a kernel library's config, a loop over the budget) makes the class
`unevaluated` with the reason, file and line; nothing is guessed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from harness.core.contract import Shape, SizingArgs
from harness.sizing.vllm_source.interpreter import (
    ACTIVATION_ENUM_STANDIN,
    DEFAULT_BUDGET,
    DTYPES,
    FORMAT_ENUM_STANDIN,
    Activation,
    Binding,
    BoundMethod,
    Budget,
    FakeTensor,
    Function,
    Interpreter,
    StandIn,
    Unevaluable,
    function_decorators,
)
from harness.sizing.vllm_source.sources import VllmSource, VllmSourceError

MODULAR_KERNEL_MODULE = "vllm.model_executor.layers.fused_moe.modular_kernel"
ACTIVATION_MODULE = "vllm.model_executor.layers.fused_moe.activation"
FORMAT_METHODS = ("activation_format", "activation_formats")
BATCHED_FORMAT = "BatchedExperts"

# What is read of a tree at all. vLLM 0.33.0's fused_moe package holds 115 files, 1.9 MB, the largest 85 kB; the
# limits leave 8x to 17x of room and keep the parsed trees of a hostile one to a few hundred MB.
MAX_SOURCE_FILES = 2000
MAX_SOURCE_FILE_BYTES = 1 << 20
MAX_SOURCE_TREE_BYTES = 16 << 20

MAX_KEPT_EVALUATIONS = 1 << 16  # a few MB of shapes at most
# AST nodes kept of a whole tree: 0.33.0's fused_moe parses to 213,976 nodes (0.29.0: 175,339); a tree of AST-dense
# files (15 MiB of `x=(1,2,...)`) would keep tens of millions, several GB. Files past the cap are listed, not parsed.
MAX_AST_NODES = 1_500_000

MODULAR_KERNEL_STANDIN = {
    "FusedMoEActivationFormat": FORMAT_ENUM_STANDIN,
    "ExpertTokensMetadata": StandIn("mk.ExpertTokensMetadata"),
}


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
    """One parsed file with what its module-level statements bind."""

    file: str
    module: str  # dotted name
    tree: ast.Module
    imported_names: dict[str, tuple[str, str]]  # local name -> (module, original name)
    module_aliases: dict[str, str]  # local name -> module
    bindings: dict[str, Binding]  # every name bound at module level, as the interpreter resolves it


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
    """The fused-MoE package of one VllmSource, parsed once, with class lookup across its files.

    It is the interpreter's Program: module-level bindings, class bodies and C3 method resolution order.
    """

    def __init__(self, source: VllmSource) -> None:
        self.source = source
        self.modules: dict[str, ParsedModule] = {}
        self.unparsed: dict[str, str] = {}  # file -> why ast could not read it
        self.ast_nodes = 0  # kept so far, against MAX_AST_NODES
        self.classes_by_name: dict[str, list[ParsedClass]] = {}
        self._file_by_module: dict[str, str] = {}
        self._mro: dict[tuple[str, str], list[ParsedClass]] = {}
        self._class_bindings: dict[tuple[tuple[str, str], str], Binding | None] = {}  # a class body is read once
        self._batched: list[ParsedClass] | None = None
        # evaluate() is a pure function of (class, sizing arguments) on a tree that does not change: a matrix plan
        # asks for the same point in many cells (T doubled in one cell is the next cell's T).
        self._evaluations: dict[tuple[tuple[str, str], SizingArgs, int | None], Evaluation] = {}
        # what other modules read off the tree once and keep, by a key naming the reader first (sweep.indexed_call)
        self.memo: dict[tuple[str, ...], object] = {}
        fused_moe = source.fused_moe_dir
        if not fused_moe.is_dir():
            raise VllmSourceError(f"{source.label}: no fused-MoE package at {fused_moe}")
        for path in _python_files(fused_moe, self.unparsed, source.root):
            self._parse(path)
        if not self.modules:
            raise VllmSourceError(f"{source.label}: none of the files under {fused_moe} could be parsed")

    def _parse(self, path: Path) -> None:
        file = path.relative_to(self.source.root).as_posix()
        module = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        try:
            tree = ast.parse(_read_source(path), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError, OSError) as error:
            self.unparsed[file] = f"{type(error).__name__}: {error}"
            return
        nodes = sum(1 for _ in ast.walk(tree))
        if self.ast_nodes + nodes > MAX_AST_NODES:
            self.unparsed[file] = (f"{nodes} AST nodes, over the {MAX_AST_NODES} nodes kept of a tree "
                                   f"({self.ast_nodes} already kept)")  # fmt: skip
            return
        self.ast_nodes += nodes
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported_names: dict[str, tuple[str, str]] = {}
        module_aliases: dict[str, str] = {}
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
        bindings = _module_bindings(file, tree, package)
        for name, binding in bindings.items():
            if binding.kind == "class":
                bindings[name] = Binding(
                    "class", binding.node, file, cls=ParsedClass(name, file, cast(ast.ClassDef, binding.node))
                )
        parsed = ParsedModule(file, module, tree, imported_names, module_aliases, bindings)
        self.modules[file] = parsed
        self._file_by_module[module] = file
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bound = bindings.get(node.name)
                cls = bound.cls if bound is not None and bound.node is node else ParsedClass(node.name, file, node)
                self.classes_by_name.setdefault(node.name, []).append(cls)

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
            aliased = parsed.module_aliases.get(base.value.id)
            if aliased is not None:
                found = self._class_in_module(aliased, base.attr)
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
        if self._batched is None:
            self._batched = self._find_batched_classes()
        return list(self._batched)

    def _find_batched_classes(self) -> list[ParsedClass]:
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

    def standard_classes(self) -> list[ParsedClass]:
        """Every class that defines a concrete workspace_shapes in its own body and is not batched: the standard
        format (tokens x hidden), in file then line order."""
        batched = {c.key for c in self.batched_classes()}
        found = [
            cls
            for classes in self.classes_by_name.values()
            for cls in classes
            if cls.key not in batched
            and any(isinstance(node, ast.FunctionDef) and node.name == "workspace_shapes" and not _is_abstract(node)
                    for node in cls.node.body)
        ]  # fmt: skip
        return sorted(found, key=lambda c: (c.file, c.node.lineno))

    def class_named(self, name: str) -> list[ParsedClass]:
        return list(self.classes_by_name.get(name, []))

    def may_define_batched_classes(self, file: str) -> bool:
        """Whether an unparsed file may hold batched-experts classes: it mentions BatchedExperts, or it was not
        read at all (a link, a FIFO, too large), so nobody can tell."""
        try:
            data = _read_source_bytes(self.source.root / file)
        except OSError:
            return True
        return BATCHED_FORMAT.encode() in data

    # --- the interpreter's Program -------------------------------------------------------------------------

    def global_binding(self, file: str, name: str) -> Binding | None:
        parsed = self.modules.get(file)
        return parsed.bindings.get(name) if parsed is not None else None

    def module_file(self, module: str) -> str | None:
        return self._file_by_module.get(module)

    def standin_import(self, module: str, name: str) -> object | None:
        if module == MODULAR_KERNEL_MODULE:
            return MODULAR_KERNEL_STANDIN.get(name)
        if module == ACTIVATION_MODULE and name == "MoEActivation":
            return ACTIVATION_ENUM_STANDIN
        return None

    def class_binding(self, cls: ParsedClass, name: str) -> Binding | None:
        key = (cls.key, name)
        if key not in self._class_bindings:
            if len(self._class_bindings) >= MAX_KEPT_EVALUATIONS:
                return _class_binding(cls, name)
            self._class_bindings[key] = _class_binding(cls, name)
        return self._class_bindings[key]

    def mro(self, cls: ParsedClass) -> list[ParsedClass]:
        """Python's C3 order over the parsed bases (bases outside the parsed files are left out)."""
        if cls.key not in self._mro:
            self._mro[cls.key] = [cls]  # a base cycle across files ends here instead of recursing
            bases = [b for b in (self.resolve_base(cls, e) for e in cls.node.bases) if b and b.key != cls.key]
            merged = _c3_merge([self.mro(b) for b in bases] + [bases])
            self._mro[cls.key] = [cls] + (merged if merged is not None else self.lineage(cls)[1:])
        return self._mro[cls.key]

    # --- evaluation ------------------------------------------------------------------------------------------

    def evaluate(self, cls: ParsedClass, args: SizingArgs, *, budget: Budget = DEFAULT_BUDGET,
                 n: int | None = None) -> Evaluation:  # fmt: skip
        """cls.workspace_shapes on a stand-in self for these sizing arguments, interpreted from the AST; n: the N
        the class's own moe_problem_size derives, when it differs from args.N (Marlin: I)."""
        key = (cls.key, args, n)
        if budget == DEFAULT_BUDGET and key in self._evaluations:
            return self._evaluations[key]
        evaluation = self._evaluate(cls, args, budget, n)
        if budget == DEFAULT_BUDGET and len(self._evaluations) < MAX_KEPT_EVALUATIONS:
            self._evaluations[key] = evaluation
        return evaluation

    def _evaluate(self, cls: ParsedClass, args: SizingArgs, budget: Budget, n: int | None = None) -> Evaluation:
        interpreter = Interpreter(self, budget)
        try:
            instance = interpreter.instance(cls, standin_attributes(args))
            method = interpreter.get_attribute(instance, "workspace_shapes")
            arguments = _call_arguments(method, args)
            if n is not None and "N" in arguments:
                arguments["N"] = n
            result = interpreter.call(method, (), arguments)
        except Unevaluable as error:
            return Evaluation(None, None, None, f"workspace_shapes {error}")
        except RecursionError:
            return Evaluation(None, None, None, "workspace_shapes nests deeper than Python's own stack allows")
        return _normalize(result)

    def call_method(
        self,
        cls: ParsedClass,
        name: str,
        *,
        attributes: Mapping[str, object],
        arguments: Mapping[str, object] | None = None,
        budget: Budget = DEFAULT_BUDGET,
    ) -> object:
        """cls.<name>(**arguments) on a stand-in self carrying `attributes` (a property: its value); raises
        Unevaluable with the reason.

        Attribute and argument values are plain values (int, float, bool, None, str, tuples, lists, dicts) or the
        stand-ins of interpreter.py (StandIn, DType, Activation, FakeTensor). So is the result.
        """
        interpreter = Interpreter(self, budget)
        instance = interpreter.instance(cls, attributes)
        try:
            member = interpreter.get_attribute(instance, name)
            if arguments is None and not isinstance(member, (Function, BoundMethod)):
                return member  # a property or a plain attribute
            return interpreter.call(member, (), dict(arguments or {}))
        except RecursionError:
            raise Unevaluable(f"{name} nests deeper than Python's own stack allows") from None

    def call_function(
        self,
        file: str,
        name: str,
        *,
        arguments: Mapping[str, object] | None = None,
        budget: Budget = DEFAULT_BUDGET,
    ) -> object:
        """A module-level function of a parsed file (file relative to the source root), called by keyword."""
        interpreter = Interpreter(self, budget)
        try:
            return interpreter.call(interpreter.global_value(file, name), (), dict(arguments or {}))
        except RecursionError:
            raise Unevaluable(f"{name} nests deeper than Python's own stack allows") from None


@functools.lru_cache(maxsize=8)
def _cached_tree(source: VllmSource) -> SourceTree:
    return SourceTree(source)


_EDITABLE_TREES: dict[VllmSource, tuple[str, SourceTree]] = {}
MAX_EDITABLE_TREES = 4


def source_tree(source: VllmSource) -> SourceTree:
    """The parsed tree, once per process for what cannot change (a release or wheel extraction) and shared by the
    audit, the sweep, the policy path and the layer path. A tree users edit (--vllm-src, installed) is parsed again
    unless its python files hold the same bytes as when it was last parsed (content_digest): hashing them costs a
    small part of parsing them, and one command asks for the tree several times."""
    if source.kind in ("release", "wheel"):
        return _cached_tree(source)
    digest = content_digest(source)
    cached = _EDITABLE_TREES.get(source)
    if digest is not None and cached is not None and cached[0] == digest:
        return cached[1]
    tree = SourceTree(source)
    if digest is not None:
        _EDITABLE_TREES.pop(source, None)
        while len(_EDITABLE_TREES) >= MAX_EDITABLE_TREES:
            _EDITABLE_TREES.pop(next(iter(_EDITABLE_TREES)))
        _EDITABLE_TREES[source] = (digest, tree)
    return tree


def content_digest(source: VllmSource) -> str | None:
    """sha256 over the fused-MoE package's listing (what _python_files takes and leaves) and the bytes of every file it
    takes; None where the package cannot be listed or read (SourceTree then says why)."""
    unparsed: dict[str, str] = {}
    digest = hashlib.sha256()
    try:
        for path in _python_files(source.fused_moe_dir, unparsed, source.root):
            data = _read_source_bytes(path)
            digest.update(f"{path.relative_to(source.root).as_posix()}\0{len(data)}\0".encode())
            digest.update(data)
    except (OSError, VllmSourceError):
        return None
    for file, why in sorted(unparsed.items()):
        digest.update(f"{file}\0{why}\0".encode())
    return digest.hexdigest()


def standin_attributes(args: SizingArgs) -> dict[str, object]:
    """What the stand-in self carries: the attributes batched-experts classes read in releases 0.22-0.33.

    Values describe the FP8 batched CUTLASS deployment of the sizing arguments. A method or property of the same
    name in the release wins over these, as it would over an instance attribute in Python.
    """
    bf16 = DTYPES[args.workspace_dtype] if args.workspace_dtype in DTYPES else DTYPES["bfloat16"]
    fp8 = DTYPES["float8_e4m3fn"]
    activation = Activation(args.activation)
    moe_config = StandIn(
        "self.moe_config",
        num_local_experts=args.num_local_experts,
        num_experts=args.num_global_experts,
        num_logical_experts=args.num_global_experts,
        experts_per_token=args.top_k,
        hidden_dim=args.hidden_size,
        hidden_dim_unpadded=args.hidden_size,  # FusedMoEConfig.__post_init__: None -> hidden_dim
        intermediate_size_per_partition=args.intermediate_size,
        in_dtype=bf16,
        max_num_tokens=args.max_tokens_per_rank,
        activation=activation,
    )
    quant_config = StandIn(
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


def workspace_shapes_arguments(args: SizingArgs) -> dict[str, object]:
    """workspace_shapes' arguments by parameter name, across the signatures vLLM has used (0.9 to 0.33)."""
    fp8 = DTYPES["float8_e4m3fn"]
    bf16 = DTYPES.get(args.workspace_dtype, DTYPES["bfloat16"])
    return {
        "M": args.M,
        "N": args.N,
        "K": args.K,
        "topk": args.top_k,
        "top_k": args.top_k,
        "global_num_experts": args.num_global_experts,
        "local_num_experts": args.num_local_experts,
        "expert_tokens_meta": None,
        "expert_tokens_metadata": None,  # the name up to ~0.10
        "activation": Activation(args.activation),
        # Up to ~0.10 the batched classes read padded_M from aq.size(1) and the dtype from a.
        "a": FakeTensor((args.max_tokens_per_rank, args.K), bf16),
        "aq": FakeTensor((args.num_local_experts, args.M, args.K), fp8),
    }


def _call_arguments(method: object, args: SizingArgs) -> dict[str, object]:
    """workspace_shapes arguments by parameter name, across the signatures vLLM has used."""
    if isinstance(method, BoundMethod):
        function, skip = method.function, 1
    elif isinstance(method, Function):
        function, skip = method, 0
    else:
        raise Unevaluable("workspace_shapes is not a method of the class")
    by_name = workspace_shapes_arguments(args)
    spec = function.node.args
    positional = [*spec.posonlyargs, *spec.args]
    with_default = {a.arg for a in positional[len(positional) - len(spec.defaults) :]}
    with_default |= {a.arg for a, d in zip(spec.kwonlyargs, spec.kw_defaults, strict=True) if d is not None}
    positional = positional[skip:]
    kwargs: dict[str, object] = {}
    for parameter in (*positional, *spec.kwonlyargs):
        if parameter.arg in by_name:
            kwargs[parameter.arg] = by_name[parameter.arg]
        elif parameter.arg not in with_default:
            raise Unevaluable(f"takes parameter {parameter.arg!r}, which has no stand-in argument")
    return kwargs


# --- reading the tree ------------------------------------------------------------------------------------------


def _python_files(directory: Path, unparsed: dict[str, str], root: Path) -> list[Path]:
    """The regular *.py files under directory, without following links; others are noted in `unparsed`."""
    found: list[Path] = []
    total_bytes = 0
    for current, dirs, files in os.walk(directory, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(current) / name
            file = path.relative_to(root).as_posix()
            try:
                info = path.lstat()
            except OSError as error:
                unparsed[file] = f"cannot stat: {error}"
                continue
            if not stat.S_ISREG(info.st_mode):
                unparsed[file] = "not a regular file (a link, FIFO or device is not read)"
            elif info.st_size > MAX_SOURCE_FILE_BYTES:
                unparsed[file] = f"{info.st_size} bytes, over the {MAX_SOURCE_FILE_BYTES} bytes read of one file"
            elif len(found) >= MAX_SOURCE_FILES or total_bytes + info.st_size > MAX_SOURCE_TREE_BYTES:
                raise VllmSourceError(
                    f"{directory} holds more than {MAX_SOURCE_FILES} python files or {MAX_SOURCE_TREE_BYTES} bytes "
                    "of them; a vLLM fused_moe package holds about 120 files and 2 MB"
                )
            else:
                found.append(path)
                total_bytes += info.st_size
    return found


def _read_source(path: Path) -> str:
    return _read_source_bytes(path).decode("utf-8")


def _read_source_bytes(path: Path) -> bytes:
    # O_NOFOLLOW: the file was a regular file when listed; do not follow a link swapped in since.
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError("not a regular file")
        data = handle.read(MAX_SOURCE_FILE_BYTES + 1)
    if len(data) > MAX_SOURCE_FILE_BYTES:
        raise OSError(f"over the {MAX_SOURCE_FILE_BYTES} bytes read of one file")
    return data


def _module_bindings(file: str, tree: ast.Module, package: str) -> dict[str, Binding]:
    """What each module-level name is bound to after the module's straight-line statements ran.

    A name also bound inside a top-level if/try/with/for (an optional import, a platform switch) is
    `conditional`: which binding holds depends on running the module, so the interpreter does not pick one.
    """
    bindings: dict[str, Binding] = {}
    conditional: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            bindings[node.name] = Binding("function", node, file)
        elif isinstance(node, ast.ClassDef):
            bindings[node.name] = Binding("class", node, file)
        elif isinstance(node, ast.AnnAssign) and node.value is None:
            continue  # `name: type` alone binds nothing
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in _stored_names(target):
                    simple = isinstance(target, ast.Name) and node.value is not None
                    bindings[name] = Binding("value" if simple else "unsupported", node.value, file)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.partition(".")[0]
                bindings[local] = Binding("module", None, file, module=alias.name if alias.asname else local)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute_module(node, package)
            for alias in node.names:
                bindings[alias.asname or alias.name] = Binding("import", None, file, module=base, original=alias.name)
        elif isinstance(node, (ast.AsyncFunctionDef, ast.AugAssign)):
            for stored in [node.name] if isinstance(node, ast.AsyncFunctionDef) else _stored_names(node.target):
                bindings[stored] = Binding("unsupported", node, file)
        else:
            conditional.update(_names_bound_in(node))
    for name in conditional:
        bindings[name] = Binding("conditional", None, file)
    return bindings


def _stored_names(target: ast.expr) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _names_bound_in(statement: ast.stmt) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
    return names


def _class_binding(cls: ParsedClass, name: str) -> Binding | None:
    """The def or assignment that binds name in the class body (the last one, as Python leaves it).

    A property's `@name.setter` def rebinds the name to the same property, so the getter stays what is read.
    """
    found: Binding | None = None
    for node in cls.node.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            if function_decorators(node) & {"setter", "deleter"}:
                continue
            found = Binding("function", node, cls.file)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = Binding("value", node.value, cls.file)
    return found


def _c3_merge(sequences: list[list[ParsedClass]]) -> list[ParsedClass] | None:
    """Python's C3 linearization of the bases' MROs; None when the bases admit no consistent order."""
    sequences = [list(s) for s in sequences if s]
    result: list[ParsedClass] = []
    while sequences:
        for sequence in sequences:
            head = sequence[0]
            if not any(head.key in [c.key for c in other[1:]] for other in sequences):
                break
        else:
            return None
        result.append(head)
        sequences = [[c for c in s if c.key != head.key] for s in sequences]
        sequences = [s for s in sequences if s]
    return result


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


def _as_shape(value: object) -> Shape | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(int(v) for v in value)
    return None


def _normalize(result: object) -> Evaluation:
    """(ws13, ws2, out) from the three-tuple of today or the four-tuple (..., dtype) of older releases."""
    if not isinstance(result, tuple) or len(result) not in (3, 4):
        reason = f"workspace_shapes returned {_shown(result)}, not (ws13, ws2, out[, dtype])"
        return Evaluation(None, None, None, reason)
    shapes = [_as_shape(value) for value in result[:3]]
    if any(shape is None for shape in shapes):
        return Evaluation(None, None, None, f"workspace_shapes returned non-integer shapes {_shown(result[:3])}")
    ws13, ws2, out = shapes
    return Evaluation(ws13, ws2, out)


def _shown(value: object) -> str:
    """repr of an interpreter value, cut short: values are bounded, but a reason is one line."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
