"""Several voices in one model: the layout ``python -m export`` writes, and picking one.

A model's version folder holds the default voice (``voice.json``, and ``model.onnx`` /
``loudness.json`` where the model needs them) and ``voices.json``, the ordered list of voice
names (the first is the default). Every other voice has ``voices/<name>/voice.json`` and its own
``model.onnx`` / ``loudness.json`` only when its graph differs from the default's: a voice that
is the same network with other defaults (a slower ``length_scale``) shares the default's files,
and the models share its ONNX Runtime session, so its requests batch with the default's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from piper.config import PiperConfig

from .errors import InvalidInputError, ModelConfigError


def load_voice_config(path: str | Path) -> PiperConfig:
    """Read a Piper ``.onnx.json`` voice config."""
    with open(path, encoding="utf-8") as f:
        return PiperConfig.from_dict(json.load(f))


INDEX = "voices.json"
FOLDER = "voices"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
T = TypeVar("T")


def exported(path: Path) -> Path:
    """``path``, or a ModelConfigError saying how to make it (a build output of the export)."""
    if not path.exists():
        raise ModelConfigError(
            f"{path} is missing: run `make export` (python -m export) to generate it"
        )
    return path


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise ValueError(
            f"voice name {name!r}: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class VoiceFiles:
    """One voice of a model: its name, config and where its files are."""

    name: str
    config: PiperConfig
    folder: Path  # its own folder (the version folder for the default voice)
    default_folder: Path

    def file(self, name: str) -> Path:
        """Its own copy of ``name`` if it has one, else the default voice's."""
        own = self.folder / name
        return exported(own if own.exists() else self.default_folder / name)


def voice_names(version_folder: Path) -> list[str]:
    """The names in ``voices.json``, default first; one voice named by its dataset without it."""
    index = version_folder / INDEX
    if not index.exists():
        data = json.loads((version_folder / "voice.json").read_text(encoding="utf-8"))
        return [str(data.get("dataset") or "default")]
    names = json.loads(index.read_text(encoding="utf-8")).get("voices")
    if not isinstance(names, list) or not names or len(set(names)) != len(names):
        raise ModelConfigError(f"{index}: 'voices' must be a list of distinct names")
    try:
        return [check_name(str(n)) for n in names]
    except ValueError as e:
        raise ModelConfigError(f"{index}: {e}") from None


def discover(version_folder: Path) -> list[VoiceFiles]:
    """Every voice of the model in ``version_folder``, default first."""
    names = voice_names(version_folder)
    voices = [VoiceFiles(names[0], load_voice_config(version_folder / "voice.json"),
                         version_folder, version_folder)]  # fmt: skip
    for name in names[1:]:
        folder = version_folder / FOLDER / name
        config = folder / "voice.json"
        if not config.exists():
            raise ModelConfigError(f"voice {name!r} is listed in {INDEX} but {config} is missing")
        voices.append(VoiceFiles(name, load_voice_config(config), folder, version_folder))
    return voices


class VoiceTable(Generic[T]):
    """Name -> what a model built for that voice; ``pick`` turns a request's name into it."""

    def __init__(self, voices: list[VoiceFiles], build: Callable[[VoiceFiles], T]) -> None:
        self.items: dict[str, T] = {v.name: build(v) for v in voices}
        self.configs: dict[str, PiperConfig] = {v.name: v.config for v in voices}
        self.default = voices[0].name
        # In the order of voices.json, the same in every stage: an SSML document's segments
        # name their voice by this index between the stages.
        self.names: tuple[str, ...] = tuple(self.items)
        self._index = {name: i for i, name in enumerate(self.names)}

    def index(self, name: str) -> int:
        """The position of a voice (known to be loaded) in ``names``."""
        return self._index[name]

    def pick(self, name: str | None) -> tuple[str, T]:
        """The named voice (None or empty: the default), or InvalidInputError listing them."""
        name = name or self.default
        if name not in self.items:
            raise InvalidInputError(f"unknown voice {name!r}; voices: {', '.join(self.items)}")
        return name, self.items[name]

    def speaker(self, voice: str, speaker: str | None) -> int:
        """The id of ``speaker`` of the (loaded) ``voice``: see :func:`speaker_id`."""
        return speaker_id(self.configs[voice], voice, speaker)

    def speakers_by_index(self, voice: str, speaker: str | None) -> list[int]:
        """Each voice's speaker id (by its index in ``names``) for a request to ``voice`` with
        ``speaker``: that speaker for ``voice``'s spans, the first for another voice's (an SSML
        document's ``<voice>``)."""
        own = self.speaker(voice, speaker)
        return [own if name == voice else 0 for name in self.names]

    def __iter__(self) -> Iterator[tuple[str, T]]:
        return iter(self.items.items())


def speakers(config: PiperConfig) -> list[str]:
    """A voice's speaker names in id order (ids as names where its config names none); one
    empty list for a single-speaker voice."""
    if config.num_speakers <= 1:
        return []
    names = {i: str(i) for i in range(config.num_speakers)}
    for name, i in config.speaker_id_map.items():
        if 0 <= i < config.num_speakers:
            names[i] = name
    return [names[i] for i in range(config.num_speakers)]


def speaker_number(speaker: str, count: int) -> int | None:
    """``speaker`` read as an id 0..``count``-1, or None: ASCII digits only ("²" is a digit
    to str.isdigit, not to int), and few of them."""
    if speaker.isascii() and speaker.isdigit() and len(speaker) <= 9 and int(speaker) < count:
        return int(speaker)
    return None


def speaker_id(config: PiperConfig, voice: str, speaker: str | None) -> int:
    """The id of a request's ``speaker`` (a name of the voice's ``speaker_id_map`` or an id
    0..N-1; None or empty: its first, 0), or InvalidInputError saying what it has."""
    speaker = (speaker or "").strip()
    if not speaker:
        return 0
    if config.num_speakers <= 1:
        raise InvalidInputError(
            f"voice {voice!r} has one speaker: leave speaker empty (got {speaker[:64]!r})"
        )
    if speaker in config.speaker_id_map:
        return int(config.speaker_id_map[speaker])
    number = speaker_number(speaker, config.num_speakers)
    if number is not None:
        return number
    names = speakers(config)
    shown = ", ".join(names[:20]) + (f" ... ({len(names)} in all)" if len(names) > 20 else "")
    raise InvalidInputError(
        f"unknown speaker {speaker[:64]!r} of voice {voice!r}; its speakers: {shown} "
        f"(or an id 0..{config.num_speakers - 1})"
    )


def decode_name(raw: bytes | str | None, input_name: str = "voice") -> str | None:
    """A request's ``voice`` or ``speaker`` input (UTF-8 bytes) as a name, None when absent or
    empty."""
    if raw is None:
        return None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"{input_name} is not valid UTF-8") from None
    return raw.strip() or None
