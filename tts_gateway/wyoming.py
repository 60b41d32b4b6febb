"""Home Assistant's voice protocol (Wyoming) on a port of the gateway's own (docs/wyoming.md).

Built on the ``wyoming`` package (its events, its reader and writer, its handler class); what
it cannot do is here: bounds on what a client may send (a header line, a ``data_length``, a
``payload_length``), an idle timeout and connection caps. Each synthesis goes through the
gateway's speech service, so it is admitted, deadlined and drained like an OpenAI request and
batched in Triton with everyone else's.

- ``describe`` -> ``info``: every voice of the gateway (speakers of multi-speaker voices),
  streaming synthesis supported;
- ``synthesize``: ``audio-start``, ``audio-chunk``s as they are made (16-bit mono PCM at the
  voice's rate), ``audio-stop``;
- ``synthesize-start``, ``synthesize-chunk``s, ``synthesize-stop``: each sentence spoken as soon
  as it is complete (its own ``audio-start`` ... ``audio-stop``), then ``synthesize-stopped``;
  the ``synthesize`` a client also sends during a stream (for older servers) is ignored.

Bad input gets an ``error`` event and the connection goes on; a header over the bounds closes
it after an ``error``. Word timestamps are not part of Wyoming.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import itertools
import logging
import socket

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)
from zeroconf import Error as ZeroconfError
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from tts_client.session import FIRST_PIECE_WORDS, BufferRule, TextBuffer
from tts_wire import __version__
from tts_wire.caps import PerClient
from tts_wire.refusals import Refusals

from .encoding import FORMATS
from .errors import APIError
from .service import SpeechJob, SpeechService, piece_options
from .settings import GatewaySettings, Voice

log = logging.getLogger("tts_gateway.wyoming")
REFUSALS = Refusals(log)  # one line a kind a minute: a client cannot fill the disk

VERSION = __version__
# What a client may send: a header line, its JSON data, a binary payload (a TTS client sends
# none; an ASR client's audio is not for this server).
MAX_LINE = 64 * 1024
MAX_DATA = 1024 * 1024
MAX_PAYLOAD = 1024 * 1024
PCM = dataclasses.replace(FORMATS["pcm"], sample_rate=None)  # the voice's own rate
ATTRIBUTION = Attribution(name="tts-triton", url="https://github.com/triton-inference-server")


class TooLarge(ValueError):
    """A header announcing more than this server reads."""


class BoundedReader:
    """The stream reader ``wyoming.event.async_read_event`` reads from, refusing a length over
    the bounds before reading it (the library reads whatever a header announces)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.refused: str | None = None
        self.line = b""  # the last header line read (the library drops one it cannot parse)

    async def readline(self) -> bytes:
        self.line = await self.reader.readline()  # (the server's StreamReader limit: MAX_LINE)
        return self.line

    async def readexactly(self, n: int) -> bytes:
        if n > max(MAX_DATA, MAX_PAYLOAD):
            self.refused = f"an event announced {n} bytes; this server reads at most {MAX_DATA}"
            raise TooLarge(self.refused)
        return await self.reader.readexactly(n)


def wyoming_name(voice: Voice) -> str:
    """A gateway voice's name in Wyoming: its id, or for a speaker of a multi-speaker voice the
    Triton voice's name (the speakers are listed under it)."""
    return (voice.model_voice or voice.id) if voice.speaker else voice.id


def info(settings: GatewaySettings) -> Info:
    """``info``: one TTS program with every voice (and speaker) the gateway serves."""
    grouped: dict[str, list[Voice]] = {}
    for voice in settings.voices:
        grouped.setdefault(wyoming_name(voice), []).append(voice)
    voices = []
    for name, members in grouped.items():
        speakers = [TtsVoiceSpeaker(v.speaker) for v in members if v.speaker]
        voices.append(
            TtsVoice(
                name=name,
                attribution=ATTRIBUTION,
                installed=True,
                description=members[0].description,
                version=VERSION,
                languages=[_language(members[0].language or "en-us")],
                speakers=speakers or None,
            )
        )
    program = TtsProgram(
        name="tts-triton",
        attribution=ATTRIBUTION,
        installed=True,
        description="Text to speech served by Triton Inference Server, batched across clients",
        version=VERSION,
        voices=voices,
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


_CONNECTIONS = itertools.count(1)


class Handler(AsyncEventHandler):
    """One Wyoming connection."""

    def __init__(
        self,
        server: WyomingServer,
        client: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(reader, writer)
        self.server, self.client = server, client
        # Home Assistant opens a connection per satellite's request: each is one listener.
        self.listener = f"wyoming-{next(_CONNECTIONS)}"
        self.settings = server.settings
        self.bounded = BoundedReader(reader)
        self.stream_voice: SynthesizeVoice | None = None
        self.streaming = False
        self.buffer: TextBuffer | None = None
        self.stream_chars = 0
        self.stream_spoken = False
        self.busy = False  # speaking: not closed to make room for another address
        self.evicted = False  # closed to make room; ending

    async def run(self) -> None:
        """Events until the client leaves, stays idle past ``wyoming_idle_s``, or sends a
        header over the bounds (answered with an error first)."""
        try:
            while True:
                try:
                    async with asyncio.timeout(self.settings.wyoming_idle_s):
                        event = await async_read_event(self.bounded)
                except TimeoutError:
                    return
                except (AttributeError, KeyError, TypeError) as e:
                    # Not an event (the wyoming library reads the header without checking
                    # it): the client hears why; where the next event starts is unknown.
                    await self._malformed(type(e).__name__)
                    return
                if event is None:
                    if self.bounded.refused:
                        await self._error(self.bounded.refused, "too_large")
                    elif self.bounded.line.strip():  # (the library drops what is not JSON)
                        await self._malformed("no JSON")
                    return
                if not await self.handle_event(event):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except TimeoutError:  # (a write: the client stopped reading)
            log.warning("wyoming: %s stopped reading; connection closed", self.client)
        finally:
            self.writer.close()

    async def write_event(self, event: Event) -> None:
        """Send ``event``; a client that reads nothing for ``wyoming_write_timeout_s`` is
        dropped (TimeoutError ends the connection) rather than hold its places for ever."""
        async with asyncio.timeout(self.settings.wyoming_write_timeout_s):
            await super().write_event(event)

    async def _malformed(self, what: str) -> None:
        """A header that is not an event: an ``error`` event says so, one line a minute is
        logged (a client cannot fill the disk)."""
        REFUSALS.refused("a Wyoming header that is not an event", self.client)
        await self._error(
            "malformed event header: each event starts with one line of JSON, an object with "
            "a string 'type' (and integer 'data_length' and 'payload_length' where it has "
            f"them); this one gave {what}",
            "invalid_event",
        )

    async def _error(self, text: str, code: str) -> None:
        try:
            await self.write_event(Error(text=text, code=code).event())
        except (ConnectionError, TimeoutError):
            pass

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._handle(event)
        except APIError as e:
            await self._error(e.message, e.code or e.type)
        except (KeyError, TypeError, ValueError) as e:
            await self._error(f"malformed {event.type!r} event: {e}", "invalid_event")
        return True

    async def _handle(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.server.info.event())
        elif Synthesize.is_type(event.type):
            if not self.streaming:  # (in a stream it is the copy sent for older servers)
                request = Synthesize.from_event(event)
                text = _text(request.text, request.text_format)
                if _is_ssml(request.text_format, text):  # one document: cut, its markup breaks
                    await self._speak(text, request.voice)
                else:  # plain text: in pieces, each one request
                    await self._speak_pieces(text, request.voice)
        elif SynthesizeStart.is_type(event.type):
            start = SynthesizeStart.from_event(event)
            self._voice(start.voice)  # an unknown voice: refused now, not at the first sentence
            self.streaming, self.stream_voice, self.stream_chars = True, start.voice, 0
            self.stream_spoken = False  # a piece of this stream spoken yet
            self.buffer = TextBuffer(self._stream_rule())
        elif SynthesizeChunk.is_type(event.type):
            if self.buffer is None:
                raise APIError(400, "synthesize-chunk before synthesize-start", code="no_stream")
            chunk = SynthesizeChunk.from_event(event).text
            self.stream_chars += len(chunk)
            if self.stream_chars > self.settings.session_max_chars:
                raise APIError(
                    400,
                    f"the stream's text is over {self.settings.session_max_chars} characters",
                    code="string_above_max_length",
                )
            for piece in self.buffer.add(chunk):
                await self._speak(piece.text, self.stream_voice, self.stream_spoken)
                self.stream_spoken = True
        elif SynthesizeStop.is_type(event.type):
            if self.buffer is None:
                raise APIError(400, "synthesize-stop before synthesize-start", code="no_stream")
            for piece in self.buffer.flush():
                await self._speak(piece.text, self.stream_voice, self.stream_spoken)
                self.stream_spoken = True
            self.streaming, self.buffer = False, None
            await self.write_event(SynthesizeStopped().event())
        else:
            raise APIError(
                400,
                f"unknown event type {event.type!r}; this server answers describe, synthesize, "
                "synthesize-start, synthesize-chunk and synthesize-stop",
                code="unknown_event",
            )
        return True

    def _stream_rule(self) -> BufferRule:
        """Where streaming synthesis's text (arriving word by word) is cut: after its first
        words (`cut`), or where a sentence or a clause ends (`windows`)."""
        if self.settings.wyoming_early_audio == "windows":
            return BufferRule()
        return BufferRule(first_piece_words=FIRST_PIECE_WORDS)

    def _voice(self, wanted: SynthesizeVoice | None) -> Voice:
        """The gateway voice a request's voice (name, speaker, language) selects."""
        voices = self.settings.voices
        if wanted is None or (wanted.name is None and wanted.language is None):
            return voices[0]
        if wanted.name is None:
            for voice in voices:
                if _language(voice.language or "") == _language(wanted.language):
                    return voice
            raise APIError(400, f"no voice speaks {wanted.language!r}", code="voice_not_found")
        for voice in voices:
            if wyoming_name(voice) == wanted.name and wanted.speaker in (None, voice.speaker):
                return voice
        names = sorted({wyoming_name(v) for v in voices})
        which = wanted.name + (f" speaker {wanted.speaker!r}" if wanted.speaker else "")
        raise APIError(
            400, f"unknown voice {which!r}; voices: {', '.join(names)}", code="voice_not_found"
        )

    async def _speak(self, text: str, wanted: SynthesizeVoice | None, later: bool = False) -> None:
        """One text as ``audio-start``, its chunks as they are made, ``audio-stop``
        (``later``: not the first piece of its turn)."""
        await self._speak_pieces(text, wanted, whole=True, later=later)

    async def _speak_pieces(
        self,
        text: str,
        wanted: SynthesizeVoice | None,
        whole: bool = False,
        later: bool = False,
    ) -> None:
        """``text`` as one ``audio-start``, the audio of each of its pieces as it is made
        (each piece one ``tts`` request, cut as a session's text is, within what one request
        takes: a 180-character text took one of its address's 4 long-text requests, and a
        Home Assistant host's 16 satellites got 4 answers), then ``audio-stop``. ``whole``:
        one piece, however long (SSML)."""
        if not text.strip():
            raise APIError(400, "the text is empty; send the text to speak", code="empty_text")
        if len(text) > self.settings.max_input_chars:
            raise APIError(
                400,
                f"the text is {len(text)} characters, over this server's limit of "
                f"{self.settings.max_input_chars}",
                code="string_above_max_length",
            )
        voice = self._voice(wanted)
        try:
            options = voice.options(1.0, caller=self.client or None, listener=self.listener)
        except ValueError as e:
            raise APIError(400, str(e), code="invalid_voice") from None
        windows = self.settings.wyoming_early_audio == "windows"
        if whole:
            pieces = [text]
        else:
            if windows:  # cut where a sentence ends (or a long one's clause), no sooner
                rule = BufferRule(
                    max_chars=self.settings.direct_max_chars,
                    first_words=BufferRule.clause_words,
                )
            else:
                rule = BufferRule(
                    max_chars=self.settings.direct_max_chars, first_piece_words=FIRST_PIECE_WORDS
                )
            buffer = TextBuffer(rule)
            pieces = [p.text for p in buffer.add(text) + buffer.flush()]
            if not pieces:
                raise APIError(400, "the text has no word to speak; send words", code="empty_text")
        jobs = [
            SpeechJob(
                piece,
                piece_options(options, later or k > 0),
                PCM,
                # A turn's first piece streams where its first audio comes from windows: the
                # front door admits a short text's stream as it admits `tts`.
                len(piece) > self.settings.direct_max_chars or (windows and not later and k == 0),
                self.client,
            )
            for k, piece in enumerate(pieces)
        ]
        started = False
        self.busy = True
        opening: asyncio.Future | None = asyncio.ensure_future(self.server.service.open(jobs[0]))
        try:
            for k in range(len(jobs)):
                assert opening is not None
                speech = await opening
                # The next piece is made while this one is sent, one ahead at most: a client
                # that stops reading holds back what is made for it.
                opening = None
                if k + 1 < len(jobs):
                    opening = asyncio.ensure_future(self.server.service.open(jobs[k + 1]))
                try:
                    rate = speech.encoder.output_rate
                    if not started:
                        await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
                        started = True
                    async for data in speech.body():
                        if data:
                            chunk = AudioChunk(rate=rate, width=2, channels=1, audio=data)
                            await self.write_event(chunk.event())
                finally:
                    await speech.close()
            if started:
                await self.write_event(AudioStop().event())
        finally:
            self.busy = False
            if opening is not None:
                await _abandon(opening)


async def _abandon(opening: asyncio.Future) -> None:
    """A piece opened ahead and not needed (an error, a closed connection): cancelled, or
    closed if it was already open, so its request and its slot end."""
    opening.cancel()
    (speech,) = await asyncio.gather(opening, return_exceptions=True)
    if not isinstance(speech, BaseException):
        await speech.close()


def _language(code: str) -> str:
    """espeak-ng's "en-us" as Wyoming voices name languages ("en_US", as wyoming-piper)."""
    language, _, region = code.replace("_", "-").partition("-")
    return f"{language.lower()}_{region.upper()}" if region else language.lower()


def _is_ssml(text_format, text: str) -> bool:
    """Whether a ``synthesize`` text is SSML: said so, or a ``<speak>`` document (as the
    server reads it)."""
    return getattr(text_format, "value", text_format) == "ssml" or text.lstrip().startswith(
        "<speak"
    )


def _text(text: str, text_format) -> str:
    """A ``synthesize`` text: SSML (text_format "ssml") is a document whatever its root."""
    format_ = getattr(text_format, "value", text_format)
    if format_ == "ssml" and not text.lstrip().startswith("<speak"):
        return f"<speak>{text}</speak>"
    return text


SERVICE_TYPE = "_wyoming._tcp.local."


async def advertise(name: str, host: str, port: int) -> AsyncZeroconf:
    """Announce ``name`` (``<name>._wyoming._tcp.local.``) at ``host``:``port`` over mDNS, as
    wyoming-piper does (wyoming's own helper cannot withdraw it at a stop); closing the
    returned object withdraws it."""
    address = socket.gethostbyname(host)
    if ipaddress.ip_address(address).is_unspecified:  # all interfaces: the default route's
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("224.0.0.251", 5353))  # (no packet is sent)
            address = probe.getsockname()[0]
    if ipaddress.ip_address(address).is_loopback:
        log.warning(
            "gateway: advertising Wyoming at %s over mDNS: only this machine can reach it "
            "(bind it where Home Assistant can: make serve BIND=0.0.0.0, or --wyoming-host)",
            address,
        )
    zeroconf = AsyncZeroconf()
    info = AsyncServiceInfo(
        SERVICE_TYPE,
        f"{name}.{SERVICE_TYPE}",
        addresses=[socket.inet_aton(address)],
        port=port,
    )
    await zeroconf.async_register_service(info)
    log.info("gateway: Wyoming advertised over mDNS as %s at %s:%d", name, address, port)
    return zeroconf


class WyomingServer:
    """The TCP server: connections capped in all and per address."""

    def __init__(
        self,
        settings: GatewaySettings,
        service: SpeechService,
        sock: socket.socket | None = None,
    ) -> None:
        self.settings, self.service, self.sock = settings, service, sock
        self.info = info(settings)
        self.host = settings.wyoming_host or settings.host
        self.by_client = PerClient(settings.wyoming_max_connections_per_client)
        self.handlers: dict[asyncio.Task, Handler] = {}  # open connections, oldest first
        self._server: asyncio.Server | None = None
        self._advertised: AsyncZeroconf | None = None

    async def start(self) -> int:
        """Listen on ``wyoming_host``:``wyoming_port`` (advertised over mDNS when asked); the
        port bound."""
        if self.sock is not None:
            self._server = await asyncio.start_server(
                self._connected, sock=self.sock, limit=MAX_LINE
            )
        else:
            self._server = await asyncio.start_server(
                self._connected, self.host, self.settings.wyoming_port, limit=MAX_LINE
            )
        port = self._server.sockets[0].getsockname()[1]
        if self.settings.wyoming_zeroconf:
            try:
                self._advertised = await advertise(self.settings.wyoming_zeroconf, self.host, port)
            except (OSError, ValueError, ZeroconfError) as e:  # the port serves all the same
                log.error(
                    "gateway: could not advertise Wyoming over mDNS (%s: %s); it serves on "
                    "port %d, and Home Assistant must be given its address",
                    type(e).__name__, e, port,
                )  # fmt: skip
        return port

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        peer = writer.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) else ""
        s = self.settings
        refused = None
        if self.by_client.full(client):
            refused = (
                f"this address holds {s.wyoming_max_connections_per_client} Wyoming "
                "connections (the limit per address); close one or retry later"
            )
        elif len(self.handlers) >= s.wyoming_max_connections and not self._make_room(client):
            refused = (
                f"this server holds its limit of {s.wyoming_max_connections} Wyoming "
                "connections, all busy or from addresses holding no more than yours; retry later"
            )
        if refused:
            with contextlib.suppress(ConnectionError):
                error = Error(text=refused, code="too_many_connections")
                await async_write_event(error.event(), writer)
            writer.close()
            return
        self.by_client.take(client)
        task = asyncio.current_task()
        handler = Handler(self, client, reader, writer)
        self.handlers[task] = handler
        try:
            await handler.run()
        except Exception:
            log.exception("wyoming connection failed")
        finally:
            self.handlers.pop(task, None)
            self.by_client.give(client)

    def _make_room(self, client: str) -> bool:
        """At the cap: close the oldest idle connection of the address holding the most, when
        it holds more than ``client`` (16 idle connections from each of four addresses kept
        Home Assistant's own out). False when there is none to close."""
        holder = self.by_client.most()
        if holder is None or self.by_client[holder] <= self.by_client[client]:
            return False
        for handler in self.handlers.values():  # (oldest first)
            if handler.client == holder and not (handler.busy or handler.evicted):
                handler.evicted = True
                handler.writer.close()  # its reader sees the end; it lets go of its place
                return True
        return False

    async def close(self) -> None:
        if self._advertised is not None:  # goodbye packets: discovery forgets it at once
            await self._advertised.async_close()
        if self._server is not None:
            self._server.close()
            for task in list(self.handlers):
                task.cancel()
            await asyncio.gather(*self.handlers, return_exceptions=True)
