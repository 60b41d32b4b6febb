"""tts_launcher.children's stop: the edge's ports first (SIGQUIT, nginx's graceful stop), the
gateway's drain, the front door's, then tritonserver; and an edge that does not finish by
itself is killed at its limit. Real child processes that write down which signal came when
(the launcher end to end: tests/reliability/test_drain.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

from tts_launcher import children
from tts_launcher.commands import StopBudget
from tts_launcher.restarts import RestartedChild, RestartPolicy

# A child that appends "<name> <signal>" to a file on SIGTERM or SIGQUIT, then exits 0 (or,
# with IGNORE, stays).
CHILD = """
import signal, sys, time
name, log, ignore = sys.argv[1], sys.argv[2], sys.argv[3] == "IGNORE"
def on(signum, frame):
    with open(log, "a") as f:
        f.write(f"{name} {signal.Signals(signum).name}\\n")
    if not ignore:
        sys.exit(0)
signal.signal(signal.SIGTERM, on)
signal.signal(signal.SIGQUIT, on)
open(log + "." + name, "w").close()
while True:
    time.sleep(0.05)
"""


SENT: list[str] = []  # "<name> <signal>" in the order the launcher sent them


class Child(subprocess.Popen):
    def send_signal(self, sig) -> None:
        SENT.append(f"{self.args[3]} {children.signal.Signals(sig).name}")
        super().send_signal(sig)


def start(name: str, log, ignore: bool = False) -> subprocess.Popen:
    process = Child(
        [sys.executable, "-c", CHILD, name, str(log), "IGNORE" if ignore else "-"],
        start_new_session=True,  # the edge is killed by process group
    )
    until = time.monotonic() + 10
    while not (log.parent / f"{log.name}.{name}").exists() and time.monotonic() < until:
        time.sleep(0.02)
    return process


def kept(name: str, log) -> RestartedChild:
    return RestartedChild(name, lambda: start(name, log), RestartPolicy(), lambda line: None)


def test_a_stop_goes_edge_gateway_front_door_tritonserver(tmp_path):
    log = tmp_path / "signals"
    edge, gateway, front = kept("edge", log), kept("gateway", log), kept("front", log)
    triton = start("triton", log)
    said: list[str] = []
    launch = SimpleNamespace(
        front=front,
        gateway=gateway,
        edges=[edge],
        drained=threading.Event(),
        say=said.append,
        kept=[edge, gateway, front],
    )
    SENT.clear()
    assert children._stop_in_order(triton, None, launch, StopBudget(5)) == 0
    order = ["edge SIGQUIT", "gateway SIGTERM", "front SIGTERM", "triton SIGTERM"]
    assert SENT == order
    assert sorted(log.read_text().splitlines()) == sorted(order)  # each got its own
    assert said == ["launcher: stopping tritonserver"]
    assert all(p.poll() is not None for p in (edge.process, gateway.process, front.process))


def test_an_edge_still_sending_is_waited_for_then_killed_at_its_limit(tmp_path):
    log = tmp_path / "signals"
    edge = start("edge", log, ignore=True)
    edge.send_signal(children.signal.SIGQUIT)
    said: list[str] = []
    start_s = time.monotonic()
    children._finish_edge(edge, start_s + 1.5, said.append)
    assert edge.returncode == -9 and 1.4 < time.monotonic() - start_s < 5
    assert said and said[0].startswith("launcher: the edge is still sending to clients")
    polite = start("edge2", log)
    polite.send_signal(children.signal.SIGQUIT)
    said.clear()
    children._finish_edge(polite, time.monotonic() + 10, said.append)
    assert polite.returncode == 0 and said == []  # it finished by itself: nothing said


# A process that answers Triton's readiness probe on a free port, and prints the port.
READY_SERVER = """
from http.server import BaseHTTPRequestHandler, HTTPServer
class Ready(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = HTTPServer(("127.0.0.1", 0), Ready)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_a_ready_answer_from_another_process_on_the_port_is_not_tritonservers(tmp_path):
    """Two launchers can pick the same free inner port: the one whose tritonserver is still
    loading saw the other's answer ready, and its admin-key check then failed closed. An
    answer counts only from the process the launcher started (or its children)."""
    server = subprocess.Popen([sys.executable, "-c", READY_SERVER], stdout=subprocess.PIPE)
    loading = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        port = int(server.stdout.readline())
        ready, other = children._readiness(port, loading.pid)
        assert not ready and other.endswith(f"(pid {server.pid})"), other
        assert children._readiness(port, server.pid) == (True, "")
        server.kill()
        server.wait()
        assert children._readiness(port, loading.pid) == (False, "")  # nothing answers
    finally:
        for p in (server, loading):
            p.kill()
            p.wait()
