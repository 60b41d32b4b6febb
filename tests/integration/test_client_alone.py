"""The client as a user installs it: ``pip install ./client`` into a venv of its own,
which resolves the newest tritonclient (``make test`` builds ``.venv-client``). It runs
tests/client_alone/check.py against the test server: sync and async, gRPC and HTTP, streams,
a long text and a stream error."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.paths import ROOT

PYTHON = ROOT / ".venv-client" / "bin" / "python"


def test_the_client_alone_works_on_the_newest_tritonclient(server):
    if not PYTHON.exists():
        pytest.skip("no .venv-client: `make test` (or `make client-venv`) builds it")
    result = subprocess.run(
        [str(PYTHON), str(ROOT / "tests/client_alone/check.py"), server.grpc_url, server.http_url],
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",  # nothing of the repository on the path but what the venv installed
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    version = result.stdout.splitlines()[0].split()[-1]
    # The point is a tritonclient newer than the server environment's pin (2.51).
    assert tuple(int(p) for p in version.split(".")[:2]) > (2, 51), version
