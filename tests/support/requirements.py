"""The project's pinned requirements, read as pip reads them."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import ROOT


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version of a requirements file, following its -r includes."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found.update(pins(path.parent / line[3:].strip()))
        elif line:
            name, _, version = line.partition("==")
            assert version, f"{path}: {line!r} is not an exact pin"
            name = name.split("[")[0]  # extras pin the same distribution
            assert norm(name) not in found, f"{path}: {name} pinned twice"
            found[norm(name)] = version
    return found


ALL = pins(ROOT / "requirements.txt")
