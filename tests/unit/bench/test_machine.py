"""bench.machine: the CPU line every benchmark prints."""

from __future__ import annotations

import os

from bench.machine import cpu_line

CPUINFO = """processor : 0
model name : Intel(R) Xeon(R) Processor
flags : fpu sse2 avx2 fma avx512f avx512_vnni
processor : 1
model name : Intel(R) Xeon(R) Processor
flags : fpu sse2 avx2 fma avx512f avx512_vnni
"""


def test_the_cpu_line_names_the_model_cores_and_vector_extensions():
    line = cpu_line(CPUINFO)
    assert (
        line == f"Intel(R) Xeon(R) Processor, {os.cpu_count()} cores, avx2 fma avx512f avx512_vnni"
    )
    assert cpu_line("model name : Old\nflags : sse2\n").endswith("no AVX2")
