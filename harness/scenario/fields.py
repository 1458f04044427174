"""Field types in words, for the schema reference and for "missing field" messages: `integer > 0: T, ...`.

Knows pydantic and annotated-types only, not the Scenario model, so both harness.scenario.schema and
harness.scenario.doc can use it.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _constraint(meta: Any) -> str | None:
    """One annotated-types constraint as text: `> 0`, `>= 0`, `at least 1 item`."""
    if isinstance(meta, annotated_types.Gt):
        return f"> {meta.gt}"
    if isinstance(meta, annotated_types.Ge):
        return f">= {meta.ge}"
    if isinstance(meta, annotated_types.Lt):
        return f"< {meta.lt}"
    if isinstance(meta, annotated_types.Le):
        return f"<= {meta.le}"
    if isinstance(meta, annotated_types.MinLen):
        return f"at least {meta.min_length} item{'s' if meta.min_length != 1 else ''}"
    if isinstance(meta, annotated_types.MaxLen):
        return f"at most {meta.max_length} items"
    return None


def _constraints(metadata: list[Any]) -> list[str]:
    found: list[str] = []
    for meta in metadata:
        # Annotated[int, Field(gt=0)] carries a FieldInfo whose own metadata holds the Gt.
        inner = meta.metadata if isinstance(meta, FieldInfo) else [meta]
        found += [c for c in map(_constraint, inner) if c]
    return found


def describe_type(
    annotation: Any, metadata: list[Any] | None = None, *, sections: dict[type[BaseModel], str] | None = None
) -> str:
    """A field's type in words: "integer > 0", "one of `silu`, `gelu`", "list of string", ...

    `sections` names the reference section of each nested model, for "mapping (see `parallel`)".
    """
    sections = sections or {}
    constraints = _constraints(metadata or [])
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return describe_type(args[0], list(args[1:]) + list(metadata or []), sections=sections)
    if origin in (typing.Union, types.UnionType):
        # Optional[X]: an unset field shows as its default, so only X is described.
        described = [describe_type(a, metadata, sections=sections) for a in args if a is not type(None)]
        return " or ".join(described)
    if origin is typing.Literal:
        text = "one of " + ", ".join(f"`{a}`" for a in args)
    elif origin is list:
        text = f"list of {describe_type(args[0], sections=sections)}"
    elif origin is dict:
        text = f"mapping of {describe_type(args[0], sections=sections)} to {describe_type(args[1], sections=sections)}"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        section = sections.get(annotation)
        text = f"mapping (see `{section}`)" if section else "mapping; `harness schema` lists its fields"
    else:
        text = _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))
    sizes = [c for c in constraints if c.startswith(("at least", "at most"))]
    bounds = [c for c in constraints if c not in sizes]
    return ", ".join([" ".join([text, *bounds[:1]]), *bounds[1:], *sizes])


def describe_field(field: FieldInfo, *, with_description: bool = True) -> str:
    """Type and meaning of one field, for messages: `integer > 0, <= 262144: T, per-dispatcher token capacity`."""
    text = describe_type(field.annotation, field.metadata)
    return f"{text}: {field.description}" if field.description and with_description else text
