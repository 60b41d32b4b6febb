"""The cluster's manifests (deploy/), checked as far as a machine without a cluster can:
rendered by kubectl's kustomize, validated against the Kubernetes schemas (kubernetes-validate)
and a policy scan (checkov), and read for what the issue asks of them. The image's files:
test_image.py. What is not run here (a cluster) is listed in docs/deployment.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.deploy import deploy_tool
from tests.support.paths import ROOT
from tts_front.security import FRONT_TOKEN_FILE_ENV, GATEWAY_FRONT_TOKEN_ENV
from tts_gateway.settings import GatewaySettings
from tts_launcher.commands import STOP_BUDGET_S
from tts_launcher.liveness import LIVE_PATH
from tts_launcher.stub_healing import SERVING_SINCE

KUBERNETES_VERSION = "1.30.0"  # the oldest release still in common support when this was written


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
    import tomllib

    targets = tomllib.loads((ROOT / "deploy" / "sizing.toml").read_text())["autoscaler"]
    rule = yaml.safe_load((ROOT / "deploy/monitoring/prometheus-adapter-rules.yaml").read_text())
    metric = rule["rules"]["custom"][0]["name"]["as"]
    for overlay in ("cpu", "gpu"):
        docs = documents(rendered[overlay])
        pod = docs["Deployment/tts"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == f"tts-triton:{overlay}"
        # Ready when every model is (per model), live on the server; never root.
        assert container["readinessProbe"]["exec"]["command"][:3] == [
            "python", "-m", "tts_launcher.healthcheck"]  # fmt: skip
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
        assert int(target.rstrip("k")) * 1000 == round(targets[f"{overlay}_target_queue_s"] * 1e6)
        pdb = docs["PodDisruptionBudget/tts"]["spec"]
        assert len({"minAvailable", "maxUnavailable"} & pdb.keys()) == 1
        # Only the gateway is open; Triton's APIs, Wyoming (no authentication) and the metrics
        # stay inside.
        rules = docs["NetworkPolicy/tts"]["spec"]["ingress"]
        open_ports = [p["port"] for r in rules if "from" not in r for p in r["ports"]]
        assert open_ports == [8080]
        inside = {p["port"] for r in rules if "from" in r for p in r["ports"]}
        assert inside == {8000, 8001, 8002, 8003, 10200}
        assert docs["Service/tts-gateway"]["spec"]["ports"][0]["targetPort"] == "gateway"
        assert docs["Service/tts-wyoming"]["spec"]["ports"][0]["targetPort"] == "wyoming"


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
    """The gpu overlay's gateway Deployment, sized from the measured cost."""
    import tomllib

    sized = tomllib.loads((ROOT / "deploy" / "sizing.toml").read_text())["gateway"]

    assert "--gateway-port=0" in server["args"]  # none in the GPU pods
    assert "--gateway-url" not in " ".join(server["readinessProbe"]["exec"]["command"])
    pod = gateway["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ns = {"kubernetes.io/metadata.name": "tts"}
    assert admitted(docs["NetworkPolicy/tts"], pod["metadata"]["labels"], "tts", ns) >= {8001}
    assert "--triton-url=grpc://tts-triton:8001" in container["args"]
    assert "--wyoming-port=10200" in container["args"]
    client = {"tts-client": "true"}
    assert admitted(docs["NetworkPolicy/tts-gateway"], client, "tts", ns) == {8080, 10200}
    assert admitted(docs["NetworkPolicy/tts-gateway"], {"app": "other"}, "tts", ns) == {8080}
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
    needed = gpu_replicas * sized["audio_rate"] * sized["mp3_cpu_s_per_audio_s"]
    assert hpa["maxReplicas"] * usable >= needed, (hpa["maxReplicas"], needed / usable)
    # A stop covers the preStop and the gateway's drain.
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = GatewaySettings().drain_s
    assert pod["spec"]["terminationGracePeriodSeconds"] >= sleep + drain
    assert docs["PodDisruptionBudget/tts-gateway"]["spec"]["selector"]["matchLabels"].items() <= (
        pod["metadata"]["labels"].items()
    )


def check_the_network_policy_and_selectors(docs: dict) -> None:
    """1. A client pod labelled tts-client=true, as the docs say, reaches Triton and Wyoming;
    an unlabelled one only the gateway; Prometheus' pods, wherever they run, the metrics.
    Every selector finds the pods it is meant for."""
    policy = docs["NetworkPolicy/tts"]
    ns = {"kubernetes.io/metadata.name": "tts"}
    assert admitted(policy, {"tts-client": "true"}, "tts", ns) == {8080, 8000, 8001, 10200}
    assert admitted(policy, {"app": "other"}, "tts", ns) == {8080}
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    observability = {"kubernetes.io/metadata.name": "observability"}
    assert admitted(policy, prometheus, "observability", observability) >= {8002, 8003}
    pod_labels = docs["Deployment/tts"]["spec"]["template"]["metadata"]["labels"]
    for kind_name in ("Deployment/tts", "PodDisruptionBudget/tts"):
        assert docs[kind_name]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    for name in ("tts-triton", "tts-metrics"):
        assert docs[f"Service/{name}"]["spec"]["selector"].items() <= pod_labels.items()


def test_the_manifests_hold_on_a_real_cluster(rendered):
    """What a real cluster would have hit, read from the rendered manifests."""
    rule_file = ROOT / "deploy/monitoring/prometheus-adapter-rules.yaml"
    query = yaml.safe_load(rule_file.read_text())["rules"]["custom"][0]["metricsQuery"]
    monitor = yaml.safe_load((ROOT / "deploy/monitoring/servicemonitor.yaml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for overlay in ("cpu", "gpu"):
        docs = documents(rendered[overlay])
        check_the_network_policy_and_selectors(docs)  # 1.
        deployment = docs["Deployment/tts"]
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
        # Wyoming is the gateway's: its Service finds the pods that serve it, on the port named.
        wyoming = docs["Service/tts-wyoming"]["spec"]
        assert wyoming["selector"].items() <= gateway_labels.items()
        (gateway_container,) = gateway["spec"]["template"]["spec"]["containers"]
        assert "wyoming" in {p["name"] for p in gateway_container["ports"]}
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
