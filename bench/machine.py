"""The machine a benchmark ran on, in one line: CPU model, cores and vector extensions (they
change between sessions here: AVX2 only one day, AVX-512 the next)."""

from __future__ import annotations

import os
from pathlib import Path

VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")


def cpu_line(cpuinfo: str | None = None) -> str:
    """``"<model>, N cores, avx2 fma ..."`` from /proc/cpuinfo (or ``cpuinfo``)."""
    text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    model, flags = "unknown CPU", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    vectors = " ".join(f for f in VECTOR_FLAGS if f in flags) or "no AVX2"
    return f"{model}, {os.cpu_count()} cores, {vectors}"


if __name__ == "__main__":
    print(cpu_line())
