"""English text normalization and splitting for speech."""

from .normalize import normalize
from .numbers import cardinal, ordinal
from .split import split_text

__all__ = ["cardinal", "normalize", "ordinal", "split_text"]
