#!/usr/bin/env bash
# Inside the NGC Triton image: install the Python deps once, export the voice, then run the
# project's launcher (python -m tts_tools.server, as `make serve` does) on the image's own
# tritonserver (TTS_TRITON_HOME): the admin key kept out of the command line, the front door,
# the supervisor that heals dead stubs, restarts with backoff and the drain on SIGTERM. It
# serves the gpu profile (model_repository/*/configs/gpu.pbtxt; TTS_PROFILE overrides, none:
# every model's config.pbtxt). The gateway runs in its own service (docker-compose.yml).
set -euo pipefail
cd "${TTS_WORKSPACE:-/workspace}"
marker="${TTS_INSTALLED_MARKER:-/opt/tts/.installed}"  # the deps are installed once per container
if [ ! -f "$marker" ]; then
  # The launcher builds a small preloaded library (tts_tools/launcher/server_shim.c).
  command -v cc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc >/dev/null; }
  pip install -q -r docker/requirements-gpu.txt
  pip install -q --no-deps piper-tts==1.8.0
  pip install -q --no-deps -e wire -e client -e .
  mkdir -p "$(dirname "$marker")" && touch "$marker"
fi
python3 -m export --repository model_repository
export TTS_TRITON_HOME="${TTS_TRITON_HOME:-/opt/tritonserver}"
# The admin key: $TTS_ADMIN_KEY or the file $TTS_ADMIN_KEY_FILE (the launcher reads both);
# with neither the admin APIs are refused to all.
profile="${TTS_PROFILE:-gpu}"
profile_args=()
if [ "$profile" != "none" ]; then profile_args=(--model-config-name="$profile"); fi
exec python3 -m tts_tools.server --model-repository=model_repository \
  --bind="${BIND:-0.0.0.0}" --http-port=8000 --grpc-port=8001 --metrics-port=8002 \
  --supervisor-metrics-port=8003 --gateway-port=0 --cache-dir=/tmp/tts-cache \
  "${profile_args[@]}" "$@"
