"""phonemizer: UTF-8 text -> (normalized English) -> the chosen voice's phoneme ids.

Wiring only: the stage is ``tts_serving/triton/phonemizer.py`` (Triton loads this class).
"""

from tts_serving.triton.phonemizer import PhonemizerStage


class TritonPythonModel(PhonemizerStage):
    pass
