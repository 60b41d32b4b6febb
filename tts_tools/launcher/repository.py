"""What the launcher reads from the model repository it serves."""

from __future__ import annotations

from pathlib import Path

from tts_serving.errors import ModelConfigError
from tts_serving.voices import discover, voice_names


def repository_voices(repository: Path) -> list[str]:
    """The voices the repository's ``acoustic`` model serves, default first (its
    ``voices.json``, written by ``python -m export``); empty before the voice is exported."""
    version = Path(repository) / "acoustic" / "1"
    try:
        return voice_names(version)
    except (OSError, ValueError):
        return []


def gateway_voices(repository: Path) -> str:
    """``name=language,...`` for the gateway's ``--triton-voices``: the repository's voices,
    default first, each with its espeak-ng language (the phonemizer's voice configs)."""
    try:
        languages = {
            v.name: v.config.espeak_voice for v in discover(Path(repository) / "phonemizer" / "1")
        }
    except (OSError, ValueError, ModelConfigError):
        languages = {}
    return ",".join(
        f"{name}={languages[name]}" if name in languages else name
        for name in repository_voices(repository)
    )
