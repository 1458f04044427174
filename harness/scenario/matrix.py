"""Regression matrices: one YAML file expands into many scenarios (cells), run one after another, reported together.

    matrix:
      name: nightly-releases
      description: ...
      base_file: ../deepseek-v3-dp32-pr55579.yaml   # or `base:` with an inline scenario mapping
      axes:                                         # dotted scenario fields -> the values to try
        parallel.num_dispatchers: [8, 16, 32, 64]
        policies: [["vllm==0.29.0", "vllm==0.30.0"]]
      overrides:                                    # optional: set fields in the cells that match `when`
        - when: {parallel.num_dispatchers: 64}
          set: {expect.outcomes: {"vllm==0.29.0": oom, "vllm==0.30.0": fit}}

Cells are the cartesian product of the axes, in the order the axes are written. Each is validated with
`parse_scenario`; a combination the schema rejects (E x D cannot hold the experts, D not a multiple of P, ...)
is skipped with its reason and counted, "N of M valid", as vLLM's test matrices do.

`harness run MATRIX.yaml` (harness.launch.run) runs each cell into MATRIX_DIR/<cell.name>/ and then calls
`collect_matrix`, which collects every cell (writing the cell's own reports), goes on past a cell that failed or
never ran, and writes one combined report.json/md/html and junit.xml into MATRIX_DIR.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin
from collections.abc import Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from harness.core.records import write_json_atomic
from harness.scenario.schema import REPO_DIR, Scenario, ScenarioError, parse_scenario, resolve_scenario_path

MATRIX_MANIFEST = "matrix.json"
MATRIX_MANIFEST_VERSION = 1


class MatrixError(ScenarioError):
    """A matrix file or matrix directory that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MatrixOverride(_Strict):
    """Set `set`'s dotted fields in every cell whose fields equal `when`'s (all of them; empty: every cell)."""

    when: dict[str, Any] = Field(default_factory=dict)
    set_fields: dict[str, Any] = Field(alias="set", min_length=1)


@dataclass(frozen=True, kw_only=True)
class MatrixCell:
    name: str  # filesystem-safe: the cell's directory under the matrix directory
    scenario: Scenario
    axis_values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SkippedCell:
    name: str
    axis_values: dict[str, Any]
    reason: str


@dataclass(frozen=True, kw_only=True)
class MatrixExpansion:
    cells: tuple[MatrixCell, ...]
    skipped: tuple[SkippedCell, ...]
    num_combinations: int

    @property
    def num_valid(self) -> int:
        return len(self.cells)

    def summary(self) -> str:
        return f"{self.num_valid} of {self.num_combinations} valid"


class Matrix(_Strict):
    name: str | None = None
    description: str = ""
    base: dict[str, Any] | None = None
    base_file: str | None = None
    axes: dict[str, list[Any]] = Field(min_length=1)
    overrides: list[MatrixOverride] = Field(default_factory=list)

    _path: Path = PrivateAttr(default=Path("<matrix>"))
    _base_data: dict[str, Any] = PrivateAttr(default_factory=dict)
    _expansion: MatrixExpansion | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_base(self) -> Matrix:
        if (self.base is None) == (self.base_file is None):
            raise ValueError("give exactly one of matrix.base (an inline scenario) or matrix.base_file (a path)")
        for key, values in self.axes.items():
            if not values:
                raise ValueError(f"matrix.axes.{key}: give at least one value")
        return self

    @property
    def path(self) -> Path:
        return self._path

    def expansion(self) -> MatrixExpansion:
        if self._expansion is None:
            self._expansion = _expand(self)
        return self._expansion

    def cells(self) -> list[MatrixCell]:
        """The valid cells, in axis order."""
        return list(self.expansion().cells)

    def skipped(self) -> list[SkippedCell]:
        """The combinations the scenario schema rejected, with the reason."""
        return list(self.expansion().skipped)


# ---------------------------------------------------------------------------------------------------------------
# Loading


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise MatrixError(f"{path}: YAML syntax error{where}: {getattr(exc, 'problem', None) or exc}") from None


def is_matrix_file(path: str | Path) -> bool:
    """True for a YAML file whose top level is `matrix:` (a scenario file has `model:`, `parallel:`, ...)."""
    try:
        resolved = resolve_scenario_path(path)
    except ScenarioError:
        return False
    if resolved.suffix not in (".yaml", ".yml") or not resolved.is_file():
        return False
    try:
        data = yaml.safe_load(resolved.read_text())
    except (OSError, yaml.YAMLError):
        return False  # load_scenario or load_matrix will say what is wrong with it
    return isinstance(data, dict) and "matrix" in data


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`X`, `X | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _is_mapping(annotation: Any) -> bool:
    return annotation is dict or get_origin(annotation) is dict or any(_is_mapping(a) for a in get_args(annotation))


def check_field_path(key: str) -> str | None:
    """Why `key` ("parallel.num_dispatchers") is not a scenario field, or None when it is one."""
    current: type[BaseModel] = Scenario
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = current.model_fields
        where = ".".join(parts[:i]) or "the top level"
        if part not in fields:
            return f"unknown scenario field {key!r}: {where} has {', '.join(sorted(fields))}"
        annotation = fields[part].annotation
        if i == len(parts) - 1:
            return None
        if _is_mapping(annotation):
            return None  # expect.outcomes.<policy>: any key
        model = _model_in(annotation)
        if model is None:
            return f"{'.'.join(parts[: i + 1])!r} is a value, not a section: {key!r} goes too deep"
        current = model
    return None


def _format_matrix_error(path: Path, error: dict[str, Any]) -> str:
    loc = ("matrix",) + tuple(str(p) for p in error["loc"])
    where = ".".join(loc)
    if error["type"] == "extra_forbidden":
        allowed = sorted(Matrix.model_fields) if len(loc) == 2 else sorted(("when", "set"))
        allowed = [("set" if a == "set_fields" else a) for a in allowed]
        return f"{path}: unknown key {where!r}; allowed here: {', '.join(sorted(allowed))}"
    if error["type"] == "missing":
        return f"{path}: missing field {where!r}"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "value_error":
        return f"{path}: {message}"
    return f"{path}: {where}: {message} (got {error.get('input')!r})"


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file; raise MatrixError (a ScenarioError) naming the file and the field."""
    resolved = resolve_scenario_path(path)
    data = _read_yaml(resolved)
    if not isinstance(data, dict) or "matrix" not in data:
        raise MatrixError(f"{resolved}: a matrix file has one top-level key `matrix:` (got {sorted(data) if isinstance(data, dict) else type(data).__name__})")
    extra = sorted(set(data) - {"matrix"})
    if extra:
        raise MatrixError(f"{resolved}: unknown top-level key(s) {', '.join(map(repr, extra))}; a matrix file has only `matrix:`")
    body = data["matrix"]
    if not isinstance(body, dict):
        raise MatrixError(f"{resolved}: matrix: a mapping with base or base_file, axes, and optionally overrides")
    try:
        matrix = Matrix.model_validate(body)
    except ValidationError as exc:
        raise MatrixError("\n".join(_format_matrix_error(resolved, e) for e in exc.errors())) from None
    problems = [f"{resolved}: matrix.axes: {why}" for key in matrix.axes if (why := check_field_path(key))]
    for i, override in enumerate(matrix.overrides):
        for section, keys in (("when", override.when), ("set", override.set_fields)):
            problems += [f"{resolved}: matrix.overrides.{i}.{section}: {why}" for key in keys if (why := check_field_path(key))]
    if problems:
        raise MatrixError("\n".join(problems))

    if matrix.base_file is not None:
        base_path = (resolved.parent / matrix.base_file).resolve()
        if not base_path.is_file():
            raise MatrixError(f"{resolved}: matrix.base_file: {matrix.base_file!r} does not exist (looked at {base_path})")
        base = _read_yaml(base_path)
    else:
        base = matrix.base
    if not isinstance(base, dict):
        raise MatrixError(f"{resolved}: matrix.base{'_file' if matrix.base_file else ''}: a scenario mapping, got {type(base).__name__}")
    if matrix.name is None:
        matrix = matrix.model_copy(update={"name": resolved.stem})  # rebuilt, never mutated: the model is frozen
    matrix._path = resolved  # private attributes: not part of the frozen, validated fields
    matrix._base_data = base
    expansion = matrix.expansion()
    if not expansion.cells:
        reasons = "; ".join(f"{s.name}: {s.reason}" for s in expansion.skipped[:5])
        raise MatrixError(f"{resolved}: none of the {expansion.num_combinations} combinations is a valid scenario: {reasons}")
    return matrix


# ---------------------------------------------------------------------------------------------------------------
# Expansion


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def _get_dotted(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]+")
_AXIS_LABELS = {
    "parallel.num_dispatchers": "D",
    "parallel.num_ranks": "P",
    "parallel.num_local_experts": "E",
    "parallel.max_tokens_per_rank": "T",
}


def _safe(text: str) -> str:
    return _UNSAFE.sub("-", text.replace("==", "-")).strip("-") or "x"


def _label(key: str, value: Any) -> str:
    if key in _AXIS_LABELS:
        return f"{_AXIS_LABELS[key]}{value}"
    if key == "model.preset":
        return _safe(str(value))
    if isinstance(value, list):
        return _safe("+".join(map(str, value)))
    return _safe(f"{key.rsplit('.', 1)[-1]}-{value}")


def cell_name(data: dict[str, Any], axis_values: dict[str, Any], axes: dict[str, list[Any]]) -> str:
    """e.g. "deepseek-v3_D32_T256": the model, D and T always, then every other axis that varies."""
    model = data.get("model") or {}
    preset = model.get("preset") if isinstance(model, dict) else None
    parts = [_safe(str(preset)) if preset else _safe(f"K{model.get('hidden_size')}-I{model.get('intermediate_size')}")]
    parts.append(f"D{_get_dotted(data, 'parallel.num_dispatchers')}")
    parts.append(f"T{_get_dotted(data, 'parallel.max_tokens_per_rank')}")
    fixed_in_name = {"model.preset", "parallel.num_dispatchers", "parallel.max_tokens_per_rank"}
    parts += [_label(k, v) for k, v in axis_values.items() if k not in fixed_in_name and len(axes[k]) > 1]
    return "_".join(parts)


def _expand(matrix: Matrix) -> MatrixExpansion:
    keys = list(matrix.axes)
    cells: list[MatrixCell] = []
    skipped: list[SkippedCell] = []
    used: dict[str, int] = {}
    combinations = list(itertools.product(*(matrix.axes[k] for k in keys)))
    for combo in combinations:
        axis_values = dict(zip(keys, combo))
        data = copy.deepcopy(matrix._base_data)
        for key, value in axis_values.items():
            _set_dotted(data, key, value)
        for override in matrix.overrides:
            if all(_get_dotted(data, k) == v for k, v in override.when.items()):
                for key, value in override.set_fields.items():
                    _set_dotted(data, key, value)
        name = cell_name(data, axis_values, matrix.axes)
        if name in used:  # two combinations that only differ in characters the name drops
            used[name] += 1
            name = f"{name}_{used[name]}"
        else:
            used[name] = 1
        data["name"] = f"{matrix.name}.{name}"
        data["description"] = f"matrix {matrix.name}, cell {name}" + (f": {matrix.description}" if matrix.description else "")
        label = f"{matrix._path}[{name}]"
        try:
            scenario = parse_scenario(data, path=label)
        except ScenarioError as exc:
            reason = str(exc).replace(f"{label}: ", "")
            skipped.append(SkippedCell(name=name, axis_values=axis_values, reason=reason))
            continue
        cells.append(MatrixCell(name=name, scenario=scenario, axis_values=axis_values))
    return MatrixExpansion(cells=tuple(cells), skipped=tuple(skipped), num_combinations=len(combinations))


# ---------------------------------------------------------------------------------------------------------------
# The matrix directory and its combined report


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def write_matrix_manifest(matrix_dir: Path, cells: Sequence[MatrixCell], *, matrix: Matrix | None = None) -> Path:
    """matrix.json: which cells the matrix has, so `harness collect MATRIX_DIR` can re-collect it later.

    harness.launch.run may write it before running the first cell; collect_matrix writes it (again) in any case.
    """
    data = {
        "schema_version": MATRIX_MANIFEST_VERSION,
        "record_kind": "matrix",
        "name": matrix.name if matrix else None,
        "description": matrix.description if matrix else "",
        "path": display_path(matrix.path) if matrix else None,
        "axes": jsonable(matrix.axes) if matrix else {},
        "num_combinations": matrix.expansion().num_combinations if matrix else len(cells),
        "cells": [{"name": c.name, "axis_values": jsonable(c.axis_values), "scenario": c.scenario.model_dump(mode="json")}
                  for c in cells],
        "skipped": [{"name": s.name, "axis_values": jsonable(s.axis_values), "reason": s.reason}
                    for s in (matrix.skipped() if matrix else [])],
    }
    return write_json_atomic(Path(matrix_dir) / MATRIX_MANIFEST, data)


def display_path(path: Path) -> str:
    """Relative to the repository when inside it, so reports do not depend on where the checkout lives."""
    try:
        return str(path.resolve().relative_to(REPO_DIR))
    except ValueError:
        return str(path)


