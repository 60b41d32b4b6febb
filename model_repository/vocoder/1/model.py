"""vocoder: latent frames [192, T] -> audio, exactly T * hop_length samples per item.

Wiring only: the stage is ``tts_serving/triton/vocoder.py`` (Triton loads this class).
"""

from tts_serving.triton.vocoder import VocoderStage


class TritonPythonModel(VocoderStage):
    pass
