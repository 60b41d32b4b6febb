"""tts_tools.image: the wheels an image's build installs offline, for that image's Python."""

from __future__ import annotations

from pathlib import Path

from tts_tools.gpu_bundle import PLATFORMS
from tts_tools.image import PROFILES, ROOT, download_command


def test_each_profile_downloads_its_locks_for_its_images_python(tmp_path):
    assert PROFILES["cpu"][0] == "3.11"  # Debian 12's, the cpu image's base
    assert PROFILES["gpu"][0] == "3.12"  # NGC Triton's
    for python, locks in PROFILES.values():
        for lock in locks:
            assert (ROOT / lock).exists(), lock
            command = download_command(ROOT / lock, tmp_path, python)
            # Hash-checked, wheels only, no dependency beyond the lock's own pins.
            for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:"):
                assert flag in command
            assert command[command.index("--python-version") + 1] == python
            assert command[command.index("-r") + 1] == str(ROOT / lock)
            assert command[command.index("-d") + 1] == str(tmp_path)
            platforms = [command[i + 1] for i, a in enumerate(command) if a == "--platform"]
            assert platforms == list(PLATFORMS)
    # Triton's own wheel only where the base has no Triton (the Debian image).
    assert "requirements/image-triton.lock" in PROFILES["cpu"][1]
    assert not any("triton" in Path(lock).name for lock in PROFILES["gpu"][1])
