"""bench.cpu_time on the real voice, in-process: what it prints adds up (each stage's row into
the pipeline's, the pipeline's against Piper's into the ratio line it prints)."""

from __future__ import annotations

import re

import pytest

from bench import cpu_time


def cells(out: str, row: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith(f"| {row} |"))
    return [float(c) for c in re.findall(r"\|\s*(\d+\.\d+)\s*(?=\|)", line)]


@pytest.mark.slow
def test_the_figures_it_prints_add_up(exported_repository, capsys):
    args = ["--repository", str(exported_repository), "--batch", "2", "--seconds", "0"]
    assert cpu_time.main([*args, "--rounds", "1", "--sentences", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    stages = [cells(out, name) for name in ("phonemizer", "acoustic", "vocoder")]
    ours, piper = cells(out, "**ours, all stages**"), cells(out, "Piper's PiperVoice, alone")
    for column in range(4):  # alone wall and CPU, batched wall and CPU: the stages' sum
        assert abs(sum(s[column] for s in stages) - ours[column]) <= 0.2, (column, stages, ours)
    assert all(figure > 0 for figure in [*ours[:4], *piper])
    ratio = re.search(r"CPU per audio second: alone ([\d.]+)x, batched ([\d.]+)x", out)
    assert abs(float(ratio[1]) - ours[1] / piper[1]) <= 0.011
    assert abs(float(ratio[2]) - ours[3] / piper[1]) <= 0.011
