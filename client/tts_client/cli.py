"""``python -m tts_client "Hello world" -o hello.wav``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tts_wire import MAX_SPEED, MIN_SPEED

from .audio import Audio, join_chunks
from .client import TTSClient
from .errors import TTSError
from .protocol import OptionKeywords

if TYPE_CHECKING:  # (typing.Unpack is Python 3.11+, the client runs on 3.10)
    from typing_extensions import Unpack


def stream_to_file(
    client: TTSClient,
    text: str,
    path: str,
    start: float,
    **options: Unpack[OptionKeywords],
) -> Audio:
    """Write each chunk as it arrives, so the file grows while the server works."""
    import soundfile

    chunks = []
    fmt = "FLAC" if path.lower().endswith(".flac") else "WAV"
    with soundfile.SoundFile(path, "w", client.sample_rate, 1, "PCM_16", format=fmt) as f:
        chunks_of = client.stream(text, **options)
        for chunk in chunks_of:
            if chunk.index == 0:
                print(f"first audio after {time.perf_counter() - start:.2f} s", file=sys.stderr)
            f.write(chunk.samples)
            f.flush()
            chunks.append(chunk)
    return join_chunks(chunks, client.sample_rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tts_client",
        description="Text to speech.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("text", help="text to speak ('-' reads standard input)")
    parser.add_argument(
        "-o", "--output", default="out.wav", help="output .wav or .flac (no suffix: WAV)"
    )
    parser.add_argument("--url", default="grpc://localhost:8001", help="grpc:// or http:// URL")
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help=f"{MIN_SPEED}..{MAX_SPEED}, 1.0 = normal",
    )
    parser.add_argument(
        "--voice", default=None, help="a voice the server has (None: the server's first)"
    )
    parser.add_argument(
        "--speaker", default=None, help="a multi-speaker voice's speaker: a name or an id"
    )
    parser.add_argument(
        "--model", default="tts", help="the Triton model to call (tts, or another repository's)"
    )
    parser.add_argument(
        "--stream", action="store_true", help="stream long text, writing audio as it arrives (gRPC)"
    )
    parser.add_argument(
        "--captions",
        default=None,
        help="also write word-timed captions here: a .srt or .vtt file",
    )
    args = parser.parse_args(argv)
    if Path(args.output).suffix.lower() not in ("", ".wav", ".flac"):
        # Before any work: a format found unsupported after synthesizing wastes it. (No
        # suffix, /dev/null say: written as WAV.)
        parser.error(f"--output must name a .wav or .flac file, not {args.output!r}")
    if args.captions and Path(args.captions).suffix.lower() not in (".srt", ".vtt"):
        parser.error("--captions must name a .srt or .vtt file")
    text = sys.stdin.read() if args.text == "-" else args.text
    try:
        with TTSClient(args.url, model=args.model) as client:
            start = time.perf_counter()
            options = OptionKeywords(
                speed=args.speed,
                voice=args.voice,
                speaker=args.speaker,
                word_timestamps=bool(args.captions),
            )
            if args.stream:
                audio = stream_to_file(client, text, args.output, start, **options)
            else:
                audio = client.synthesize(text, **options)
                audio.write(args.output)
            if args.captions:
                srt = Path(args.captions).suffix.lower() == ".srt"
                Path(args.captions).write_text(audio.to_srt() if srt else audio.to_vtt())
            elapsed = time.perf_counter() - start
    except TTSError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.output}: {audio.duration:.2f} s at {audio.sample_rate} Hz in {elapsed:.2f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
