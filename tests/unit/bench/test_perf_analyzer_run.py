"""perf_analyzer_configs.run against a running server whose front door keeps the stages for
the admin key (`make serve`): a clear error naming both ways on, not a traceback."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from perf_analyzer_configs import run


def sweep_failing_with(status: str):
    def sweep(*args, **kwargs):
        raise InferenceServerException("model 'phonemizer' is not served", status=status)

    return sweep


def test_a_stage_kept_for_the_admin_key_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(run, "sweep", sweep_failing_with("StatusCode.PERMISSION_DENIED"))
    argv = ["--smoke", "--grpc-port", "1", "--http-port", "2", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        run.main(argv)
    message = str(exit_.value.code)
    assert "model 'phonemizer' is not served" in message
    assert "--models tts tts_stream" in message and "TTS_FRONT_PUBLIC_MODELS" in message


def test_other_errors_are_not_rewritten(monkeypatch, tmp_path):
    monkeypatch.setattr(run, "sweep", sweep_failing_with("StatusCode.UNAVAILABLE"))
    argv = ["--smoke", "--grpc-port", "1", "--http-port", "2", "--out", str(tmp_path)]
    with pytest.raises(InferenceServerException):
        run.main(argv)
