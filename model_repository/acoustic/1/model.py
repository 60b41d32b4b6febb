"""acoustic: phoneme ids (+ per-item speed and noise) -> latent frames [192, T] per item.

Wiring only: the stage is ``tts_serving/triton/acoustic.py`` (Triton loads this class).
"""

from tts_serving.triton.acoustic import AcousticStage


class TritonPythonModel(AcousticStage):
    pass
