"""Ready when every model is: Triton's per-model readiness, for a container's health check.

    python -m tts_launcher.healthcheck [--url http://127.0.0.1:8000] [--repository DIR]
                                       [--gateway | --gateway-url http://127.0.0.1:8080]

Asks ``GET /v2/models/<name>/ready`` for each model of the repository (every folder with a
config.pbtxt), not only the server's ``/v2/health/ready``: a server is up while one model
failed to load or its stub died. With ``--gateway-url``, the gateway's ``/ready`` too. Exit
status 0 when all answer 200; 1 otherwise, naming each model that is not ready. Standard
library only, so it runs wherever the server's Python does (docker/Dockerfile HEALTHCHECK,
the Kubernetes readiness probe in deploy/). Its defaults are the launcher's own variables where
they are set (``TTS_LAUNCHER_HTTP_PORT``, ``TTS_LAUNCHER_GATEWAY_PORT``,
``TTS_LAUNCHER_MODEL_REPOSITORY``: the image configures the launcher by them), so a container
started on other ports checks those.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

# The launcher's variables (tts_launcher.settings, ENV_PREFIX; not imported: this module
# stays standard library only), with the launcher's defaults.
ENV_PREFIX = "TTS_LAUNCHER_"


def launcher_env(name: str, default: str) -> str:
    """The launcher's setting ``name`` as its variable gives it, or the launcher's default."""
    return os.environ.get(ENV_PREFIX + name.upper(), default)


def models(repository: Path) -> list[str]:
    """The models of a repository: its folders that hold a config.pbtxt."""
    found = sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))
    if not found:
        raise SystemExit(f"healthcheck: no models in {repository} (no */config.pbtxt)")
    return found


def not_ready(url: str, names: list[str], timeout: float) -> list[str]:
    """Each model that does not answer 200 to its readiness request, with why."""
    problems = []
    for name in names:
        try:
            with urllib.request.urlopen(f"{url}/v2/models/{name}/ready", timeout=timeout) as r:
                if r.status != 200:
                    problems.append(f"{name}: HTTP {r.status}")
        except urllib.error.HTTPError as e:
            problems.append(f"{name}: HTTP {e.code}")
        except (urllib.error.URLError, OSError) as e:
            problems.append(f"{name}: {getattr(e, 'reason', e)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tts_launcher.healthcheck", description=__doc__)
    http = launcher_env("http_port", "8000")
    parser.add_argument("--url", default=f"http://127.0.0.1:{http}", help="Triton's HTTP endpoint")
    repository = launcher_env("model_repository", "model_repository")
    parser.add_argument("--repository", type=Path, default=Path(repository))
    parser.add_argument("--gateway-url", default=None, help="also the gateway's /ready")
    gateway = launcher_env("gateway_port", "8080")
    parser.add_argument(
        "--gateway",
        action="store_const",
        dest="gateway_url",
        const=f"http://127.0.0.1:{gateway}",
        help="also the gateway's /ready on the launcher's gateway port",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per request")
    args = parser.parse_args(argv)
    problems = not_ready(args.url.rstrip("/"), models(args.repository), args.timeout)
    if args.gateway_url:
        try:
            with urllib.request.urlopen(f"{args.gateway_url.rstrip('/')}/ready", timeout=3):
                pass
        except (urllib.error.URLError, OSError) as e:
            problems.append(f"gateway: {getattr(e, 'code', None) or getattr(e, 'reason', e)}")
    for problem in problems:
        print(f"healthcheck: not ready: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
