"""perf_analyzer as it runs here, by hand, against any server:

    .venv/bin/python -m perf_analyzer_configs.pa -m tts -u localhost:8001 -i grpc \\
        --input-data perf_analyzer_configs/tts_mixed.json --concurrency-range 1:8:2

The pip wheel's perf_analyzer links libcudart.so.12 even on a CPU machine ("libcudart.so.12:
cannot open shared object file" when run directly); this puts the pip CUDA runtime's library
directory on LD_LIBRARY_PATH and runs it with every argument given (``--help`` for its own).
"""

from __future__ import annotations

import os
import sys

from perf_analyzer_configs.run import perf_analyzer_binary, perf_analyzer_env


def main(argv: list[str] | None = None) -> None:
    binary = str(perf_analyzer_binary())
    os.execve(binary, [binary, *(sys.argv[1:] if argv is None else argv)], perf_analyzer_env())


if __name__ == "__main__":
    main()
