"""``python -m tts_client "Hello world" -o hello.wav``."""

from __future__ import annotations

import argparse
import sys
import time

from .client import TTSClient
from .errors import TTSError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tts_client", description="Text to speech.")
    parser.add_argument("text", help="text to speak ('-' reads standard input)")
    parser.add_argument("-o", "--output", default="out.wav", help="output .wav or .flac")
    parser.add_argument("--url", default="grpc://localhost:8001", help="grpc:// or http:// URL")
    parser.add_argument("--speed", type=float, default=1.0, help="0.25..4.0, 1.0 = normal")
    parser.add_argument("--model", default="tts")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.text == "-" else args.text
    try:
        with TTSClient(args.url, model=args.model) as client:
            start = time.perf_counter()
            audio = client.synthesize(text, speed=args.speed)
            elapsed = time.perf_counter() - start
            audio.write(args.output)
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
