"""The launcher's choice of tritonserver, and the container entrypoint that calls it."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
from pathlib import Path

import pytest

from tts_launcher import commands, environment


def fake_triton_home(tmp_path: Path) -> Path:
    home = tmp_path / "tritonserver"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "tritonserver").write_text("#!/bin/sh\n")
    (home / "backends" / "python").mkdir(parents=True)
    return home


def test_an_installed_triton_is_used_with_its_own_backends_and_libraries(tmp_path, monkeypatch):
    home = fake_triton_home(tmp_path)
    monkeypatch.setenv(environment.TRITON_HOME_ENV, str(home))
    assert environment.tritonserver_binary() == home / "bin" / "tritonserver"
    assert environment.prepare_backends(tmp_path / "cache") == home / "backends"
    assert not (tmp_path / "cache").exists()  # nothing copied from the wheel
    env = environment.server_env(base={"LD_LIBRARY_PATH": "/x"})
    assert "nvidia_pytriton.libs" not in env["LD_LIBRARY_PATH"]
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[-1] == "/x"


@pytest.mark.parametrize(
    ("libdir", "listed"),
    [("/usr/lib/x86_64-linux-gnu", False), ("/usr/lib", False), ("/opt/py/lib", True)],
)
def test_only_a_python_outside_the_system_folders_puts_its_libraries_first(
    libdir, listed, monkeypatch
):
    """Ubuntu's Python (the NGC image's) has LIBDIR /usr/lib/x86_64-linux-gnu: first on the
    path, that folder's older cuDNN came before torch's own."""
    real = environment.sysconfig.get_config_var
    monkeypatch.setattr(
        environment.sysconfig,
        "get_config_var",
        lambda name: libdir if name == "LIBDIR" else real(name),
    )
    folders = environment.server_env(base={})["LD_LIBRARY_PATH"].split(os.pathsep)
    assert (folders[0] == libdir) if listed else libdir not in folders


def test_without_it_the_wheels_tritonserver_runs(monkeypatch):
    monkeypatch.delenv(environment.TRITON_HOME_ENV, raising=False)
    assert environment.tritonserver_binary() == environment.pytriton_dir() / "bin/tritonserver"
    assert "nvidia_pytriton.libs" in environment.server_env(base={})["LD_LIBRARY_PATH"]


def test_a_home_that_is_not_triton_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="has no bin/tritonserver: not a Triton installation"):
        environment.triton_home({environment.TRITON_HOME_ENV: str(tmp_path)})


def time_wait_port() -> int:
    """A port whose server closed a connection first (as a stopping server does): it holds
    the port in TIME_WAIT for a minute, with nothing listening. The server sets SO_REUSEADDR
    as aiohttp, gRPC and uvicorn do (Linux keeps that flag on the TIME_WAIT socket)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: TIME_WAIT is on the server's port
        client.recv(1)
        client.close()
    return port


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not():
    port = time_wait_port()
    with socket.socket() as plain:  # what the launcher checked before: "Address already in use"
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert commands.taken_ports("127.0.0.1", [(port, "--http-port")]) == []
    with socket.socket() as listening:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(("127.0.0.1", port))
        listening.listen()
        [message] = commands.taken_ports("127.0.0.1", [(port, "--http-port")])
    assert f"port {port} on 127.0.0.1 is not free" in message
    assert "--http-port" in message


def test_a_port_held_by_another_program_names_it_not_a_launcher(tmp_path):
    """wyoming-piper also listens on 10200: a launcher running elsewhere was blamed for it
    (its pid named, the port's holder not). Every taken port is named at once."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, time\n"
         "ss = [socket.socket() for _ in range(2)]\n"
         "for s in ss: s.bind(('127.0.0.1', 0)); s.listen()\n"
         "print(*(s.getsockname()[1] for s in ss), flush=True); time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first, second = map(int, holder.stdout.readline().split())
        lines = commands.taken_ports(
            "127.0.0.1",
            [(first, "--wyoming-port / WYOMING_PORT"), (0, "-"), (second, "--http-port")],
            launchers=[1 << 22],  # a launcher that holds neither
        )
    finally:
        holder.kill()
        holder.wait()
    assert len(lines) == 2, lines
    assert f"port {first} on 127.0.0.1 is not free: python" in lines[0], lines
    assert f"(pid {holder.pid}) listens on it" in lines[0] and "WYOMING_PORT" in lines[0]
    assert "another launcher" not in " ".join(lines)
    assert f"port {second}" in lines[1] and "--http-port" in lines[1]


def test_a_second_launcher_names_the_first_not_the_port_it_happened_to_hit(tmp_path):
    """Two `make serve` at once: the first holds the supervisor's port (it binds it first);
    the second must say another launcher runs, not only 'choose another
    SUPERVISOR_METRICS_PORT'."""
    import subprocess
    import sys

    from tests.support.paths import ROOT

    first = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, sys, time\n"
         "from pathlib import Path\n"
         "from export.serving import serving\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
         "with serving(Path(sys.argv[1])):\n"
         "    print(s.getsockname()[1], flush=True); time.sleep(60)\n",
         str(ROOT / "model_repository")],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        port = int(first.stdout.readline())
        free = [str(commands.free_port()) for _ in range(4)]
        second = subprocess.run(
            [sys.executable, "-m", "tts_launcher", f"--supervisor-metrics-port={port}",
             f"--http-port={free[0]}", f"--grpc-port={free[1]}", f"--metrics-port={free[2]}",
             f"--gateway-port={free[3]}", "--wyoming-port=0"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2, second.stderr
    assert f"port {port} on 127.0.0.1 is not free" in second.stderr
    # Among the launchers it names (make test runs others beside this one).
    named = re.search(
        r"another launcher \(`make serve`, pid ([0-9, ]+)\) is running", second.stderr
    )
    assert named and str(first.pid) in named.group(1).split(", "), second.stderr


def test_the_gateway_is_given_the_repositorys_voices(exported_repository, tmp_path):
    from tts_launcher.repository import gateway_voices, repository_voices

    version = tmp_path / "acoustic" / "1"
    assert repository_voices(tmp_path) == []  # not exported yet: the gateway's defaults
    version.mkdir(parents=True)
    (version / "voice.json").write_text('{"dataset": "joe"}')
    assert repository_voices(tmp_path) == ["joe"]
    (version / "voices.json").write_text('{"voices": ["joe", "joe_slow"]}')
    assert repository_voices(tmp_path) == ["joe", "joe_slow"]
    # With each voice's language, when the phonemizer's voice configs are there.
    assert gateway_voices(tmp_path) == "joe,joe_slow"  # not yet: names alone
    phonemizer = tmp_path / "phonemizer" / "1"
    shutil.copytree(
        exported_repository / "phonemizer" / "1",
        phonemizer,
        ignore=shutil.ignore_patterns("voices*"),
    )
    (phonemizer / "voices.json").write_text('{"voices": ["joe", "joe_de"]}')
    (phonemizer / "voices" / "joe_de").mkdir(parents=True)
    german = json.loads((phonemizer / "voice.json").read_text()) | {"espeak": {"voice": "de"}}
    (phonemizer / "voices" / "joe_de" / "voice.json").write_text(json.dumps(german))
    (version / "voices.json").write_text('{"voices": ["joe", "joe_de"]}')
    assert gateway_voices(tmp_path) == "joe=en-us,joe_de=de"
    # A multi-speaker voice: once per speaker (ids where its config names none).
    german |= {"num_speakers": 3, "speaker_id_map": {"ann": 0, "bob": 2}}
    (phonemizer / "voices" / "joe_de" / "voice.json").write_text(json.dumps(german))
    assert gateway_voices(tmp_path) == "joe=en-us,joe_de:ann=de,joe_de:1=de,joe_de:bob=de"


def test_an_unreadable_admin_key_file_says_how_to_fix_it(tmp_path, monkeypatch):
    """Compose mounts a secret with the host file's owner and mode; 0600 of the host's user is
    unreadable to the image's uid 10001 (root reads anything, so the refusal is simulated)."""
    from tts_front import security

    key = tmp_path / "key"
    key.write_text("k")
    with pytest.raises(SystemExit, match="does not exist"):
        security.admin_key({security.ADMIN_KEY_FILE_ENV: str(tmp_path / "missing")})

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(security.Path, "read_text", refused)
    with pytest.raises(SystemExit, match="is not readable by uid .*chmod 0644"):
        security.admin_key({security.ADMIN_KEY_FILE_ENV: str(key)})


def test_the_front_doors_token_comes_from_a_variable_or_a_mounted_file(tmp_path):
    """The gpu overlay's gateway pods and GPU pods share it through a Secret's file."""
    from tts_front.security import FRONT_TOKEN_ENV, FRONT_TOKEN_FILE_ENV, secret_setting

    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    what = "the front door's token"
    assert secret_setting(FRONT_TOKEN_ENV, FRONT_TOKEN_FILE_ENV, what, {}) == ""
    assert secret_setting(FRONT_TOKEN_ENV, FRONT_TOKEN_FILE_ENV, what,
                          {FRONT_TOKEN_FILE_ENV: str(token)}) == "t0k3n"  # fmt: skip
    both = {FRONT_TOKEN_ENV: "direct", FRONT_TOKEN_FILE_ENV: str(token)}
    assert secret_setting(FRONT_TOKEN_ENV, FRONT_TOKEN_FILE_ENV, what, both) == "direct"
    token.write_text(" \n")
    with pytest.raises(SystemExit, match="is empty: put the front door's token in it"):
        secret_setting(
            FRONT_TOKEN_ENV, FRONT_TOKEN_FILE_ENV, what, {FRONT_TOKEN_FILE_ENV: str(token)}
        )


def _prepare_after(barrier, cache: Path, results) -> None:
    barrier.wait()  # all at once, as make test's workers start their servers
    try:
        results.put(str(environment.prepare_backends(cache)))
    except Exception as e:
        results.put(f"{type(e).__name__}: {e}")


@pytest.mark.slow
def test_servers_starting_at_once_share_one_complete_backend_folder(tmp_path):
    """make test's workers start servers at once on an empty cache: each must get a whole
    python backend (one copy failed with FileExistsError; a late one deleted a half copy)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    expected = environment.pytriton_dir() / "python_backend_stubs" / environment.PY_VERSION
    for round in range(3):
        cache = tmp_path / f"cache{round}"
        barrier, results = context.Barrier(8), context.Queue()
        workers = [
            context.Process(target=_prepare_after, args=(barrier, cache, results)) for _ in range(8)
        ]
        for w in workers:
            w.start()
        found = {results.get(timeout=60) for _ in workers}
        for w in workers:
            w.join(10)
        (folder,) = found  # one answer, the folder: no error
        stub = Path(folder) / "python" / "triton_python_backend_stub"
        assert stub.stat().st_size == (expected / stub.name).stat().st_size
        assert (Path(folder) / "python" / "libtriton_python.so").exists()
        # Nothing left aside (the lock file stays, for the next start).
        assert sorted(p.name for p in cache.iterdir()) == sorted(
            [Path(folder).name, f".{Path(folder).name}.lock"]
        )


IDLE_CLIENT = """
import asyncio, grpc
async def main():
    server = grpc.aio.server(options=[("grpc.max_connection_idle_ms", 300)])
    echo = grpc.unary_unary_rpc_method_handler(lambda r, c: r)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t", {"m": echo}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/t/m")
        await call(b"x")
        await asyncio.sleep(1.5)  # past the server's idle limit: it sends GOAWAY
        await call(b"y")
    await server.stop(0)
asyncio.run(main())
"""


def test_an_idle_connection_closed_by_the_server_is_not_logged_by_the_children():
    """The launcher's children (gateway, front door) log gRPC at errors only: an idle
    connection the front door closed wrote 'Got goaway ... connection idle' every minute."""
    import subprocess
    import sys

    loud = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    before = subprocess.run([sys.executable, "-c", IDLE_CLIENT], env=loud, capture_output=True)
    quiet = dict(loud)
    environment.quiet_grpc(quiet)
    after = subprocess.run([sys.executable, "-c", IDLE_CLIENT], env=quiet, capture_output=True)
    assert before.returncode == after.returncode == 0, after.stderr
    assert b"Got goaway" in before.stderr  # what it guards against, seen without it
    assert b"goaway" not in after.stderr.lower(), after.stderr
    chosen = {"GRPC_VERBOSITY": "DEBUG"}
    environment.quiet_grpc(chosen)
    assert chosen == {"GRPC_VERBOSITY": "DEBUG"}  # a level the user chose stays


def test_free_ports_are_distinct_and_avoid_the_ports_named():
    first = commands.free_ports(8)
    assert len(set(first)) == 8
    again = commands.free_ports(8, avoid=first)
    assert len(set(again)) == 8 and not set(again) & set(first)
    # Outside the range outgoing connections take their local ports from (one took the front
    # door's port between its choice and its bind).
    low, high = commands.ephemeral_range()
    assert not any(low <= p <= high for p in first + again), (first, again, low, high)


def test_the_port_pool_is_the_larger_stretch_outside_the_ephemeral_range(tmp_path):
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("32768\t60999\n")
    assert commands.ephemeral_range(setting) == (32768, 60999)
    assert commands.port_pool((32768, 60999)) == range(20000, 32768)
    assert commands.port_pool((20500, 50000)) == range(50001, 65536)
    assert commands.port_pool((20000, 65000)) == range(20000, 65536)  # none left: anywhere
    assert commands.ephemeral_range(tmp_path / "absent") == commands.DEFAULT_EPHEMERAL
    # A port in use is passed over.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert taken not in commands.free_ports(3, rng=TakenFirst(taken))


class TakenFirst(random.Random):
    """Offers ``taken`` before the pool's own ports."""

    def __init__(self, taken: int) -> None:
        super().__init__(0)
        self.taken = taken

    def sample(self, population, k, **_):
        return [self.taken, *[p for p in population if p != self.taken][: k - 1]]


def test_on_a_gpu_machine_triton_gets_a_cuda_pool_per_gpu_that_extra_arguments_override(
    tmp_path, monkeypatch
):
    """Triton's 64 MiB default pool made gpu-dlpack's stub copies fail under load (docs/gpu.md)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for node in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        (dev / node).touch()
    assert environment.gpu_ids(dev) == [0, 1]
    assert environment.gpu_args(dev) == [
        f"--cuda-memory-pool-byte-size=0:{2 << 30}",
        f"--cuda-memory-pool-byte-size=1:{2 << 30}",
    ]
    monkeypatch.setattr(commands, "has_gpu", lambda: True)
    monkeypatch.setattr(commands, "gpu_args", lambda: environment.gpu_args(dev))
    command = commands.server_command(
        tmp_path, 1, 2, 3, tmp_path, extra_args=["--cuda-memory-pool-byte-size=0:1"]
    )
    pools = [a for a in command if a.startswith("--cuda-memory-pool-byte-size")]
    assert pools[-1] == "--cuda-memory-pool-byte-size=0:1"  # after ours: Triton keeps the last
    assert "--allow-gpu-metrics=false" not in command
    monkeypatch.setattr(commands, "has_gpu", lambda: False)
    command = commands.server_command(tmp_path, 1, 2, 3, tmp_path)
    assert not any(a.startswith("--cuda-memory-pool") for a in command)


def test_the_backend_folder_can_be_read_by_other_users(tmp_path):
    """An image lays the backend out as root at build time and runs as its own user: the
    folder is not mkdtemp's 0700 (the image's first start failed on it)."""
    backends = environment.prepare_backends(tmp_path / "cache")
    assert backends.stat().st_mode & 0o755 == 0o755
