"""The README's and docs/http-api.md's gateway examples, run as written: only the port is
substituted (8080 -> the test gateway's), `aplay` (no sound card here) becomes a byte count,
and the SDK example gets an article.txt to read."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import ROOT


def blocks(language: str, section: str | None = None) -> list[str]:
    """The ```language blocks of one README section, in order; without ``section``, of
    docs/http-api.md (the gateway's page, which the README points to)."""
    if section is None:
        text = (ROOT / "docs" / "http-api.md").read_text()
    else:
        readme = (ROOT / "README.md").read_text()
        text = readme.split(f"## {section}\n", 1)[1].split("\n## ")[0]
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def run_python(code: str, cwd, python: str = sys.executable) -> subprocess.CompletedProcess:
    """A README Python block in a fresh interpreter; its output and errors captured."""
    return subprocess.run(
        [python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_quickstart_runs_as_written(server, gateway, tmp_path):
    """The first screen of the README: its curl and its Python, ports substituted."""
    port = gateway.url.rsplit(":", 1)[1]
    make, curl = blocks("bash", "Quickstart")
    assert make.startswith("make system-deps serve")  # what CI's `make test` sets up too
    curl = curl.replace("localhost:8080", f"localhost:{port}")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", curl], cwd=tmp_path)
    assert result.returncode == 0
    assert (tmp_path / "hello.mp3").read_bytes()[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3")
    # Each Python block where the README says to run it: in a user's environment holding only
    # the README's `pip install` lines (.venv-client; the first block once asked for openai and
    # tts_client together, which no environment the README sets up had).
    sdk, client = blocks("python", "Quickstart")
    assert "tts_client" not in sdk and "openai" not in client
    sdk = sdk.replace("localhost:8080", f"localhost:{port}")
    client = client.replace("localhost:8001", f"localhost:{server.grpc_port}")
    for code in (sdk, client):
        result = run_python(code, tmp_path, python=user_python())
        assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "sdk.mp3").stat().st_size > 1000
    assert (tmp_path / "client.wav").read_bytes()[:4] == b"RIFF"


def user_python() -> str:
    python = ROOT / ".venv-client" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-client: `make test` (or `make client-venv`) builds it")
    return str(python)


def test_every_pip_install_line_is_what_the_user_environment_was_built_from():
    """The README's `pip install` lines are exactly the user environment's (Makefile
    client-venv), which the examples and tests/integration/test_client_alone.py run in: a line
    that cannot install (`pip install ./client` needed an unpublished tts-wire) fails there."""
    readme = (ROOT / "README.md").read_text()
    lines = {" ".join(m.split()) for m in re.findall(r"`pip install ([^`]+)`", readme)}
    assert lines == {"./client", "openai"}, lines
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(CLIENT_VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    assert "pip install -q --disable-pip-version-check ./client\n" in recipe
    assert "grep '^openai==' requirements.txt" in recipe
    python = user_python()
    freeze = subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True).stdout
    assert "tts-client" in freeze and "openai" in freeze and "tts-serving" not in freeze


def test_the_curl_examples_run_as_written(gateway, tmp_path):
    if not shutil.which("curl"):  # `make test` installs it (Makefile TEST_SYSTEM_PACKAGES)
        pytest.fail("needs curl: apt-get install curl")
    port = gateway.url.rsplit(":", 1)[1]
    script = blocks("bash")[0].replace("localhost:8080", f"localhost:{port}")
    script = re.sub(r"\| aplay [^#\n]*", "| wc -c > pcm.bytes ", script)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hello.mp3").read_bytes()[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3")
    pcm_bytes = int((tmp_path / "pcm.bytes").read_text())
    assert pcm_bytes > 2 * 24000 * 1.0  # over a second of 24 kHz 16-bit speech


def test_the_captioned_speech_example_runs_as_written(gateway, tmp_path):
    port = gateway.url.rsplit(":", 1)[1]
    (script,) = [b for b in blocks("bash") if "/dev/captioned_speech" in b]
    script = script.replace("localhost:8080", f"localhost:{port}")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    word = ast.literal_eval(result.stdout)  # the dict the example prints
    assert word["word"] == "$5.50" and word["end_time"] > word["start_time"] > 0


def test_the_sdk_example_runs_as_written(gateway, tmp_path):
    port = gateway.url.rsplit(":", 1)[1]
    code = blocks("python")[0].replace("localhost:8080", f"localhost:{port}")
    (tmp_path / "article.txt").write_text("An article. It has two sentences.")
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "hello.mp3").stat().st_size > 1000
    assert (tmp_path / "article.ogg").read_bytes()[:4] == b"OggS"


def test_the_python_examples_of_use_it_run_as_written(server, tmp_path):
    """The client library and plain tritonclient, as the README shows them."""
    for code in blocks("python", "Use it"):
        code = code.replace("localhost:8001", f"localhost:{server.grpc_port}")
        code += "\nprint('ran', flush=True)\n"
        result = run_python(code, tmp_path)
        assert result.returncode == 0 and "ran" in result.stdout, result.stderr[-2000:]
    assert (tmp_path / "hello.wav").read_bytes()[:4] == b"RIFF"


def test_the_from_pipers_server_example_runs_as_written(gateway, tmp_path):
    text = (ROOT / "docs" / "http-api.md").read_text().split("## From Piper's server\n", 1)[1]
    (script,) = re.findall(r"```bash\n(.*?)```", text, re.S)
    port = gateway.url.rsplit(":", 1)[1]
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script.replace("localhost:8080", f"localhost:{port}")],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "test.wav").read_bytes()[:4] == b"RIFF"
