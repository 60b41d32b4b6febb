"""The install sets: what `make serve` installs is enough to serve, and holds no torch, no test
or benchmark tools; every file pins the same versions."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.support.paths import ROOT
from tests.support.requirements import ALL, norm, pins

SERVE = pins(ROOT / "requirements/serve.txt")
TORCH = pins(ROOT / "requirements/torch.txt")
TEST_TOOLS = {"pytest", "hypothesis", "ruff", "selenium", "faster-whisper", "matplotlib", "jiwer"}


def test_the_server_set_is_lean_and_every_file_pins_the_same_versions():
    assert SERVE.keys() <= ALL.keys() and TORCH.keys() <= ALL.keys()
    assert not SERVE.keys() & TORCH.keys()
    assert "torch" in TORCH and "torch" not in SERVE
    assert not TEST_TOOLS & SERVE.keys(), TEST_TOOLS & SERVE.keys()


# What `make serve` runs, imported as it runs them (the stages under the tests' fake pb_utils),
# with torch made unimportable: the CPU default must never need it.
SERVE_IMPORTS = """
import sys
sys.modules["torch"] = None
from tests.support import pb_utils
pb_utils.install()
import export.__main__, export.build, export.torch_weights
import tts_launcher.server, tts_front, tts_launcher.children, tts_triton.probes
import tts_gateway.__main__, tts_gateway.app
import tts_serving.triton.phonemizer, tts_serving.triton.acoustic
import tts_serving.triton.vocoder, tts_serving.triton.tts_stream
import tts_serving.engines.onnx, tts_serving.engines.models
import tts_serving.model_config, tritonclient.grpc, tritonclient.http
import google.protobuf.text_format, tritonclient.grpc.model_config_pb2
import tts_client, tts_client.aio, soundfile
import json
print(json.dumps(sorted({m.split(".")[0] for m in list(sys.modules) if sys.modules[m]})))
"""


def test_everything_make_serve_imports_is_in_its_set_and_needs_no_torch():
    from importlib.metadata import packages_distributions

    result = subprocess.run(
        [sys.executable, "-c", SERVE_IMPORTS], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    modules = json.loads(result.stdout.splitlines()[-1])
    ours = {"tts-serving", "tts-client"}
    # Imported only when present: setuptools' startup hook (every venv has it), and sniffio,
    # which anyio tries (`except ModuleNotFoundError`) if the dev set brought it.
    ours |= {"setuptools", "pip", "sniffio"}
    distributions = packages_distributions()
    needed = {norm(d) for m in modules for d in distributions.get(m, [])} - ours
    assert needed, "no third-party distribution found: the check would pass for nothing"
    assert needed <= SERVE.keys(), sorted(needed - SERVE.keys())


def make(*args: str) -> str:
    result = subprocess.run(
        ["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_alone_prints_help_and_make_serve_runs_no_apt_get():
    assert "make serve" in make() and "make test" in make()  # the default goal is help
    for profile in ("", "PROFILE=gpu"):
        plan = make("-n", "-B", "serve", *([profile] if profile else []))
        # (its hint names the command; it never runs it)
        assert "apt-get update" not in plan and "apt-install" not in plan, plan
        assert "-r requirements/serve.txt" in plan
        assert ("-r requirements/torch.txt" in plan) == bool(profile), plan
        assert "-r requirements.txt" not in plan
    assert "apt-get update" in make("-n", "-B", "system-deps")  # the explicit target does


def test_make_help_names_every_target_the_docs_name():
    """A newcomer reads `make X` in the README or docs/ and looks for X in `make`'s help."""
    named = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named |= set(re.findall(r"\bmake ([a-z][a-z0-9-]+)\b", doc.read_text()))
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))
    named &= targets  # "make the ..." in prose is no target
    assert named, "no make target found in the docs: the check would pass for nothing"
    shown = make()
    missing = {t for t in named if not re.search(rf"make ([a-z|-]+ )*{t}(?![a-z-])|{t}\|", shown)}
    missing -= {t for t in named if f"image-{t.split('-')[-1]}" == t and "image-cpu|gpu" in shown}
    assert not missing, f"make help does not name: {sorted(missing)}"


def test_the_built_wheels_alone_start_every_entry_point(tmp_path):
    """The server's wheel (and the client's, which carries the wire contract) unpacked into a
    fresh environment that has the pinned dependencies but not the checkout: each command
    the image and `make serve` run imports and answers --help. The wheel once listed its
    packages by hand and left out tts_front, tts_triton and export, which the launcher
    imports: it worked only from the checkout."""
    import shutil
    import site
    import zipfile

    # Built from a copy of the sources (every package folder at the top, and the client): a
    # build in the checkout reuses its build/ folder, which may hold what the list left out.
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for folder in ROOT.iterdir():
        if (folder / "__init__.py").exists() and folder.name not in ("tests", "bench"):
            shutil.copytree(folder, source / folder.name, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copytree(ROOT / "client", source / "client", ignore=skip)
    shutil.copytree(ROOT / "wire", source / "wire", ignore=skip)
    wheels = tmp_path / "wheels"
    for project in (source, source / "client"):
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "--disable-pip-version-check", "-w", str(wheels), str(project)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    packages = next(fresh.glob("lib/python*/site-packages"))
    for wheel in wheels.glob("*.whl"):
        zipfile.ZipFile(wheel).extractall(packages)
    # The dependencies from this environment's site-packages as a plain path: its .pth files
    # (the editable installs that point at the checkout) are not read from there.
    (packages / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = fresh / "bin" / "python"
    where = subprocess.run(
        [python, "-c", "import tts_launcher, tts_front, tts_client; "
         "print(tts_launcher.__file__, tts_front.__file__, tts_client.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert str(ROOT) not in where.stdout and str(packages) in where.stdout, where.stdout
    for module in ("tts_launcher", "tts_front", "tts_gateway", "export"):
        helped = subprocess.run(
            [python, "-m", module, "--help"], capture_output=True, text=True, cwd=tmp_path,
            timeout=120,
        )  # fmt: skip
        assert helped.returncode == 0 and "usage" in helped.stdout.lower(), (
            module, helped.stdout[-500:], helped.stderr[-2000:],
        )  # fmt: skip
