"""Reading scenario and matrix files: bounded in time and memory whatever the file holds.

    path ──> check_input_file   a regular file (after symlinks) of at most MAX_FILE_BYTES; never opened otherwise
         ──> read_input_text    UTF-8, no control characters
         ──> parse_yaml         BoundedLoader: nesting, node count after alias expansion, aliases, string lengths,
                                integer digits and duplicate keys checked while the document is composed

Every refusal is a ScenarioError whose message is one line naming the file, the field (the YAML path), what was
found and what is allowed. Nothing here formats a value the file holds without bounding it first.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, TypeVar

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.core.errors import BadInput
from harness.scenario.limits import (
    MAX_FILE_BYTES,
    MAX_INT_DIGITS,
    MAX_STRING_CHARS,
    MAX_YAML_ALIASES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    shown,
    shown_key,
    shown_text,
)


class ScenarioError(BadInput):
    """A scenario that cannot be loaded; the message names the file, the field, the value and what is allowed."""


# C0 and C1 control characters other than tab, newline and carriage return; YAML's own non-characters.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff]")
_CONTROL_IN_VALUE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffe\uffff]")  # tab and newline are allowed
_INT_TAG = "tag:yaml.org,2002:int"
_N = TypeVar("_N", bound=Node)
_FLOAT_TAG = "tag:yaml.org,2002:float"
_OCTAL_RE = re.compile(r"^[-+]?0[0-7_]+$")  # YAML 1.1 octal: a leading zero (0o17 and plain 0 are unambiguous)
_SEXAGESIMAL_RE = re.compile(r"^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?$")  # YAML 1.1 base 60: 1:30, 1:30.5
_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def display(path: Path | str) -> str:
    """A path for a message: control characters escaped, at most 200 characters."""
    return shown_text(str(path))


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def check_input_file(path: Path, *, what: str = "scenario file") -> os.stat_result:
    """Refuse anything but a regular file of at most MAX_FILE_BYTES, without opening it."""
    try:
        info = os.stat(path)  # follows symlinks: a link to /dev/zero is a character device
    except FileNotFoundError:
        raise ScenarioError(f"{display(path)}: no such file") from None
    except OSError as exc:
        raise ScenarioError(f"{display(path)}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ScenarioError(f"{display(path)}: is {_kind(info.st_mode)}, not a regular file; give a {what}")
    if info.st_size > MAX_FILE_BYTES:
        raise ScenarioError(f"{display(path)}: is {info.st_size} bytes; a {what} may be at most {MAX_FILE_BYTES} bytes")
    return info


def _read_bytes(path: Path, *, what: str) -> bytes:
    check_input_file(path, what=what)
    try:
        # O_NONBLOCK: should the path become a FIFO after the check, opening it does not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ScenarioError(f"{display(path)}: cannot read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ScenarioError(f"{display(path)}: is {_kind(info.st_mode)}, not a regular file; give a {what}")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{display(path)}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ScenarioError(f"{display(path)}: is over {MAX_FILE_BYTES} bytes; a {what} may be at most that")
    return data


def _line_column(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def read_input_text(path: Path, *, what: str = "scenario file") -> str:
    """The file's text: a regular file, UTF-8, without control characters other than tab and newline."""
    data = _read_bytes(path, what=what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = _line_column(data[: exc.start].decode("utf-8", "replace"), exc.start)
        raise ScenarioError(
            f"{display(path)}: is not UTF-8 text (byte 0x{data[exc.start]:02x} at {where}); a {what} is UTF-8 YAML"
        ) from None
    text = text.removeprefix("\ufeff")
    bad = _CONTROL.search(text)
    if bad:
        raise ScenarioError(
            f"{display(path)}: control character U+{ord(bad.group()):04X} at {_line_column(text, bad.start())}; "
            "allowed: printable text, tabs and newlines"
        )
    return text


# ---------------------------------------------------------------------------------------------------------------
# YAML


class YamlRefusal(yaml.YAMLError):
    """Raised inside the loader; parse_yaml turns it into a ScenarioError with the file's name."""

    def __init__(self, where: str, problem: str, node_or_mark: Any) -> None:
        super().__init__(problem)
        self.where, self.problem = where, problem
        self.mark = getattr(node_or_mark, "start_mark", node_or_mark)


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses, while composing, what would make loading or reporting unbounded.

    - nesting deeper than MAX_YAML_DEPTH (the composer recurses once per level);
    - more than MAX_YAML_NODES nodes once aliases are expanded (an alias bomb stays a few KiB on disk but
      expands exponentially wherever the data is walked), more than MAX_YAML_ALIASES aliases, recursive aliases;
    - strings over MAX_STRING_CHARS, control characters in a value (escapes like "\\0" included);
    - integers of more than MAX_INT_DIGITS digits (never converted, so never formatted);
    - a key given twice in one mapping (PyYAML keeps the last one silently), and merge keys (<<), which would
      override keys past that rule;
    - YAML 1.1 numbers that read as another number than written: octal `020` (16), base-60 `1:30.5` (90.5).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str] = []
        self._num_aliases = 0

    def _where(self) -> str:
        return ".".join(self._path) or "(top level)"

    def _refuse(self, problem: str, node_or_mark: Any) -> YamlRefusal:
        return YamlRefusal(self._where(), problem, node_or_mark)

    @staticmethod
    def _label(parent: Node | None, index: Any) -> str | None:
        if isinstance(parent, SequenceNode):
            return str(index)
        if isinstance(parent, MappingNode):
            return shown_text(str(index.value), 40) if isinstance(index, ScalarNode) else "(a key)"
        return None

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        label = self._label(parent, index)
        if label is not None:
            self._path.append(label)
        try:
            if len(self._path) > MAX_YAML_DEPTH:
                raise self._refuse(
                    f"nesting deeper than {MAX_YAML_DEPTH} levels; allowed: {MAX_YAML_DEPTH}",
                    self.peek_event().start_mark,
                )
            is_alias = self.check_event(yaml.AliasEvent)
            mark = self.peek_event().start_mark
            if is_alias:
                self._num_aliases += 1
                if self._num_aliases > MAX_YAML_ALIASES:
                    raise self._refuse(f"more than {MAX_YAML_ALIASES} aliases; allowed: {MAX_YAML_ALIASES}", mark)
            node = super().compose_node(parent, index)
            if is_alias:
                height = getattr(node, "harness_height", None)
                if height is None:
                    raise self._refuse("an alias to the collection that holds it (a recursive alias)", mark)
                if len(self._path) + height - 1 > MAX_YAML_DEPTH:
                    raise self._refuse(f"the alias nests deeper than {MAX_YAML_DEPTH} levels once expanded", mark)
            return node
        finally:
            if label is not None:
                self._path.pop()

    def _sized(self, node: _N, children: list[Node]) -> _N:
        """Record the node's size and height once expanded; refuse past MAX_YAML_NODES."""
        size = 1 + sum(c.harness_size for c in children)  # type: ignore[attr-defined]
        if size > MAX_YAML_NODES:
            raise self._refuse(
                f"more than {MAX_YAML_NODES} values, aliases counted as often as they expand; "
                f"allowed: {MAX_YAML_NODES}",
                node,
            )
        node.harness_size = size  # type: ignore[attr-defined]
        node.harness_height = 1 + max((c.harness_height for c in children), default=0)  # type: ignore[attr-defined]
        return node

    def compose_scalar_node(self, anchor: Any) -> ScalarNode:  # anchor: a str or None (the stubs say a dict)
        node = super().compose_scalar_node(anchor)
        value = node.value
        if node.tag == _INT_TAG:
            num_digits = sum(ch.isalnum() for ch in value)
            if num_digits > MAX_INT_DIGITS:
                raise self._refuse(f"an integer of {num_digits} digits; allowed: at most {MAX_INT_DIGITS} digits", node)
        if node.style is None and node.tag in (_INT_TAG, _FLOAT_TAG):
            self._refuse_yaml11_number(node)
        if len(value) > MAX_STRING_CHARS:
            raise self._refuse(f"a string of {len(value)} characters; allowed: at most {MAX_STRING_CHARS}", node)
        bad = _CONTROL_IN_VALUE.search(value)
        if bad:
            raise self._refuse(
                f"control character U+{ord(bad.group()):04X} in {shown(value)}; allowed: printable text", node
            )
        return self._sized(node, [])

    def _refuse_yaml11_number(self, node: ScalarNode) -> None:
        """YAML 1.1 forms that read as another number than the one written: `020` is octal 16, `1:30.5` is
        sexagesimal 90.5. Nobody writing a scenario means those; quoting or the decimal says what is meant."""
        value = node.value
        if _OCTAL_RE.match(value):
            raise self._refuse(
                f"{shown(value)} is a YAML 1.1 octal number (read as {int(value.replace('_', ''), 8)}),"
                f" not {int(value.replace('_', ''), 10)}; quote it or write the decimal",
                node,
            )
        if _SEXAGESIMAL_RE.match(value):
            read = self.construct_object(node)
            raise self._refuse(
                f"{shown(value)} is a YAML 1.1 base-60 number (read as {read}); quote it or write the decimal", node
            )

    def compose_sequence_node(self, anchor: Any) -> SequenceNode:
        node = super().compose_sequence_node(anchor)
        return self._sized(node, node.value)

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], ScalarNode] = {}
        for key, _ in node.value:
            if isinstance(key, ScalarNode) and key.tag == "tag:yaml.org,2002:merge":
                # `<<: *base` merges keys past the duplicate-key rule (a merged key is silently overridden)
                raise self._refuse(
                    "a merge key (<<); allowed: each key written out (an anchor and alias may stand for a whole value)",
                    key,
                )
            if isinstance(key, ScalarNode):
                first = seen.setdefault((key.tag, key.value), key)
                if first is not key:
                    self._path.append(shown_text(key.value, 40))
                    raise self._refuse(
                        f"duplicate key {shown_key(key.value)} (first at line {first.start_mark.line + 1}); "
                        "allowed: each key once",
                        key,
                    )
        return self._sized(node, [part for pair in node.value for part in pair])


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line from a PyYAML error: the problem, where it was noticed, and where its context starts."""
    if isinstance(exc, YamlRefusal):
        at = f" (line {exc.mark.line + 1}, column {exc.mark.column + 1})" if exc.mark is not None else ""
        return f"{exc.where}: {exc.problem}{at}"
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    # The mark is where YAML noticed; the context mark is often where the mistake is (an unclosed bracket).
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark:
        problem += f" ({context} that starts at line {context_mark.line + 1}, column {context_mark.column + 1})"
    kind = "YAML error" if isinstance(exc, (ConstructorError, ComposerError)) else "YAML syntax error"
    return f"{kind}{where}: {shown_text(problem)}"


def parse_yaml(text: str, *, path: Path | str) -> Any:
    """The one YAML document in `text`, loaded with BoundedLoader; ScenarioError names `path` on any problem."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{display(path)}: {_yaml_problem(exc)}") from None
    except RecursionError:  # not reachable within MAX_YAML_DEPTH; kept so no input can produce a traceback
        raise ScenarioError(f"{display(path)}: nesting too deep; allowed: {MAX_YAML_DEPTH} levels") from None
    finally:
        loader.dispose()


def read_yaml_file(path: Path, *, what: str = "scenario file") -> Any:
    """check_input_file + read_input_text + parse_yaml."""
    return parse_yaml(read_input_text(path, what=what), path=path)


VLLM_INPUT_KINDS = {  # what each vLLM input names, for the one-line refusal of one that is not there
    "ops_library": ("file", "vLLM's compiled ops library file (vllm/_C_stable_libtorch.abi3.so or vllm/_C.abi3.so)"),
    "wheel": ("file", "a vLLM wheel file (.whl)"),
    "src": ("directory", "a vLLM source tree (a directory)"),
}


def missing_vllm_input(named: list[tuple[str, str, str | Path | None]]) -> str | None:
    """The first (label, kind, path) whose path is not there, as one line ("--vllm-ops-library nope.so: no such
    file or directory; allowed: ..."); kind is a key of VLLM_INPUT_KINDS. Checked before anything starts: a
    missing ops library otherwise surfaced only once every rank had started and failed on it."""
    for label, kind, value in named:
        if value is None:
            continue
        want, allowed = VLLM_INPUT_KINDS[kind]
        path = Path(value).expanduser()
        if not (path.is_file() if want == "file" else path.is_dir()):
            what = "no such file or directory" if not path.exists() else f"not a {want}"
            return f"{label} {display(path)}: {what}; allowed: {allowed}"
    return None
