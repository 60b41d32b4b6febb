"""Ready when every model is: Triton's per-model readiness, for a container's health check.

    python -m tts_launcher.healthcheck [--url http://127.0.0.1:8000] [--repository DIR]
                                       [--gateway-url http://127.0.0.1:8080]

Asks ``GET /v2/models/<name>/ready`` for each model of the repository (every folder with a
config.pbtxt), not only the server's ``/v2/health/ready``: a server is up while one model
failed to load or its stub died. With ``--gateway-url``, the gateway's ``/ready`` too. Exit
status 0 when all answer 200; 1 otherwise, naming each model that is not ready. Standard
library only, so it runs wherever the server's Python does (docker/Dockerfile HEALTHCHECK,
the Kubernetes readiness probe in deploy/).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_REPOSITORY = os.environ.get("TTS_MODEL_REPOSITORY", "model_repository")


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
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="Triton's HTTP endpoint")
    parser.add_argument("--repository", type=Path, default=Path(DEFAULT_REPOSITORY))
    parser.add_argument("--gateway-url", default=None, help="also the gateway's /ready")
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
