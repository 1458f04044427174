"""The scenario schema reference, generated from the pydantic models in harness.scenario.schema so it cannot drift.

`harness schema` prints it; docs/scenario-schema.md is its committed output, and a test keeps the two equal.
The same type descriptions name what a field allows in "missing field" messages.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from harness.core.backends import KINDS
from harness.scenario import limits as L
from harness.scenario.fields import describe_type
from harness.scenario.fit import CPU_RANK_OVERHEAD_BYTES, GPU_RANK_OVERHEAD_BYTES, MAX_RANKS_PER_CPU
from harness.scenario.schema import MAX_PROBLEMS_SHOWN, Scenario
from harness.scenario.sections import VERSION_TEXT

REGENERATE = "harness schema > docs/scenario-schema.md"


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined or value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, (list, dict)) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    if isinstance(value, list):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _nested_models(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """(section name, model) for the model and every model under it, depth first, in field order."""
    found: list[tuple[str, type[BaseModel]]] = []

    def walk(prefix: str, current: type[BaseModel]) -> None:
        found.append((prefix, current))
        for name, field in current.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(f"{prefix}.{name}" if prefix else name, annotation)

    walk("", model)
    return found


def _checks(model: type[BaseModel]) -> list[str]:
    """The docstrings of the model's cross-field validators: the rules a table of fields cannot show."""
    decorators = model.__pydantic_decorators__.model_validators.values()
    lines: list[str] = []
    for decorator in decorators:
        doc = typing.cast(Any, decorator.func).__doc__
        if doc:
            lines += [line.strip() for line in doc.strip().splitlines() if line.strip()]
    return lines


def _doc(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    # pydantic gives a model without a docstring BaseModel's own; that one is not about scenarios.
    return "" if doc == BaseModel.__doc__ else " ".join(line.strip() for line in doc.strip().splitlines())


def _limits() -> list[str]:
    """The limits every input is checked against before anything runs (harness.scenario.limits, .fit)."""
    mib = 2**20
    return [
        "## Limits",
        "",
        "`harness plan` and `harness run` check every input against these before anything heavy happens (before",
        "torch is imported, before a rank is spawned). A refusal is one line naming the file, the field, the value",
        f"(shortened to {L.MAX_SHOWN_CHARS} characters) and what is allowed, with exit code 2; at most "
        f"{MAX_PROBLEMS_SHOWN} problems are listed.",
        "",
        "| what | limit |",
        "|---|---|",
        f"| file | a regular file after symlinks (not a directory, FIFO or device; those are never opened), at most "
        f"{L.MAX_FILE_BYTES} bytes, UTF-8, no control characters but tab and newline |",
        f"| YAML nesting | at most {L.MAX_YAML_DEPTH} levels, aliases included once expanded |",
        f"| YAML size | at most {L.MAX_YAML_NODES} values once aliases are expanded; at most {L.MAX_YAML_ALIASES} "
        "aliases; no recursive alias |",
        "| YAML keys | each key once per mapping (a repeated key is refused, not overwritten) |",
        f"| integers | at most {L.MAX_INT_DIGITS} digits, then the field's range; `true`, `\"512\"` and `512.0` "
        "are not integers |",
        "| numbers | finite: `.inf` and `.nan` are refused; an integer is taken as a number |",
        f"| strings | at most {L.MAX_STRING_CHARS} characters, no control characters (NUL included) |",
        f"| `name` | {L.NAME_PATTERN_TEXT}, at most {L.MAX_NAME_CHARS} characters (it names the run directory; a "
        "name taken from the file name has other characters replaced by `-`) |",
        f"| release versions | `vllm==`{VERSION_TEXT}, at most {L.MAX_POLICY_CHARS} characters in all |",
        f"| matrix | at most {L.MAX_MATRIX_AXES} axes of at most {L.MAX_AXIS_VALUES} values, and at most "
        f"{L.MAX_MATRIX_CELLS} cells: the product of the axis lengths, checked before any cell is built, and at "
        f"most {L.MAX_MATRIX_VALUES} values in all (cells x the base's values); at most {L.MAX_MATRIX_OVERRIDES} "
        f"overrides; `matrix.name` at most {L.MAX_MATRIX_NAME_CHARS} characters |",
        f"| ranks on this machine (`harness run`, local) | CPU: at most {MAX_RANKS_PER_CPU} ranks per core this "
        "process may use; GPU: one rank per GPU (NVML, within CUDA_VISIBLE_DEVICES) |",
        "| ranks on a Ray cluster | `num_ranks` x `launch.cpus_per_rank` at most the cluster's CPUs; one GPU per "
        "rank on cuda |",
        f"| memory per rank (`harness run`, local) | estimated from the shapes: weights, dispatch and combine "
        f"buffers, tokens and the process ({CPU_RANK_OVERHEAD_BYTES // mib} MiB on CPU, "
        f"{GPU_RANK_OVERHEAD_BYTES // mib} MiB on GPU); CPU: plus the largest workspace, times the ranks, at most "
        "the available RAM (and the cgroup's limit); GPU: plus the ballast, at most the GPU's total memory and the "
        "budget (a workspace past it is an OOM the run records) |",
        f"| command line (every command) | at most {L.MAX_ARGS} arguments of at most {L.MAX_ARG_CHARS} characters each, "
        "counted before argparse reads them (argparse takes minutes for 100,000 options) |",
        "| `--out` | a new path, or an empty directory this user may write; claimed atomically, so a second run "
        "given the same `--out` at once is refused, naming the first |",
    ]


def _backends() -> list[str]:
    """The backends of harness.core.backends: what each field can name and where each can run."""
    out = [
        "## Backends",
        "",
        "What `experts_backend` and `comm` can name (harness/core/backends.py declares them). `harness run`",
        "checks the named backends against the resolved device and the layout before any rank starts; a rank",
        "then asks what only it can tell (compute capability, symmetric memory, the ops library). `auto` takes the first",
        "backend of its order that passes both.",
        "",
        "| field | name | devices | supports | auto order | description |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for b in kind.backends:
            limits = [f"at least {b.min_ranks} ranks"] if b.min_ranks > 1 else []
            limits += [f"{what} {', '.join(values)}" for what, values in (
                ("model.activation", b.activations), ("model.quant_dtype", b.quant_dtypes),
                ("model.workspace_dtype", b.workspace_dtypes)) if values is not None]
            place = "never" if b.auto_rank is None else str(1 + kind.auto_order.index(b))
            out.append(f"| `{kind.field}` | `{b.name}` | {', '.join(b.devices)} | {_cell('; '.join(limits) or 'any')} "
                       f"| {place} | {_cell(b.description)} |")
    return out


def schema_markdown() -> str:
    """The Markdown reference of the scenario file format, from harness.scenario.schema.Scenario."""
    sections = _nested_models(Scenario)
    section_names = {model: name for name, model in sections if name}
    out = [
        "# Scenario file reference",
        "",
        "Generated from `harness/scenario/schema.py` by `harness schema`; do not edit by hand.",
        f"Regenerate with `{REGENERATE}`.",
        "",
        "A scenario is a YAML mapping. Unknown keys are errors, every size is checked before anything runs, and",
        "no check touches a GPU. Letters follow docs/design.md: T tokens per rank, D dispatchers, M = T * D,",
        "E local experts, K hidden size, I intermediate size (N = 2I). `harness plan FILE` validates a file and",
        "prints the workspace each policy would allocate.",
        "",
        *_limits(),
        "",
        *_backends(),
    ]
    for name, model in sections:
        title = f"`{name}`" if name else "Top level"
        out += ["", f"## {title}", ""]
        doc = _doc(model)
        if doc:
            out += [doc, ""]
        out += ["| field | type | default | description |", "|---|---|---|---|"]
        for field_name, field in model.model_fields.items():
            key = f"{name}.{field_name}" if name else field_name
            kind = describe_type(field.annotation, field.metadata, sections=section_names)
            out.append(f"| `{key}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(field.description or '')} |")
        checks = _checks(model)
        if checks:
            out += ["", "Checks across fields:", ""] + [f"- {line.removeprefix('- ')}" for line in checks]
    return "\n".join(out) + "\n"
