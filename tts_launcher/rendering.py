"""A profile's config files, rendered from each model's config.pbtxt and an override, and
each config.pbtxt's ``input``/``output`` blocks and ensemble steps from ``tts_wire.tensors``."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from tts_serving.model_config import (
    TRITON_PARAMETERS,
    own_parameters,
    parse_model_config,
    parse_settings,
)
from tts_serving.settings import SETTINGS
from tts_wire import PRIORITY_LEVELS
from tts_wire.tensors import ENSEMBLES, MODEL_IO, check_ensemble

from .served import BATCHED


@dataclass(frozen=True)
class Override:
    max_batch_size: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None
    max_queue_delay_microseconds: int | None = None
    instance_group: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    why: str = ""


def with_parameters(o: Override, parameters: dict[str, str], why: str) -> Override:
    """``o`` with more parameters, its reason extended."""
    why = f"{o.why}; {why}" if o.why else why
    return dataclasses.replace(o, parameters={**o.parameters, **parameters}, why=why)


def _sub(text: str, pattern: str, replacement: str, what: str) -> str:
    new, n = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    if n != 1:
        raise ValueError(f"config.pbtxt has no {what} to override")
    return new


def render(base: str, model: str, profile: str, o: Override, by: str = "") -> str:
    """config.pbtxt text with the profile's overrides applied; ``by``: what generates it."""
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
    by = by or "`python -m tts_launcher.profiles` (edit PROFILES there)"
    header = (
        f"# Profile {profile!r} of {model}: generated from ../config.pbtxt by\n"
        f"# {by}, not edited here." + (f"\n# {o.why}" if o.why else "") + "\n"
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


def expected(
    repository: Path,
    table: dict[str, dict[str, Override]],
    configs: Path | None = None,
    by: str = "",
) -> dict[Path, str]:
    """Every generated file: each model's config.pbtxt (its I/O blocks) and the profiles of
    ``table``, written under ``configs`` (default: the repository itself) as
    ``<model>/configs/<profile>.pbtxt``."""
    configs = configs or repository
    files = {}
    bases = {}
    for model in MODEL_IO:
        path = repository / model / "config.pbtxt"
        bases[model] = with_io(path.read_text(), model)
        if configs == repository:
            files[path] = bases[model]
    for profile, models in table.items():
        for model, override in models.items():
            base = bases.get(model) or (repository / model / "config.pbtxt").read_text()
            path = configs / model / "configs" / f"{profile}.pbtxt"
            files[path] = render(base, model, profile, override, by)
    return files
