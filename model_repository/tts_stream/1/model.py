"""tts_stream: long text -> ordered audio chunks over a decoupled (streaming) response.

Wiring only: the stage is ``tts_serving/triton/tts_stream.py`` (Triton loads this class).
"""

from tts_serving.triton.tts_stream import TtsStream


class TritonPythonModel(TtsStream):
    pass
