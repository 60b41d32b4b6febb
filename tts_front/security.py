"""The admin key: where it comes from, the headers that carry it, the APIs it guards, and a
probe that proves tritonserver got it.
"""

from __future__ import annotations

import os
import secrets
import urllib.request
from collections.abc import Mapping
from pathlib import Path

ADMIN_HEADER = "tts-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # how Triton names such a header over gRPC
RESTRICTED = "model-repository,logging,trace,shared-memory"
ADMIN_KEY_ENV = "TTS_ADMIN_KEY"
# Behind the front door, tritonserver's own ports refuse inference without this header, whose
# value is a secret made for each launch and handed only to the front door (in this variable
# of its environment) and the supervisor: nothing reaches the models around admission.
INNER_HEADER = "tts-inner-key"
INNER_KEY_ENV = "TTS_FRONT_INNER_KEY"
# The edge's key (launcher/edge.py, tts_wire.EDGE_KEY_HEADER), generated per launch: the
# front door's environment and the gateway's (its setting edge_key).
EDGE_KEY_ENV = "TTS_FRONT_EDGE_KEY"
GATEWAY_EDGE_KEY_ENV = "TTS_GATEWAY_EDGE_KEY"
ADMIN_KEY_FILE_ENV = "TTS_ADMIN_KEY_FILE"
DEFAULT_BIND = "127.0.0.1"
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


# Shared-memory regions and files tritonserver creates are its user's alone (request text and
# audio pass through /dev/shm).
SERVER_UMASK = 0o077
KEY_FAILED = (
    "the admin key did not reach tritonserver (tts_launcher/server_shim.c was not loaded), so its "
    "key would be the placeholder any local user can read in /proc; stopped"
)

# A request per restricted API that needs the key and changes nothing.
KEY_PROBES = {
    "model-repository": ("POST", "/v2/repository/index"),
    "logging": ("GET", "/v2/logging"),
    "trace": ("GET", "/v2/trace/setting"),
    "shared-memory": ("GET", "/v2/systemsharedmemory/status"),
    "statistics": ("GET", "/v2/models/stats"),
}


def key_works(http_port: int, key: str, restricted: str = RESTRICTED) -> bool:
    """Whether ``key`` opens a restricted API. False means the shim did not hand tritonserver
    the key, so its key is the placeholder anyone can read: the caller must not go on."""
    for api in restricted.split(","):
        if api in KEY_PROBES:
            method, path = KEY_PROBES[api]
            request = urllib.request.Request(
                f"http://127.0.0.1:{http_port}{path}",
                data=b"{}" if method == "POST" else None,
                method=method,
                headers=admin_headers(key),
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status == 200
            except OSError:
                return False
    return True  # nothing restricted that a probe knows: nothing to check
