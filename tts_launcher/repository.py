"""What the launcher reads from the model repository it serves."""

from __future__ import annotations

from pathlib import Path

from tts_serving.voices import discover, speakers, voice_names


def repository_voices(repository: Path) -> list[str]:
    """The voices the repository's ``acoustic`` model serves, default first (its
    ``voices.json``, written by ``python -m export``); empty before the voice is exported."""
    version = Path(repository) / "acoustic" / "1"
    try:
        return voice_names(version)
    except (OSError, ValueError):
        return []


def gateway_voices(repository: Path) -> str:
    """``name=language,...`` for the gateway's ``--triton-voices``: the phonemizer's voices,
    default first, each with its espeak-ng language (a multi-speaker voice once per speaker,
    ``name:speaker=language``); the names alone where it has none yet."""
    try:
        voices = discover(Path(repository) / "phonemizer" / "1")
    except (OSError, ValueError):  # (ModelConfigError is a ValueError)
        return ",".join(repository_voices(repository))
    return ",".join(
        f"{v.name}{f':{speaker}' if speaker else ''}={v.config.espeak_voice}"
        for v in voices
        for speaker in (speakers(v.config) or [""])
    )
