"""An OpenAI-compatible speech API in front of Triton (``python -m tts_gateway``; Python 3.11+)."""
