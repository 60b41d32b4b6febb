"""The launcher's settings: one dataclass; its fields are flags and ``TTS_LAUNCHER_*`` variables.

The front door and the gateway have their own (``TTS_FRONT_*``, ``TTS_GATEWAY_*``: their
settings modules); the launcher's children inherit its environment, so
``TTS_FRONT_DEADLINE_S=5 make serve`` reaches the front door with nothing else to pass. Flags
the launcher does not know go to tritonserver (``--model-config-name=gpu``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tts_front.settings import ENV_PREFIX as FRONT_PREFIX
from tts_gateway.settings import env_name as gateway_env
from tts_wire.settings import Setting, add_settings, build, settings_of

from .admin_key import DEFAULT_BIND, RESTRICTED
from .commands import DRAIN_S, StopBudget
from .liveness import LOAD_BUDGET_S

ENV_PREFIX = "TTS_LAUNCHER_"
DRAIN_ENV = ENV_PREFIX + "DRAIN_S"
# The drain as the children would read it themselves: under the launcher it is its own.
CHILD_DRAIN_ENVS = (gateway_env("drain_s"), FRONT_PREFIX + "DRAIN_S")


@dataclass(frozen=True)
class LauncherSettings:
    """What ``python -m tts_launcher`` starts and where; defaults are ``make serve``'s."""

    model_repository: Path = Path("model_repository")  # the models served (python -m export)
    http_port: int = 8000  # HTTP: Triton's API through the front door
    grpc_port: int = 8001  # gRPC: Triton's API through the front door
    metrics_port: int = 8002  # Triton's Prometheus metrics
    cache_dir: Path = Path(".cache/triton")  # the engines' caches (TensorRT, compiled kernels)
    # The address of every public port (127.0.0.1: this machine only; 0.0.0.0 opens them).
    bind: str = DEFAULT_BIND
    gateway_port: int = 8080  # the OpenAI-compatible gateway, on bind (0: no gateway)
    # Home Assistant's Wyoming protocol, served by the gateway on bind (0: none; docs/wyoming.md).
    wyoming_port: int = 10200
    # Prometheus metrics of the supervisor (outages, restarts) on bind (0: none).
    supervisor_metrics_port: int = 8003
    # APIs that need the admin key (add statistics, model-config to close those too).
    restricted_apis: str = RESTRICTED
    # Serve tritonserver's HTTP and gRPC on the public ports directly, without the front
    # door's size limits, admission and stream watch (tts_front/).
    no_front: bool = False
    # Serve the front door and the gateway on the public ports themselves, without the nginx
    # edge in front (its connection limits are then the front door's own).
    no_edge: bool = False
    # Start tritonserver again when it is not ready this long after its start (a model load
    # that hung): half the liveness probe's budget.
    load_budget_s: float = LOAD_BUDGET_S
    # After SIGTERM, requests and streams in flight get this long to finish; the gateway's,
    # the front door's and the launcher's own deadlines all follow from it (StopBudget).
    drain_s: float = DRAIN_S

    def __post_init__(self) -> None:
        StopBudget(self.drain_s)  # raises on a drain out of range
        if self.load_budget_s <= 0:
            raise ValueError(f"load_budget_s must be positive, not {self.load_budget_s}")

    @property
    def stop_budget(self) -> StopBudget:
        return StopBudget(self.drain_s)


def settings() -> list[Setting]:
    """Every setting of the launcher, as its flags and variables name them."""
    return settings_of(LauncherSettings, ENV_PREFIX)


def drain_set_elsewhere(environ: Mapping[str, str]) -> str | None:
    """Why the drain is set where the launcher would not see it (None: it is not): the
    gateway's or the front door's own variable would leave the launcher's waits behind."""
    for name in CHILD_DRAIN_ENVS:
        if name in environ:
            return (
                f"${name} is set: under the launcher the drain is one setting, --drain-s (or "
                f"${DRAIN_ENV}), from which the gateway's, the front door's and the launcher's "
                "own deadlines follow; unset it and set that instead"
            )
    return None


def parse_args(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[LauncherSettings, list[str]]:
    """The launcher's settings (flags, then ``TTS_LAUNCHER_*`` variables, then the defaults),
    and the rest of the command line (passed on to tritonserver)."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m tts_launcher", description=__doc__)
    fields = settings()
    add_settings(parser, fields, environ)
    args, extra = parser.parse_known_args(argv)
    if any(a.startswith("--front-args") for a in extra):
        parser.error(
            "the front door's settings are variables now: TTS_FRONT_<SETTING> for its "
            "--<setting> (python -m tts_front --help lists them), e.g. TTS_FRONT_DEADLINE_S=5"
        )
    problem = drain_set_elsewhere(environ)
    if problem:
        parser.error(problem)
    return build(LauncherSettings, args, fields, parser), extra


DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BEGIN = "<!-- settings: python -m tts_launcher.settings -->"
END = "<!-- end of settings -->"


def processes() -> list[tuple[str, str, list[Setting]]]:
    """Each process's name, how it is run, and its settings."""
    from tts_front.settings import settings as front
    from tts_gateway.settings import settings as gateway

    return [
        ("The launcher", "python -m tts_launcher", settings()),
        ("The front door", "python -m tts_front", front()),
        ("The gateway", "python -m tts_gateway", gateway()),
    ]


def document() -> str:
    """The docs' tables of every setting, generated from the three settings classes."""
    from tts_wire.settings import table

    parts = []
    for name, command, fields in processes():
        parts += [f"**{name}** (`{command}`)", "", table(fields), ""]
    return "\n".join(parts).rstrip()


def main(argv: list[str] | None = None) -> int:
    import re
    import sys

    p = argparse.ArgumentParser(prog="python -m tts_launcher.settings", description=__doc__)
    p.add_argument("--check", action="store_true", help=f"fail when {DOC.name} is stale")
    args = p.parse_args(argv)
    if not args.check:
        print(document())
        return 0
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), DOC.read_text(), re.DOTALL)
    if not found or found.group(1) != document():
        print(f"{DOC} has stale settings tables: python -m tts_launcher.settings", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
