"""The deployment files, checked as far as a machine without a Docker engine or a cluster can:
the Dockerfile linted (hadolint) and read (its stages, user, health check, entrypoint against
the launcher's own argument parser); docker/install.sh run with a recording python; the
image's locks pinned, hashed, in step with the project's pins and resolvable for the image's
Python and platform (pip, against the package index); compose's profiles; deploy/ rendered by
kubectl's kustomize, validated against the Kubernetes schemas (kubernetes-validate) and a
policy scan (checkov), and read for what the issue asks of it. What is not run here (an image
build, a cluster) is listed in docs/deployment.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.requirements import ALL, norm, pins
from tts_gateway.settings import GatewaySettings
from tts_tools.launcher.commands import (
    FRONT_TOKEN_FILE_ENV,
    GATEWAY_FRONT_TOKEN_ENV,
    STOP_BUDGET_S,
)
from tts_tools.launcher.liveness import LIVE_PATH
from tts_tools.launcher.stub_healing import SERVING_SINCE

DOCKERFILE = ROOT / "docker/Dockerfile"
DEPLOY_TOOLS = ROOT / ".venv-deploy" / "bin"
# (Named image-cpu and image-gpu, not cpu and gpu: a test id holding "gpu" is skipped as one
# that needs a GPU, tests/conftest.py.)
LOCKS = {name: ROOT / f"requirements/{name}.lock" for name in ("image-cpu", "image-gpu")}
KUBERNETES_VERSION = "1.30.0"  # the oldest release still in common support when this was written


def deploy_tool(name: str) -> str:
    path = DEPLOY_TOOLS / name
    if not path.exists():  # `make test` builds it (Makefile deploy-venv)
        pytest.fail(f"needs {path}: run make deploy-venv")
    return str(path)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_the_dockerfile_passes_hadolint():
    result = subprocess.run(
        [deploy_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_is_built_on_a_patched_triton_as_a_non_root_user():
    steps = instructions()
    base = next(a for i, a in steps if i == "ARG" and a.startswith("TRITON_IMAGE="))
    release = re.fullmatch(r"TRITON_IMAGE=nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3", base)
    # 26.04: the first release with the fixes of NVIDIA's bulletin 5828 (May 2026: HTTP
    # authentication bypasses CVE-2026-24206/24207, path traversals -24208/24209); 25.08 before
    # it had those of August 2025 (CVE-2025-23316) and not these.
    assert release and (int(release[1]), int(release[2])) >= (26, 4), base
    stages = [a.split(" AS ")[-1] for i, a in steps if i == "FROM" and " AS " in a]
    assert {"build-cpu", "build-gpu", "runtime", "cpu", "gpu"} <= set(stages)
    assert ("USER", "10001:10001") in steps
    (healthcheck,) = [a for i, a in steps if i == "HEALTHCHECK"]
    assert '"tts_tools.healthcheck"' in healthcheck  # per model, not /v2/health/ready
    for instruction, args in steps:  # everything copied from the context exists
        if instruction == "COPY" and "--from" not in args:
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source
    installs = [a for i, a in steps if i == "RUN" and "docker/install.sh" in a]
    assert len(installs) == 2 and all("--venv /opt/tts/venv" in a for a in installs)


def test_the_entrypoint_is_the_launcher_with_flags_it_takes():
    from tts_tools.server import parse_args

    steps = instructions()
    (entrypoint,) = [json.loads(a) for i, a in steps if i == "ENTRYPOINT"]
    # NGC's entrypoint (CUDA forward compatibility on older data-center drivers) runs it.
    nvidia, *entrypoint = entrypoint
    assert nvidia == "/opt/nvidia/nvidia_entrypoint.sh"
    assert entrypoint[:3] == ["python", "-m", "tts_tools.server"]
    commands = [json.loads(a) for i, a in steps if i == "CMD"]
    assert commands == [[], ["--model-config-name=gpu"]]  # the cpu and gpu stages, in order
    for command in commands:
        args, extra = parse_args(entrypoint[3:] + command)
        assert extra == command  # passed on to tritonserver
        assert args.bind == "0.0.0.0" and args.gateway_port == 8080
        assert str(args.model_repository) == "/opt/tts/app/model_repository"
    assert sorted(p.parts[-3] for p in ROOT.glob("model_repository/*/configs/gpu.pbtxt"))


@pytest.fixture
def recording_python(tmp_path):
    """A python3 that records every call and plays a venv's part (pip, sysconfig, export)."""
    log = tmp_path / "calls"
    site = tmp_path / "site"
    site.mkdir()
    fake = tmp_path / "python3"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "$(basename "$0") $*" >> {log}\n'
        'if [ "$1 $2" = "-m venv" ]; then\n'
        '  dir="${@: -1}"; mkdir -p "$dir/bin"; cp "$0" "$dir/bin/python"; exit 0\n'
        "fi\n"
        f'if [ "$1" = "-c" ]; then echo {site}; fi\n'
    )
    fake.chmod(0o755)
    return fake, log, site


@pytest.mark.parametrize(("profile", "lock"), [("cpu", "image-cpu"), ("gpu", "image-gpu"),
                                               ("gpu-host-torch", "image-cpu")])  # fmt: skip
def test_install_sh_installs_the_hashed_lock_then_exports(
    recording_python, tmp_path, profile, lock
):
    fake, log, site = recording_python
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["bash", str(ROOT / "docker/install.sh"), "--profile", profile, "--venv", str(venv),
         "--python", str(fake)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == f"python3 -m venv {venv}"
    (install,) = [c for c in calls if " install " in c]
    assert install.startswith("python -m pip install --no-cache-dir")
    for flag in ("--require-hashes", "--only-binary=:all:", "--no-deps"):
        assert flag in install
    assert install.endswith(f"-r {ROOT}/requirements/{lock}.lock")
    assert calls[-1] == "python -m export --repository model_repository"
    paths = (site / "tts_project.pth").read_text().split()
    assert paths == [str(ROOT), str(ROOT / "client"), str(ROOT / "wire")]


def test_install_sh_offline_and_refusals(recording_python, tmp_path):
    fake, log, _ = recording_python
    script = ["bash", str(ROOT / "docker/install.sh"), "--venv", str(tmp_path / "v"),
              "--python", str(fake)]  # fmt: skip
    subprocess.run([*script, "--wheels", "/w", "--no-export"], check=True, capture_output=True)
    calls = log.read_text().splitlines()
    assert "--no-index --find-links /w" in next(c for c in calls if " install " in c)
    assert not any("export" in c for c in calls)
    bad = subprocess.run([*script, "--profile", "tpu"], capture_output=True, text=True)
    assert bad.returncode == 2 and "cpu, gpu or gpu-host-torch" in bad.stderr


def lock_pins(path: Path) -> dict[str, str]:
    text = path.read_text()
    found = dict(re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+) \\$", text, re.M))
    # Every pin is followed by its hashes: pip installs it with --require-hashes.
    blocks = re.split(r"^(?=\S+==)", text, flags=re.M)[1:]
    assert len(blocks) == len(found) and all("--hash=sha256:" in b for b in blocks)
    return {norm(name.split("[")[0]): version for name, version in found.items()}


def test_the_locks_pin_the_projects_versions_and_one_torch():
    cpu, gpu = lock_pins(LOCKS["image-cpu"]), lock_pins(LOCKS["image-gpu"])
    assert "torch" not in cpu and gpu["torch"] == pins(ROOT / "requirements/torch.txt")["torch"]
    assert {k: gpu[k] for k in cpu} == cpu  # the gpu lock is the cpu lock plus torch's
    for name, version in cpu.items():  # the same versions as the server's own install
        if name in ALL:
            assert ALL[name] == version, (name, version, ALL[name])
    wanted = [norm(line.split("[")[0]) for line in (ROOT / "requirements/image.in").read_text()
              .splitlines() if line and not line.startswith("#")]  # fmt: skip
    assert set(wanted) <= cpu.keys()
    # No other file pins torch (the issue: three pins once disagreed).
    texts = [p for p in ROOT.glob("**/*") if p.suffix in {".txt", ".md", ".py", ".sh", ".yml"}
             and ".venv" not in p.parts and p.is_file()]  # fmt: skip
    others = {str(p.relative_to(ROOT)) for p in texts if re.search(r"torch==\d", p.read_text())}
    assert others <= {"requirements/torch.txt", "CHANGELOG.md"}, others


@pytest.mark.parametrize("profile", sorted(LOCKS))
def test_the_lock_resolves_for_the_images_python_and_platform(profile, tmp_path):
    """pip resolves the whole lock for CPython 3.12 on x86-64 glibc, wheels only, every hash
    and every dependency in the lock (it downloads metadata, not the wheels)."""
    from tts_tools.gpu_bundle import PLATFORMS  # the bundle downloads for the same ones

    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
               "--target", str(tmp_path / "t"), "--require-hashes", "-r", str(LOCKS[profile]),
               "--quiet", "--report", str(tmp_path / "report.json")]  # fmt: skip
    for platform in PLATFORMS:
        command += ["--platform", platform]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    resolved = {norm(item["metadata"]["name"]) for item in report["install"]}
    assert resolved == set(lock_pins(LOCKS[profile]))


def test_compose_has_a_cpu_and_a_gpu_profile_on_the_images_targets():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    stages = {a.split(" AS ")[-1] for i, a in instructions() if i == "FROM"}
    for profile in ("cpu", "gpu"):
        service = services[f"tts-{profile}"]
        assert service["profiles"] == [profile]
        assert service["build"]["target"] == profile and profile in stages
        assert all(p.startswith("127.0.0.1:") for p in service["ports"])
        assert service["environment"]["TTS_ADMIN_KEY_FILE"] == "/run/secrets/tts_admin_key"
        assert "volumes" not in service  # no source bind mount: the image holds it all
    assert "deploy" not in services["tts-cpu"]
    assert services["tts-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"]
    assert ".secrets/" in (ROOT / ".gitignore").read_text().split()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # `make test` installs one (Makefile test-system-deps)
        pytest.fail(
            "needs kubectl (its kustomize renders deploy/): apt-get install kubernetes-client"
        )
    out = tmp_path_factory.mktemp("deploy")
    files = {}
    for overlay in ("cpu", "gpu"):
        result = subprocess.run(
            [kubectl, "kustomize", str(ROOT / "deploy/overlays" / overlay)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        files[overlay] = out / f"{overlay}.yaml"
        files[overlay].write_text(result.stdout)
    return files


def documents(path: Path) -> dict[str, dict]:
    return {
        d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all(path.read_text())
    }


def test_the_manifests_validate_against_the_kubernetes_schemas(rendered, tmp_path):
    validate = [deploy_tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION]
    result = subprocess.run([*validate, *map(str, rendered.values())], capture_output=True)
    assert result.returncode == 0, result.stdout.decode()[-3000:]
    # The validator is no formality: a wrong type or an unknown field fails it.
    broken = rendered["cpu"].read_text().replace("replicas: 2", 'replicas: "two"', 1)
    (tmp_path / "broken.yaml").write_text(broken)
    assert subprocess.run(
        [*validate, str(tmp_path / "broken.yaml")], capture_output=True
    ).returncode
    unknown = rendered["cpu"].read_text().replace("revisionHistoryLimit:", "revisionHistory:", 1)
    (tmp_path / "unknown.yaml").write_text(unknown)
    assert subprocess.run(
        [*validate, str(tmp_path / "unknown.yaml")], capture_output=True
    ).returncode


def test_the_manifests_pass_the_policy_scan(rendered):
    command = [deploy_tool("checkov"), "--framework", "kubernetes", "--quiet", "--compact",
               "--skip-download"]  # fmt: skip
    for path in rendered.values():
        command += ["-f", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=rendered["cpu"].parent)
    assert result.returncode == 0, result.stdout[-3000:]
    # Every check skipped says why, in the manifest itself.
    skips = re.findall(r"checkov\.io/skip\d+: (.+)", rendered["cpu"].read_text())
    assert skips and all("=" in s and len(s.split("=", 1)[1]) > 10 for s in skips)


def test_the_manifests_do_what_the_issue_asks(rendered):
    from bench.autoscale import CPU, H100

    rule = yaml.safe_load((ROOT / "deploy/monitoring/prometheus-adapter-rules.yaml").read_text())
    metric = rule["rules"]["custom"][0]["name"]["as"]
    for overlay, curve in (("cpu", CPU), ("gpu", H100)):
        docs = documents(rendered[overlay])
        pod = docs["Deployment/tts"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == f"tts-triton:{overlay}"
        # Ready when every model is (per model), live on the server; never root.
        assert container["readinessProbe"]["exec"]["command"][:3] == [
            "python", "-m", "tts_tools.healthcheck"]  # fmt: skip
        assert container["livenessProbe"]["httpGet"]["path"] == LIVE_PATH
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"]
        assert container["securityContext"]["readOnlyRootFilesystem"]
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        # The admin key from a Secret, where the launcher reads it.
        env = {e["name"]: e["value"] for e in container["env"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert env["TTS_ADMIN_KEY_FILE"].startswith(mounts["admin-key"])
        volume = next(v for v in pod["volumes"] if v["name"] == "admin-key")
        assert volume["secret"]["secretName"] == "tts-admin-key"
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        assert (gpus == 1) if overlay == "gpu" else gpus is None
        # The autoscaler: Triton's queue time per request, at the target docs/scaling.md
        # derives (the simulation's own).
        hpa = docs["HorizontalPodAutoscaler/tts"]["spec"]
        (scale_on,) = hpa["metrics"]
        assert scale_on["pods"]["metric"]["name"] == metric
        target = scale_on["pods"]["target"]["averageValue"]
        assert int(target.rstrip("k")) * 1000 == round(curve.target_queue_s * 1e6)
        pdb = docs["PodDisruptionBudget/tts"]["spec"]
        assert len({"minAvailable", "maxUnavailable"} & pdb.keys()) == 1
        # Only the gateway is open; Triton's APIs and the metrics stay inside.
        rules = docs["NetworkPolicy/tts"]["spec"]["ingress"]
        open_ports = [p["port"] for r in rules if "from" not in r for p in r["ports"]]
        assert open_ports == [8080]
        inside = {p["port"] for r in rules if "from" in r for p in r["ports"]}
        assert inside == {8000, 8001, 8002, 8003}
        assert docs["Service/tts-gateway"]["spec"]["ports"][0]["targetPort"] == "gateway"


def admitted(policy: dict, labels: dict, namespace: str, namespace_labels: dict) -> set[int]:
    """The ports a NetworkPolicy admits from a pod (matchLabels only, as deploy/ uses)."""

    def matches(selector: dict | None, have: dict) -> bool:
        return selector is not None and selector.get("matchLabels", {}).items() <= have.items()

    ports = set()
    for rule in policy["spec"]["ingress"]:
        peers = rule.get("from")
        ok = peers is None or any(
            (
                matches(peer["namespaceSelector"], namespace_labels)
                if "namespaceSelector" in peer
                else namespace == policy["metadata"]["namespace"]
            )
            and ("podSelector" not in peer or matches(peer["podSelector"], labels))
            for peer in peers
        )
        if ok:
            ports |= {p["port"] for p in rule["ports"]}
    return ports


def check_the_gateway_pods(docs: dict, server: dict, gateway: dict) -> None:
    """Issue 27, item 6: the gpu overlay's gateway Deployment, sized from the measured cost."""
    from bench.gateway_cost import SIZED

    assert "--gateway-port=0" in server["args"]  # none in the GPU pods
    assert "--gateway-url" not in " ".join(server["readinessProbe"]["exec"]["command"])
    pod = gateway["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ns = {"kubernetes.io/metadata.name": "tts"}
    assert admitted(docs["NetworkPolicy/tts"], pod["metadata"]["labels"], "tts", ns) >= {8001}
    assert "--triton-url=grpc://tts-triton:8001" in container["args"]
    assert any(p["port"] == 8001 for p in docs["Service/tts-triton"]["spec"]["ports"])

    def secret(spec: dict, c: dict, variable: str) -> tuple[str, str]:
        """(Secret, key) of the file the variable names, through the container's mounts."""
        path = Path(next(e for e in c["env"] if e["name"] == variable)["value"])
        mount = next(m for m in c["volumeMounts"] if Path(m["mountPath"]) == path.parent)
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])["secret"]
        (item,) = [i for i in volume["items"] if i["path"] == path.name]
        return volume["secretName"], item["key"]

    # The token the front door trusts is the one the gateway shows it.
    server_pod = docs["Deployment/tts"]["spec"]["template"]["spec"]
    assert secret(server_pod, server, FRONT_TOKEN_FILE_ENV) == secret(
        pod["spec"], container, GATEWAY_FRONT_TOKEN_ENV + "_FILE"
    )
    # Its own scaling signal, CPU, and a ceiling that covers the GPU replicas' ceiling in MP3
    # at the measured cost per audio second.
    hpa = docs["HorizontalPodAutoscaler/tts-gateway"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == gateway["metadata"]["name"]
    (metric,) = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu"
    usable = float(container["resources"]["limits"]["cpu"]) * (
        metric["resource"]["target"]["averageUtilization"] / 100
    )
    gpu_replicas = docs["HorizontalPodAutoscaler/tts"]["spec"]["maxReplicas"]
    needed = gpu_replicas * SIZED["audio_rate"] * SIZED["mp3_cpu_s_per_audio_s"]
    assert hpa["maxReplicas"] * usable >= needed, (hpa["maxReplicas"], needed / usable)
    # A stop covers the preStop and the gateway's drain.
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = GatewaySettings().drain_s
    assert pod["spec"]["terminationGracePeriodSeconds"] >= sleep + drain
    assert docs["PodDisruptionBudget/tts-gateway"]["spec"]["selector"]["matchLabels"].items() <= (
        pod["metadata"]["labels"].items()
    )


def test_the_manifests_hold_on_a_real_cluster(rendered):
    """Issue 27: what a real cluster would have hit, read from the rendered manifests."""
    rule_file = ROOT / "deploy/monitoring/prometheus-adapter-rules.yaml"
    query = yaml.safe_load(rule_file.read_text())["rules"]["custom"][0]["metricsQuery"]
    monitor = yaml.safe_load((ROOT / "deploy/monitoring/servicemonitor.yaml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for overlay in ("cpu", "gpu"):
        docs = documents(rendered[overlay])
        # 1. A client pod labelled tts-client=true, as the docs say, reaches Triton; an
        # unlabelled one only the gateway; Prometheus' pods, wherever they run, the metrics.
        policy = docs["NetworkPolicy/tts"]
        ns = {"kubernetes.io/metadata.name": "tts"}
        assert admitted(policy, {"tts-client": "true"}, "tts", ns) == {8080, 8000, 8001}
        assert admitted(policy, {"app": "other"}, "tts", ns) == {8080}
        prometheus = {"app.kubernetes.io/name": "prometheus"}
        observability = {"kubernetes.io/metadata.name": "observability"}
        assert admitted(policy, prometheus, "observability", observability) >= {8002, 8003}
        # Every selector finds the pods it is meant for.
        deployment = docs["Deployment/tts"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        for kind_name in ("Deployment/tts", "PodDisruptionBudget/tts"):
            assert docs[kind_name]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
        for name in ("tts-triton", "tts-metrics"):
            assert docs[f"Service/{name}"]["spec"]["selector"].items() <= pod_labels.items()
        # 2. Liveness is the launcher's own, on its port: not Triton's through the front door.
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe in ("livenessProbe", "startupProbe"):
            assert container[probe]["httpGet"] == {"path": LIVE_PATH, "port": "supervisor"}
        assert ports["supervisor"] == 8003
        # 3. Endpoints stop sending before the drain; the grace period covers both.
        sleep = container["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep[0] == "sleep" and int(sleep[1]) >= 5
        assert pod["terminationGracePeriodSeconds"] >= int(sleep[1]) + STOP_BUDGET_S
        # 4. A GPU rollout never waits for a GPU that a full pool does not have.
        update = deployment["spec"]["strategy"]["rollingUpdate"]
        if overlay == "gpu":
            assert update == {"maxSurge": 0, "maxUnavailable": 1}
        # 5. The ServiceMonitor finds the metrics Service and its ports.
        service = docs["Service/tts-metrics"]
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )
        named = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= named
        # 6. The gateway: in the server pods on CPU; on GPU in pods of its own, scaled on CPU.
        gateway = docs.get("Deployment/tts-gateway", deployment)
        gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
        assert docs["Service/tts-gateway"]["spec"]["selector"].items() <= gateway_labels.items()
        if overlay == "gpu":
            check_the_gateway_pods(docs, container, gateway)
        else:
            assert "Deployment/tts-gateway" not in docs and "args" not in container
        # 7. /dev/shm holds the gpu profile's largest batches (two vocoder instances).
        shm = next(v for v in pod["volumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"]
        assert int(shm.rstrip("Gi")) >= (2 if overlay == "gpu" else 1)
    # 5. The rule's window holds at least 4 scrapes of the ServiceMonitor's interval (and 2
    # of Prometheus' default 1 m).
    windows = {int(w) for w in re.findall(r"\[(\d+)m\]", query)}
    intervals = {int(e["interval"].rstrip("s")) for e in monitor["spec"]["endpoints"]}
    assert windows and min(windows) * 60 >= max(4 * max(intervals), 2 * 60)
    # 5. A pod's value waits until its window no longer holds the front door's warm-up (16 in
    # flight: about 0.5 s of queue per request, 5x the CPU target, on every new pod), on the
    # supervisor's gauge, which the ServiceMonitor scrapes (port 8003).
    gate = re.search(r"time\(\) - max by \(<<\.GroupBy>>\) \((\w+)\{[^}]*\}\) > (\d+)", query)
    assert gate and gate[1] == SERVING_SINCE, query
    assert int(gate[2]) >= max(windows) * 60 and query.count(" and on (<<.GroupBy>>)") == 1
    # 3. Compose: a stop gets the launcher's whole drain.
    grace = compose["x-tts"]["stop_grace_period"]
    assert int(grace.rstrip("s")) >= STOP_BUDGET_S
    assert int(compose["services"]["tts-gpu"]["shm_size"].rstrip("g")) >= 2


def test_the_gpu_bundle_installs_by_the_images_own_script(tmp_path, monkeypatch):
    """A GPU machine without Docker gets the image's install steps: docker/install.sh, offline
    from the bundle's wheels, with the gpu lock (or the cpu one beside the machine's torch)."""
    from tts_tools import gpu_bundle

    calls: list[list[str]] = []
    monkeypatch.setattr(gpu_bundle, "run", lambda cmd, **kw: calls.append(list(cmd)))
    bundle = tmp_path / "bundle"
    (bundle / "project").mkdir(parents=True)
    (bundle / "host-torch").write_text("no\n")
    python = bundle / "venv" / "bin" / "python"  # what install.sh leaves (it is not run here)
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    gpu_bundle.install(bundle)
    script, pytriton, tools = calls
    assert script[:2] == ["bash", str((bundle / "project" / "docker/install.sh").resolve())]
    assert script[script.index("--profile") + 1] == "gpu" and "--no-export" in script
    assert script[script.index("--wheels") + 1] == str(bundle / "wheels")
    assert pytriton[-1] == "nvidia-pytriton==0.7.0" and "--no-index" in pytriton
    assert tools[-2:] == ["-r", str((bundle / "project" / gpu_bundle.BENCH_TOOLS).resolve())]
    assert "--no-index" in tools
    assert gpu_bundle.LOCKS == {False: "requirements/image-gpu.lock",
                                True: "requirements/image-cpu.lock"}  # fmt: skip


def test_the_gpu_measurements_are_one_command_each_and_their_flags_exist(tmp_path):
    """gpu_bundle bench: every step names a module of this project with flags its parser
    knows (read from its --help here; the steps themselves need a GPU), and the tools the
    bundle adds are pinned as the project pins them."""
    from tts_tools import gpu_bundle

    steps = gpu_bundle.bench_steps(ROOT, tmp_path, py=sys.executable)
    assert list(steps) == [
        "tests", "engine", "host-ceiling", "perf-gpu", "perf-gpu-dlpack", "client", "stream"
    ]  # fmt: skip
    for name, cmd in steps.items():
        assert cmd[:2] == [sys.executable, "-m"], name
        helped = subprocess.run(
            [*cmd[:3], "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert helped.returncode == 0, (name, helped.stderr[-500:])
        for flag in (a for a in cmd[3:] if a.startswith("--")):
            assert flag in helped.stdout, (name, flag)
        profiles = [cmd[i + 1] for i, a in enumerate(cmd) if a in ("--profile", "--profiles")]
        for profile in profiles:
            assert (ROOT / "model_repository/vocoder/configs" / f"{profile}.pbtxt").exists()
    pins = {}
    for path in ("requirements.txt", "requirements/serve.txt"):
        for line in (ROOT / path).read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==")
                pins[name.strip().lower()] = version.split()[0]
    tools = (ROOT / gpu_bundle.BENCH_TOOLS).read_text().splitlines()
    for line in (t for t in tools if t and not t.startswith("#")):
        name, version = line.split("==")
        assert pins[name.lower()] == version, line
