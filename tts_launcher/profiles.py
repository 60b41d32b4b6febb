"""The profiles this repository serves: ``configs/<profile>.pbtxt`` beside a config.pbtxt.

Triton reads them with ``--model-config-name=<profile>`` (``make serve PROFILE=gpu``); a model
without one falls back to its config.pbtxt. They are generated from each config.pbtxt plus the
few overrides below (tts_launcher/rendering.py), so a change to a model's inputs or defaults
reaches every profile. Each config.pbtxt's ``input`` and ``output`` blocks are generated too,
from the declarations in ``tts_wire.tensors``:

    python -m tts_launcher.profiles            # rewrite them
    python -m tts_launcher.profiles --check    # fail when a committed file is stale (a test does)

- ``gpu``: the torch engine on CUDA in float16 with CUDA graphs, batches up to 64; the
  phonemizer (espeak-ng, CPU) gets several instances to keep up. ``gpu-dlpack``: the same,
  the latents kept on the device from acoustic to vocoder.
- ``torch-cpu`` (and ``torch-cpu-dlpack``): the torch engine on the CPU, everything else as
  config.pbtxt (what CI uses to test the torch engine and the hand-off end to end).
- ``cpu-int8``: the vocoder in int8 (ONNX Runtime static quantization, the last stage in
  float32; ``export/quantize.py``), within the quality gates of ``bench.cpu_variants``; not the
  default (docs/performance.md says why).
- ``cpu-interactive``: one item per batch at the voice's stages (latency beside a flood
  before throughput).

Only served profiles live here. The baselines benchmarks measure the defaults against (and the
null engine's host ceiling) are made by ``bench.baselines``, in a repository of their own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tts_serving.settings import AcousticSettings

from .rendering import Override, expected as rendered, with_parameters
from .served import REPOSITORY

_GPU_ENGINE = {"engine": "torch", "device": "cuda", "dtype": "float16", "intra_op_threads": "1"}

PROFILES: dict[str, dict[str, Override]] = {
    "gpu": {
        "phonemizer": Override(
            max_batch_size=64,
            instance_group="[ { count: 4, kind: KIND_CPU } ]",
            why="espeak-ng runs on the CPU: four instances keep the GPU fed",
        ),
        "acoustic": Override(
            max_batch_size=64,
            preferred_batch_size=(16, 32, 64),
            # As measured on the H100 (docs/gpu.md); the CPU default waits for none.
            max_queue_delay_microseconds=2000,
            instance_group="[ { count: 2, kind: KIND_GPU } ]",
            parameters={
                **_GPU_ENGINE,
                "cuda_graph_batches": "1,2,4,8,16,32,64",
                "cuda_graph_frames": "128,256,512,1024,2048",
                # Up to max_phoneme_ids (config.pbtxt's); eager, their launches took 20 of a
                # lone request's 31 ms on an H100 (docs/gpu.md).
                "cuda_graph_phonemes": f"32,64,128,256,{AcousticSettings().max_phoneme_ids}",
                "max_padded_length": "25600",
            },
            why="the flow in float16 CUDA graphs; encoder and durations in float32 CUDA graphs",
        ),
        "vocoder": Override(
            max_batch_size=64,
            preferred_batch_size=(16, 32, 64),
            # As measured on the H100 (docs/gpu.md); the CPU default waits for none.
            max_queue_delay_microseconds=2000,
            instance_group="[ { count: 2, kind: KIND_GPU } ]",
            parameters={
                **_GPU_ENGINE,
                "cuda_graph_batches": "1,2,4,8,16,32,64",
                "cuda_graph_frames": "128,256,512,1024",
                # float16 peaked near 8 x 400 frames per call on an H100 (bench.gpu); larger
                # calls ran slower per second of audio, so a big batch runs as several calls.
                "max_padded_length": "4096",
            },
            why="float16 CUDA graphs; a batch is padded up to the next captured bucket",
        ),
    },
    "torch-cpu": {
        "acoustic": Override(parameters={"engine": "torch", "device": "cpu"}),
        "vocoder": Override(parameters={"engine": "torch", "device": "cpu"}),
    },
    "cpu-int8": {
        "vocoder": Override(
            parameters={"dtype": "int8"},
            why="the vocoder in int8 (ONNX Runtime, model.int8.onnx from the export)",
        ),
    },
    # One item per batch at the voice's stages (and so two requests in Triton at once, the
    # front door's slots): a newcomer waits behind one item at each stage, not a batch of 16.
    # Beside a flood it keeps a bystander within about 2.4x its quiet latency (17x by default)
    # for about a third less of the flood's throughput (docs/performance.md).
    "cpu-interactive": {
        **{
            stage: Override(
                max_batch_size=1,
                preferred_batch_size=(1,),
                parameters={"scheduling": "batch"},
                why="one item per batch: latency beside a flood before throughput",
            )
            for stage in ("acoustic", "vocoder")
        },
        "tts": Override(max_batch_size=1, why="as its stages"),
    },
}


# Latents handed from acoustic to vocoder as device tensors (DLPack), not through host memory:
# the gpu profile so (gpu-dlpack), and the torch-cpu one so (torch-cpu-dlpack), which CI serves
# to test the hand-off end to end where there is no GPU.
_DLPACK = {"device_tensors": "true"}
_DLPACK_VOCODER = {**_DLPACK, "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}
_DLPACK_WHY = "latents stay on the device from acoustic to vocoder (DLPack)"


for _base in ("gpu", "torch-cpu"):
    PROFILES[f"{_base}-dlpack"] = {
        **PROFILES[_base],
        "acoustic": with_parameters(PROFILES[_base]["acoustic"], _DLPACK, _DLPACK_WHY),
        "vocoder": with_parameters(PROFILES[_base]["vocoder"], _DLPACK_VOCODER, _DLPACK_WHY),
    }


def check_engines(table: dict[str, dict[str, Override]] = PROFILES) -> None:
    """Refuse the null engine in a served profile (it serves silence)."""
    for profile, models in table.items():
        for model, o in models.items():
            if o.parameters.get("engine") == "null":
                raise ValueError(
                    f"profile {profile!r} selects engine null for {model}: that engine serves "
                    "silence and belongs to a benchmark's repository (bench.baselines)"
                )


def expected(repository: Path = REPOSITORY) -> dict[Path, str]:
    """Every generated file: each model's config.pbtxt (its I/O blocks) and its profiles."""
    check_engines()
    return rendered(repository, PROFILES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tts_launcher.profiles", description=__doc__)
    parser.add_argument("--repository", type=Path, default=REPOSITORY)
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected(args.repository).items():
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale profile configs (run python -m tts_launcher.profiles):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
