"""``python -m tts_front``: the front door on its own (the launcher starts it so)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from .door import Front
from .http_proxy import quiet_refusals
from .settings import MIB, FrontSettings, parse_args


async def serve(settings: FrontSettings) -> None:
    front = Front(settings)
    print(f"front: {await front.warm_up()}", flush=True)
    try:
        await front.start()
    except (OSError, RuntimeError) as e:  # a port taken: one line that names it (gRPC's
        # bind failure is a RuntimeError), not a traceback
        if isinstance(e, RuntimeError) and "bind" not in str(e):
            raise
        await front.stop()
        raise SystemExit(
            f"front: cannot listen on {settings.bind} (gRPC port {settings.grpc_port}, HTTP "
            f"port {settings.http_port}): {getattr(e, 'strerror', None) or e}"
        ) from None
    print(
        f"front: {', '.join(f'{k} on {settings.bind}:{v}' for k, v in front.ports.items())} -> "
        f"tritonserver (requests over {settings.max_request_bytes / MIB:g} MiB refused; "
        f"public models {', '.join(settings.public_models)}, admitted by cost within a "
        f"{settings.deadline_s:g} s deadline; {settings.max_connections} connections, "
        f"{settings.max_connections_per_client} per client)",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await front.drain()
    if front.stuck() and settings.notify_parent:
        # The launcher waits for our exit or this signal before it stops tritonserver.
        os.kill(os.getppid(), signal.SIGUSR1)
    await front.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_refusals(logging.getLogger("tts_front"))
    settings = parse_args(argv)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main(sys.argv[1:])
