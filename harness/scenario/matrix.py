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
is skipped with its reason and counted, "N of M valid", as vLLM's test matrices do. The product of the axis
lengths is checked against MAX_MATRIX_CELLS before any cell is built.

`harness run MATRIX.yaml` (harness.launch.run) runs each cell into MATRIX_DIR/<cell.name>/ and then calls
`collect_matrix`, which collects every cell (writing the cell's own reports), goes on past a cell that failed or
never ran, and writes one combined report.json/md/html and junit.xml into MATRIX_DIR.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from harness.scenario import limits as L
from harness.scenario.dotted import DottedKeyError, get_dotted, set_dotted
from harness.scenario.limits import shown, shown_key, shown_text
from harness.scenario.schema import Scenario, ScenarioError, format_errors, parse_scenario, resolve_scenario_path
from harness.scenario.sections import REPO_DIR, is_safe_name, safe_name
from harness.scenario.source import display, read_yaml_file

MATRIX_MANIFEST = "matrix.json"
MATRIX_MANIFEST_VERSION = 1


class MatrixError(ScenarioError):
    """A matrix file or matrix directory that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class MatrixOverride(_Strict):
    """Set `set`'s dotted fields in every cell whose fields equal `when`'s (all of them; empty: every cell)."""

    when: dict[str, Any] = Field(default_factory=dict, max_length=L.MAX_MATRIX_AXES)
    set_fields: dict[str, Any] = Field(alias="set", min_length=1, max_length=L.MAX_MATRIX_AXES)


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
    name: str | None = Field(None, max_length=L.MAX_MATRIX_NAME_CHARS)
    description: str = Field("", max_length=L.MAX_DESCRIPTION_CHARS)
    base: dict[str, Any] | None = None
    base_file: str | None = Field(None, min_length=1, max_length=L.MAX_PATH_CHARS)
    axes: dict[str, list[Any]] = Field(min_length=1, max_length=L.MAX_MATRIX_AXES)
    overrides: list[MatrixOverride] = Field(default_factory=list, max_length=L.MAX_MATRIX_OVERRIDES)

    _path: Path = PrivateAttr(default=Path("<matrix>"))
    _base_data: dict[str, Any] = PrivateAttr(default_factory=dict)
    _expansion: MatrixExpansion | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not is_safe_name(value, L.MAX_MATRIX_NAME_CHARS):
            raise ValueError(
                f"{shown(value)} cannot name a matrix directory; allowed: {L.NAME_PATTERN_TEXT}, at "
                f"most {L.MAX_MATRIX_NAME_CHARS} characters"
            )
        return value

    @model_validator(mode="after")
    def _one_base(self) -> Matrix:
        if (self.base is None) == (self.base_file is None):
            raise ValueError("give exactly one of matrix.base (an inline scenario) or matrix.base_file (a path)")
        for key, values in self.axes.items():
            if not values:
                raise ValueError(f"matrix.axes.{shown_text(key, 60)}: give at least one value")
            if len(values) > L.MAX_AXIS_VALUES:
                raise ValueError(
                    f"matrix.axes.{shown_text(key, 60)}: {len(values)} values; allowed: at most {L.MAX_AXIS_VALUES}"
                )
        # The product of the lengths, before any cell exists: 8 axes of 30 values are 6.6e11 cells.
        num_cells = math.prod(len(values) for values in self.axes.values())
        if num_cells > L.MAX_MATRIX_CELLS:
            lengths = " x ".join(str(len(values)) for values in self.axes.values())
            raise ValueError(
                f"matrix.axes: {lengths} values make {num_cells} cells; allowed: at most "
                f"{L.MAX_MATRIX_CELLS} cells in one matrix (split it into several)"
            )
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
        return read_yaml_file(path, what="matrix or scenario file")
    except ScenarioError as exc:
        raise MatrixError(str(exc)) from None


def _is_matrix_data(data: Any) -> bool:
    return isinstance(data, dict) and "matrix" in data


def is_matrix_file(path: str | Path) -> bool:
    """True for a YAML file whose top level is `matrix:` (a scenario file has `model:`, `parallel:`, ...)."""
    try:
        return _is_matrix_data(read_yaml_file(resolve_scenario_path(path)))
    except ScenarioError:
        return False  # load_scenario or load_matrix will say what is wrong with it


def load_input(name_or_path: str | Path) -> Scenario | Matrix:
    """A scenario or a matrix file, read once: what `harness plan` and `harness run` take."""
    path = resolve_scenario_path(name_or_path)
    data = read_yaml_file(path)
    if _is_matrix_data(data):
        return matrix_from_data(data, path)
    return parse_scenario(data, path=path)


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
            return f"unknown scenario field {shown(key)}: {shown_text(where, 80)} has {', '.join(sorted(fields))}"
        annotation = fields[part].annotation
        if i == len(parts) - 1:
            return None
        if _is_mapping(annotation):
            return None  # expect.outcomes.<policy>: any key
        model = _model_in(annotation)
        if model is None:
            return f"{shown('.'.join(parts[: i + 1]))} is a value, not a section: {shown(key)} goes too deep"
        current = model
    return None


def _format_matrix_error(path: Path, error: dict[str, Any]) -> str:
    loc = ("matrix", *tuple(str(p) for p in error["loc"]))
    where = ".".join(loc)
    if error["type"] == "extra_forbidden":
        allowed = sorted(Matrix.model_fields) if len(loc) == 2 else sorted(("when", "set"))
        allowed = [("set" if a == "set_fields" else a) for a in allowed]
        return f"{path}: unknown key {shown_key(where)}; allowed here: {', '.join(sorted(allowed))}"
    if error["type"] == "missing":
        return f"{path}: missing field {where!r}"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "value_error":  # a field's own check names the field; a check across fields names them
        return f"{path}: {shown_text(where, 80)}: {message}" if error["loc"] else f"{path}: {message}"
    return f"{path}: {shown_text(where, 80)}: {message} (got {shown(error.get('input'))})"


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file; raise MatrixError (a ScenarioError) naming the file and the field."""
    resolved = resolve_scenario_path(path)
    return matrix_from_data(_read_yaml(resolved), resolved)


def _check_keys(matrix: Matrix, where: str) -> None:
    problems = [f"{where}: matrix.axes: {why}" for key in matrix.axes if (why := check_field_path(key))]
    for i, override in enumerate(matrix.overrides):
        for section, keys in (("when", override.when), ("set", override.set_fields)):
            problems += [
                f"{where}: matrix.overrides.{i}.{section}: {why}" for key in keys if (why := check_field_path(key))
            ]
    if problems:
        raise MatrixError("\n".join(problems[:10]))


def _base_data(matrix: Matrix, resolved: Path, where: str) -> dict[str, Any]:
    if matrix.base_file is not None:
        # Not resolved: a loop of links or a name too long is the reader's one-line refusal, never an exception here.
        base_path = Path(os.path.normpath(resolved.parent.absolute() / matrix.base_file))
        if not os.path.lexists(base_path):
            raise MatrixError(
                f"{where}: matrix.base_file: {shown(matrix.base_file)} does not exist (looked at {display(base_path)})"
            )
        base = _read_yaml(base_path)
    else:
        base = matrix.base
    if not isinstance(base, dict):
        raise MatrixError(
            f"{where}: matrix.base{'_file' if matrix.base_file else ''}: a scenario mapping, got {type(base).__name__}"
        )
    return base


def _num_values(data: Any) -> int:
    """Values in parsed YAML data (mappings count keys and values), walked without recursion."""
    count, stack = 0, [data]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack += list(node.keys()) + list(node.values())
        elif isinstance(node, list):
            stack += node
    return count


def _check_work(matrix: Matrix, base: dict[str, Any], where: str) -> None:
    """Every cell starts as a copy of the base: bound cells x base values before building any."""
    num_cells = math.prod(len(values) for values in matrix.axes.values())
    num_values = _num_values(base)  # the reader bounded the base to MAX_YAML_NODES values
    if num_cells * num_values > L.MAX_MATRIX_VALUES:
        raise MatrixError(
            f"{where}: matrix: {num_cells} cells of a base of {num_values} values are "
            f"{num_cells * num_values} values to build; allowed: at most {L.MAX_MATRIX_VALUES}"
        )


def matrix_from_data(data: Any, resolved: Path) -> Matrix:
    """Validate a matrix file's parsed data, read its base, expand its cells; MatrixError on any problem."""
    where = display(resolved)
    if not _is_matrix_data(data):
        got = shown(sorted(map(str, data))) if isinstance(data, dict) else type(data).__name__
        raise MatrixError(f"{where}: a matrix file has one top-level key `matrix:` (got {got})")
    extra = sorted(str(k) for k in set(data) - {"matrix"})
    if extra:
        raise MatrixError(f"{where}: unknown top-level key(s) {shown(extra)}; a matrix file has only `matrix:`")
    body = data["matrix"]
    if not isinstance(body, dict):
        raise MatrixError(f"{where}: matrix: a mapping with base or base_file, axes, and optionally overrides")
    try:
        matrix = Matrix.model_validate(body)
    except ValidationError as exc:
        raise MatrixError(format_errors(where, exc.errors(), _format_matrix_error)) from None
    _check_keys(matrix, where)
    base = _base_data(matrix, resolved, where)
    _check_work(matrix, base, where)
    if matrix.name is None:  # rebuilt, never mutated: the model is frozen
        matrix = matrix.model_copy(update={"name": safe_name(resolved.stem, L.MAX_MATRIX_NAME_CHARS)})
    matrix._path = resolved  # private attributes: not part of the frozen, validated fields
    matrix._base_data = base
    expansion = matrix.expansion()
    if not expansion.cells:
        first = expansion.skipped[0]
        raise MatrixError(
            f"{where}: none of the {expansion.num_combinations} combinations is a valid scenario; "
            f"the first, {first.name}: {first.reason.splitlines()[0]}"
        )
    return matrix


# ---------------------------------------------------------------------------------------------------------------
# Expansion


_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]+")
_AXIS_LABELS = {
    "parallel.num_dispatchers": "D",
    "parallel.num_ranks": "P",
    "parallel.num_local_experts": "E",
    "parallel.max_tokens_per_rank": "T",
}


def _safe(text: str) -> str:
    """A piece of a cell name: letters, digits, '.', '+', '-'; never starting with '.' (no '..' component)."""
    return _UNSAFE.sub("-", text[:200].replace("==", "-")).strip("-").lstrip(".+") or "x"


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
    model = data.get("model")
    model = model if isinstance(model, dict) else {}  # not a mapping: the cell is skipped with the schema's reason
    preset = model.get("preset")
    parts = [_safe(str(preset)) if preset else _safe(f"K{model.get('hidden_size')}-I{model.get('intermediate_size')}")]
    parts.append(_safe(f"D{get_dotted(data, 'parallel.num_dispatchers')}"))
    parts.append(_safe(f"T{get_dotted(data, 'parallel.max_tokens_per_rank')}"))
    fixed_in_name = {"model.preset", "parallel.num_dispatchers", "parallel.max_tokens_per_rank"}
    parts += [_label(k, v) for k, v in axis_values.items() if k not in fixed_in_name and len(axes[k]) > 1]
    name = "_".join(parts)
    if len(name) > L.MAX_CELL_NAME_CHARS:  # keep it a short path component, unique through a hash of the whole
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: L.MAX_CELL_NAME_CHARS - 9]}-{digest}"
    return name


def _expand(matrix: Matrix) -> MatrixExpansion:
    keys = list(matrix.axes)
    cells: list[MatrixCell] = []
    skipped: list[SkippedCell] = []
    used: dict[str, int] = {}
    num_combinations = 0
    # Matrix's validator has capped the product at MAX_MATRIX_CELLS; iterate, never materialise the product.
    for combo in itertools.product(*(matrix.axes[k] for k in keys)):
        num_combinations += 1
        axis_values = dict(zip(keys, combo, strict=True))
        data = copy.deepcopy(matrix._base_data)
        try:
            for key, value in axis_values.items():
                set_dotted(data, key, value)
            for override in matrix.overrides:
                if all(get_dotted(data, k) == v for k, v in override.when.items()):
                    for key, value in override.set_fields.items():
                        set_dotted(data, key, value)
        except DottedKeyError as exc:
            skipped.append(SkippedCell(name=f"cell-{num_combinations}", axis_values=axis_values, reason=str(exc)))
            continue
        name = cell_name(data, axis_values, matrix.axes)
        if name in used:  # two combinations that only differ in characters the name drops
            used[name] += 1
            name = f"{name}_{used[name]}"
        else:
            used[name] = 1
        data["name"] = f"{matrix.name}.{name}"
        description = f"matrix {matrix.name}, cell {name}" + (f": {matrix.description}" if matrix.description else "")
        data["description"] = description[: L.MAX_DESCRIPTION_CHARS]
        label = f"{matrix._path}[{name}]"
        try:
            scenario = parse_scenario(data, path=label)
        except ScenarioError as exc:
            reason = str(exc).replace(f"{label}: ", "")
            skipped.append(SkippedCell(name=name, axis_values=axis_values, reason=reason))
            continue
        cells.append(MatrixCell(name=name, scenario=scenario, axis_values=axis_values))
    return MatrixExpansion(cells=tuple(cells), skipped=tuple(skipped), num_combinations=num_combinations)


# ---------------------------------------------------------------------------------------------------------------
# The matrix directory and its combined report


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def write_matrix_manifest(matrix_dir: Path, cells: Sequence[MatrixCell], *, matrix: Matrix | None = None) -> Path:
    """matrix.json: which cells the matrix has, so `harness collect MATRIX_DIR` can re-collect it later.

    harness.launch.run may write it before running the first cell; collect_matrix writes it (again) in any case.
    """
    from harness.core.records import write_json_atomic  # pydantic records: not needed to read and check input

    data = {
        "schema_version": MATRIX_MANIFEST_VERSION,
        "record_kind": "matrix",
        "name": matrix.name if matrix else None,
        "description": matrix.description if matrix else "",
        "path": display_path(matrix.path) if matrix else None,
        "axes": jsonable(matrix.axes) if matrix else {},
        "num_combinations": matrix.expansion().num_combinations if matrix else len(cells),
        "cells": [
            {"name": c.name, "axis_values": jsonable(c.axis_values), "scenario": c.scenario.model_dump(mode="json")}
            for c in cells
        ],
        "skipped": [
            {"name": s.name, "axis_values": jsonable(s.axis_values), "reason": s.reason}
            for s in (matrix.skipped() if matrix else [])
        ],
    }
    return write_json_atomic(Path(matrix_dir) / MATRIX_MANIFEST, data)


def display_path(path: Path) -> str:
    """Relative to the repository when inside it, so reports do not depend on where the checkout lives."""
    try:
        return str(path.resolve().relative_to(REPO_DIR))
    except ValueError:
        return str(path)
