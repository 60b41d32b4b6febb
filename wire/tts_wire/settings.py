"""A process's settings class is its one source: its command line, its environment variables
and its docs table are generated from the dataclass.

Each field ``max_waiting`` is ``--max-waiting`` and ``$<PREFIX>MAX_WAITING``; a flag wins over
the variable, the variable over the default. A field's help is the comment written above it
(and any comment at the end of its line), so the code's own explanation is what ``--help``
and the docs say. Types: str, int, float, bool (``--flag``, ``--flag false``), Path, an
optional int or float (``none``), a tuple of str (comma-separated).
docs/decisions/0008-settings-from-dataclasses.md says why this is ours and not a library's.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_FIELD = re.compile(r"^\s+(\w+)\s*:[^=]*=")
_COMMENT = re.compile(r"^\s*#\s?(.*)$")


def parse_bool(value: object) -> bool:
    """A bool from a flag or variable: true/1/yes/on or false/0/no/off."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if str(text).strip().lower() in ("", "none") else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in str(text).split(",") if w.strip())


def _converter(hint: Any) -> Callable[[str], Any]:
    """The function that reads a field of this type from a flag's or variable's text."""
    args = typing.get_args(hint)
    if hint in (str, int, float, Path):
        return hint
    if hint is bool:
        return parse_bool
    if typing.get_origin(hint) is tuple and args[:1] == (str,):
        return _words
    if type(None) in args and len(args) == 2:  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        if inner in (int, float, str):
            return _optional(inner)
    raise TypeError(f"no command-line form for a setting of type {hint!r}")


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment: the ``#`` lines right above it, then one at its line's end."""
    notes: dict[str, str] = {}
    block: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        comment = _COMMENT.match(line)
        if comment:
            block.append(comment.group(1))
            continue
        field = _FIELD.match(line)
        if field:
            tail = line.split("#", 1)[1].strip() if "  # " in line else ""
            notes[field.group(1)] = " ".join([*block, tail]).strip()
        block = []
    return notes


@dataclass(frozen=True)
class Setting:
    """One field of a settings class, as the command line and the environment see it."""

    name: str
    flag: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    help: str
    is_bool: bool


def settings_of(cls: type, env_prefix: str, exclude: Iterable[str] = ()) -> list[Setting]:
    """The settings of a dataclass (``exclude``: fields set only in code)."""
    hints = typing.get_type_hints(cls)
    notes = _comments(cls)
    skip = set(exclude)
    found = []
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        found.append(
            Setting(
                f.name,
                "--" + f.name.replace("_", "-"),
                env_prefix + f.name.upper(),
                default,
                _converter(hints[f.name]),
                notes.get(f.name, ""),
                hints[f.name] is bool,
            )
        )
    return found


def add_settings(
    parser: argparse.ArgumentParser,
    settings: list[Setting],
    environ: Mapping[str, str],
) -> None:
    """One flag per setting, its default the variable's value where one is set."""
    for s in settings:
        default = s.default
        if s.env in environ:
            try:
                default = s.parse(environ[s.env])
            except (ValueError, argparse.ArgumentTypeError) as e:
                parser.error(f"${s.env}={environ[s.env]!r}: {e}")
        help_text = f"{s.help} (default {_show(s.default)}; ${s.env})".lstrip()
        help_text = help_text.replace("%", "%%")
        if s.is_bool:
            # --flag alone is true; --flag false (or 0, no) is false.
            parser.add_argument(
                s.flag, type=parse_bool, nargs="?", const=True, default=default, help=help_text
            )
        else:
            parser.add_argument(s.flag, type=s.parse, default=default, help=help_text)


def build(
    cls: type,
    args: argparse.Namespace,
    settings: list[Setting],
    parser: argparse.ArgumentParser,
    **fixed: Any,
) -> Any:
    """The settings object from parsed flags; a value the class refuses is the parser's error."""
    try:
        return cls(**{s.name: getattr(args, s.name) for s in settings}, **fixed)
    except ValueError as e:
        parser.error(str(e))


def parse(
    cls: type,
    argv: list[str] | None,
    environ: Mapping[str, str],
    *,
    prog: str,
    description: str,
    env_prefix: str,
) -> Any:
    """Flags, then variables, then the defaults: the settings object."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    settings = settings_of(cls, env_prefix)
    add_settings(parser, settings, environ)
    return build(cls, parser.parse_args(argv), settings, parser)


def table(settings: list[Setting]) -> str:
    """A markdown table of the settings: flag, variable, default, what it does."""
    rows = ["| flag | variable | default | what it does |", "|---|---|---|---|"]
    for s in settings:
        note = s.help.replace("|", "\\|")
        rows.append(f"| `{s.flag}` | `{s.env}` | `{_show(s.default)}` | {note} |")
    return "\n".join(rows)
