"""``python -m tts_client``: what it refuses before any work, and what --help says."""

from __future__ import annotations

import pytest

from tts_client import cli


def test_an_output_format_it_cannot_write_is_refused_before_synthesizing(capsys, monkeypatch):
    def no_server(*_args, **_kwargs):
        raise AssertionError("connected to a server before checking the output")

    monkeypatch.setattr(cli, "TTSClient", no_server)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["Hello.", "-o", "x.mp3"])
    assert exit_.value.code == 2
    assert "--output must name a .wav or .flac file, not 'x.mp3'" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="connected"):  # no suffix: WAV, as before
        cli.main(["Hello.", "-o", "/dev/null"])


def test_help_shows_the_defaults_and_every_option_has_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "(default: out.wav)" in shown and "(default: grpc://localhost:8001)" in shown
    assert "--model MODEL the Triton model to call" in shown
