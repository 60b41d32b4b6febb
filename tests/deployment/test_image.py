"""The container image's files, checked as far as a machine without a Docker engine can: the
Dockerfile linted (hadolint) and read (its stages, user, health check, entrypoint against the
launcher's own argument parser); docker/install.sh run with a recording python; the image's
locks pinned, hashed, in step with the project's pins and resolvable for the image's Python and
platform (pip, against the package index); compose's profiles; the GPU bundle, which installs
by the image's own script. The cluster's manifests: test_deploy.py. What is not run here (an
image build) is listed in docs/deployment.md."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.deploy import deploy_tool
from tests.support.paths import ROOT
from tests.support.requirements import ALL, norm, pins

DOCKERFILE = ROOT / "docker/Dockerfile"
# (Named image-cpu and image-gpu, not cpu and gpu: a test id holding "gpu" was once skipped as
# one that needs a GPU.)
LOCKS = {name: ROOT / f"requirements/{name}.lock" for name in ("image-cpu", "image-gpu")}


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


def test_the_images_are_built_on_patched_bases_as_a_non_root_user():
    steps = instructions()
    base = next(a for i, a in steps if i == "ARG" and a.startswith("TRITON_IMAGE="))
    release = re.fullmatch(r"TRITON_IMAGE=nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3", base)
    # 26.04: the first release with the fixes of NVIDIA's bulletin 5828 (May 2026: HTTP
    # authentication bypasses CVE-2026-24206/24207, path traversals -24208/24209); 25.08 before
    # it had those of August 2025 (CVE-2025-23316) and not these.
    assert release and (int(release[1]), int(release[2])) >= (26, 4), base
    # The cpu image: Debian 12 (its Python 3.11, which the pytriton wheel has a stub for).
    debian = next(a for i, a in steps if i == "ARG" and a.startswith("DEBIAN_IMAGE="))
    assert debian == "DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim"
    froms = dict(reversed(a.split(" AS ")) for i, a in steps if i == "FROM" and " AS " in a)
    assert froms == {"dependencies": "scratch", "project": "scratch",
                     "dependencies-cpu": "${DEBIAN_IMAGE}", "build-cpu": "dependencies-cpu",
                     "cpu": "${DEBIAN_IMAGE}", "dependencies-gpu": "${TRITON_IMAGE}",
                     "build-gpu": "dependencies-gpu", "gpu": "${TRITON_IMAGE}"}  # fmt: skip
    assert steps.count(("USER", "10001:10001")) == 2  # both images
    healthchecks = [a for i, a in steps if i == "HEALTHCHECK"]
    assert len(healthchecks) == 2  # per model, not /v2/health/ready; the launcher's ports
    assert all('"tts_launcher.healthcheck", "--gateway"' in a for a in healthchecks)
    copied = [
        source
        for instruction, args in steps
        if instruction == "COPY" and "--from" not in args
        for source in args.split()[:-1]
    ]
    for source in copied:  # everything copied from the context exists
        assert (ROOT / source).exists(), source
    # Developer tools, benchmarks and tests stay out of the image; the server needs none.
    assert not {"tts_tools", "bench", "tests"} & {Path(s).parts[0] for s in copied}, copied
    installs = [a for i, a in steps if i == "RUN" and "docker/install.sh" in a]
    assert len(installs) == 4 and all("--venv /opt/tts/venv" in a for a in installs)
    # Per image: the dependencies, then the project on them (its own layer: an edit of the
    # project installs nothing again), the venv copied into the last stage before the project.
    assert [re.search(r"--only (\w+)", a)[1] for a in installs] == ["dependencies", "project"] * 2
    # Triton from the wheel on Debian only (NGC's image has its own); the wheels folder gone.
    assert ["--triton" in a for a in installs] == [True, False, False, False]
    assert ["rm -rf docker/wheels" in a for a in installs] == [True, False, True, False]
    for kind in ("cpu", "gpu"):
        copies = [a for i, a in steps if i == "COPY" and f"--from=build-{kind}" in a]
        venv = steps.index(("COPY", f"--from=dependencies-{kind} /opt/tts/venv /opt/tts/venv"))
        assert all(steps.index(("COPY", a)) > venv for a in copies), kind
    # The wheels come in with the dependencies only.
    assert [a for i, a in steps if i == "COPY" and a.startswith("docker ")] == [
        "docker /opt/tts/app/docker"
    ]


def test_the_entrypoint_is_the_launcher_configured_by_its_variables():
    from tts_launcher.settings import parse_args, settings

    steps = instructions()
    entrypoints = [json.loads(a) for i, a in steps if i == "ENTRYPOINT"]
    # NGC's entrypoint (CUDA forward compatibility on older data-center drivers) runs the gpu one.
    launcher = ["python", "-m", "tts_launcher"]
    assert entrypoints == [launcher, ["/opt/nvidia/nvidia_entrypoint.sh", *launcher]]
    commands = [json.loads(a) for i, a in steps if i == "CMD"]
    assert commands == [[], ["--model-config-name=gpu"]]  # the cpu and gpu stages, in order
    known = {s.env for s in settings()}
    for env in [a for i, a in steps if i == "ENV"]:
        values = dict(re.findall(r"(\w+)=(\S+)", env))
        launcher = {k: v for k, v in values.items() if k.startswith("TTS_LAUNCHER_")}
        assert launcher.keys() <= known, launcher.keys() - known
        assert launcher["TTS_LAUNCHER_BIND"] == "0.0.0.0"
        assert launcher["TTS_LAUNCHER_MODEL_REPOSITORY"] == "/opt/tts/app/model_repository"
        for command in commands:
            args, extra = parse_args(command, launcher)
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
    bad = subprocess.run([*script, "--only", "voice"], capture_output=True, text=True)
    assert bad.returncode == 2 and "dependencies or project" in bad.stderr


def test_install_sh_in_two_steps_as_the_image_layers_it(recording_python, tmp_path):
    """--only dependencies: the venv, the lock and the project's path, no export; --only
    project: the path and the export on that venv, nothing installed."""
    fake, log, site = recording_python
    script = ["bash", str(ROOT / "docker/install.sh"), "--venv", str(tmp_path / "v"),
              "--python", str(fake), "--only"]  # fmt: skip
    subprocess.run([*script, "dependencies"], check=True, capture_output=True)
    calls = log.read_text().splitlines()
    assert calls[0].startswith("python3 -m venv") and any(" install " in c for c in calls)
    assert not any("export" in c for c in calls)
    assert (site / "tts_project.pth").read_text().split()[0] == str(ROOT)
    log.unlink()
    (site / "tts_project.pth").unlink()
    subprocess.run([*script, "project"], check=True, capture_output=True)
    calls = log.read_text().splitlines()
    assert not any(" venv " in c or " install " in c for c in calls), calls
    assert calls[-1] == "python -m export --repository model_repository"
    assert (site / "tts_project.pth").read_text().split()[0] == str(ROOT)


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
    # No other file of the project pins torch (three pins once disagreed). Its own files:
    # what git tracks, not venvs or caches (a benchmark's venv under .cache holds packages).
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()  # fmt: skip
    texts = [ROOT / f for f in tracked if Path(f).suffix in {".txt", ".md", ".py", ".sh", ".yml"}]
    texts = [p for p in texts if p.is_file()]
    others = {str(p.relative_to(ROOT)) for p in texts if re.search(r"torch==\d", p.read_text())}
    assert others <= {"requirements/torch.txt", "CHANGELOG.md"}, others


def test_install_sh_installs_triton_from_its_own_lock_without_dependencies(
    recording_python, tmp_path
):
    fake, log, _ = recording_python
    script = ["bash", str(ROOT / "docker/install.sh"), "--venv", str(tmp_path / "v"),
              "--python", str(fake), "--triton", "--no-export"]  # fmt: skip
    subprocess.run(script, check=True, capture_output=True)
    installs = [c for c in log.read_text().splitlines() if " install " in c]
    assert [c.rsplit("/", 1)[-1] for c in installs] == ["image-cpu.lock", "image-triton.lock"]
    assert all("--no-deps" in c and "--require-hashes" in c for c in installs)
    triton = lock_pins(ROOT / "requirements/image-triton.lock")
    assert triton == {"nvidia-pytriton": ALL["nvidia-pytriton"]}  # make serve's Triton


# The images' Pythons: Debian 12's for the cpu image, NGC's for the gpu image (and the bundle).
# The gpu lock is the cpu lock and torch (test_the_locks_pin_the_projects_versions_and_one_torch):
# resolved for 3.12, it resolves every pin of the cpu lock for 3.12 too.
@pytest.mark.slow
@pytest.mark.parametrize(("profile", "python"), [("image-cpu", "3.11"), ("image-gpu", "3.12")])
def test_the_lock_resolves_for_the_images_python_and_platform(profile, python, tmp_path):
    """pip resolves the whole lock for the image's CPython on x86-64 glibc, wheels only, every
    hash and every dependency in the lock (it downloads metadata, not the wheels)."""
    from tts_tools.gpu_bundle import PLATFORMS  # the bundle downloads for the same ones

    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
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
    from bench.baselines import BASELINES
    from tts_tools import gpu_bundle

    steps = gpu_bundle.bench_steps(ROOT, tmp_path, py=sys.executable)
    assert list(steps) == [
        "tests", "dlpack", "engine", "host-ceiling", "perf-gpu", "perf-gpu-dlpack", "client",
        "stream",
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
        for profile in profiles:  # served, or a baseline the benchmarks make (bench.baselines)
            served = (ROOT / "model_repository/vocoder/configs" / f"{profile}.pbtxt").exists()
            assert served or profile in BASELINES, (name, profile)
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
