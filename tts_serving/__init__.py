"""Shared server-side code for the TTS models in ``model_repository/``.

Each ``model.py`` is a thin adapter over this package, so the batching, validation and
inference logic is written once and unit-tested without a running server.
"""

from tts_wire import __version__

__all__ = ["__version__"]
