"""A lent GPU machine's parts, built here and carried in two device calls of 64 MiB each.

The device tool's machine (docs/gpu.md) has CUDA, Python 3.12 with torch, no network, and takes
at most 64 MiB per call, the working tree (about 3 MB) included; it goes back 30 s after a
call. The full offline bundle (``tts_tools.gpu_bundle``, 391 MB) does not fit; this does:

    python -m tts_tools.gpu_lease build        # .carry/voice.tar.xz and .carry/site.tar.xz

``voice.tar.xz`` holds the export's files the torch profiles read (both halves' weights and
the small JSON files, not the ONNX models); ``site.tar.xz`` the Python 3.12 packages the image
lacks, at requirements/serve.txt's pins, pruned to what serving needs (one Python-backend stub,
no other languages' espeak-ng dictionaries, no Hebrew or Arabic models). Then, one call right
after the other (``tts_tools/gpu_lease.sh`` is tracked, so it travels with the tree):

    run: bash tts_tools/gpu_lease.sh voice                     carry [".carry/voice.tar.xz"]
    run: bash tts_tools/gpu_lease.sh site && bash tts_tools/gpu_lease.sh dlpack tests
                                                               carry [".carry/site.tar.xz"]
    run: bash tts_tools/gpu_lease.sh perf gpu gpu-dlpack       (nothing to carry)

Files laid out by one call stay for the next while the machine is held.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tts_tools.gpu_bundle import PLATFORMS

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "requirements/serve.txt"
# What the serving stack, perf_analyzer and the tests need beyond the device image's packages
# (torch, onnxruntime, grpcio, protobuf, safetensors, pytest, matplotlib are there).
PACKAGES = (
    "numpy",  # 1.26: Triton 2.51's stub returns empty outputs under the image's numpy 2
    "nvidia-pytriton",  # tritonserver and the Python backend
    "tritonclient",  # the client and perf_analyzer
    "piper-tts",  # espeak-ng and its data
    "unicode-rbnf",
    "python-rapidjson",
    "nvidia-cuda-runtime-cu12",  # libcudart.so.12 for perf_analyzer
)
LIMIT = 64 << 20  # what one device call carries, the tree included
ESPEAK_DICTS_KEPT = ("en_dict",)


def pins(names: tuple[str, ...] = PACKAGES, path: Path = PINS) -> list[str]:
    """``name==version`` of each of ``names`` as ``path`` pins it."""
    found = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            found[name.strip().lower().replace("_", "-")] = version.split()[0]
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"{path} pins none of {', '.join(missing)}")
    return [f"{n}=={found[n]}" for n in names]


def prune(site: Path, python: str) -> None:
    """Leave what serving on ``python`` needs: the other Pythons' backend stubs and pytriton's
    libpython 3.13 (for its own 3.13 stub), perf_analyzer's twin perf_client, numpy's tests,
    piper's Hebrew and Arabic models, espeak-ng dictionaries of other languages."""
    stubs = site / "pytriton/tritonserver/python_backend_stubs"
    for stub in stubs.iterdir() if stubs.exists() else ():
        if stub.name != python:
            shutil.rmtree(stub)
    for path in [
        *site.glob("nvidia_pytriton.libs/libpython3-*"),
        site / "bin/perf_client",
        *site.glob("piper/*/*.onnx"),
    ]:
        path.unlink(missing_ok=True)
    for tests in [*site.glob("numpy/*/tests"), site / "numpy/tests"]:
        shutil.rmtree(tests, ignore_errors=True)
    for dictionary in site.glob("piper/espeak-ng-data/*_dict"):
        if dictionary.name not in ESPEAK_DICTS_KEPT:
            dictionary.unlink()


def voice_files(repository: Path) -> list[Path]:
    """The export's files the torch profiles read: everything it wrote but the ONNX models."""
    names = ("weights.safetensors", "voice.json", "voices.json", "loudness.json")
    files = [p for name in names for p in sorted(repository.glob(f"*/1/{name}"))]
    files += sorted(repository.glob("*/1/voices"))  # a --voices export's other voices
    return [*files, repository / ".export-manifest.json"]


def pack(out: Path, root: Path, paths: list[Path]) -> Path:
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for path in paths:
            tar.add(path, arcname=str(path.relative_to(root)))
    return out


def tree_bytes() -> int:
    """What travels with every call: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    files = [ROOT / p.decode() for p in listed if p]
    return sum(f.stat().st_size for f in files if f.is_file())


def build(out: Path, python: str = "3.12") -> list[Path]:
    """Both carries in ``out``; SystemExit when one would not fit a call."""
    repository = ROOT / "model_repository"
    if not (repository / ".export-manifest.json").exists():
        raise SystemExit("no exported voice: run `make export` (python -m export) first")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
        for platform in PLATFORMS:
            target += ["--platform", platform]
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
             "--target", str(site), *target, *pins()],
            check=True,
        )  # fmt: skip
        prune(site, python)
        carries = [
            pack(out / "voice.tar.xz", ROOT, voice_files(repository)),
            pack(out / "site.tar.xz", site, sorted(site.iterdir())),
        ]
    tree = tree_bytes()
    for carry in carries:
        size = carry.stat().st_size
        print(f"{carry}: {size / 2**20:.1f} MiB (+ the tree, {tree / 2**20:.1f} MiB)")
        if size + tree > LIMIT:
            raise SystemExit(f"{carry} and the tree exceed a call's {LIMIT >> 20} MiB")
    return carries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tts_tools.gpu_lease", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="the two carries for a device lease")
    b.add_argument("--out", type=Path, default=ROOT / ".carry")
    b.add_argument("--python", default="3.12", help="the device's Python")
    args = parser.parse_args(argv)
    build(args.out, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
