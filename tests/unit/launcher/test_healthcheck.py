"""tts_launcher.healthcheck against a small HTTP server that answers like Triton: ready only
when every model of the repository is, each one that is not named (the real server:
tests/integration/test_healthcheck.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tts_launcher.healthcheck import main, models


@pytest.fixture
def triton():
    """A server whose ``ready`` set says which models answer 200 (the others 400, as Triton
    does for a model that failed to load); ``/ready`` (the gateway's) likewise."""
    ready: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            parts = self.path.strip("/").split("/")
            name = parts[2] if parts[:2] == ["v2", "models"] else "gateway"
            self.send_response(200 if name in ready else 400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", ready
    server.shutdown()


@pytest.fixture
def repository(tmp_path):
    for name in ("acoustic", "tts", "vocoder"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"')
    (tmp_path / "notes").mkdir()  # a folder without a config is no model
    return tmp_path


def test_the_models_are_the_folders_with_a_config(repository, tmp_path_factory):
    assert models(repository) == ["acoustic", "tts", "vocoder"]
    with pytest.raises(SystemExit, match="no models in"):
        models(tmp_path_factory.mktemp("empty"))


def test_ready_only_when_every_model_and_the_gateway_are(triton, repository, capsys):
    url, ready = triton
    args = ["--url", url, "--repository", str(repository)]
    ready |= {"acoustic", "tts"}
    assert main(args) == 1
    assert capsys.readouterr().err == "healthcheck: not ready: vocoder: HTTP 400\n"
    ready.add("vocoder")
    assert main(args) == 0
    assert main([*args, "--gateway-url", url]) == 1
    assert "gateway: 400" in capsys.readouterr().err
    ready.add("gateway")
    assert main([*args, "--gateway-url", url]) == 0


def test_a_server_that_is_not_there_is_not_ready(repository, capsys):
    from tts_launcher.commands import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["--url", url, "--repository", str(repository), "--timeout", "1"]) == 1
    assert capsys.readouterr().err.count("not ready") == 3


def test_its_defaults_are_the_launchers_variables(triton, repository, monkeypatch):
    """The image configures the launcher by its variables; a container started on other ports
    (TTS_LAUNCHER_HTTP_PORT=...) is checked on those, the gateway too (--gateway)."""
    from tts_launcher.settings import ENV_PREFIX, settings

    url, ready = triton
    port = url.rsplit(":", 1)[1]
    names = {s.env for s in settings()}
    for field in ("http_port", "gateway_port", "model_repository"):
        assert ENV_PREFIX + field.upper() in names  # the launcher reads the same names
    monkeypatch.setenv("TTS_LAUNCHER_HTTP_PORT", port)
    monkeypatch.setenv("TTS_LAUNCHER_GATEWAY_PORT", port)
    monkeypatch.setenv("TTS_LAUNCHER_MODEL_REPOSITORY", str(repository))
    ready |= {"acoustic", "tts", "vocoder"}
    assert main([]) == 0
    assert main(["--gateway"]) == 1
    ready.add("gateway")
    assert main(["--gateway"]) == 0
