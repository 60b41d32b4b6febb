"""Which tritonserver runs, with what: by default the one in the nvidia-pytriton wheel (its
binary, the Python-backend stub for this interpreter, its libraries); with ``TTS_TRITON_HOME``
an installed Triton such as ``/opt/tritonserver`` in NVIDIA's images (its own binary and
backends). Also the shim that hands tritonserver the admin key.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from tts_front.security import EDGE_KEY_ENV, GATEWAY_EDGE_KEY_ENV, INNER_KEY_ENV
from tts_serving.engines.cpu_share import SERVICE_PID_ENV

PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


TRITON_HOME_ENV = "TTS_TRITON_HOME"


def triton_home(environ: dict[str, str] | None = None) -> Path | None:
    """An installed Triton (``bin/tritonserver``, ``backends/``) named by TTS_TRITON_HOME, or
    None for the wheel's."""
    home = (os.environ if environ is None else environ).get(TRITON_HOME_ENV)
    if not home:
        return None
    path = Path(home)
    for part in ("bin/tritonserver", "backends/python"):
        if not (path / part).exists():
            raise SystemExit(f"{TRITON_HOME_ENV}={home} has no {part}: not a Triton installation")
    return path


def pytriton_dir() -> Path:
    # Found without importing pytriton: its __init__ pulls in its Python API's dependencies,
    # which a server-only environment (the GPU bundle) does not install.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nvidia-pytriton is not installed (it ships tritonserver)")
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def tritonserver_binary() -> Path:
    home = triton_home()
    return (home or pytriton_dir()) / "bin" / "tritonserver"


def prepare_backends(cache_dir: Path) -> Path:
    """A backend directory whose python backend uses this interpreter's stub (idempotent); an
    installed Triton's own (its stub is built for the image's Python)."""
    home = triton_home()
    if home is not None:
        return home / "backends"
    src = pytriton_dir()
    stub = src / "python_backend_stubs" / PY_VERSION / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"nvidia-pytriton has no Python backend stub for Python {PY_VERSION}")
    backends = Path(cache_dir) / f"backends-py{PY_VERSION}"
    marker = backends / "python" / "triton_python_backend_stub"

    def current() -> bool:
        return marker.exists() and marker.stat().st_size == stub.stat().st_size

    if current():
        return backends
    # Made aside and renamed into place under a lock: several servers start at once (make
    # test's workers, a benchmark beside make serve). Without the lock one set aside, as
    # stale, the copy another had just put in place, and a third found none.
    backends.parent.mkdir(parents=True, exist_ok=True)
    with open(backends.parent / f".{backends.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not current():
            staging = Path(tempfile.mkdtemp(prefix=f".{backends.name}-", dir=backends.parent))
            # mkdtemp's 0700 would keep it to its maker: an image lays it out as root for
            # the user it runs as.
            staging.chmod(0o755)
            try:
                shutil.copytree(src / "backends" / "python", staging / "python")
                shutil.copy2(stub, staging / "python" / "triton_python_backend_stub")
                if backends.exists():  # another pytriton's stub: set aside, then removed
                    stale = staging.with_name(staging.name + "-stale")
                    backends.rename(stale)
                    shutil.rmtree(stale, ignore_errors=True)
                staging.rename(backends)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    if not current():
        raise RuntimeError(f"could not lay out the Python backend in {backends}")
    return backends


SHIM_SOURCE = Path(__file__).with_name("server_shim.c")
KEY_PLACEHOLDER = "tts-admin-key-hidden"  # what /proc/PID/cmdline shows; see server_shim.c
KEY_ENV = "TTS_TRITON_ADMIN_KEY"
INNER_PLACEHOLDER = "tts-inner-key-hidden"  # the same for the inner key
INNER_ENV = "TTS_TRITON_INNER_KEY"


def server_shim(cache_dir: Path) -> Path:
    """``server_shim.c`` built into ``cache_dir`` (rebuilt when the source changes)."""
    source = SHIM_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    library = Path(cache_dir) / f"libtts_server_shim-{digest}.so"
    if not library.exists():
        compiler = shutil.which(os.environ.get("CC", "cc"))
        if compiler is None:
            raise SystemExit(
                "no C compiler (cc) to build tts_launcher/server_shim.c, which keeps the "
                "admin key out of tritonserver's command line: run `make system-deps` (installs "
                "gcc)"
            )
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        flags = ["-shared", "-fPIC", "-O2", "-Wall"]
        subprocess.run([compiler, *flags, "-o", str(partial), str(SHIM_SOURCE), "-ldl"], check=True)
        partial.replace(library)
    return library


SYSTEM_LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")


def system_library_dir(path: str) -> bool:
    """A folder the dynamic loader searches without LD_LIBRARY_PATH (multiarch ones too)."""
    found = Path(path).resolve()
    system = {Path(d).resolve() for d in SYSTEM_LIBRARY_DIRS}
    return found in system or (found.parent in system and found.name.endswith("-linux-gnu"))


def quiet_grpc(environ: dict[str, str] | os._Environ) -> None:
    """gRPC's own log at errors only, unless the user chose a level: at its default the gateway
    wrote "Got goaway ... connection idle" each time the front door closed an idle connection
    (a planned event: the next call opens another)."""
    environ.setdefault("GRPC_VERBOSITY", "ERROR")


def server_env(
    base: dict[str, str] | None = None,
    key: str | None = None,
    cache_dir: Path | None = None,
    inner_key: str | None = None,
) -> dict[str, str]:
    """tritonserver's environment; with ``key`` (and ``inner_key``), the shim that hands it
    the keys (server_shim.c)."""
    env = dict(os.environ if base is None else base)
    # The stages tell this service's CPU from other processes' by this tree (cpu_share.py).
    env.setdefault(SERVICE_PID_ENV, str(os.getpid()))
    for secret in (INNER_KEY_ENV, EDGE_KEY_ENV, GATEWAY_EDGE_KEY_ENV):  # not for Triton's stubs
        env.pop(secret, None)
    if key is not None:
        env[KEY_ENV] = key
        if inner_key:
            env[INNER_ENV] = inner_key
        env["LD_PRELOAD"] = str(server_shim(cache_dir or Path(".cache/triton")).resolve())
    # The stub needs this Python's libpython. A system Python's LIBDIR is where the loader
    # looks anyway, and first on the path it put that folder's libraries (an older cuDNN on
    # Ubuntu's, in the NGC image) before torch's own.
    libdir = sysconfig.get_config_var("LIBDIR")
    ld = [] if not libdir or system_library_dir(libdir) else [libdir]
    if triton_home() is None:  # the wheel's tritonserver needs the wheel's libraries
        ld.append(str(Path(pytriton_dir()).parent.parent / "nvidia_pytriton.libs"))
    if env.get("LD_LIBRARY_PATH"):
        ld.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
    # The stub finds this environment's packages through the python on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # PYTHONPATH pointing at site-packages instead of the PATH route gave empty outputs once.
    env.pop("PYTHONPATH", None)
    return env


def has_gpu() -> bool:
    """An NVIDIA driver is present (its device node), so CUDA may be used."""
    return Path("/dev/nvidiactl").exists()


# On a machine without a GPU, Triton still probes NVML and DCGM for GPU metrics and logs both
# failures; this flag stops that probe. The CUDA lines that remain are harmless (README).
CPU_ONLY_ARGS = ("--allow-gpu-metrics=false",)

# Triton's CUDA memory pool per GPU (its default: 64 MiB). The Python backend hands GPU tensors
# between stages through it, and a stub's copy that finds it full fails while the response
# goes on unwritten (docs/gpu.md): it must hold what is in flight at full load. A later
# --cuda-memory-pool-byte-size in the server's extra arguments overrides it.
CUDA_POOL_BYTES = 2 << 30


def gpu_ids(dev: Path = Path("/dev")) -> list[int]:
    """The NVIDIA GPUs' ordinals, from their device nodes (/dev/nvidia0, ...)."""
    return sorted(
        int(node.name[len("nvidia") :])
        for node in dev.glob("nvidia[0-9]*")
        if node.name[len("nvidia") :].isdigit()
    )


def gpu_args(dev: Path = Path("/dev")) -> list[str]:
    """tritonserver's flags on a machine with GPUs: a CUDA pool of CUDA_POOL_BYTES each."""
    return [f"--cuda-memory-pool-byte-size={i}:{CUDA_POOL_BYTES}" for i in gpu_ids(dev)]


# Closed by default: what changes the server or reaches into its memory needs the admin key,
# sent as this header; inference, health and model metadata stay open. Two read-only APIs stay
# open by default too: model configuration (clients read the sample rate from the tts config)
# and statistics (perf_analyzer reads them and cannot send a header over gRPC); an operator
# who does not need them closes them with --restricted-apis (docs/operations.md, Security).
