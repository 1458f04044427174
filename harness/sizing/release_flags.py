"""The flags one release's `vllm serve` accepts, read from its source with the AST (nothing imported or executed).

    engine/arg_utils.py            EngineArgs.add_cli_args / AsyncEngineArgs.add_cli_args: every
                                   `group.add_argument("--flag", "-f", **X_kwargs["field"])`, X_kwargs = get_kwargs(Cls)
    config/*.py (config.py)        Cls's field annotation: bool -> --flag and --no-flag (get_kwargs gives bools
                                   argparse.BooleanOptionalAction); list/tuple/set -> one or more values; a Literal
                                   (or a module-level alias of one) -> its choices
    entrypoints/openai/cli_args.py FrontendArgs' fields, each `--field-name` (BaseFrontendArgs.add_cli_args), and
                                   make_arg_parser's own add_argument calls (--headless, --api-server-count, --config)
    entrypoints/cli/serve.py       the serve subcommand's own (--grpc)
    utils/argparse_utils.py        FlexibleArgumentParser: `-O3`/`-O 3`/`-O=3` as --optimization-level where the
                                   engine has no `-O` of its own (older releases: -O is --compilation-config),
                                   `--flag_name` as `--flag-name`, `--json-flag.key value` as part of --json-flag

An explicit add_argument's keywords decide too: action="store_true"/"store_false" (a switch), nargs, choices.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ARG_UTILS = "vllm/engine/arg_utils.py"
# the frontend's parser: entrypoints/openai/cli_args.py, later entrypoints/launchers/cli_args.py
CLI_ARGS_FILES = ("vllm/entrypoints/openai/cli_args.py", "vllm/entrypoints/launchers/cli_args.py")
SERVE = "vllm/entrypoints/cli/serve.py"
ARGPARSE_UTILS = "vllm/utils/argparse_utils.py"
CONFIG_DIR = "vllm/config"
MAX_FILE_BYTES = 4 << 20

Arity = Literal["switch", "bool", "value", "list"]


@dataclass(frozen=True)
class ReleaseFlag:
    options: tuple[str, ...]  # "--tensor-parallel-size", "-tp"
    dest: str  # the EngineArgs / FrontendArgs field, or the option's name
    arity: Arity  # switch: no value; bool: --x / --no-x, no value; value: one; list: one or more
    choices: tuple[str, ...] | None
    ref: str  # file:line of the add_argument (or the field)


@dataclass(frozen=True)
class ReleaseFlags:
    version: str | None
    flags: dict[str, ReleaseFlag] = field(default_factory=dict)  # every option string, --no-x too
    optimization_flag: str | None = None  # what -O stands for: --optimization-level, --compilation-config, or None

    def get(self, option: str) -> ReleaseFlag | None:
        return self.flags.get(option)

    def long_options(self) -> list[str]:
        return sorted(o for o in self.flags if o.startswith("--"))

    def close(self, option: str, n: int = 3) -> list[str]:
        return difflib.get_close_matches(option, self.long_options(), n=n, cutoff=0.6)

    def choices(self, option: str) -> tuple[str, ...] | None:
        flag = self.flags.get(option)
        return flag.choices if flag is not None else None


def _parse(path: Path) -> ast.Module | None:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return None


class _Classes:
    """The config classes of a release: name -> (file, ClassDef), and module-level type aliases."""

    def __init__(self, root: Path) -> None:
        self.classes: dict[str, tuple[str, ast.ClassDef]] = {}
        self.aliases: dict[str, ast.expr] = {}
        files = sorted((root / CONFIG_DIR).glob("*.py")) if (root / CONFIG_DIR).is_dir() else []
        files += [p for p in (root / "vllm" / "config.py", *(root / f for f in CLI_ARGS_FILES)) if p.is_file()]
        for path in files:
            module = _parse(path)
            if module is None:
                continue
            rel = path.relative_to(root).as_posix()
            for node in module.body:
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, (rel, node))
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    self.aliases.setdefault(node.targets[0].id, node.value)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                    self.aliases.setdefault(node.target.id, node.value)  # X: TypeAlias = Literal[...]

    def field(self, class_name: str, name: str, seen: int = 0) -> tuple[str, ast.AnnAssign] | None:
        found = self.classes.get(class_name)
        if found is None or seen > 8:
            return None
        file, cls = found
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == name:
                return file, item
        for base in cls.bases:
            if isinstance(base, ast.Name):
                inherited = self.field(base.id, name, seen + 1)
                if inherited is not None:
                    return inherited
        return None

    def fields(self, class_name: str, seen: int = 0) -> list[tuple[str, ast.AnnAssign]]:
        found = self.classes.get(class_name)
        if found is None or seen > 8:
            return []
        file, cls = found
        inherited = [f for base in cls.bases if isinstance(base, ast.Name) for f in self.fields(base.id, seen + 1)]
        own = [(file, item) for item in cls.body
               if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
               and not _is_classvar(item.annotation)]  # fmt: skip
        names = {item.target.id for _, item in own}  # type: ignore[union-attr]
        return [f for f in inherited if f[1].target.id not in names] + own  # type: ignore[union-attr]

    def literal_values(self, annotation: ast.expr, depth: int = 0) -> tuple[str, ...] | None:
        """The string values of a Literal in the annotation (through aliases), None when it has none."""
        values: list[str] = []
        for node in ast.walk(annotation):
            if isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
                inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                values += [str(e.value) for e in inner if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            elif isinstance(node, ast.Name) and node.id in self.aliases and depth < 4:
                sub = self.literal_values(self.aliases[node.id], depth + 1)
                values += list(sub or ())
        return tuple(dict.fromkeys(values)) or None


def _is_classvar(annotation: ast.expr) -> bool:
    return "ClassVar" in ast.unparse(annotation)


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _arity_of_annotation(annotation: ast.expr, classes: _Classes) -> Arity:
    text = ast.unparse(annotation)
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    if any(n in classes.classes and n.endswith("Config") for n in names):
        return "value"  # a config dataclass: JSON (get_kwargs checks dataclasses first)
    if "bool" in names:
        return "bool"
    if names & {"list", "tuple", "set", "List", "Tuple", "Set"}:
        return "list"
    return "value"


def _function(module: ast.Module, class_name: str, method: str) -> ast.FunctionDef | None:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    return None


def _kwargs_bindings(function: ast.AST) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """X = get_kwargs(Cls) -> {X: Cls}; Y = X["field"] -> {Y: (X, field)}."""
    classes: dict[str, str] = {}
    picks: dict[str, tuple[str, str]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
            if isinstance(value, ast.Call) and _name(value.func) == "get_kwargs" and value.args:
                cls = _name(value.args[0])
                if cls:
                    classes[target] = cls
            elif isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and \
                    isinstance(value.slice, ast.Constant) and isinstance(value.slice.value, str):  # fmt: skip
                picks[target] = (value.value.id, value.slice.value)
    return classes, picks


def _flags_of_calls(function: ast.AST, file: str, classes: _Classes) -> list[ReleaseFlag]:
    bound, picks = _kwargs_bindings(function)
    out = []
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and _name(node.func) == "add_argument"):
            continue
        options = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and a.value.startswith("-"))  # fmt: skip
        if not options:
            continue
        dest = options[0].lstrip("-").replace("-", "_")
        arity: Arity = "value"
        choices: tuple[str, ...] | None = None
        for keyword in node.keywords:
            if keyword.arg is None:  # **X["field"], **Y or **{**X["field"], "default": None}
                spread = keyword.value
                if isinstance(spread, ast.Dict):
                    inner = [v for k, v in zip(spread.keys, spread.values, strict=True) if k is None]
                    spread = inner[0] if inner else spread
                ref: tuple[str, str] | None = None
                if isinstance(spread, ast.Subscript) and isinstance(spread.value, ast.Name) and \
                        isinstance(spread.slice, ast.Constant):  # fmt: skip
                    ref = (spread.value.id, str(spread.slice.value))
                elif isinstance(spread, ast.Name) and spread.id in picks:
                    ref = picks[spread.id]
                if ref is not None and ref[0] in bound:
                    dest = ref[1]
                    found = classes.field(bound[ref[0]], ref[1])
                    if found is not None:
                        arity = _arity_of_annotation(found[1].annotation, classes)
                        choices = classes.literal_values(found[1].annotation)
            elif keyword.arg == "action":
                action = ast.unparse(keyword.value)
                if "store_true" in action or "store_false" in action or "store_const" in action:
                    arity = "switch"
                elif "BooleanOptionalAction" in action:
                    arity = "bool"
            elif keyword.arg == "nargs":
                nargs = keyword.value.value if isinstance(keyword.value, ast.Constant) else None
                arity = "list" if nargs in ("+", "*") else "value"
            elif keyword.arg == "choices" and isinstance(keyword.value, (ast.List, ast.Tuple)):
                choices = tuple(str(e.value) for e in keyword.value.elts if isinstance(e, ast.Constant))
            elif keyword.arg == "dest" and isinstance(keyword.value, ast.Constant):
                dest = str(keyword.value.value)
        out.append(ReleaseFlag(options=options, dest=dest, arity=arity, choices=choices,
                               ref=f"{file.removeprefix('vllm/')}:{node.lineno}"))  # fmt: skip
    return out


def _frontend_flags(module: ast.Module, classes: _Classes) -> list[ReleaseFlag]:
    """FrontendArgs' fields, each --field-name (BaseFrontendArgs.add_cli_args loops over get_kwargs(cls))."""
    if "FrontendArgs" not in classes.classes:
        return []
    out = []
    for file, item in classes.fields("FrontendArgs"):
        name = item.target.id  # type: ignore[union-attr]
        arity = _arity_of_annotation(item.annotation, classes)
        out.append(ReleaseFlag(options=(f"--{name.replace('_', '-')}",), dest=name, arity=arity,
                               choices=classes.literal_values(item.annotation),
                               ref=f"{file.removeprefix('vllm/')}:{item.lineno}"))  # fmt: skip
    return out


def read_flags(root: Path, version: str | None = None) -> ReleaseFlags | None:
    """Every flag of the release under `root` (the directory holding vllm/); None when it has no arg_utils.py."""
    return _read_flags(str(root), version)


@functools.lru_cache(maxsize=8)
def _read_flags(root_text: str, version: str | None) -> ReleaseFlags | None:
    root = Path(root_text)
    arg_utils = _parse(root / ARG_UTILS)
    if arg_utils is None:
        return None
    classes = _Classes(root)
    flags: list[ReleaseFlag] = []
    for cls, method in (("EngineArgs", "add_cli_args"), ("AsyncEngineArgs", "add_cli_args")):
        function = _function(arg_utils, cls, method)
        if function is not None:
            flags += _flags_of_calls(function, ARG_UTILS, classes)
    for cli_file in CLI_ARGS_FILES:
        cli = _parse(root / cli_file)
        if cli is None:
            continue
        flags += _frontend_flags(cli, classes)
        for node in cli.body:
            if isinstance(node, ast.FunctionDef) and node.name == "make_arg_parser":
                flags += _flags_of_calls(node, cli_file, classes)
    serve = _parse(root / SERVE)
    if serve is not None:
        for found in ast.walk(serve):
            if isinstance(found, ast.FunctionDef) and found.name == "subparser_init":
                flags += _flags_of_calls(found, SERVE, classes)
    table: dict[str, ReleaseFlag] = {}
    for flag in flags:
        for option in flag.options:
            table.setdefault(option, flag)
            if flag.arity == "bool" and option.startswith("--"):
                table.setdefault("--no-" + option[2:], flag)
    optimization = None
    if "-O" in table:
        optimization = table["-O"].options[0]
    elif "--optimization-level" in table:
        optimization = "--optimization-level"
    return ReleaseFlags(version=version, flags=table, optimization_flag=optimization)
