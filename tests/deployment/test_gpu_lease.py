"""tts_tools.gpu_lease and gpu_lease.sh: what a lent GPU machine is given and runs. The device
steps need a GPU; here: the pruning, the pins, the voice's files, and that every command the
script runs names a module and flags that exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from tests.support.paths import ROOT
from tts_tools import gpu_lease


def test_the_site_keeps_what_serving_on_the_devices_python_needs(tmp_path):
    site = tmp_path / "site"
    files = [
        "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub",
        "pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub",
        "nvidia_pytriton.libs/libpython3-419a3a08.13.so.1.0",
        "nvidia_pytriton.libs/libtritonserver-717102f0.so",
        "bin/perf_client",
        "bin/perf_analyzer",
        "numpy/core/tests/test_a.py",
        "numpy/core/multiarray.py",
        "piper/tashkeel/model.onnx",
        "piper/tashkeel/__init__.py",
        "piper/espeak-ng-data/en_dict",
        "piper/espeak-ng-data/ru_dict",
        "piper/espeak-ng-data/phondata",
    ]
    for name in files:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"x")
    gpu_lease.prune(site, "3.12")
    kept = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert kept == sorted([
        "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub",
        "nvidia_pytriton.libs/libtritonserver-717102f0.so",
        "bin/perf_analyzer",
        "numpy/core/multiarray.py",
        "piper/tashkeel/__init__.py",  # piper imports it; its model is not needed
        "piper/espeak-ng-data/en_dict",
        "piper/espeak-ng-data/phondata",
    ])  # fmt: skip


def test_the_packages_are_the_ones_make_serve_pins(tmp_path):
    assert gpu_lease.pins() and all("==" in p for p in gpu_lease.pins())
    assert "numpy==1.26.4" in gpu_lease.pins()  # numpy 2 empties every output (docs/gpu.md)
    (tmp_path / "serve.txt").write_text("numpy==1.26.4\n")
    try:
        gpu_lease.pins(("numpy", "tritonclient"), tmp_path / "serve.txt")
    except SystemExit as e:
        assert "tritonclient" in str(e)
    else:
        raise AssertionError("a package without a pin was not refused")


def test_the_voice_carry_is_what_the_torch_profiles_read(exported_repository):
    files = gpu_lease.voice_files(exported_repository)
    names = {p.name for p in files}
    assert {"weights.safetensors", "voice.json", "loudness.json", ".export-manifest.json"} <= names
    assert not any(p.suffix == ".onnx" for p in files) and all(p.exists() for p in files)


def test_every_command_of_the_device_script_exists_with_its_flags():
    script = (ROOT / "tts_tools/gpu_lease.sh").read_text()
    commands = re.findall(r"python -m ([\w.]+)([^|\n]*)", script)
    modules = {module for module, _ in commands}
    assert {"bench.gpu_dlpack", "pytest", "perf_analyzer_configs.run"} <= modules
    for module, rest in commands:
        if module == "pytest":
            continue
        helped = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert helped.returncode == 0, (module, helped.stderr[-500:])
        for flag in (a for a in shlex.split(rest.replace('"', "")) if a.startswith("--")):
            assert flag in helped.stdout, (module, flag)
    for path in re.findall(r"tests/[\w/]+\.py", script):
        assert (ROOT / path).exists(), path
    bash = subprocess.run(["bash", "-n", str(ROOT / "tts_tools/gpu_lease.sh")], capture_output=True)
    assert bash.returncode == 0, bash.stderr
