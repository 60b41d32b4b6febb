"""Serve and benchmark the GPU profile on a bare CUDA machine without network.

On a machine with network (this one):

    python -m tts_tools.gpu_bundle build out/gpu-bundle [--python 3.12] [--host-torch]

downloads every wheel the GPU server and its benchmark need for the target Python on x86-64
Linux: the image's hashed lock (requirements/image-gpu.lock: numpy 1.26, torch with its CUDA
runtime; image-cpu.lock with ``--host-torch``) and Triton 2.51 from nvidia-pytriton (the
image has its own Triton), copies the project (``git archive``) and the exported voice. Copy
the folder over, then on the GPU machine:

    python3 project/tts_tools/gpu_bundle.py install .    # offline venv in ./venv
    venv/bin/python -m tts_tools.gpu_bundle bench .      # every GPU measurement, in steps
    venv/bin/python -m tts_tools.gpu_bundle bench . --only engine perf-gpu   # some of them

``install`` runs docker/install.sh, the image's own install steps (docs/deployment.md), offline
from the bundle's wheels. Needs there: an NVIDIA driver for the lock's CUDA (13 for torch
2.13), Python 3.12 (the locks' Python), ``libpython`` (any CPython install has it).
``--host-torch`` leaves torch out and uses the one the machine already has (a CUDA image);
numpy 1.26 then shadows its numpy for this venv alone, since Triton 2.51's Python-backend stub
returns empty outputs under numpy 2 (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTALL = "docker/install.sh"
LOCKS = {False: "requirements/image-gpu.lock", True: "requirements/image-cpu.lock"}  # host torch?
BENCH_TOOLS = "requirements/gpu-bench.txt"  # pytest, matplotlib, perf_analyzer's libcudart.so.12
# Installed without its dependencies: the server needs only the binary it ships, and its Python
# API's pins (geventhttpclient<=2.0.2) have no wheel for newer Pythons.
NO_DEPS = ("nvidia-pytriton==0.7.0",)
# Every glibc tag up to the machine's (the CUDA wheels use 2_25 and 2_27, not only 2_17/2_28).
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)), "manylinux2014_x86_64")


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def build(out: Path, python: str, host_torch: bool) -> None:
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for platform in PLATFORMS:
        target += ["--platform", platform]
    download = [sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), *target]
    run([*download, "--require-hashes", "--no-deps", "-r", str(ROOT / LOCKS[host_torch])])
    run([*download, "--no-deps", *NO_DEPS])
    run([*download, "-r", str(ROOT / BENCH_TOOLS)])  # with their dependencies
    (out / "host-torch").write_text("yes\n" if host_torch else "no\n")
    project = out / "project"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    run(["tar", "-x", "-C", str(project)], input=archive)
    # The export's own list of what it wrote, less the ONNX files the torch engine never reads.
    from export.build import MANIFEST  # here, not at the top: `install` runs standalone

    repo = ROOT / "model_repository"
    manifest = repo / MANIFEST
    if not manifest.exists():
        raise SystemExit("no exported voice: run `make export` first")
    outputs = json.loads(manifest.read_text())["outputs"]
    files = [repo / p for p in outputs if not p.endswith(".onnx")] + [manifest]
    if not any(p.name == "weights.safetensors" for p in files):
        raise SystemExit("the export has no weights.safetensors: run `make export` again")
    with tarfile.open(out / "voice.tar", "w") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(repo)))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6
    print(f"bundle in {out}: {size:.0f} MB; copy it to the GPU machine and see the docstring")


def host_site_packages(python: str = "python3") -> str | None:
    """The site-packages that holds the machine's own torch, if it has one."""
    probe = "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def install(bundle: Path, wheels: list[Path] | None = None, no_deps: bool = False) -> Path:
    """A venv in ``bundle/venv`` by the image's install steps (docker/install.sh), offline from
    the bundle's wheels; then Triton 2.51 (nvidia-pytriton) and the exported voice."""
    env_dir = bundle / "venv"
    project = (bundle / "project").resolve()
    host_torch = (bundle / "host-torch").exists() and (
        bundle / "host-torch"
    ).read_text().strip() == "yes"
    found = bundle / "wheels"
    if no_deps:  # just these wheels into the venv already there
        py = str(env_dir / "bin" / "python")
        run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
             *map(str, wheels or sorted(found.glob("*.whl")))])  # fmt: skip
        return env_dir
    profile = "gpu-host-torch" if host_torch else "gpu"
    run(["bash", str(project / INSTALL), "--profile", profile, "--venv", str(env_dir),
         "--python", sys.executable, "--wheels", str(found), "--no-export"])  # fmt: skip
    py = str(env_dir / "bin" / "python")
    has_pip = subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode == 0
    pip = [py, "-m", "pip"] if has_pip else [sys.executable, "-m", "pip", "--python", py]
    run([*pip, "install", "-q", "--no-index", "--find-links", str(found), "--no-deps", *NO_DEPS])
    run([*pip, "install", "-q", "--no-index", "--find-links", str(found),
         "-r", str(project / BENCH_TOOLS)])  # fmt: skip
    if host_torch:
        host = host_site_packages()
        if not host:
            raise SystemExit("the bundle was built with --host-torch but python3 has no torch")
        site = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # Appended after this venv's own packages, so its numpy 1.26 wins over the host's.
        (Path(site) / "zz_host_torch.pth").write_text(host + "\n")
    voice = bundle / "voice.tar"
    if voice.exists():
        with tarfile.open(voice) as tar:
            tar.extractall(project / "model_repository", filter="data")
    return env_dir


def bench_steps(project: Path, out: Path, py: str = sys.executable) -> dict[str, list[str]]:
    """Every GPU measurement docs/gpu.md lists, by name, in the order to run them; each one fits
    the device's 10 minutes per call. Figures and logs land in ``out``."""
    repo = str(project / "model_repository")
    perf = ["--models", "tts", "--protocols", "grpc", "--request-count", "1000",
            "--concurrency", "1", "16", "64", "128", "256"]  # fmt: skip
    return {
        # The equality tests where the GPU is: CUDA vs CPU, float16 error, the DLPack hand-off.
        "tests": [
            *(py, "-m", "pytest", "-q", "-s", "-m", "gpu"),
            *("tests/adapter/test_gpu.py", "tests/integration/test_gpu_serving.py"),
        ],
        # Every answer of gpu-dlpack against gpu's at c=256 (its copies failed under Triton's
        # default CUDA pool on 2026-11-27).
        "dlpack": [py, "-m", "bench.gpu_dlpack", *"--concurrency 256 --requests 1024".split()],
        # The engine alone: numpy in and out, the latent on the device, no copies at all.
        "engine": [py, "-m", "bench.gpu", "--repository", repo, "--out", f"{out}/gpu_engine.json"],
        # What Triton, the stubs and espeak-ng carry on this machine's cores (null engine).
        "host-ceiling": [
            *(py, "-m", "perf_analyzer_configs.host_ceiling", "--profiles", "gpu-host-ceiling"),
            *"--concurrency 16 64 256 --request-count 2000".split(),
            *("--out", f"{out}/host-ceiling"),
        ],
        # End to end with perf_analyzer (C++; its CPU and Triton's per-stage statistics in the
        # CSV): latents through the host (gpu) and on the device (gpu-dlpack).
        **{
            f"perf-{name}": [
                *(py, "-m", "perf_analyzer_configs.run", "--profile", name, *perf),
                *("--out", f"{out}/perf-{name}"),
            ]
            for name in ("gpu", "gpu-dlpack")
        },
        # The Python client's figure beside perf_analyzer's.
        "client": [
            *(py, "-m", "bench.compare", "--profile", "gpu", "--systems", "ours-grpc"),
            *("--repository", repo, *"--concurrency 1 64 256 --rounds 1 --requests 512".split()),
            *("--json", f"{out}/gpu_e2e.json"),
        ],
        # A stream's first audio at concurrency 1.
        "stream": [
            py,
            "-m",
            "bench.streaming",
            *"--profile gpu --runs 5 --mixed-seconds 10".split(),
        ],
    }


def bench(bundle: Path, out: Path, only: list[str] | None = None) -> int:
    """Run the steps of ``bench_steps`` (or ``only`` these), each to the end even when one
    fails; their output in ``out/<step>.log``; the number of failed steps."""
    project = (bundle / "project").resolve()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = bench_steps(project, out)
    unknown = sorted(set(only or []) - set(steps))
    if unknown:
        raise SystemExit(f"unknown step(s) {', '.join(unknown)}; steps: {', '.join(steps)}")
    failed = []
    for name, cmd in steps.items():
        if only and name not in only:
            continue
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        with open(out / f"{name}.log", "w") as log:
            code = subprocess.run(cmd, cwd=project, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"   exit {code}; log {out / f'{name}.log'}", flush=True)
        if code:
            failed.append(name)
    print(f"failed: {', '.join(failed)}" if failed else "every step ran", flush=True)
    return len(failed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tts_tools.gpu_bundle", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download wheels, copy project and voice")
    b.add_argument("out", type=Path)
    b.add_argument("--python", default="3.12", help="the GPU machine's Python (major.minor)")
    b.add_argument("--host-torch", action="store_true", help="use the machine's own torch")
    i = sub.add_parser("install", help="offline venv from a bundle (on the GPU machine)")
    i.add_argument("bundle", type=Path)
    i.add_argument("--no-deps", nargs="*", type=Path, help="install just these wheels")
    r = sub.add_parser("bench", help="run the GPU benchmarks from the bundle's venv")
    r.add_argument("bundle", type=Path)
    r.add_argument("--out", type=Path, default=Path("bench-results"))
    r.add_argument("--only", nargs="+", help="these steps (names: see bench_steps)")
    args = p.parse_args(argv)
    if args.command == "build":
        build(args.out, args.python, args.host_torch)
    elif args.command == "install":
        install(args.bundle, args.no_deps, no_deps=args.no_deps is not None)
    else:
        return 1 if bench(args.bundle, args.out, args.only) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
