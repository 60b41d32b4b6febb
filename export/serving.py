"""Which launchers serve a model repository now: an export must not rewrite the files a
running server reads (``make perf-smoke`` beside ``make serve`` did).

Each launcher leaves a file named by its pid in a folder of the system's temporary directory
named after the repository's path (not in the repository: Triton would take a folder there for
a model). A file whose process has ended is stale and ignored.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _root() -> Path:
    return Path(tempfile.gettempdir()) / "tts-triton-serving"


def _folder(repository: Path) -> Path:
    key = hashlib.sha256(str(repository.resolve()).encode()).hexdigest()[:16]
    return _root() / key


@contextmanager
def serving(repository: Path) -> Iterator[None]:
    """While inside, this process counts as serving ``repository``."""
    marker = _folder(repository) / str(os.getpid())
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{repository.resolve()}\n")
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def servers(repository: Path | None = None) -> list[int]:
    """The pids of the live processes serving ``repository`` (None: any repository); stale
    files are removed."""
    folder = _root() if repository is None else _folder(repository)
    live = []
    pattern = "*/*" if repository is None else "*"
    for marker in folder.glob(pattern) if folder.is_dir() else []:
        if not marker.name.isdigit():
            continue
        try:
            os.kill(int(marker.name), 0)
        except ProcessLookupError:
            marker.unlink(missing_ok=True)
            continue
        except PermissionError:
            pass  # alive, another user's
        live.append(int(marker.name))
    return sorted(live)
