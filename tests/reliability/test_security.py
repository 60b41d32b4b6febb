"""The admin surface is closed by default: refused without the key, allowed with it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.paths import ROOT
from tts_front.security import ADMIN_HEADER, admin_key
from tts_launcher.admin_key import DEFAULT_BIND
from tts_launcher.commands import server_command
from tts_launcher.environment import KEY_ENV, KEY_PLACEHOLDER, server_env
from tts_triton.probes import python_models, stubs_by_model

NOBODY = 65534
as_another_user = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running a command as another user needs root and setpriv (util-linux)",
)


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    """``argv`` run as the unprivileged user nobody: any local account."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        timeout=30,
    )


def http(server, method: str, path: str, body: dict | None = None, headers=None) -> int:
    request = urllib.request.Request(
        f"http://localhost:{server.http_port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers=headers or {},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


ADMIN_CALLS = [
    ("POST", "/v2/logging", {"log_verbose_level": 1000}),  # turn logs into a flood
    ("POST", "/v2/logging", {"log_error": False}),  # or silence them
    ("POST", "/v2/repository/index", {}),
    ("POST", "/v2/repository/models/tts/unload", {}),
    ("GET", "/v2/systemsharedmemory/status", None),
    (
        "POST",
        "/v2/systemsharedmemory/region/x/register",
        {"key": "/x", "offset": 0, "byte_size": 8},
    ),
    ("GET", "/v2/trace/setting", None),
]


@pytest.mark.parametrize("method, path, body", ADMIN_CALLS)
def test_admin_http_apis_are_refused_without_the_key(server, method, path, body):
    assert http(server, method, path, body) in (401, 403)
    wrong = {ADMIN_HEADER: "guess"}
    assert http(server, method, path, body, wrong) in (401, 403)


def test_admin_apis_work_with_the_key_and_open_ones_without(server):
    key = server.admin_headers
    assert http(server, "GET", "/v2/logging", None, key) == 200
    assert http(server, "GET", "/v2/systemsharedmemory/status", None, key) == 200
    # Open by default: read-only, and perf_analyzer needs statistics (docs/operations.md, Security).
    open_paths = ("/v2/models/tts/stats", "/v2/models/tts/config")
    for path in ("/v2/health/ready", "/v2/models/tts", *open_paths):
        assert http(server, "GET", path) == 200, path


def test_admin_grpc_protocols_are_refused_without_the_key(server):
    client = grpcclient.InferenceServerClient(f"localhost:{server.grpc_port}")
    for call in (
        lambda **kw: client.get_model_repository_index(**kw),
        lambda **kw: client.get_trace_settings(**kw),
        lambda **kw: client.update_log_settings({"log_verbose_level": 1000}, **kw),
        lambda **kw: client.get_system_shared_memory_status(**kw),
    ):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.PERMISSION_DENIED")
        call(headers=server.admin_headers)  # allowed with the key
    assert client.is_model_ready("tts")  # health stays open


def test_binds_are_loopback_by_default(server):
    command = server.command
    for flag in ("--http-address", "--grpc-address", "--metrics-address"):
        assert f"{flag}={DEFAULT_BIND}" in command
    # A non-loopback address of this machine does not reach the server.
    outside = None
    try:  # the address of the interface a packet to elsewhere would leave from (none is sent)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            outside = probe.getsockname()[0]
    except OSError:
        pass
    if not outside or outside.startswith("127."):
        pytest.skip("this machine has no non-loopback address to try")
    with pytest.raises(OSError), socket.create_connection((outside, server.http_port), 2):
        pass


def test_without_a_configured_key_nobody_has_it(monkeypatch, tmp_path):
    monkeypatch.delenv("TTS_ADMIN_KEY", raising=False)
    monkeypatch.delenv("TTS_ADMIN_KEY_FILE", raising=False)
    first, configured = admin_key()
    assert not configured and first != admin_key()[0] and len(first) >= 32
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    monkeypatch.setenv("TTS_ADMIN_KEY_FILE", str(key_file))
    assert admin_key() == ("s3cret", True)
    command = " ".join(server_command(tmp_path))
    assert "s3cret" not in command and "shared-memory" in command
    assert f"{ADMIN_HEADER}={KEY_PLACEHOLDER}" in command
    env = server_env(key="s3cret", cache_dir=ROOT / ".cache" / "triton")
    assert env[KEY_ENV] == "s3cret" and Path(env["LD_PRELOAD"]).exists()
    closed = " ".join(server_command(tmp_path, restricted="logging,statistics"))
    assert "--http-restricted-api=logging,statistics:" in closed


@as_another_user
def test_another_local_user_cannot_get_the_key_or_load_code(server):
    # As nobody, the key was read from /proc/PID/cmdline and a model loaded
    # with a file override ran code as root.
    pid = server.process.pid
    seen = as_nobody("cat", f"/proc/{pid}/cmdline")
    assert seen.returncode == 0, seen.stderr
    assert server.admin_key.encode() not in seen.stdout
    assert KEY_PLACEHOLDER.encode() in seen.stdout
    assert as_nobody("cat", f"/proc/{pid}/environ").returncode != 0
    stubs = set().union(*stubs_by_model(pid, python_models(server.model_repository)).values())
    for stub in stubs:  # the stubs inherit neither the key nor the preloaded library
        environ = Path(f"/proc/{stub}/environ").read_bytes()
        assert server.admin_key.encode() not in environ and b"LD_PRELOAD" not in environ
    # What nobody can see opens nothing: the load with a file override is refused.
    code = base64.b64encode(b"import os\nos.system('id > /tmp/pwned')\n").decode()
    body = {"parameters": {"config": "{}", "file:1/model.py": code}}
    for header in (KEY_PLACEHOLDER, ""):
        status = http(
            server, "POST", "/v2/repository/models/pwn/load", body, {ADMIN_HEADER: header}
        )
        assert status in (401, 403), status


def test_shared_memory_regions_are_the_servers_own(server):
    regions: dict[int, str] = {}
    stubs_by_model(server.process.pid, python_models(server.model_repository), regions)
    assert regions
    for region in regions.values():
        mode = os.stat(f"/dev/shm/{region}").st_mode & 0o777
        assert mode == 0o600, (region, oct(mode))


@as_another_user
def test_another_local_user_cannot_read_a_region(server):
    regions: dict[int, str] = {}
    stubs_by_model(server.process.pid, python_models(server.model_repository), regions)
    for region in regions.values():
        assert as_nobody("cat", f"/dev/shm/{region}").returncode != 0, region
