"""The keys the front door checks and carries: the admin key (where it comes from, the headers
that carry it), the launch's inner and edge keys, and the gateway's token. What the launcher
does with them besides (the probe that proves tritonserver got the admin key, the APIs it
guards) is tts_launcher.admin_key.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

ADMIN_HEADER = "tts-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # how Triton names such a header over gRPC
ADMIN_KEY_ENV = "TTS_ADMIN_KEY"
# Behind the front door, tritonserver's own ports refuse inference without this header, whose
# value is a secret made for each launch and handed only to the front door (in this variable
# of its environment) and the supervisor: nothing reaches the models around admission.
INNER_HEADER = "tts-inner-key"
INNER_KEY_ENV = "TTS_FRONT_INNER_KEY"
# The edge's key (tts_launcher/edge.py, tts_wire.EDGE_KEY_HEADER), generated per launch: the
# front door's environment and the gateway's (its setting edge_key).
EDGE_KEY_ENV = "TTS_FRONT_EDGE_KEY"
GATEWAY_EDGE_KEY_ENV = "TTS_GATEWAY_EDGE_KEY"
ADMIN_KEY_FILE_ENV = "TTS_ADMIN_KEY_FILE"
# A token the launcher gives the front door and the gateway: requests carrying it come from
# the gateway, which caps streams per caller itself (the front door sees one address for all
# its callers).
FRONT_TOKEN_ENV = "TTS_FRONT_TOKEN"
FRONT_TOKEN_FILE_ENV = "TTS_FRONT_TOKEN_FILE"  # or a file holding it (a mounted Secret)
GATEWAY_FRONT_TOKEN_ENV = "TTS_GATEWAY_FRONT_TOKEN"  # the gateway's setting front_token


def admin_key(environ: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """(key, configured): from $TTS_ADMIN_KEY or the file named by $TTS_ADMIN_KEY_FILE.

    With neither, a random key nobody is told: the admin APIs are then refused to everyone.
    """
    key = secret_setting(ADMIN_KEY_ENV, ADMIN_KEY_FILE_ENV, "the admin key", environ)
    return (key, True) if key else (secrets.token_urlsafe(32), False)


def secret_setting(
    name: str, file_name: str, what: str, environ: Mapping[str, str] | None = None
) -> str:
    """$name, else the content of the file $file_name names (a mounted secret), else "".
    A file that is named but unreadable, missing or empty stops the launcher, saying why."""
    env = os.environ if environ is None else environ
    if env.get(name):
        return env[name]
    if not env.get(file_name):
        return ""
    path = Path(env[file_name])
    try:
        value = path.read_text().strip()
    except PermissionError:
        # Compose mounts a secret file with its host owner and mode: 0600 of the host's
        # user is unreadable to the image's uid 10001 (it restarted in a loop, unexplained).
        raise SystemExit(
            f"{path} is not readable by uid {os.getuid()}: make the secret file readable "
            "to it (Compose keeps the host file's owner and mode: chmod 0644 the file "
            "inside a 0700 folder; Kubernetes: the Secret's defaultMode)"
        ) from None
    except FileNotFoundError:
        raise SystemExit(f"{path} does not exist: mount {what} there") from None
    if not value:
        raise SystemExit(f"{path} is empty: put {what} in it")
    return value


def admin_headers(key: str) -> dict[str, str]:
    """Headers carrying the admin key, for HTTP and gRPC alike (gRPC expects Triton's prefix)."""
    return {ADMIN_HEADER: key, f"{GRPC_HEADER_PREFIX}{ADMIN_HEADER}": key}


def inner_headers(key: str) -> dict[str, str]:
    """Headers carrying the launch's inner key (INNER_HEADER), for HTTP and gRPC alike."""
    return {INNER_HEADER: key, f"{GRPC_HEADER_PREFIX}{INNER_HEADER}": key} if key else {}
