"""Gateway settings: one dataclass; each field is a ``--flag`` and a ``TTS_GATEWAY_*`` variable."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tts_wire import SHORT_TEXT_CHARS, SynthesisOptions
from tts_wire.settings import Setting, add_settings, build, settings_of

# OpenAI's model names, all served by the same Triton pipeline (there is one engine).
MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# Their dated snapshots ("tts-1-1106", "gpt-4o-mini-tts-2025-03-20") name the same engine too.
# "kokoro" too: Kokoro-FastAPI's clients send it, and they work here unchanged.
_SNAPSHOT = re.compile(r"^(tts-1-hd|tts-1|gpt-4o-mini-tts)(-\d{4}(-\d{2}-\d{2})?)?$|^kokoro$")


def known_model(name: str) -> bool:
    """One of MODELS or a dated snapshot of one."""
    return _SNAPSHOT.match(name) is not None


# OpenAI's voice names, each an alias of a voice this repository serves.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "cedar",
    "coral",
    "echo",
    "fable",
    "marin",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)


@dataclass(frozen=True)
class Voice:
    """A voice the gateway offers: its id, aliases, the Triton voice behind it and defaults.

    ``model_voice`` is the name the repository serves it under (``python -m export --voices``;
    None: the repository's first voice), ``speaker`` one speaker of a multi-speaker voice (a
    name of its speaker_id_map or an id; None: its first). ``speed`` multiplies the request's speed;
    ``noise_scale`` / ``noise_w`` (None: the voice's own) set the variation of timbre and
    timing (0 and 0: the same audio for the same text).
    """

    id: str
    description: str = ""
    aliases: tuple[str, ...] = ()
    model_voice: str | None = None
    speed: float = 1.0
    noise_scale: float | None = None
    noise_w: float | None = None
    language: str = ""  # the voice's espeak-ng language ("en-us", "de"), as listed
    speaker: str | None = None

    def __post_init__(self) -> None:
        # The wire contract's ranges, checked at start: a bad voices file is refused in one
        # line, never answered request by request.
        try:
            SynthesisOptions(
                self.speed,
                self.noise_scale,
                self.noise_w,
                voice=self.model_voice,
                speaker=self.speaker,
            )
        except ValueError as e:
            raise ValueError(f"voice {self.id!r}: {e}") from None

    def options(self, speed: float, **options) -> SynthesisOptions:
        """A request's options with this voice: its speed scales the request's (the product
        must be in range too), its noise scales and Triton voice apply. ValueError if not."""
        try:
            return SynthesisOptions(
                speed=speed * self.speed,
                noise_scale=self.noise_scale,
                noise_w=self.noise_w,
                voice=self.model_voice,
                speaker=self.speaker,
                **options,
            )
        except ValueError as e:
            raise ValueError(f"{e} (speed {speed} x voice {self.id!r}'s {self.speed})") from None

    @classmethod
    def from_dict(cls, data: dict) -> Voice:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"voice {data.get('id')!r}: unknown key(s) {', '.join(unknown)}")
        if not isinstance(data.get("id"), str) or not data["id"]:
            raise ValueError(f"every voice needs an 'id' string, got {data!r}")
        return cls(**{**data, "aliases": tuple(data.get("aliases", ()))})


def load_voices(path: str | Path) -> tuple[Voice, ...]:
    """A JSON list of voices (``[{"id": "joe", "aliases": ["alloy"], "speed": 0.9}, ...]``)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read voices file {path}: {e}") from None
    if not isinstance(data, list) or not all(isinstance(v, dict) for v in data):
        raise ValueError(f"voices file {path} must hold a JSON list of objects")
    return tuple(Voice.from_dict(v) for v in data)


DEFAULT_VOICES = (
    Voice("joe", "Piper en_US-joe-medium (US English, male)", OPENAI_VOICES, language="en-us"),
)


SPEAKER_SEPARATOR = ":"


def repository_voices(entries: list[str]) -> tuple[Voice, ...]:
    """The voice table for the voices a repository serves (``voices.json``, default first;
    entries ``name`` or ``name=language``, a multi-speaker voice's as ``name:speaker``, one per
    speaker): each offered under its own name, and OpenAI's voice names as aliases of the
    default (the first), so an OpenAI client's ``alloy`` speaks with the repository's default
    voice. A multi-speaker voice's own name is an alias of its first speaker's entry."""
    if not entries:
        return DEFAULT_VOICES
    pairs = [(n.strip(), lang.strip()) for n, _, lang in (e.partition("=") for e in entries)]
    (name, language), rest = pairs[0], pairs[1:]
    if name == DEFAULT_VOICES[0].id and language in ("", DEFAULT_VOICES[0].language):
        table = [DEFAULT_VOICES[0]]
    else:
        voice, _, speaker = name.partition(SPEAKER_SEPARATOR)
        aliases = OPENAI_VOICES + ((voice,) if speaker else ())
        description = f"{name} (the repository's default)"
        table = [Voice(name, description, aliases, language=language, speaker=speaker or None)]
    seen = {name.partition(SPEAKER_SEPARATOR)[0]}
    for n, lang in rest:
        voice, _, speaker = n.partition(SPEAKER_SEPARATOR)
        # A multi-speaker voice's own name speaks with its first speaker.
        aliases = (voice,) if speaker and voice not in seen else ()
        seen.add(voice)
        description = f"{n} (from the model repository)"
        table.append(Voice(n, description, aliases, voice, language=lang, speaker=speaker or None))
    return tuple(table)


# The ways a listener's first audio comes early (GatewaySettings.wyoming_early_audio), and a
# short text's in a response played as it arrives (speech_early_audio).
EARLY_AUDIO = ("cut", "windows")
SPEECH_EARLY_AUDIO = ("whole", "windows")


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's settings; each field is a flag and a ``TTS_GATEWAY_*`` variable
    (tts_wire.settings), the comment above it its help."""

    triton_url: str = "grpc://127.0.0.1:8001"  # the front door's (or Triton's) gRPC
    host: str = "127.0.0.1"  # the address the HTTP API listens on
    port: int = 8080  # the HTTP API's port
    # OpenAI's own limit; raise it (up to tts_stream's max_characters) for long documents.
    max_input_chars: int = 4096
    # Bodies are read up to this size before anything else happens; bigger ones get 413.
    max_body_bytes: int = 1_048_576
    # Up to this many characters one `tts` request; longer text streams through `tts_stream`
    # (the wire's short text: the front door admits a stream of one as it admits `tts`).
    direct_max_chars: int = SHORT_TEXT_CHARS
    # Requests in flight in this gateway; beyond it, 429 with Retry-After at once.
    max_concurrent_requests: int = 256
    # Sent to the front door as the tts-front-token header (the launcher sets it): with it the
    # front door takes the caller each request names as its client (its caps per client, the
    # long-text requests among them, count the caller, not the gateway).
    front_token: str = ""
    # Or a file holding it (a mounted Secret: the gpu overlay's gateway pods).
    front_token_file: str = ""
    # Deadline for a whole request; past it, 504 (or the stream is cut with an error).
    request_timeout_s: float = 120.0
    # After SIGTERM, requests in flight get this long; a stream still running then ends with
    # an SSE error event (audio streams are cut), and the gateway exits.
    drain_s: float = 30.0
    retry_after_s: int = 1  # the Retry-After of a 429 or 503
    # A JSON list of voices (see Voice); empty: the Triton voices below, else the bundled voice,
    # with OpenAI's names as aliases of the first.
    voices_file: str = ""
    # The voices the repository serves, comma-separated, default first, each `name` or
    # `name=language` (the launcher passes them from the repository); each is offered under
    # its own name.
    triton_voices: str = ""
    # The repository's phonemizer version folder (<repository>/phonemizer/1; the launcher passes
    # it): Piper's API (GET /voices) answers each voice's Piper config from it; empty: what the
    # voice table knows.
    voice_configs: str = ""
    # Required as `Authorization: Bearer <key>` on /v1/, /dev/ and Piper's API when set (OpenAI
    # clients send one); give it as $TTS_GATEWAY_API_KEY, not a flag (flags are visible in ps).
    api_key: str = ""
    # Comma-separated origins a browser app may call from (CORS); empty: none.
    cors_origins: str = ""
    # The rate of `pcm` responses (OpenAI's is 24 kHz); 0: the voice's own.
    pcm_sample_rate: int = 24_000
    # At start, one short request per Triton voice the voice table names: refuse to start on
    # one Triton does not serve (a typo would otherwise fail every request for that voice).
    check_voices: bool = True
    # Voice-agent sessions (WebSocket /v1/audio/speech/stream, docs/sessions.md): how many
    # connections at once (beyond it, closed at once with 1013), a message's size, a session's
    # text, a connection's length, and how long a session may stay silent with nothing to say.
    # Per caller address too, so one address cannot hold every session.
    max_sessions: int = 256
    max_sessions_per_client: int = 64  # per caller address
    # Addresses of proxies whose X-Forwarded-For names the caller (comma-separated, or "*");
    # empty: none, the caller is the address that connected.
    forwarded_allow_ips: str = ""
    # The edge's key (the launcher's nginx sets it, per launch): a request carrying it names
    # its caller's address in x-real-ip (tts_wire.edge_client); without it, the address that
    # connected is the caller.
    edge_key: str = ""
    session_max_message_chars: int = 65_536  # a session's message (max_sessions: more)
    session_max_chars: int = 100_000  # a session's text in all
    session_max_s: float = 3600.0  # a session connection's length
    session_idle_s: float = 30.0  # silent this long with nothing to say: closed
    # Home Assistant's Wyoming protocol (docs/wyoming.md) on this port (0: off), on
    # wyoming_host (empty: the gateway's host); connections in all and per address, and how
    # long one may stay silent before it is closed (at the cap in all, a newcomer from an
    # address holding fewer closes the oldest idle connection of the one holding the most).
    # Per address: a Home Assistant host speaks for all its satellites from one. Wyoming has no
    # authentication: keep it on loopback or a trusted network.
    wyoming_port: int = 0
    wyoming_host: str = ""  # empty: the gateway's host
    wyoming_max_connections: int = 64  # Wyoming connections at once, in all
    wyoming_max_connections_per_client: int = 48  # and per address
    wyoming_idle_s: float = 300.0  # a connection silent this long is closed
    wyoming_write_timeout_s: float = 10.0  # a client that reads nothing this long is dropped
    # How a Wyoming answer's first audio comes early: `cut`, its text cut after its first
    # words (FIRST_PIECE_WORDS), each piece one `tts` request; `windows`, cut only where a
    # sentence ends (a clause, where the text arrives in pieces), the first piece streamed
    # through `tts_stream`, which decodes its first sentence in windows (docs/wyoming.md).
    wyoming_early_audio: str = "cut"
    # How a short text's audio starts in a response played as it arrives (`pcm`, or
    # stream_format `sse`): `whole`, one `tts` request, its first audio once the whole text is
    # made; `windows`, streamed through `tts_stream`, its first sentence's first window of
    # audio early, the text uncut (more vocoder work under load: docs/performance.md).
    speech_early_audio: str = "whole"
    # The kernel's send buffer of each client connection (HTTP, WebSocket, Wyoming), in bytes
    # (the kernel doubles it): audio waiting for a client that stops reading stays within it
    # and the edge's (docs/sessions.md); autotuned, the buffers held seconds of audio per MB.
    send_buffer_bytes: int = 65_536
    # A name to advertise the Wyoming port under over mDNS (`_wyoming._tcp`, as wyoming-piper's
    # --zeroconf does), for Home Assistant to discover it; empty: not advertised. It says the
    # address the port is bound to (on 0.0.0.0: this machine's address on its default route).
    wyoming_zeroconf: str = ""
    voices: tuple[Voice, ...] = field(default=DEFAULT_VOICES)

    def __post_init__(self) -> None:
        for name in (
            "port",
            "max_input_chars",
            "max_body_bytes",
            "max_concurrent_requests",
            "max_sessions",
            "max_sessions_per_client",
            "session_max_message_chars",
            "session_max_chars",
            "session_max_s",
            "session_idle_s",
            "wyoming_max_connections",
            "wyoming_max_connections_per_client",
            "wyoming_idle_s",
            "wyoming_write_timeout_s",
            "send_buffer_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.pcm_sample_rate not in (0, 8000, 16000, 22050, 24000, 44100, 48000):
            raise ValueError(
                f"pcm_sample_rate must be 0 (the voice's) or a common rate such as 24000, got "
                f"{self.pcm_sample_rate}"
            )
        if self.wyoming_early_audio not in EARLY_AUDIO:
            raise ValueError(
                f"wyoming_early_audio must be one of {', '.join(EARLY_AUDIO)}, got "
                f"{self.wyoming_early_audio!r}"
            )
        if self.speech_early_audio not in SPEECH_EARLY_AUDIO:
            raise ValueError(
                f"speech_early_audio must be one of {', '.join(SPEECH_EARLY_AUDIO)}, got "
                f"{self.speech_early_audio!r}"
            )
        if self.drain_s < 0:
            raise ValueError(f"drain_s must be >= 0, got {self.drain_s}")
        if not 0 <= self.wyoming_port <= 65535:
            raise ValueError(f"wyoming_port must be in [0, 65535], got {self.wyoming_port}")
        if self.max_body_bytes < 6 * self.max_input_chars:
            # A character can take 6 bytes in JSON (\\uXXXX); a legal input must fit the body.
            raise ValueError(
                f"max_body_bytes ({self.max_body_bytes}) must be at least 6 x max_input_chars "
                f"({6 * self.max_input_chars})"
            )
        if self.front_token_file and not self.front_token:
            try:
                token = Path(self.front_token_file).read_text().strip()
            except OSError as e:
                raise ValueError(f"front_token_file: cannot read it ({e.strerror})") from None
            if not token:
                raise ValueError(f"front_token_file: {self.front_token_file} is empty")
            object.__setattr__(self, "front_token", token)
        if self.voices_file and self.voices is DEFAULT_VOICES:
            object.__setattr__(self, "voices", load_voices(self.voices_file))
        elif self.triton_voices and self.voices is DEFAULT_VOICES:
            names = [n.strip() for n in self.triton_voices.split(",") if n.strip()]
            object.__setattr__(self, "voices", repository_voices(names))
        if not self.voices:
            raise ValueError("at least one voice is needed")

    def voice_names(self) -> dict[str, Voice]:
        """Every accepted name (ids first, then aliases) -> its voice."""
        names: dict[str, Voice] = {v.id: v for v in self.voices}
        for voice in self.voices:
            for alias in voice.aliases:
                names.setdefault(alias, voice)
        return names


ENV_PREFIX = "TTS_GATEWAY_"


def settings() -> list[Setting]:
    """Every setting of the gateway, as its flags and variables name them (the voice table
    comes from voices_file or triton_voices)."""
    return settings_of(GatewaySettings, ENV_PREFIX, exclude=("voices",))


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] | None = None):
    """Settings from flags, then ``TTS_GATEWAY_*`` variables, then the defaults."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m tts_gateway",
        description="OpenAI-compatible speech API in front of Triton (see README).",
    )
    scalars = settings()
    add_settings(parser, scalars, environ)
    parser.add_argument("--log-level", default=environ.get("TTS_GATEWAY_LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    return build(GatewaySettings, args, scalars, parser), args.log_level
