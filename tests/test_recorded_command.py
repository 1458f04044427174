"""The recorded command (run.json's and bench.json's `command`) is derived from the parsed arguments: every option
of `run` and `bench`, set to a value other than its default, survives the round trip command -> record -> parse.

The cases come from the subparsers' own actions, so an option added to either is covered without touching this
file, and a recorder that leaves one out fails that option's case.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cli import build_parser, recorded_command

Recorder = Callable[[argparse.ArgumentParser, argparse.Namespace], list[str]]
NOT_COMPARED = {"func", "parser"}  # set_defaults of the subparser: the handler, not an argument


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _arguments(name: str) -> list[argparse.Action]:
    return [a for a in _subparser(name)._actions if not isinstance(a, argparse._HelpAction)]


def _setting(action: argparse.Action) -> list[str]:
    """Command-line words that set `action` to a value other than its default."""
    if action.nargs == 0:  # store_true and friends
        return [action.option_strings[0]]
    if action.choices:
        value = next(str(c) for c in action.choices if c != action.default)
    elif action.type is int:
        value = "4" if action.default == 3 else "3"
    elif action.type is float:
        value = "2.5"
    elif action.type is Path:
        value = f"some/{action.dest}"
    else:
        value = f"{action.dest}-value"
    return [value] if not action.option_strings else [action.option_strings[0], value]


def _compared(ns: argparse.Namespace) -> dict[str, object]:
    return {k: v for k, v in vars(ns).items() if k not in NOT_COMPARED}


def _round_trip(command: str, words: list[str], recorder: Recorder = recorded_command):
    """(the namespace `harness COMMAND WORDS` parses to, the namespace its recorded command parses to, the record)."""
    ns = build_parser().parse_args([command, *words])
    recorded = recorder(ns.parser, ns)
    assert recorded[:2] == ["harness", command]
    return ns, build_parser().parse_args(recorded[1:]), recorded


CASES = [
    pytest.param(command, action, id=f"{command} {(action.option_strings or [action.dest])[0]}")
    for command in ("run", "bench")
    for action in _arguments(command)
]


@pytest.mark.parametrize(("command", "action"), CASES)
def test_every_option_set_is_recorded_and_parses_back_the_same(command: str, action: argparse.Action):
    ns, again, recorded = _round_trip(command, _setting(action))
    assert getattr(ns, action.dest) != action.default  # the case does set the option
    assert _compared(again) == _compared(ns), recorded


@pytest.mark.parametrize("command", ["run", "bench"])
def test_every_option_at_once_round_trips(command: str):
    words: list[str] = []
    for action in _arguments(command):
        words += _setting(action)
    ns, again, recorded = _round_trip(command, words)
    assert _compared(again) == _compared(ns), recorded
    assert all(getattr(ns, a.dest) != a.default for a in _arguments(command))


def test_defaults_are_left_out_and_the_namespace_is_untouched():
    ns = build_parser().parse_args(["bench", "smoke", "--num-ranks", "2", "--cpu-only", "--out", "x"])
    before = dict(vars(ns))
    assert recorded_command(ns.parser, ns) == [
        "harness",
        "bench",
        "smoke",
        "--out",
        "x",
        "--num-ranks",
        "2",
        "--cpu-only",
    ]
    assert vars(ns) == before
    plain = build_parser().parse_args(["run"])
    assert recorded_command(plain.parser, plain) == ["harness", "run"]


def test_a_value_that_looks_like_an_option_is_recorded_attached():
    ns = build_parser().parse_args(["run", "--policies=-legacy"])
    recorded = recorded_command(ns.parser, ns)
    assert recorded == ["harness", "run", "--policies=-legacy"]
    assert build_parser().parse_args(recorded[1:]).policies == "-legacy"


def test_a_recorder_that_drops_a_flag_fails_that_flags_case():
    """What the per-option cases catch: the hand-kept lists once left out --comm (run) and --comm/--kernels (bench)."""

    def dropping(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> list[str]:
        words = recorded_command(parser, ns)
        return [w for i, w in enumerate(words) if w != "--comm" and (i == 0 or words[i - 1] != "--comm")]

    for command in ("run", "bench"):
        (comm,) = [a for a in _arguments(command) if a.dest == "comm"]
        ns, again, _ = _round_trip(command, _setting(comm), recorder=dropping)
        assert again.comm is None and ns.comm is not None
        assert _compared(again) != _compared(ns)
