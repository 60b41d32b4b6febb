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


def test_every_benchmark_prints_the_machine_with_its_figures():
    """Figures change with the CPU's vector extensions (AVX2 one day, AVX-512 the next): each
    benchmark's command line says which machine it ran on, after its arguments are read."""
    import ast

    from tests.support.paths import ROOT

    for path in sorted((ROOT / "bench").glob("*.py")):
        tree = ast.parse(path.read_text())
        main = [f for f in tree.body if getattr(f, "name", None) == "main"]
        if path.stem in ("__init__", "machine", "baselines") or not main:  # no figures
            continue
        calls = {
            node.func.id
            for node in ast.walk(main[0])
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert "cpu_line" in calls, f"bench/{path.name}: main() does not print cpu_line()"
