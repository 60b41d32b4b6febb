"""The export as a library: Piper voices -> model_repository/ files, verified, with a manifest.

``python -m export`` (``export/__main__.py``) is its command line; ``export(specs, repository)``
does the work. Writes acoustic/1/model.onnx, vocoder/1/model.onnx and voice.json beside each
model that needs the voice's settings, then proves the split pipeline equals the whole source
model. With several voices the first is laid out as above and each other under
``<model>/1/voices/<name>/``, with ``voices.json`` listing them; a voice that is the same network
with other defaults shares the first one's graph files. A manifest records what was exported
from what, so a second run with the same inputs returns at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from export.torch_weights import convert
from tts_serving.engines import INT8_FILE, WEIGHTS_FILE
from tts_serving.engines.loudness import LOUDNESS_FILE, VoiceLoudness
from tts_serving.settings import load_settings
from tts_serving.stream.windows import REACH_FILE, write_reach
from tts_serving.voices import FOLDER, INDEX, check_name, load_voice_config

from .graph import (
    blocked_stages,
    convolutions_as_2d,
    make_scales_per_item,
    make_speakers_per_item,
    split,
    transposed_convolutions_as_convolutions,
)
from .quantize import export_int8_vocoder
from .serving import servers
from .verify import torch_installed, verify

log = logging.getLogger("export")

EXPORT_FORMAT = 11  # bump when the graph surgery or the layout changes, so old exports are redone
MANIFEST = ".export-manifest.json"
VOICE_JSON_MODELS = ("phonemizer", "acoustic", "vocoder", "tts_stream")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


INFERENCE_KEYS = ("noise_scale", "length_scale", "noise_w")


@dataclass(frozen=True)
class VoiceSpec:
    """One voice to export: its name, Piper files and overrides of its inference defaults."""

    name: str
    model: Path
    config: Path
    inference: dict[str, float] = field(default_factory=dict)

    def voice_json(self) -> dict:
        data = json.loads(self.config.read_text(encoding="utf-8"))
        data["inference"] = {**data.get("inference", {}), **self.inference}
        return data


def default_name(config: Path) -> str:
    """A Piper voice's dataset name ("joe" for en_US-joe-medium)."""
    return str(json.loads(config.read_text(encoding="utf-8")).get("dataset") or "default")


def load_specs(path: Path, default_model: Path) -> list[VoiceSpec]:
    """``[{"name": "joe"}, {"name": "joe_slow", "length_scale": 1.3}, {"name": "amy",
    "model": "/voices/en_US-amy-medium.onnx"}]``; ``model`` defaults to the bundled voice and
    ``config`` to MODEL.json."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"cannot read voices file {path}: {e}") from None
    if not isinstance(entries, list) or not entries:
        raise SystemExit(f"{path}: expected a non-empty JSON list of voices")
    specs = []
    for entry in entries:
        unknown = set(entry) - {"name", "model", "config", *INFERENCE_KEYS}
        if unknown:
            raise SystemExit(
                f"{path}: voice {entry.get('name')!r}: unknown key(s) {sorted(unknown)}"
            )
        model = Path(entry.get("model") or default_model)
        config = Path(entry.get("config") or f"{model}.json")
        for file in (model, config):
            if not file.exists():
                raise SystemExit(f"{path}: voice {entry.get('name')!r}: {file} does not exist")
        try:
            name = check_name(str(entry.get("name") or default_name(config)))
        except ValueError as e:
            raise SystemExit(f"{path}: {e}") from None
        inference = {k: float(entry[k]) for k in INFERENCE_KEYS if k in entry}
        specs.append(VoiceSpec(name, model, config, inference))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: voice names must be distinct, got {names}")
    return specs


def _folder(repo: Path, model: str, specs: list[VoiceSpec], spec: VoiceSpec) -> Path:
    base = repo / model / "1"
    return base if spec is specs[0] else base / FOLDER / spec.name


def _own_graph(specs: list[VoiceSpec], spec: VoiceSpec) -> bool:
    """Whether ``spec`` needs its own graph files (a network other than the first voice's)."""
    return spec is specs[0] or spec.model.resolve() != specs[0].model.resolve()


def _multi_speaker(spec: VoiceSpec) -> bool:
    return load_voice_config(spec.config).num_speakers > 1


def _outputs(repo: Path, specs: list[VoiceSpec]) -> list[Path]:
    files = []
    for spec in specs:
        if _own_graph(specs, spec):
            acoustic, vocoder = (_folder(repo, m, specs, spec) for m in ("acoustic", "vocoder"))
            files += [acoustic / "model.onnx", vocoder / "model.onnx", vocoder / LOUDNESS_FILE]
            files += [vocoder / REACH_FILE, _folder(repo, "tts_stream", specs, spec) / REACH_FILE]
            if not _multi_speaker(spec):  # the torch engine's and cpu-int8's files
                files += [acoustic / WEIGHTS_FILE, vocoder / WEIGHTS_FILE, vocoder / INT8_FILE]
        files += [_folder(repo, m, specs, spec) / "voice.json" for m in VOICE_JSON_MODELS]
    return files + [repo / m / "1" / INDEX for m in VOICE_JSON_MODELS]


def _manifest(specs: list[VoiceSpec], repo: Path) -> dict:
    return {
        "format": EXPORT_FORMAT,
        # An export without torch did not check the torch engine: with torch now, redo it.
        "torch_checked": torch_installed(),
        "voices": [
            {
                "name": s.name,
                "onnx": _sha256(s.model),
                "config": _sha256(s.config),
                "inference": s.inference,
            }
            for s in specs
        ],
        "outputs": {
            str(p.relative_to(repo)): _sha256(p) for p in _outputs(repo, specs) if p.exists()
        },
    }


def check_config_parameters(repo: Path, sample_rate: int, hop_length: int) -> None:
    """The sample rate clients read from config.pbtxt must be the voice's own."""
    for model, key, want in (
        ("tts", "sample_rate", sample_rate),
        ("vocoder", "sample_rate", sample_rate),
        ("vocoder", "hop_length", hop_length),
    ):
        value = getattr(load_settings(repo, model), key)
        if value != want:
            raise SystemExit(
                f"{model}/config.pbtxt parameter {key} is {value}, "
                f"the voice has {want}: fix the config"
            )


def vocoder_reach(path: Path, hop_length: int) -> int:
    """The frames each side one latent frame changes the vocoder's audio at, measured on the
    network in ``path`` (tts_stream decodes windows with this much context)."""
    import onnxruntime as ort

    from tts_serving.engines.models import receptive_field
    from tts_serving.engines.onnx import OrtVocoderNet

    net = OrtVocoderNet(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))

    def call(items):
        latent = np.stack([latent for latent, _ in items])
        speakers = np.array([s for _, s in items]) if net.takes_speakers else None
        return list(net(latent, speakers))

    reach = receptive_field(call, hop_length)
    if reach is None:
        raise SystemExit(f"{path}: the vocoder's reach is too wide to decode it in windows")
    return reach


def export_graphs(source: Path, config: Path, acoustic_dir: Path, vocoder_dir: Path) -> None:
    """Split ``source``, prove the halves equal it, write them, the voice's loudness and the
    vocoder's reach (and, for a single-speaker voice, the torch engine's weights and the int8
    vocoder)."""
    voice = load_voice_config(config)
    t0 = time.perf_counter()
    log.info("loading %s (%.0f MB)", source, source.stat().st_size / 1e6)
    model = onnx.load(str(source))
    make_scales_per_item(model)
    multi_speaker = make_speakers_per_item(model)
    if multi_speaker != (voice.num_speakers > 1):
        raise SystemExit(
            f"{config} says num_speakers {voice.num_speakers} but {source} "
            f"{'takes' if multi_speaker else 'has no'} speaker input (sid): they must agree"
        )
    acoustic, vocoder = split(model)
    log.info(
        "split into acoustic + vocoder with per-item scales%s in %.1f s",
        f" and speakers ({voice.num_speakers})" if multi_speaker else "",
        time.perf_counter() - t0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        # Each half in its own folder, as in the repository: its weights file lies beside it.
        a_path, v_path = Path(tmp) / "acoustic" / "model.onnx", Path(tmp) / "vocoder" / "model.onnx"
        a_path.parent.mkdir()
        v_path.parent.mkdir()
        onnx.save(acoustic, str(a_path))
        onnx.save(vocoder, str(v_path))
        if not multi_speaker:  # the torch engine has no speaker embedding: onnxruntime only
            convert(a_path, v_path)  # weights.safetensors beside each, for the torch engine
        # int8 quantizes the 1-D graph, the one its quality gates were measured on.
        one_d_vocoder = Path(tmp) / "vocoder-1d.onnx"
        shutil.copy(v_path, one_d_vocoder)
        rewritten = [convolutions_as_2d(part) for part in (acoustic, vocoder)]
        upsampling = transposed_convolutions_as_convolutions(vocoder)
        blocked = blocked_stages(vocoder)
        onnx.save(acoustic, str(a_path))
        onnx.save(vocoder, str(v_path))
        log.info(
            "convolutions as 2-D (ONNX Runtime's faster kernels): %d + %d, %d upsampling "
            "layers as phase convolutions, the vocoder's stages blocked (%d LeakyReLUs)",
            *rewritten,
            upsampling,
            blocked,
        )
        log.info("verifying against the whole source model (about 30 s on 2 cores)")
        result = verify(source, a_path, v_path, voice)
        if not result.ok:
            raise SystemExit(f"split model differs from the source model: {result}")
        loudness = VoiceLoudness.measure(result.audio)
        log.info(
            "voice loudness: median %.1f dBFS RMS, peak %.2f -> gain %.3f",
            loudness.rms_dbfs,
            loudness.peak,
            loudness.gain,
        )
        vocoder_dir.mkdir(parents=True, exist_ok=True)
        acoustic_dir.mkdir(parents=True, exist_ok=True)
        loudness.write(vocoder_dir / LOUDNESS_FILE)
        reach = vocoder_reach(v_path, voice.hop_length)
        log.info("the vocoder reaches %d frames each side (tts_stream's windows' context)", reach)
        write_reach(vocoder_dir / REACH_FILE, reach)
        if not multi_speaker:
            t1 = time.perf_counter()
            export_int8_vocoder(a_path, one_d_vocoder, voice, v_path.with_name(INT8_FILE))
            log.info(
                "quantized the vocoder to int8 (profile cpu-int8) in %.1f s",
                time.perf_counter() - t1,
            )
            shutil.move(str(v_path.with_name(INT8_FILE)), vocoder_dir / INT8_FILE)
        for path, folder in ((a_path, acoustic_dir), (v_path, vocoder_dir)):
            shutil.move(str(path), folder / "model.onnx")
            if not multi_speaker:
                shutil.move(str(path.with_name(WEIGHTS_FILE)), folder / WEIGHTS_FILE)


def export(
    specs: list[VoiceSpec],
    repo: Path,
    force: bool = False,
    voices_file: Path | None = None,
    check_torch: bool = False,
) -> bool:
    """Export if needed; returns True when files were (re)written. ``voices_file`` (the
    ``--voices`` list they came from) is recorded, so a later plain export keeps them.
    ``check_torch``: an export made without torch is redone (and checked against the torch
    engine) now that torch is here; otherwise only a change of the voices or of the exporter
    redoes it. Refused while a launcher serves ``repo`` (export.serving)."""
    for spec in specs:
        voice = load_voice_config(spec.config)
        try:
            check_config_parameters(repo, voice.sample_rate, voice.hop_length)
        except SystemExit as e:
            raise SystemExit(f"voice {spec.name!r}: {e}") from None
    manifest_path = repo / MANIFEST
    if not force and manifest_path.exists():
        recorded = json.loads(manifest_path.read_text())
        recorded.pop("voices_file", None)
        now = _manifest(specs, repo)
        checked, torch = recorded.pop("torch_checked", False), now.pop("torch_checked")
        if (
            recorded == now
            and len(recorded["outputs"]) == len(_outputs(repo, specs))
            and (checked or not torch or not check_torch)
        ):
            log.info("model files are up to date (use --force to redo)")
            return False
    running = servers(repo)
    if running:
        raise SystemExit(
            f"{repo} is being served (launcher pid {', '.join(map(str, running))}): stop it "
            "(Ctrl-C) before exporting into it, or export into another --repository"
        )

    t0 = time.perf_counter()
    for model in VOICE_JSON_MODELS:  # voices from an earlier export must not linger
        shutil.rmtree(repo / model / "1" / FOLDER, ignore_errors=True)
    for spec in specs:
        if _own_graph(specs, spec):
            export_graphs(
                spec.model,
                spec.config,
                _folder(repo, "acoustic", specs, spec),
                _folder(repo, "vocoder", specs, spec),
            )
        for model in VOICE_JSON_MODELS:
            folder = _folder(repo, model, specs, spec)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "voice.json").write_text(json.dumps(spec.voice_json(), indent=2) + "\n")
        if _own_graph(specs, spec):  # tts_stream's windows need it; voices sharing a net share it
            reach = _folder(repo, "vocoder", specs, spec) / REACH_FILE
            shutil.copy(reach, _folder(repo, "tts_stream", specs, spec) / REACH_FILE)
    for model in VOICE_JSON_MODELS:
        index = {"voices": [s.name for s in specs]}
        (repo / model / "1" / INDEX).write_text(json.dumps(index) + "\n")
    manifest = _manifest(specs, repo)
    if voices_file is not None:
        manifest["voices_file"] = str(Path(voices_file).resolve())
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    log.info(
        "exported voices %s into %s in %.1f s",
        ", ".join(s.name for s in specs),
        repo,
        time.perf_counter() - t0,
    )
    return True


def last_voices_file(repo: Path) -> Path | None:
    """The --voices list of the last export, when it is still there."""
    try:
        recorded = json.loads((repo / MANIFEST).read_text()).get("voices_file")
    except (OSError, ValueError):
        return None
    if not recorded:
        return None
    if not Path(recorded).exists():
        log.warning("the last export's voices file %s is gone: exporting one voice", recorded)
        return None
    log.info(
        "keeping the voices of %s (the last export's); --voices FILE or --single-voice changes "
        "that",
        recorded,
    )
    return Path(recorded)
