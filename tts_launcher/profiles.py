"""Alternative configs of the repository: ``configs/<profile>.pbtxt`` beside a config.pbtxt.

Triton reads them with ``--model-config-name=<profile>`` (``make serve PROFILE=gpu``); a model
without one falls back to its config.pbtxt. They are generated from each config.pbtxt plus the
few overrides below, so a change to a model's inputs or defaults reaches every profile. Each
config.pbtxt's ``input`` and ``output`` blocks are generated too, from the declarations in
``tts_wire.tensors``:

    python -m tts_launcher.profiles            # rewrite them
    python -m tts_launcher.profiles --check    # fail when a committed file is stale (a test does)

- ``gpu``: the torch engine on CUDA in float16 with CUDA graphs, batches up to 64; the
  phonemizer (espeak-ng, CPU) gets several instances to keep up.
- ``torch-cpu``: the torch engine on the CPU, everything else as config.pbtxt (what CI uses to
  test the torch engine end to end).
- ``cpu-fixed-lanes``: BENCHMARK BASELINE, no more single-thread sessions while other
  processes keep the CPU busy (``busy_cpu_lanes`` 1): what ``bench.compare`` on a busy
  machine measures the default's against.
- ``cpu-int8``: the vocoder in int8 (ONNX Runtime static quantization, the last stage in
  float32; ``export/quantize.py``), within the quality gates of ``bench.cpu_variants``; not the
  default (docs/performance.md, "Cheaper arithmetic", says why).
- ``cpu-whole-items``: BENCHMARK BASELINE, the vocoder's items whole (``split_items``
  false): what ``bench.compare`` measures the default's equal stretches per session against.
- ``cpu-padded``: BENCHMARK BASELINE, the CPU default's batches padded into calls on one
  multi-thread session (``items_side_by_side`` false), what ``bench.compare`` measures the
  default's items side by side against.
- ``cpu-interactive``: one item per batch at the voice's stages (latency beside a flood
  before throughput).
- ``cpu-batch``: BENCHMARK BASELINE, the stages batch as Triton forms batches, bulk work
  beside interactive work (``scheduling`` batch): what the default's levels (the front
  door's bulk requests run only while no interactive work is in the server) are measured
  against.
- ``host-ceiling``, ``gpu-host-ceiling``: BENCHMARK ONLY, the default's and the gpu profile's
  batching with the null engine (silence, no network): the host path's own ceiling.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tts_serving.model_config import (
    TRITON_PARAMETERS,
    own_parameters,
    parse_model_config,
    parse_settings,
    pbtxt_parameters,
    read_model_config,
)
from tts_serving.settings import SETTINGS
from tts_wire import PRIORITY_LEVELS
from tts_wire.tensors import ENSEMBLES, MODEL_IO, check_ensemble

REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"


@dataclass(frozen=True)
class Override:
    max_batch_size: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None
    max_queue_delay_microseconds: int | None = None
    instance_group: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    why: str = ""


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
                # Up to max_phoneme_ids (400); eager, their launches took 20 of a lone
                # request's 31 ms on an H100 (docs/gpu.md).
                "cuda_graph_phonemes": "32,64,128,256,400",
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
    "cpu-padded": {
        stage: Override(
            parameters={"items_side_by_side": "false"},
            why="BENCHMARK BASELINE: each batch padded into calls on one 2-thread session",
        )
        for stage in ("acoustic", "vocoder")
    },
    "cpu-whole-items": {
        "vocoder": Override(
            parameters={"split_items": "false"},
            why="BENCHMARK BASELINE: whole items side by side, a lone one on the 2-thread session",
        ),
    },
    "cpu-fixed-lanes": {
        stage: Override(
            parameters={"busy_cpu_lanes": "1"},
            why="BENCHMARK BASELINE: one lane per thread also while other processes are busy",
        )
        for stage in ("acoustic", "vocoder")
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
    # BENCHMARK BASELINE: the stages run each batch Triton forms as one, bulk work beside
    # interactive work (the default before 0.9.0), what bench.flood measures levels against.
    "cpu-batch": {
        stage: Override(
            parameters={"scheduling": "batch"},
            why="BENCHMARK BASELINE: batches as Triton forms them, bulk and interactive alike",
        )
        for stage in ("acoustic", "vocoder")
    },
}


# Latents handed from acoustic to vocoder as device tensors (DLPack), not through host memory:
# the gpu profile so (gpu-dlpack), and the torch-cpu one so (torch-cpu-dlpack), which CI serves
# to test the hand-off end to end where there is no GPU.
_DLPACK = {"device_tensors": "true"}
_DLPACK_VOCODER = {**_DLPACK, "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}
_DLPACK_WHY = "latents stay on the device from acoustic to vocoder (DLPack)"


def _with(o: Override, parameters: dict[str, str], why: str) -> Override:
    why = f"{o.why}; {why}" if o.why else why
    return dataclasses.replace(o, parameters={**o.parameters, **parameters}, why=why)


for _base in ("gpu", "torch-cpu"):
    PROFILES[f"{_base}-dlpack"] = {
        **PROFILES[_base],
        "acoustic": _with(PROFILES[_base]["acoustic"], _DLPACK, _DLPACK_WHY),
        "vocoder": _with(PROFILES[_base]["vocoder"], _DLPACK_VOCODER, _DLPACK_WHY),
    }

# Benchmark only: the gpu profile's and the default's batching with the null engine (no
# network; silence of the real lengths), so perf_analyzer measures what Triton, the stubs, the
# ensemble and the phonemizer carry at all (perf_analyzer_configs.host_ceiling). No other
# profile may select that engine, and the launcher refuses to serve these.
BENCHMARK_PROFILES = ("host-ceiling", "gpu-host-ceiling")
# The stages that batch the voice's work.
BATCHED = ("acoustic", "vocoder")
_NULL_WHY = "BENCHMARK ONLY: the null engine serves silence (perf_analyzer_configs.host_ceiling)"
PROFILES["host-ceiling"] = {
    model: Override(parameters={"engine": "null"}, why=_NULL_WHY)
    for model in ("acoustic", "vocoder")
}
PROFILES["gpu-host-ceiling"] = {
    **PROFILES["gpu"],
    **{
        model: dataclasses.replace(
            o,
            # KIND_CPU: the null engine touches no GPU, so this profile loads on any machine.
            instance_group=o.instance_group.replace("KIND_GPU", "KIND_CPU"),
            parameters={"engine": "null", "max_padded_length": o.parameters["max_padded_length"]},
            why=_NULL_WHY,
        )
        for model, o in PROFILES["gpu"].items()
        if model != "phonemizer"
    },
}


def front_slots(profile: str | None, repository: Path = REPOSITORY) -> int:
    """``tts`` requests the front door passes on to Triton at once under ``profile`` (None:
    config.pbtxt): two full batches of the batched stages as the configs Triton loads from
    ``repository`` give them, one computed while the next forms. One batch on a CPU halved a
    bystander's wait beside a flood (`python -m bench.flood`) but left requests on half the
    cores waiting in the front door 16 s before their refusal (docs/admission.md)."""
    return 2 * max(config.max_batch_size for config in _stage_configs(profile, repository))


def front_streams(profile: str | None, repository: Path = REPOSITORY) -> int:
    """``tts_stream``'s ``max_streams`` under ``profile``: the front door keeps the last of
    them for clients running none (FrontSettings.server_streams)."""
    path = _config_path("tts_stream", profile, repository)
    return parse_settings(SETTINGS["tts_stream"], pbtxt_parameters(path), "tts_stream").max_streams


def levels_scheduled(profile: str | None, repository: Path = REPOSITORY) -> bool:
    """Whether the batched stages run bulk work only on the time interactive work leaves
    (EngineSettings.levels), so the front door may send interactive requests at once."""
    return all(
        parse_settings(SETTINGS[name], pbtxt_parameters(path), name).levels
        for name, path in _stage_config_paths(profile, repository).items()
    )


def _config_path(name: str, profile: str | None, repository: Path) -> Path:
    """The file of model ``name``'s config Triton loads under ``profile``."""
    config = repository / name / "configs" / f"{profile}.pbtxt"
    return config if profile and config.exists() else repository / name / "config.pbtxt"


def _stage_config_paths(profile: str | None, repository: Path) -> dict[str, Path]:
    """The files of the batched stages' configs Triton loads under ``profile``, by model."""
    return {name: _config_path(name, profile, repository) for name in BATCHED}


def _stage_configs(profile: str | None, repository: Path) -> list:
    """The batched stages' configs Triton loads under ``profile`` from ``repository``."""
    return [read_model_config(p) for p in _stage_config_paths(profile, repository).values()]


def check_engines(profiles: dict[str, dict[str, Override]] = PROFILES) -> None:
    """Refuse the null engine in any profile but a benchmark one (it serves silence)."""
    for profile, models in profiles.items():
        for model, o in models.items():
            if o.parameters.get("engine") == "null" and profile not in BENCHMARK_PROFILES:
                raise ValueError(
                    f"profile {profile!r} selects engine null for {model}: that engine serves "
                    f"silence and is for {', '.join(BENCHMARK_PROFILES)} only"
                )


def _sub(text: str, pattern: str, replacement: str, what: str) -> str:
    new, n = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    if n != 1:
        raise ValueError(f"config.pbtxt has no {what} to override")
    return new


def render(base: str, model: str, profile: str, o: Override) -> str:
    """config.pbtxt text with the profile's overrides applied."""
    text = base
    if o.max_batch_size is not None:
        text = _sub(text, r"^max_batch_size: \d+", f"max_batch_size: {o.max_batch_size}", "mbs")
    if o.preferred_batch_size is not None:
        sizes = ", ".join(map(str, o.preferred_batch_size))
        text = _sub(
            text, r"preferred_batch_size: \[[^\]]*\]", f"preferred_batch_size: [ {sizes} ]", "pbs"
        )
    if o.max_queue_delay_microseconds is not None:
        delay = o.max_queue_delay_microseconds
        text = _sub(
            text,
            r"max_queue_delay_microseconds: \d+",
            f"max_queue_delay_microseconds: {delay}",
            "d",
        )
    if o.instance_group is not None:
        text = _sub(text, r"^instance_group \[.*\]$", f"instance_group {o.instance_group}", "ig")
    for key, value in o.parameters.items():
        line = f'parameters {{ key: "{key}", value: {{ string_value: "{value}" }} }}'
        if key in TRITON_PARAMETERS:  # the Python backend's own: not in config.pbtxt, added
            text = text.rstrip("\n") + f"\n# Read by Triton's Python backend itself.\n{line}\n"
            continue
        text = _sub(text, rf'^parameters {{ key: "{re.escape(key)}".*$', line, f"parameter {key}")
    text = batch_queue(text, model)
    header = (
        f"# Profile {profile!r} of {model}: generated by `python -m tts_launcher.profiles` from\n"
        f"# ../config.pbtxt; edit PROFILES there, not this file."
        + (f"\n# {o.why}" if o.why else "")
        + "\n"
    )
    return header + text


def batch_queue(text: str, model: str) -> str:
    """A batched stage's config text with Triton's queue policy and priority levels when the
    stage batches as Triton forms batches (scheduling batch: the gpu profile, the torch engine,
    cpu-batch); a stage scheduling by levels keeps its own queue and levels, and either in
    Triton's config would turn its prefetching off (config.pbtxt says why)."""
    if model not in BATCHED:
        return text
    params = own_parameters(parse_model_config(text, model))
    settings = parse_settings(SETTINGS[model], params, model)
    if settings.levels:
        return text
    lines = (
        "  # Scheduling batch: Triton queues the stage's requests. A full queue answers\n"
        "  # UNAVAILABLE at once; interactive requests (a client's priority 1) go before bulk\n"
        "  # ones (2, the default: a Python-backend BLS request, tts_stream's, carries none).\n"
        f"  default_queue_policy {{ max_queue_size: {settings.max_queue_size} }}\n"
        f"  priority_levels: {PRIORITY_LEVELS}\n"
        f"  default_priority_level: {PRIORITY_LEVELS}\n"
    )
    # In place of config.pbtxt's note on why a levels stage has neither.
    return _sub(text, r"^  # No queue policy(?:.*\n)*?(?=\}$)", lines, "levels queue note")


def with_io(text: str, model: str) -> str:
    """config.pbtxt text with its ``input`` and ``output`` blocks (and an ensemble's steps) as
    tts_wire.tensors declares them (the one place a tensor is declared)."""
    io = MODEL_IO[model]
    for kind, tensors in (("input", io.inputs), ("output", io.outputs)):
        block = f"{kind} [\n" + ",\n".join(t.pbtxt() for t in tensors) + "\n]"
        text = _sub(text, rf"^{kind} \[\n(?:.*\n)*?\]$", block.replace("\\", "\\\\"), kind)
    if model in ENSEMBLES:
        block = ensemble_scheduling(model)
        text = _sub(text, r"^ensemble_scheduling \{\n(?:.*\n)*?\}$", block, "ensemble_scheduling")
    return text


def ensemble_scheduling(model: str) -> str:
    """The ``ensemble_scheduling`` block of ``model``: each step maps every input and output of
    its model to the tensor of the same name."""
    check_ensemble(model)
    steps = []
    for step in ENSEMBLES[model]:
        io = MODEL_IO[step]
        maps = [f'      input_map {{ key: "{t.name}", value: "{t.name}" }}' for t in io.inputs]
        maps += [f'      output_map {{ key: "{t.name}", value: "{t.name}" }}' for t in io.outputs]
        lines = [f'      model_name: "{step}"', "      model_version: -1", *maps]
        steps.append("    {\n" + "\n".join(lines) + "\n    }")
    return "ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}"


def expected(repository: Path = REPOSITORY) -> dict[Path, str]:
    """Every generated file: each model's config.pbtxt (its I/O blocks) and its profiles."""
    check_engines()
    files = {}
    bases = {}
    for model in MODEL_IO:
        path = repository / model / "config.pbtxt"
        files[path] = bases[model] = with_io(path.read_text(), model)
    for profile, models in PROFILES.items():
        for model, override in models.items():
            base = bases.get(model) or (repository / model / "config.pbtxt").read_text()
            path = repository / model / "configs" / f"{profile}.pbtxt"
            files[path] = render(base, model, profile, override)
    return files


def profiles(repository: Path = REPOSITORY) -> list[str]:
    """Every profile some model of ``repository`` has a config for."""
    return sorted({p.stem for p in repository.glob("*/configs/*.pbtxt")})


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
