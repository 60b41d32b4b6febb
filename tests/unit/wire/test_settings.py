"""A settings dataclass's command line and environment, generated (tts_wire.settings)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tts_wire.settings import parse, settings_of, table


@dataclass(frozen=True)
class Example:
    # How many; the comment above a field is its help,
    # over as many lines as it takes.
    count: int = 3
    rate: float = 0.5  # per second
    name: str = "a"
    folder: Path = Path("x")
    on: bool = False
    limit: float | None = None
    models: tuple[str, ...] = ("tts", "tts_stream")

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count must be >= 0, not {self.count}")


def read(argv, environ=None):
    return parse(Example, argv, environ or {}, prog="x", description="", env_prefix="X_")


def test_every_type_from_a_flag():
    got = read(
        ["--count=4", "--rate", "2", "--name=b", "--folder=/y", "--on", "--limit=none",
         "--models=a,b"]
    )  # fmt: skip
    assert got == Example(4, 2.0, "b", Path("/y"), True, None, ("a", "b"))
    assert read(["--limit", "1.5", "--on", "false"]) == Example(limit=1.5, on=False)


def test_a_flag_wins_over_its_variable_which_wins_over_the_default():
    environ = {"X_COUNT": "7", "X_ON": "yes", "X_MODELS": "tts"}
    assert read([], environ) == Example(count=7, on=True, models=("tts",))
    assert read(["--count=9", "--on=0"], environ) == Example(count=9, models=("tts",))
    assert read([]) == Example()


def test_a_bad_value_is_refused_with_the_setting_named(capsys):
    with pytest.raises(SystemExit):
        read([], {"X_COUNT": "many"})
    assert "$X_COUNT='many'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        read(["--count=-1"])  # the class's own check
    assert "count must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        read(["--on=maybe"])
    assert "expected true or false" in capsys.readouterr().err


def test_help_and_the_docs_table_are_the_fields_comments():
    notes = {s.name: s.help for s in settings_of(Example, "X_")}
    assert notes["count"] == (
        "How many; the comment above a field is its help, over as many lines as it takes."
    )
    assert notes["rate"] == "per second"
    assert notes["name"] == ""
    rows = table(settings_of(Example, "X_")).splitlines()
    assert rows[2] == f"| `--count` | `X_COUNT` | `3` | {notes['count']} |"
    assert "| `--models` | `X_MODELS` | `tts,tts_stream` |" in rows[-1]
