#!/usr/bin/env bash
# Inside the NGC Triton image: install the Python deps once, export the voice, serve.
set -euo pipefail
cd /workspace
if [ ! -f /opt/tts/.installed ]; then
  pip install -q -r docker/requirements-gpu.txt
  pip install -q --no-deps piper-tts==1.8.0
  pip install -q --no-deps -e . -e client
  mkdir -p /opt/tts && touch /opt/tts/.installed
fi
python3 -m export --repository model_repository
exec tritonserver --model-repository=/workspace/model_repository \
  --http-port=8000 --grpc-port=8001 --metrics-port=8002 --strict-readiness=true "$@"
