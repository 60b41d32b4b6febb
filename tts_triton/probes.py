"""What the tritonserver we embed shows from outside: its health endpoints and its
Python-backend stub processes (found in /proc). Shared by the launcher, which supervises them,
and the front door, which ends the streams of a stub that died.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

STUB = "triton_python_backend_stub"


def answers_ok(url: str, timeout_s: float = 2.0) -> bool:
    """GET ``url`` answers 200 within ``timeout_s``; False for anything else, a refused or
    dropped connection included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def health(http_port: int, which: str) -> bool:
    """GET /v2/health/<which> (live or ready) on loopback answers 200 within 2 s."""
    return answers_ok(f"http://localhost:{http_port}/v2/health/{which}")


def is_live(http_port: int) -> bool:
    """The server on ``http_port`` answers live (it may be not ready: a model is down)."""
    return health(http_port, "live")


def is_ready(http_port: int) -> bool:
    """The server on ``http_port`` answers ready (not starting, not shutting down)."""
    return health(http_port, "ready")


def python_models(repository: Path) -> list[str]:
    """The models of ``repository`` that run in a Python-backend stub."""
    return sorted(p.parent.parent.name for p in Path(repository).glob("*/1/model.py"))


def stubs_by_model(
    server_pid: int | None,
    models: list[str],
    regions: dict[int, str] | None = None,
    shm_prefix: str = "",
) -> dict[str, set[int]]:
    """Living stub processes of ``server_pid`` (None: of any tritonserver of this user whose
    regions carry ``shm_prefix``), by model name (read from /proc).

    A command line proves nothing (any local user can name a process like a stub, and its exit
    then read as a dead stub): a stub is a child of the server, or with ``server_pid`` None of
    a ``tritonserver`` process, and belongs to this process's user.

    ``regions``, when given, is filled with each stub's shared-memory region name.
    """
    found: dict[str, set[int]] = {m: set() for m in models}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        # stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state == "Z" or not cmdline or STUB not in str(cmdline[0]):
            continue
        if server_pid is not None and int(ppid) != server_pid:
            continue
        if server_pid is None and not is_tritonserver(int(ppid)):
            continue
        try:
            if proc.stat().st_uid != os.geteuid():
                continue
        except OSError:
            continue
        if shm_prefix and (len(cmdline) < 3 or shm_prefix.encode() not in cmdline[2]):
            continue
        for model in models:
            if any(arg.endswith(f"/{model}/1/model.py".encode()) for arg in cmdline[1:3]):
                found[model].add(int(proc.name))
                if regions is not None and len(cmdline) > 2:
                    regions[int(proc.name)] = cmdline[2].decode(errors="replace")
    return found


def is_tritonserver(pid: int) -> bool:
    """Process ``pid`` runs a binary named tritonserver."""
    try:
        argv0 = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return argv0.rsplit(b"/", 1)[-1] == b"tritonserver"
