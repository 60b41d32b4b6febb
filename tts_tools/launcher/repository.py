"""What the launcher reads from the model repository it serves."""

from __future__ import annotations

from pathlib import Path

from tts_serving.voices import voice_names


def repository_voices(repository: Path) -> list[str]:
    """The voices the repository's ``acoustic`` model serves, default first (its
    ``voices.json``, written by ``python -m export``); empty before the voice is exported."""
    version = Path(repository) / "acoustic" / "1"
    try:
        return voice_names(version)
    except (OSError, ValueError):
        return []
