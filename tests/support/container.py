"""podman as the container tests drive it (tests/container).

Rootful podman with the ``runc`` runtime, every container limit at the host's own hard limit:
on this project's machines the default runtime (crun) cannot raise RLIMIT_NOFILE without
CAP_SYS_RESOURCE, and runc fails the same way when a container asks more than the host has
(../shared/TOOLCHAIN.md, "Containers"). podman-compose and ``podman kube play`` get the same
through a containers.conf of their own (CONTAINERS_CONF).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

IMAGE = "localhost/tts-triton:cpu"
# The engine's and the tools' Debian packages (make test-system-deps installs them).
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap",
         "podman-compose": "podman-compose"}  # fmt: skip


def missing() -> str | None:
    """Why the container tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "the container tests build and run images with rootful podman: run as root"
    absent = [package for tool, package in TOOLS.items() if not shutil.which(tool)]
    if absent:
        return f"no container engine: apt-get install {' '.join(absent)} (make test-system-deps)"
    return None


# Processes (threads) of the container's user: the server runs a few hundred. runc refused the
# host's own hard limit here (96,367: "error setting rlimit type 6") and took 4,096.
NPROC = 4096


def limits() -> dict[str, int]:
    """The container's limits: open files at the host's hard limit, which a container's may
    not pass; processes at NPROC or the host's limit if lower."""
    return {
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        "nproc": min(NPROC, resource.getrlimit(resource.RLIMIT_NPROC)[1]),
    }


def ulimit_flags() -> list[str]:
    return [flag for name, n in limits().items() for flag in ("--ulimit", f"{name}={n}:{n}")]


def engine() -> list[str]:
    return ["podman", "--runtime", shutil.which("runc") or "/usr/sbin/runc"]


def containers_conf(path: Path) -> dict[str, str]:
    """An environment whose podman (under podman-compose, kube play) uses runc and the
    host's limits."""
    default = ", ".join(f'"{name}={n}:{n}"' for name, n in limits().items())
    runc = shutil.which("runc") or "/usr/sbin/runc"
    path.write_text(f'[containers]\ndefault_ulimits = [{default}]\n[engine]\nruntime = "{runc}"\n')
    return {**os.environ, "CONTAINERS_CONF": str(path)}


def podman(*args: str, timeout: float = 120, check: bool = True, env=None, **kw):
    """One podman command, its output captured; a failure shows what it printed."""
    result = subprocess.run(
        [*engine(), *args], capture_output=True, text=True, timeout=timeout, env=env, **kw
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-3000:]}"
        )
    return result


def healthy(name: str) -> bool:
    """The image's HEALTHCHECK run once now (podman schedules it through systemd, which a
    machine without systemd lacks; `podman healthcheck run` runs it at once)."""
    return podman("healthcheck", "run", name, check=False, timeout=60).returncode == 0


def wait_healthy(name: str, budget_s: float = 300) -> float:
    """Seconds until the container's health check passed; fails with its log past the budget."""
    start = time.monotonic()
    while time.monotonic() - start < budget_s:
        state = podman("inspect", name, "--format", "{{.State.Status}}", check=False).stdout
        if state.strip() not in ("running", "created", "configured", ""):
            break  # it exited: no use waiting
        if healthy(name):
            return time.monotonic() - start
        time.sleep(3)
    log = podman("logs", name, check=False, timeout=30)
    raise AssertionError(
        f"{name} not healthy within {budget_s:.0f} s ({state.strip()}):\n"
        f"{(log.stdout + log.stderr)[-4000:]}"
    )


def logs(name: str) -> str:
    result = podman("logs", name, check=False, timeout=30)
    return result.stdout + result.stderr
