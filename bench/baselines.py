"""The baselines the benchmarks measure the served defaults against, in a repository of their
own: the exported model folders of ``model_repository`` linked, not copied, and beside each
served profile the baseline configs, rendered from the same config.pbtxt so a change to a model
reaches them too. ``model_repository`` itself holds only what is served.

    python -m bench.baselines --out out/baselines     # make it (then serve or benchmark it)
    python -m bench.compare --repository out/baselines --profile cpu-padded ...

- ``cpu-padded``: the CPU default's batches padded into calls on one multi-thread session
  (``items_side_by_side`` false), against the default's items side by side.
- ``cpu-whole-items``: the vocoder's items whole (``split_items`` false), against the default's
  equal stretches per session.
- ``cpu-fixed-lanes``: no more single-thread sessions while other processes keep the CPU busy
  (``busy_cpu_lanes`` 1), against the default's on a busy machine.
- ``cpu-batch``: the stages batch as Triton forms batches, bulk beside interactive work
  (``scheduling`` batch), against the default's levels (bench.flood).
- ``host-ceiling``, ``gpu-host-ceiling``: the default's and the gpu profile's batching with the
  null engine (silence of the real lengths, no network): the host path's own ceiling
  (perf_analyzer_configs.host_ceiling). The launcher refuses to serve these.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path

from tts_launcher.profiles import PROFILES
from tts_launcher.rendering import Override, expected
from tts_launcher.served import BATCHED, REPOSITORY

_BY = "`bench.baselines` (a benchmark's baseline, never served)"
_NULL_WHY = "the null engine serves silence (perf_analyzer_configs.host_ceiling)"


def _each_stage(**parameters: str) -> dict[str, Override]:
    return {stage: Override(parameters=parameters) for stage in BATCHED}


BASELINES: dict[str, dict[str, Override]] = {
    "cpu-padded": _each_stage(items_side_by_side="false"),
    "cpu-whole-items": {"vocoder": Override(parameters={"split_items": "false"})},
    "cpu-fixed-lanes": _each_stage(busy_cpu_lanes="1"),
    "cpu-batch": _each_stage(scheduling="batch"),
    "host-ceiling": {
        stage: Override(parameters={"engine": "null"}, why=_NULL_WHY) for stage in BATCHED
    },
    "gpu-host-ceiling": {
        **PROFILES["gpu"],
        **{
            stage: dataclasses.replace(
                o,
                # KIND_CPU: the null engine touches no GPU, so this profile loads on any machine.
                instance_group=(o.instance_group or "").replace("KIND_GPU", "KIND_CPU"),
                parameters={
                    "engine": "null",
                    "max_padded_length": o.parameters["max_padded_length"],
                },
                why=_NULL_WHY,
            )
            for stage, o in PROFILES["gpu"].items()
            if stage in BATCHED
        },
    },
}


def configs(dest: Path, source: Path = REPOSITORY) -> dict[Path, str]:
    """The baseline config files of a repository made at ``dest`` from ``source``."""
    return expected(source, BASELINES, configs=dest, by=_BY)


def baseline_repository(dest: Path, source: Path = REPOSITORY) -> Path:
    """``dest`` as a repository: every model of ``source`` (its config.pbtxt, its version
    folders and its served profiles linked), and the baselines' configs. Made again each time
    (the served configs may have changed)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for model in sorted(p.parent for p in source.glob("*/config.pbtxt")):
        (dest / model.name / "configs").mkdir(parents=True)
        for entry in model.iterdir():
            if entry.name != "configs":
                (dest / model.name / entry.name).symlink_to(entry.resolve())
        for served in model.glob("configs/*.pbtxt"):
            (dest / model.name / "configs" / served.name).symlink_to(served.resolve())
    for top in source.iterdir():  # the export's manifest, voices.json...
        if top.is_file():
            (dest / top.name).symlink_to(top.resolve())
    for path, text in configs(dest, source).items():
        path.write_text(text)
    return dest


def repository_for(profile: str | None, dest: Path, source: Path = REPOSITORY) -> Path:
    """The repository a benchmark serves ``profile`` from: a baseline's own (made at
    ``dest``), else ``source``."""
    return baseline_repository(dest, source) if profile in BASELINES else source


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.baselines", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("out/baselines"))
    p.add_argument("--repository", type=Path, default=REPOSITORY, help="the served one")
    args = p.parse_args(argv)
    made = baseline_repository(args.out, args.repository)
    print(f"{made}: the served repository's models with the baselines {', '.join(BASELINES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
