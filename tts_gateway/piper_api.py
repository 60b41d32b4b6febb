"""Piper's own HTTP API (``python -m piper.http_server``, piper-tts 1.8) on the gateway, batched
like every other route: a client written for Piper's server works by changing its URL.

- ``POST /synthesize`` (and ``POST /``, where Piper's servers before 1.8 took it, and where
  Pipecat's ``PiperHttpTTSService`` posts to the base URL it is given): a JSON object
  ``{"text", "voice", "speaker", "speaker_id", "length_scale", "noise_scale",
  "noise_w_scale"}``, answered ``audio/wav`` at the voice's rate, 16-bit mono, streamed as it is
  made (a long text through ``tts_stream``).
- ``GET /voices``: each voice by the name a request gives it, with its Piper config.
- ``GET /info``: the default voice (``last`` is always null: on a shared server the last text
  synthesized is another user's).
- ``GET /all-voices``, ``POST /download``: Piper's downloads from the internet; refused with a
  message that says how voices are added here.

The fields map onto this project's options: ``length_scale`` is the voice's own
``length_scale`` over the speed (Piper's length scale replaces the voice's), the noise scales
are the request's, ``speaker_id`` (or ``speaker``) picks one speaker of a multi-speaker voice.
Where Piper falls back to the default voice or speaker for a name it does not know, this answers
400 naming the ones served, as the OpenAI route does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

from fastapi import FastAPI, Request

from tts_wire import MAX_SPEED, MIN_SPEED

from .errors import APIError, bad_request
from .service import SpeechJob, SpeechService
from .settings import GatewaySettings, Voice

log = logging.getLogger("tts_gateway")

FIELDS = ("text", "voice", "speaker", "speaker_id", "length_scale", "noise_scale", "noise_w_scale")
# Piper's docstring names the width noise so; its code reads noise_w_scale. Either is taken.
ALIASES = {"length_w_scale": "noise_w_scale"}
VOICE_INDEX = "voices.json"


def voice_configs(folder: str | Path) -> dict[str, dict]:
    """Each voice's Piper config by its name, from a repository's phonemizer version folder
    (``voices.json``: the names, default first; ``voice.json``, ``voices/<name>/voice.json``)."""
    root = Path(folder)
    try:
        names = json.loads((root / VOICE_INDEX).read_text(encoding="utf-8"))["voices"]
    except FileNotFoundError:
        config = json.loads((root / "voice.json").read_text(encoding="utf-8"))
        return {str(config.get("dataset") or "default"): config}
    configs = {}
    for k, name in enumerate(names):
        path = root / "voice.json" if k == 0 else root / "voices" / name / "voice.json"
        configs[name] = json.loads(path.read_text(encoding="utf-8"))
    return configs


def model_id(config: dict) -> str | None:
    """The name Piper's server knows a voice by, its file's (``en_US-joe-medium``)."""
    code = (config.get("language") or {}).get("code")
    dataset, quality = config.get("dataset"), (config.get("audio") or {}).get("quality")
    return f"{code}-{dataset}-{quality}" if code and dataset and quality else None


class PiperVoices:
    """The voices as Piper's API shows and names them."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.names = settings.voice_names()
        self.voices = settings.voices
        self.default = settings.voices[0]
        self.configs: dict[str, dict] = {}
        if settings.voice_configs:
            try:
                self.configs = voice_configs(settings.voice_configs)
            except (OSError, ValueError, KeyError, TypeError) as e:
                # Speech does not need them: /voices then lists what the voice table knows.
                log.warning("Piper's API: no voice configs from %s (%s)", settings.voice_configs, e)
        # A Piper model id names the first repository voice made from that file (the others
        # made from it are variants with defaults of their own: joe_slow of joe).
        self.aliases: dict[str, str] = {}
        for name, config in self.configs.items():
            if (found := model_id(config)) and found not in self.names:
                self.aliases.setdefault(found, name)

    def config(self, voice: Voice) -> dict:
        """A voice's Piper config: the repository's file, else what the voice table knows."""
        name = voice.model_voice or next(iter(self.configs), None)
        if name in self.configs:
            return self.configs[name]
        return {
            "dataset": voice.id,
            "espeak": {"voice": voice.language},
            "num_speakers": 1,
            **({"speaker_id_map": {voice.speaker: 0}} if voice.speaker else {}),
        }

    def find(self, name: object) -> Voice:
        if name is None:
            return self.default
        if not isinstance(name, str):
            raise bad_request(f"voice must be a string, got {name!r}", param="voice")
        voice = self.names.get(self.aliases.get(name, name))
        if voice is None:
            known = ", ".join([*self.listing(), *self.aliases])
            raise APIError(
                400, f"unknown voice {name!r}; voices: {known}", param="voice",
                code="voice_not_found",
            )  # fmt: skip
        return voice

    def listing(self) -> dict[str, dict]:
        """``GET /voices``: each voice by the name a request gives it (its id)."""
        return {v.id: self.config(v) for v in self.voices}


def _number(data: dict, name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"{name} must be a finite number, got {value!r}", param=name)
    return float(value)


def parse(body: bytes) -> dict:
    """The request's fields, or the 400 that says what is wrong with them."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad_request(f"the body is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise bad_request('the body must be a JSON object: {"text": "Text to speak."}')
    data = {ALIASES.get(k, k): v for k, v in data.items()}
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise bad_request(f"unknown field(s) {', '.join(unknown)}; fields: {', '.join(FIELDS)}")
    text = data.get("text")
    if not isinstance(text, str) or not text.strip():
        raise bad_request("No text provided: send the text to speak as 'text'", param="text")
    return data


def job_for(data: dict, voices: PiperVoices, settings: GatewaySettings, formats, client: str):
    """The speech job for a Piper request (``parse``'d)."""
    text = data["text"].strip()
    if len(text) > settings.max_input_chars:
        raise bad_request(
            f"text is {len(text)} characters, over this server's limit of "
            f"{settings.max_input_chars} (TTS_GATEWAY_MAX_INPUT_CHARS)",
            param="text",
        )
    voice = voices.find(data.get("voice"))
    base = voices.config(voice).get("inference", {}).get("length_scale", 1.0)
    length_scale = _number(data, "length_scale")
    speed = 1.0
    if length_scale is not None:
        if length_scale <= 0:
            raise bad_request(f"length_scale must be above 0, got {length_scale}", "length_scale")
        speed = base / length_scale
        if not MIN_SPEED <= speed * voice.speed <= MAX_SPEED:
            raise bad_request(
                f"length_scale must be between {base / MAX_SPEED:g} and {base / MIN_SPEED:g} "
                f"for voice {voice.id!r} (its own is {base:g}), got {length_scale:g}",
                param="length_scale",
            )
    speaker = data.get("speaker_id", data.get("speaker"))
    if speaker is not None and (isinstance(speaker, bool) or not isinstance(speaker, str | int)):
        raise bad_request(f"speaker_id must be a number or a name, got {speaker!r}", "speaker_id")
    if speaker == 0 and voices.config(voice).get("num_speakers") == 1:
        speaker = None  # the one speaker a single-speaker voice has (Piper's clients send it)
    try:
        options = voice.options(speed, caller=client or None)
        noise = {
            field: value
            for field, name in (("noise_scale", "noise_scale"), ("noise_w", "noise_w_scale"))
            if (value := _number(data, name)) is not None
        }
        if speaker is not None:
            noise["speaker"] = str(speaker)
        options = dataclasses.replace(options, **noise)
    except ValueError as e:
        raise bad_request(str(e).replace("noise_w ", "noise_w_scale ")) from None
    return SpeechJob(text, options, formats["wav"], len(text) > settings.direct_max_chars, client)


def piper_routes(
    app: FastAPI, settings: GatewaySettings, service: SpeechService, formats, caller
) -> None:
    """Piper's HTTP API on ``app`` (``caller``: the request's caller, as the front door names)."""
    voices = PiperVoices(settings)

    async def synthesize(http: Request):
        try:
            job = job_for(parse(await http.body()), voices, settings, formats, caller(http))
        except APIError as e:
            raise service.refused(e, "wav") from None
        return service.response(await service.open(job), sse=False)

    app.post("/synthesize", include_in_schema=False)(synthesize)
    app.post("/", include_in_schema=False)(synthesize)

    @app.get("/voices", include_in_schema=False)
    async def piper_voices() -> dict:
        return voices.listing()

    @app.get("/info", include_in_schema=False)
    async def piper_info() -> dict:
        config = voices.config(voices.default)
        return {
            "voice": {
                "name": voices.default.id,
                "language": (config.get("espeak") or {}).get("voice", voices.default.language),
                "num_speakers": config.get("num_speakers", 1),
            },
            "last": None,  # another user's text on a shared server
        }

    async def downloads(http: Request):
        raise APIError(
            501,
            f"{http.url.path} downloads Piper voices from the internet, which this server does "
            "not do: voices are exported into its model repository (make serve VOICES=voices.json,"
            " docs/voices.md)",
            code="not_supported",
        )

    app.get("/all-voices", include_in_schema=False)(downloads)
    app.post("/download", include_in_schema=False)(downloads)
