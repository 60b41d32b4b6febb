#!/usr/bin/env bash
# The OpenAI-compatible gateway in python:3.11-slim, in front of the triton service.
set -euo pipefail
cd /workspace
if [ ! -f /opt/tts/.installed ]; then
  pip install -q --no-deps -r docker/requirements-gateway.txt
  pip install -q --no-deps ./wire ./client
  mkdir -p /opt/tts && touch /opt/tts/.installed
fi
exec python -m tts_gateway "$@"
