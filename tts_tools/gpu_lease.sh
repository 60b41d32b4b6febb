#!/bin/bash
# On a lent GPU machine (the device tool; docs/gpu.md): lays out what
# `python -m tts_tools.gpu_lease build` made and runs the GPU checks, each step to its end,
# its output under $OUT. Steps, in the order to run them, several per call:
#   voice            the exported voice's files into model_repository/ (carry .carry/voice.tar.xz)
#   site             a venv of the image's python: its torch, the carried packages, the project
#                    (carry .carry/site.tar.xz)
#   dlpack           gpu-dlpack's answers against gpu's at c=256 (python -m bench.gpu_dlpack)
#   tests            pytest -m gpu: tests/adapter/test_gpu.py, tests/integration/test_gpu_serving.py
#   perf PROFILE...  perf_analyzer on tts at c=1..256 per profile (the last step of a call)
set -u
export PYTHONUNBUFFERED=1
V=/tmp/gpu-lease-venv
OUT=${OUT:-/tmp/gpu-lease-out}
mkdir -p "$OUT"
IMAGE_PYTHON=$(command -v python3)
export PATH=$V/bin:$PATH LD_LIBRARY_PATH=/tmp/gpu-lease-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# tritonserver processes left by a step that ran out of time ([t]: not this script's own line)
stop_servers() { pkill -f '[t]ritonserver/bin/tritonserver'; sleep 1; }
step() { stop_servers; echo "== $(date +%T) $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
  voice)
    step "machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$IMAGE_PYTHON" -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"
    step "voice files"
    "$IMAGE_PYTHON" -c "import tarfile; tarfile.open('.carry/voice.tar.xz').extractall('.', filter='data')"
    ls model_repository/*/1/
    ;;
  site)
    step "venv"
    rm -rf $V && "$IMAGE_PYTHON" -m venv --without-pip $V || exit 1
    SP=$($V/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$IMAGE_PYTHON" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" > "$SP/image.pth"
    printf '%s\n' "$PWD" "$PWD/wire" "$PWD/client" > "$SP/project.pth"
    $V/bin/python -c "import tarfile; tarfile.open('.carry/site.tar.xz').extractall('$SP', filter='data')" || exit 1
    mv "$SP/bin/perf_analyzer" $V/bin/
    chmod +x $V/bin/perf_analyzer "$SP"/pytriton/tritonserver/bin/* "$SP"/pytriton/tritonserver/python_backend_stubs/*/*
    # perf_analyzer links libb64.so.0d; pytriton carries a copy under another name
    mkdir -p /tmp/gpu-lease-lib && cp "$SP"/nvidia_pytriton.libs/libb64-*.so.0d /tmp/gpu-lease-lib/libb64.so.0d
    # The voice was exported here, not there: the tests' export fixture finds it current.
    printf 'import export.__main__ as m\nm.main = lambda argv=None: 0\n' > /tmp/gpu_lease_plugin.py
    $V/bin/python -c "import numpy, torch, tritonclient.grpc, piper, tts_wire, tts_serving.settings; print('numpy', numpy.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
    ;;
  dlpack)
    step "gpu-dlpack against gpu at c=256"
    timeout 300 python -m bench.gpu_dlpack --profiles gpu gpu-dlpack --concurrency 256 --requests 1024 2>&1 | tee "$OUT/dlpack.log"
    ;;
  tests)
    step "pytest -m gpu"
    PYTHONPATH=/tmp timeout 400 python -m pytest -q -s -p gpu_lease_plugin -m gpu tests/adapter/test_gpu.py tests/integration/test_gpu_serving.py 2>&1 | tail -60 | tee "$OUT/tests.log"
    ;;
  perf)
    shift
    for profile in "$@"; do
      step "perf_analyzer $profile"
      timeout 280 python -m perf_analyzer_configs.run --profile "$profile" --models tts --protocols grpc --concurrency 1 16 64 128 256 --request-count 500 --out "$OUT/perf-$profile" 2>&1 | tail -15 | tee "$OUT/perf-$profile.log"
    done
    break
    ;;
  *)
    echo "unknown step $1"; exit 2
    ;;
  esac
  shift
done
stop_servers
