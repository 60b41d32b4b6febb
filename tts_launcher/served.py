"""What the launcher reads from a repository at start: the profiles it has, the batch sizes
of the configs Triton loads under one, whether its stages schedule by levels."""

from __future__ import annotations

from pathlib import Path

from tts_serving.model_config import parse_settings, pbtxt_parameters, read_model_config
from tts_serving.settings import SETTINGS

REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"
# The stages that batch the voice's work.
BATCHED = ("acoustic", "vocoder")


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


def profiles(repository: Path = REPOSITORY) -> list[str]:
    """Every profile some model of ``repository`` has a config for."""
    return sorted({p.stem for p in repository.glob("*/configs/*.pbtxt")})


def null_engine(profile: str | None, repository: Path = REPOSITORY) -> bool:
    """Whether a stage under ``profile`` runs the null engine (silence: a benchmark's host
    ceiling, never served)."""
    return any(
        pbtxt_parameters(path).get("engine") == "null"
        for path in _stage_config_paths(profile, repository).values()
    )
