"""The wheels for building the container image offline (docker/Dockerfile installs from
docker/wheels when that folder holds wheels, and from the package index when it is empty):

    python -m tts_tools.image wheels [--profile cpu|gpu] [--out docker/wheels]

cpu: the image on Debian 12 (its Python 3.11): requirements/image-cpu.lock and Triton's own
wheel (image-triton.lock); gpu: the NGC image (its Python 3.12): image-gpu.lock. Every wheel is
checked against the lock's hashes as it is downloaded, and again when the build installs it.
On a host without network, fill the folder on one that has it and copy it over with the tree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tts_tools.gpu_bundle import PLATFORMS

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "docker" / "wheels"
# The locks each image installs, and its Python.
PROFILES = {
    "cpu": ("3.11", ("requirements/image-cpu.lock", "requirements/image-triton.lock")),
    "gpu": ("3.12", ("requirements/image-gpu.lock",)),
}


def download_command(lock: Path, out: Path, python: str) -> list[str]:
    """pip's download of one hashed lock's wheels for ``python`` on x86-64 glibc. (gpu_bundle
    writes its own: its ``install`` runs standalone on the GPU machine, so it imports nothing
    of the project at its top, and this module imports it.)"""
    command = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "-d", str(out), "--only-binary=:all:", "--python-version", python,
               "--implementation", "cp", "--require-hashes", "--no-deps",
               "-r", str(lock)]  # fmt: skip
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return command


def wheels(profile: str = "cpu", out: Path = WHEELS) -> list[Path]:
    """The image's wheels in ``out`` (others there are removed: the build installs them all)."""
    python, locks = PROFILES[profile]
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.whl"):
        stale.unlink()
    for lock in locks:
        subprocess.run(download_command(ROOT / lock, out, python), check=True)
    found = sorted(out.glob("*.whl"))
    size = sum(p.stat().st_size for p in found) / 1e6
    print(f"{len(found)} wheels for the {profile} image in {out} ({size:.0f} MB)")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tts_tools.image",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fill = sub.add_parser("wheels", help="fill the folder the image's build installs from")
    fill.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    fill.add_argument("--out", type=Path, default=WHEELS)
    args = parser.parse_args(argv)
    wheels(args.profile, args.out)


if __name__ == "__main__":
    main()
