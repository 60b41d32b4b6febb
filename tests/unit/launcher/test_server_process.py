"""How the launcher and ServerProcess start their children: with the parent-death signal, and
without a ``preexec_fn`` (which makes subprocess fork(): a forked child of a process whose
gRPC event engine runs aborted now and then before it could exec, "Epoll1Poller ...
encountered epoll_wait error: Bad file descriptor", which we took for a start-up abort of
Triton's)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import tritonclient.grpc as grpcclient

from tests.support.paths import REPOSITORY, ROOT
from tests.support.processes import ServerProcess
from tts_launcher.commands import free_port
from tts_launcher.stub_healing import dying_with_parent

PDEATHSIG = (
    "import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); print(s.value)"
)


class Spawned(ServerProcess):
    """ServerProcess's own spawn (its environment, the shim, the wrapper) of ``command``."""

    def __init__(self, tmp_path, command: list[str]) -> None:
        super().__init__(REPOSITORY, tmp_path / "server.log", cache_dir=ROOT / ".cache" / "triton")
        self.command = command


def test_children_get_sigterm_when_their_parent_dies():
    out = subprocess.run(
        dying_with_parent([sys.executable, "-c", PDEATHSIG]),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(int(signal.SIGTERM))


def test_a_child_started_beside_a_live_grpc_channel_gets_to_exec(tmp_path):
    # A channel whose event engine polls, as in the tests' processes and the launcher's.
    client = grpcclient.InferenceServerClient(f"localhost:{free_port()}")
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                client.is_server_live(client_timeout=0.05)
            except Exception:  # nothing listens there: the polling is the point
                pass

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    server = Spawned(tmp_path, ["true"])
    try:
        codes = []
        for _ in range(1000):  # with a preexec_fn about 2 in 100 aborted (SIGABRT)
            server._spawn()
            codes.append(server.process.wait())
    finally:
        stop.set()
        poller.join()
        client.close()
    assert codes.count(0) == len(codes), (codes.count(-signal.SIGABRT), server.log_tail())
