"""``python -m tts_gateway --triton-url grpc://127.0.0.1:8001 --port 8080`` (flags: --help)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from .app import create_app
from .settings import parse_args


def main(argv: list[str] | None = None) -> None:
    settings, log_level = parse_args(argv)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    print(
        f"tts_gateway: http://{settings.host}:{settings.port}/ -> {settings.triton_url}", flush=True
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # Each open connection costs little; admission control is ours (429), not uvicorn's 503.
        timeout_graceful_shutdown=30,
        access_log=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
