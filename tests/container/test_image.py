"""The CPU image built and run as a user runs it, with podman: made from nothing but Debian's
packages (docker/base-image.sh) and the project's hashed wheels (python -m tts_tools.image
wheels), then every public port asked as its clients ask it, its health check, its user, a
drain on `podman stop`, a second start with no network at all, docker-compose.yml's cpu service
under podman-compose, and the cpu overlay's pod under `podman kube play`.

Skipped, with the reason, where no container engine is installed (make test-system-deps
installs one). docs/deployment.md says what this shows and what it cannot (HPA, NetworkPolicy,
PodDisruptionBudget: rendered and validated in tests/deployment/test_deploy.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2 as httpx
import numpy as np
import pytest
import yaml

from tests.support import container
from tests.support.container import IMAGE, engine, podman, ulimit_flags, wait_healthy
from tests.support.launcher import LIGHT_WARMUP
from tests.support.paths import ROOT
from tts_launcher.commands import StopBudget, free_ports

pytestmark = pytest.mark.slow
if container.missing():  # one line for the whole file, saying why
    pytest.skip(str(container.missing()), allow_module_level=True)

SPEECH = {"model": "tts-1", "voice": "alloy", "response_format": "wav"}
# The front door's warm-up as the launcher tests have it (tests/support/launcher.py): the
# containers this file runs itself start lighter; compose's and the pod's run as written.
LIGHT = f"--env=TTS_FRONT_WARMUP_REQUESTS={LIGHT_WARMUP}"
# The launcher's stop at its default drain, and the 10 s compose gives on top (stop_grace_period).
GRACE_S = StopBudget(30).total_s + 10


@pytest.fixture(scope="module")
def image() -> str:
    """tts-triton:cpu built from docker/Dockerfile's cpu target, offline from the wheels."""
    start = time.monotonic()
    subprocess.run(["bash", str(ROOT / "docker/base-image.sh")], check=True, timeout=900)
    based = time.monotonic()
    subprocess.run([sys.executable, "-m", "tts_tools.image", "wheels"], check=True, timeout=600)
    fetched = time.monotonic()
    podman("build", "--network", "host", *ulimit_flags(), "--format", "docker", "-f",
           "docker/Dockerfile", "--target", "cpu", "-t", IMAGE, ".", cwd=ROOT,
           timeout=1800)  # fmt: skip
    size = podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip()
    print(
        f"\nbase image {based - start:.0f} s, wheels {fetched - based:.0f} s, build "
        f"{time.monotonic() - fetched:.0f} s; {IMAGE} {int(size) / 1e9:.2f} GB"
    )
    return IMAGE


def speak(url: str, text: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json={**SPEECH, "input": text}, timeout=timeout)


def assert_wav(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text[:500]
    assert response.content[:4] == b"RIFF" and len(response.content) > 20_000


@pytest.fixture(scope="module")
def served(image):
    """The image run as `docker run` would, on this host's loopback: host network (the
    launcher's ports set by its own variables, which the health check reads too), a read-only
    root file system, its /dev/shm, the admin key from a mounted file."""
    names = ("http", "grpc", "metrics", "supervisor_metrics", "gateway", "wyoming")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    env = {f"TTS_LAUNCHER_{k.upper()}_PORT": str(v) for k, v in ports.items()}
    env["TTS_LAUNCHER_BIND"] = "127.0.0.1"
    name = f"tts-test-{secrets.token_hex(4)}"
    flags = [f"--env={k}={v}" for k, v in env.items()]
    try:
        podman("run", "-d", "--name", name, "--network", "host", *ulimit_flags(), "--read-only",
               "--tmpfs", "/tmp", "--tmpfs", "/home/tts", "--shm-size", "1g", *flags, LIGHT,
               "--env", f"TTS_ADMIN_KEY={secrets.token_hex(32)}", image)  # fmt: skip
        took = wait_healthy(name)
        print(f"\nhealthy {took:.0f} s after its start")
        yield name, ports
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def test_every_public_port_answers_its_clients(served):
    _, ports = served
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    text = np.array([[b"The container answers on every port."]], dtype=object)
    for module, port in ((grpcclient, ports["grpc"]), (httpclient, ports["http"])):
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        tensor = module.InferInput("text", [1, 1], "BYTES")
        tensor.set_data_from_numpy(text)
        audio = client.infer("tts", [tensor]).as_numpy("audio")
        assert audio.size > 20_000 and np.abs(audio).max() > 0.05, module.__name__
    # curl, as a user tries the gateway first
    wav = subprocess.run(
        ["curl", "-sS", "--fail", "-X", "POST", f"http://127.0.0.1:{ports['gateway']}/v1/audio/speech",
         "-H", "content-type: application/json",
         "-d", json.dumps({**SPEECH, "input": "Hello from curl."})],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert wav.returncode == 0 and wav.stdout[:4] == b"RIFF", wav.stderr
    # Home Assistant's client
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    async def wyoming() -> int:
        samples = 0
        async with AsyncTcpClient("127.0.0.1", ports["wyoming"]) as client:
            await client.write_event(Synthesize(text="Hello from Wyoming.").event())
            while (event := await asyncio.wait_for(client.read_event(), 60)) is not None:
                if event.type == "audio-chunk":
                    samples += len(event.payload or b"") // 2
                if event.type == "audio-stop":
                    break
        return samples

    assert asyncio.run(wyoming()) > 10_000


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_at_concurrency_4_has_no_errors(served, protocol):
    _, ports = served
    result = subprocess.run(
        [sys.executable, "-m", "perf_analyzer_configs.pa", "-m", "tts",
         "-u", f"127.0.0.1:{ports[protocol]}", "-i", protocol,
         "--input-data", str(ROOT / "perf_analyzer_configs/tts_short.json"),
         "--concurrency-range", "4", "--measurement-mode", "count_windows",
         "--measurement-request-count", "16", "--stability-percentage", "1000000"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Throughput:" in result.stdout and "error" not in result.stdout.lower()


def test_it_runs_as_its_own_user_with_a_read_only_root(served):
    name, _ = served
    users = podman("top", name, "user", "comm").stdout.split("\n")[1:]
    assert users and all(line.split()[0] == "tts" for line in users if line.strip()), users
    assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
    touched = podman("exec", name, "touch", "/opt/tts/x", check=False)
    assert touched.returncode != 0 and "Read-only file system" in touched.stderr


def test_podman_stop_drains_a_request_in_flight_and_exits_0(served):
    """The last test of the running container: SIGTERM (the image's STOPSIGNAL) with a
    paragraph being synthesized; it is served whole, and the container exits 0 within the
    launcher's stop budget."""
    name, ports = served
    url = f"http://127.0.0.1:{ports['gateway']}"
    paragraph = " ".join(["The container drains what it was asked before it stops."] * 6)
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(speak(url, paragraph, 120)))
    thread.start()
    time.sleep(1.0)  # admitted and being synthesized
    start = time.monotonic()
    podman("stop", "-t", str(int(GRACE_S)), name, timeout=GRACE_S + 30)
    took = time.monotonic() - start
    thread.join(120)
    code = podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
    log = container.logs(name)
    print(f"\nstopped in {took:.1f} s, exit {code}")
    assert code == "0" and took < StopBudget(30).total_s, log[-3000:]
    assert answers, "the request in flight got no answer"
    assert_wav(answers[0])
    assert len(answers[0].content) > 44 + 2 * 22050 * 10  # the whole paragraph, not a cut


def test_a_second_start_serves_with_no_network_at_all(image):
    """Nothing is downloaded when a container starts: one with no network but its own
    loopback becomes healthy and speaks (asked from inside, where the health check asks)."""
    name = f"tts-test-{secrets.token_hex(4)}"
    try:
        podman("run", "-d", "--name", name, "--network", "none", *ulimit_flags(), "--read-only",
               "--tmpfs", "/tmp", "--tmpfs", "/home/tts", "--shm-size", "1g", LIGHT,
               image)  # fmt: skip
        wait_healthy(name)
        probe = (
            "import json, urllib.request; r = urllib.request.urlopen(urllib.request.Request("
            "'http://127.0.0.1:8080/v1/audio/speech', data=json.dumps({'model': 'tts-1', "
            "'voice': 'alloy', 'input': 'Offline.', 'response_format': 'wav'}).encode(), "
            "headers={'content-type': 'application/json'}), timeout=60); "
            "body = r.read(); print(r.status, body[:4].decode(), len(body))"
        )
        status, magic, size = podman("exec", name, "python", "-c", probe).stdout.split()
        assert (status, magic) == ("200", "RIFF") and int(size) > 10_000
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


COMPOSE_PORTS = (8080, 10200, 8000, 8001, 8002, 8003)  # docker-compose.yml's, on 127.0.0.1


def ports_taken(ports) -> list[int]:
    import socket

    taken = []
    for port in ports:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    return taken


def test_compose_runs_the_cpu_service(image, tmp_path):
    """docker-compose.yml as a user runs it (its README lines), with Debian's podman-compose:
    the cpu service's published ports, its secret as the admin key, read-only, healthy."""
    taken = ports_taken(COMPOSE_PORTS)
    assert not taken, f"docker-compose.yml publishes {taken} on 127.0.0.1, taken here: stop it"
    shutil.copy(ROOT / "docker-compose.yml", tmp_path)
    key = secrets.token_hex(32)
    (tmp_path / ".secrets").mkdir(mode=0o700)
    (tmp_path / ".secrets/tts_admin_key").write_text(key + "\n")
    env = container.containers_conf(tmp_path / "containers.conf")
    compose = ["podman-compose", "-p", f"ttstest{secrets.token_hex(3)}"]
    up = subprocess.run([*compose, "up", "-d", "--no-build", "tts-cpu"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)  # fmt: skip
    names = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={compose[2]}",
         "--format", "{{.Names}}"], capture_output=True, text=True, env=env,
    ).stdout.split()  # fmt: skip
    try:
        assert up.returncode == 0 and names, up.stdout[-3000:] + up.stderr[-3000:]
        (name,) = names
        wait_healthy(name)
        assert_wav(speak("http://127.0.0.1:8080", "Hello from compose."))
        admin = "http://127.0.0.1:8000/v2/repository/index"
        assert httpx.post(admin, timeout=10).status_code == 403
        assert httpx.post(admin, headers={"tts-admin-key": key}, timeout=10).status_code == 200
        assert (
            podman("inspect", name, "--format", "{{.HostConfig.ReadonlyRootfs}}").stdout.strip()
            == "true"
        )
    finally:
        down = subprocess.run([*compose, "down"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=GRACE_S + 60)  # fmt: skip
        for name in names:
            podman("rm", "-f", "-t", "0", name, check=False)
    assert not ports_taken(COMPOSE_PORTS), down.stdout[-2000:]


def pod_manifest(tmp_path: Path, key: str, ports: dict[str, int]) -> tuple[Path, Path, Path]:
    """The cpu overlay rendered (kubectl kustomize), its Deployment as `podman kube play`
    (podman 4.3) can run it on one host, and a Secret with the admin key. What is changed, each
    where podman differs from a cluster: one replica; the image is the local one
    (imagePullPolicy IfNotPresent, no registry); each container port published on 127.0.0.1
    (hostPort: a Service's job in a cluster); the memory-backed /dev/shm emptyDir a host tmpfs
    folder anyone may write (podman 4.3 makes emptyDir a root-owned disk volume, where a
    cluster's is writable by the pod's user); the Secret volume `optional: false` spelled out
    (podman 4.3 crashes on it unset: podman issue 16636). Everything else is the overlay's."""
    rendered = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy/overlays/cpu")],
                              check=True, capture_output=True, text=True).stdout  # fmt: skip
    (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    deployment["spec"]["replicas"] = 1
    pod = deployment["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    assert server["image"].startswith("tts-triton:"), server["image"]
    server["image"] = IMAGE
    server["imagePullPolicy"] = "IfNotPresent"
    for port in server["ports"]:
        port["hostIP"], port["hostPort"] = "127.0.0.1", ports[port["name"]]
    shm = Path("/dev/shm") / f"tts-test-{secrets.token_hex(4)}"
    shm.mkdir()
    shm.chmod(0o1777)
    for volume in pod["volumes"]:
        if volume.get("emptyDir", {}).get("medium") == "Memory":
            volume.pop("emptyDir")
            volume["hostPath"] = {"path": str(shm), "type": "Directory"}
        if "secret" in volume:
            volume["secret"]["optional"] = False
            secret_name = volume["secret"]["secretName"]
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": secret_name},
              "data": {"key": base64.b64encode(key.encode()).decode()}}  # fmt: skip
    (tmp_path / "secret.yaml").write_text(yaml.safe_dump(secret))
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    return tmp_path / "secret.yaml", tmp_path / "deployment.yaml", shm


def test_kube_play_runs_the_cpu_overlays_pod(image, tmp_path):
    """The pod of deploy/overlays/cpu: its container starts as its securityContext says, its
    probes pass (the readiness command, the liveness and startup GET /live), the Secret is
    the admin key, and its ports answer."""
    names = ("gateway", "wyoming", "http", "grpc", "metrics", "supervisor")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    key = secrets.token_hex(32)
    secret, deployment, shm = pod_manifest(tmp_path, key, ports)
    env = container.containers_conf(tmp_path / "containers.conf")
    kube = ["podman", "kube", "play"]
    try:
        for manifest in (secret, deployment):
            played = subprocess.run([*kube, str(manifest)], env=env, capture_output=True,
                                    text=True, timeout=300)  # fmt: skip
            assert played.returncode == 0, played.stdout[-3000:] + played.stderr[-3000:]
        spec = yaml.safe_load(deployment.read_text())["spec"]["template"]["spec"]
        (server,) = spec["containers"]
        name = (
            f"{yaml.safe_load(deployment.read_text())['metadata']['name']}-pod-0-{server['name']}"
        )
        # The startup and liveness probes: the supervisor's /live, as the kubelet asks it.
        path = server["livenessProbe"]["httpGet"]["path"]
        live = f"http://127.0.0.1:{ports['supervisor']}{path}"
        startup = server["startupProbe"]
        start_budget = startup["periodSeconds"] * startup["failureThreshold"]
        begun = time.monotonic()
        started = ready = None
        while time.monotonic() - begun < 300:
            try:  # the startup probe may fail for its budget; once passed, liveness may not
                alive = httpx.get(live, timeout=5).status_code == 200
            except httpx.HTTPError:
                alive = False
            if started is None and alive:
                started = time.monotonic() - begun
            assert alive or (started is None and time.monotonic() - begun < start_budget), (
                f"{live} failed (startup passed after {started} s)\n{container.logs(name)[-3000:]}"
            )
            probe = podman("exec", name, *server["readinessProbe"]["exec"]["command"],
                           check=False, timeout=30)  # fmt: skip
            if probe.returncode == 0:
                ready = time.monotonic() - begun
                break
            time.sleep(3)
        print(f"\npod: live after {started} s, ready after {ready} s")
        assert ready, f"readiness never passed: {probe.stderr}\n{container.logs(name)[-3000:]}"
        assert httpx.get(live, timeout=5).status_code == 200
        assert podman("exec", name, "id", "-u").stdout.strip() == str(
            spec["securityContext"]["runAsUser"]
        )
        assert_wav(speak(f"http://127.0.0.1:{ports['gateway']}", "Hello from the pod."))
        # The Secret's key, as the runtime mounts it: decoded in a cluster; podman 4.3 mounts
        # `data` as written, still base64 (it ignores stringData), so either is the Secret's.
        (volume,) = [v for v in spec["volumes"] if "secret" in v]
        (mount,) = [m for m in server["volumeMounts"] if m["name"] == volume["name"]]
        path = f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
        mounted = podman("exec", name, "cat", path).stdout.strip()
        assert mounted in (key, base64.b64encode(key.encode()).decode()), mounted
        admin = f"http://127.0.0.1:{ports['http']}/v2/repository/index"
        assert httpx.post(admin, timeout=10).status_code == 403
        assert httpx.post(admin, headers={"tts-admin-key": mounted}, timeout=10).status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=10)
        assert metrics.status_code == 200 and "nv_inference_count" in metrics.text
    finally:
        subprocess.run([*kube, "--down", str(deployment)], env=env, capture_output=True,
                       timeout=GRACE_S + 60)  # fmt: skip
        subprocess.run([*engine(), "secret", "rm", "tts-admin-key"], capture_output=True)
        shutil.rmtree(shm, ignore_errors=True)
