"""English text normalization for speech (splitting is tts_wire.split, shared with the client)."""

from .normalize import normalize
from .numbers import cardinal, ordinal

__all__ = ["cardinal", "normalize", "ordinal"]
