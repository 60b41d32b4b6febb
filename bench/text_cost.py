"""Cost of text normalization and chunk planning on hostile shapes: must be linear.

    python -m bench.text_cost [--sizes 25000 100000]

For each shape of tts_front.sample_texts.hostile_texts, the time to normalize it at each size and
the ratio between sizes (about 4 for 25k -> 100k when linear; 16 when quadratic).
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.machine import cpu_line
from tts_front.sample_texts import hostile_texts
from tts_serving.text import normalize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.text_cost", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs=2, default=[25_000, 100_000])
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    small, large = (hostile_texts(n) for n in args.sizes)
    print(f"| shape | {args.sizes[0]} chars | {args.sizes[1]} chars | ratio |\n|---|---|---|---|")
    worst = 0.0
    for name in large:
        times = []
        for text in (small[name], large[name]):
            start = time.perf_counter()
            normalize(text)
            times.append(time.perf_counter() - start)
        worst = max(worst, times[1])
        print(f"| {name} | {times[0] * 1000:.0f} ms | {times[1] * 1000:.0f} ms | "
              f"{times[1] / max(times[0], 1e-9):.1f} |")  # fmt: skip
    print(f"\nworst at {args.sizes[1]} characters: {worst:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
