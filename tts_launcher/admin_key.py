"""What the launcher does with the admin key besides handing it on: the APIs it guards, the
mode of what tritonserver writes, and the probe that proves tritonserver got the key (the keys
and their headers are the front door's: tts_front.security).
"""

from __future__ import annotations

import urllib.request

from tts_front.security import admin_headers

RESTRICTED = "model-repository,logging,trace,shared-memory"
DEFAULT_BIND = "127.0.0.1"

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
