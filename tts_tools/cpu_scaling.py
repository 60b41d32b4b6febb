"""Instances and threads per stage for a CPU of ``cores`` cores:

    python -m tts_tools.cpu_scaling 16

prints what each model's ``config.pbtxt`` should say (``instance_group`` count and ONNX Runtime
``intra_op_threads``) and the throughput the rule predicts. The rule generalises the measured
2-core default (one acoustic and one vocoder instance of 2 threads each: two threads per core,
since the stages take turns more than they overlap):

- every acoustic or vocoder instance has 2 intra-op threads, and there are as many instances
  as cores (two on a single core), so the threads are twice the cores, as at 2 cores;
- the instances are split by the stages' share of the work, measured on the 2-core machine
  (``bench.queue_signal`` at low load: a sentence's acoustic batch 39 ms, vocoder 67 ms), at
  least one each;
- the phonemizer (1 to 2 ms a sentence, single-threaded) gets one instance per 8 cores.

Measured on this machine (``bench.cpu_cores``, retired since:
docs/history/2026-12-04-one-off-benchmarks.md): the default config pinned with ``taskset``
to one core, then two; the mean of four closed-loop runs each):
1 core 6.3 requests/s at c=16, 2 cores 11.0. Beyond 2 the figures are a **prediction**: each
doubling of the cores keeps the 87% of linear that 1 -> 2 kept. Memory bandwidth, Triton's
per-model scheduling and NUMA are not modelled.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

VOCODER_SHARE = 67 / (39 + 67)  # of the acoustic + vocoder work per sentence
MEASURED = {1: 6.3, 2: 11.0}  # requests/s at c=16, 3.3 s of audio each (2026-11-25)
DOUBLING_EFFICIENCY = MEASURED[2] / (2 * MEASURED[1])  # 0.87


@dataclass(frozen=True)
class StageLayout:
    instances: int
    threads: int  # ONNX Runtime intra_op_threads per instance (the phonemizer: 1, no ORT)


def cpu_layout(cores: int) -> dict[str, StageLayout]:
    """Each stage's instances and threads for ``cores`` cores (see the module's docstring)."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    threads = 2
    slots = max(2, cores)  # acoustic + vocoder instances
    vocoder = min(slots - 1, max(1, round(slots * VOCODER_SHARE)))
    return {
        "phonemizer": StageLayout(math.ceil(cores / 8), 1),
        "acoustic": StageLayout(slots - vocoder, threads),
        "vocoder": StageLayout(vocoder, threads),
    }


def predicted_rate(cores: int) -> float:
    """Requests/s at c=16-like load: measured at 1 and 2 cores, else the doubling rule."""
    if cores in MEASURED:
        return MEASURED[cores]
    doublings = math.log2(cores / 2)
    return MEASURED[2] * (cores / 2) * DOUBLING_EFFICIENCY**doublings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tts_tools.cpu_scaling", description=__doc__)
    p.add_argument("cores", type=int, nargs="+")
    a = p.parse_args(argv)
    for cores in a.cores:
        layout = cpu_layout(cores)
        stages = ", ".join(
            f"{name} {s.instances} x {s.threads} thread{'s' if s.threads > 1 else ''}"
            for name, s in layout.items()
        )
        kind = "measured" if cores in MEASURED else "predicted"
        print(f"{cores} cores: {stages}; {predicted_rate(cores):.0f} requests/s ({kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
