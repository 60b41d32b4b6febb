"""ONNX Runtime, the default engine: sessions and one padded-batch call per half."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tts_wire.tensors import LATENT_CHANNELS as LATENT_CHANNELS  # (engines read it here)

from ..errors import ModelConfigError
from ..settings import EngineSettings

# Tensor names inside the exported ONNX files (see export/).
ACOUSTIC_INPUTS = ("phoneme_ids", "phoneme_lengths", "scales")
ACOUSTIC_OUTPUTS = ("latent", "num_frames", "durations")
VOCODER_INPUT = "latent"
VOCODER_OUTPUT = "audio"
# A multi-speaker voice's speaker per item, int64 [B], in both halves (Piper names it "sid";
# export/graph.py makes Piper's [1] per item).
SPEAKER_INPUT = "sid"

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def providers(options: EngineSettings) -> list[str]:
    """ONNX Runtime execution providers for ``options.device``."""
    available = ort.get_available_providers()
    if options.device == "cuda" and "CUDAExecutionProvider" not in available:
        raise ModelConfigError("device=cuda but ONNX Runtime has no CUDAExecutionProvider")
    if options.device != "cpu" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


@functools.cache
def _share_process_arena() -> None:
    """Registers one CPU arena in ONNX Runtime's environment for the sessions created with
    ``shared_arena`` (once per process: a stage's stub)."""
    memory = ort.OrtMemoryInfo(
        "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
    )
    ort.create_and_register_allocator(memory, None)


def create_session(
    path: str | Path,
    options: EngineSettings,
    plan_memory_reuse: bool = True,
    shared_arena: bool = False,
) -> ort.InferenceSession:
    """A session of the file in ``path``. ``plan_memory_reuse=False`` skips ONNX Runtime's
    plan of which intermediate tensor reuses which buffer, on the CPU: on the acoustic graph
    (2,905 nodes, most of them shape arithmetic on ragged lengths) it took 2.3 of the 2.9 s
    a session took to create, and the calls ran no faster and peaked no lower without it
    (docs/history (notebook), "Startup"). ``shared_arena``: its CPU buffers come from one arena
    of the process's, shared with the other sessions created so, instead of an arena of its
    own that grows to its own peak (a spinning twin would double the memory of its half's
    calls, and its first calls would grow the process long after its warm-up)."""
    so = ort.SessionOptions()
    if shared_arena:
        _share_process_arena()
        so.add_session_config_entry("session.use_env_allocators", "1")
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.graph_optimization_level = _OPT_LEVELS[options.graph_optimization]
    so.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if options.allow_spinning else "0"
    )
    so.add_session_config_entry(
        "session.inter_op.allow_spinning", "1" if options.allow_spinning else "0"
    )
    if options.allow_spinning:
        # Spinning between operators, never after the call: an idle stage's threads would
        # otherwise busy-wait on the cores the next stage needs.
        so.add_session_config_entry("session.force_spinning_stop", "1")
    # Sequential execution: the graph is one chain, parallel mode only adds thread hops.
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    chosen = providers(options)
    # On a GPU the plan keeps device memory down; that was not measured without it.
    so.enable_mem_reuse = plan_memory_reuse or chosen[0] != "CPUExecutionProvider"
    return ort.InferenceSession(str(path), sess_options=so, providers=chosen)


class SpinWhenAlone:
    """A session's calls on ``spinning`` (the same file, its threads busy-waiting between
    operators) while ``alone()`` and no other process keeps the CPU busy (``others_busy``),
    else on ``session``. Spinning is faster for a lone request's 2,900 small operators (no
    wake-up at each), but where another stage or process is busy it takes the cores that one
    needs (docs/history (notebook), "Spinning while alone")."""

    def __init__(
        self,
        session,
        spinning,
        alone: Callable[[], bool],
        others_busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.session, self.spinning = session, spinning
        self.alone, self.others_busy = alone, others_busy

    def run(self, outputs, feeds, run_options=None):
        spin = self.alone() and not self.others_busy()
        return (self.spinning if spin else self.session).run(outputs, feeds, run_options)

    def get_inputs(self):
        return self.session.get_inputs()

    def get_providers(self):
        return self.session.get_providers()


class _OrtNet:
    plan_memory_reuse = True  # create_session's, for this half's sessions

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.description = f"ONNX Runtime {ort.__version__} on {session.get_providers()[0]}"
        # A multi-speaker voice's halves take each item's speaker.
        self.takes_speakers = SPEAKER_INPUT in {i.name for i in session.get_inputs()}

    @staticmethod
    def feeds(feeds: dict, speakers: np.ndarray | None) -> dict:
        """``feeds`` with each item's speaker, for a multi-speaker network."""
        if speakers is not None:
            feeds[SPEAKER_INPUT] = np.asarray(speakers, np.int64).reshape(-1)
        return feeds

    @staticmethod
    def is_out_of_memory(error: BaseException) -> bool:
        return False  # never split: ONNX Runtime here runs on the CPU or its CUDA arena


class OrtAcousticNet(_OrtNet):
    """One ONNX Runtime call: padded ids [B, L], lengths [B], scales [B, 4] (and speakers [B]
    of a multi-speaker voice) -> latent [B, 192, T], frames [B], frames per id [B, L]."""

    plan_memory_reuse = False

    def __call__(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        scales: np.ndarray,
        speakers: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        feeds = {"phoneme_ids": ids, "phoneme_lengths": lengths, "scales": scales}
        latent, frames, durations = self.session.run(
            list(ACOUSTIC_OUTPUTS), self.feeds(feeds, speakers)
        )
        return latent, frames.reshape(-1), durations.reshape(ids.shape)


class OrtVocoderNet(_OrtNet):
    """One ONNX Runtime call: padded latents [B, 192, T] (and speakers [B] of a multi-speaker
    voice) -> audio [B, T * hop]."""

    def __call__(self, latent: np.ndarray, speakers: np.ndarray | None = None) -> np.ndarray:
        feeds = self.feeds({VOCODER_INPUT: latent}, speakers)
        (audio,) = self.session.run([VOCODER_OUTPUT], feeds)
        return audio.reshape(latent.shape[0], -1)
