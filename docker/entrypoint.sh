#!/usr/bin/env bash
# Inside the NGC Triton image: install the Python deps once, export the voice, serve the
# gpu profile (model_repository/*/configs/gpu.pbtxt: torch on CUDA; TTS_PROFILE overrides).
set -euo pipefail
cd /workspace
if [ ! -f /opt/tts/.installed ]; then
  pip install -q -r docker/requirements-gpu.txt
  pip install -q --no-deps piper-tts==1.8.0
  pip install -q --no-deps -e wire -e client -e .
  mkdir -p /opt/tts && touch /opt/tts/.installed
fi
python3 -m export --repository model_repository
# Closed by default, as `make serve`: the admin APIs need the tts-admin-key header with the key
# from $TTS_ADMIN_KEY or the file $TTS_ADMIN_KEY_FILE; with neither they are refused to all.
key="${TTS_ADMIN_KEY:-}"
if [ -z "$key" ] && [ -n "${TTS_ADMIN_KEY_FILE:-}" ]; then key="$(tr -d '[:space:]' < "$TTS_ADMIN_KEY_FILE")"; fi
if [ -z "$key" ]; then key="$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"; fi
restricted="model-repository,logging,trace,shared-memory"
bind="${BIND:-0.0.0.0}"  # inside the container; the compose file decides what is published
profile="${TTS_PROFILE:-gpu}"  # none: every model's config.pbtxt (ONNX Runtime)
profile_args=()
if [ "$profile" != "none" ]; then profile_args=(--model-config-name="$profile"); fi
exec tritonserver --model-repository=/workspace/model_repository \
  --http-address="$bind" --grpc-address="$bind" --metrics-address="$bind" \
  --http-restricted-api="$restricted:tts-admin-key=$key" \
  --grpc-restricted-protocol="$restricted:tts-admin-key=$key" \
  --http-port=8000 --grpc-port=8001 --metrics-port=8002 --strict-readiness=true \
  "${profile_args[@]}" "$@"
