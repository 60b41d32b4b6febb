"""Batched inference for the acoustic and vocoder halves of a VITS voice.

Both halves take ragged items, sort them by length, pad each bucket into one call of the
engine (ONNX Runtime in ``onnx.py``, torch in ``torch_engine.py``) and cut every result back to
the item's own length. A bucket that runs out of accelerator memory is retried in halves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tts_serving.engines.batching import (
    halve_on_error,
    join_spans,
    pad_stack,
    run_in_buckets,
    run_side_by_side,
    shared_calls,
    split_by_lengths,
    split_for_lanes,
)

from ..errors import ModelConfigError
from ..levels import Gate, GatedSession
from ..settings import EngineSettings, VocoderSettings
from . import INT8_FILE, WEIGHTS_FILE
from .cpu_share import CpuShare, process_share
from .null import NullAcousticNet, NullVocoderNet
from .onnx import OrtAcousticNet, OrtVocoderNet, SpinWhenAlone, create_session, providers


def model_file(options: EngineSettings) -> str:
    """The file of a voice half the configured engine loads (both are written by export)."""
    if options.engine == "torch":
        return WEIGHTS_FILE
    if options.dtype == "int8":
        return INT8_FILE
    return "model.onnx"  # the null engine reads none, but names the voice's network by it


def check_speakers(voice: str, num_speakers: int, options: EngineSettings) -> None:
    """A multi-speaker voice runs on ONNX Runtime at float32 only (export writes neither torch
    weights nor an int8 vocoder for it): ModelConfigError on another engine or dtype."""
    if num_speakers > 1 and (options.engine == "torch" or options.dtype == "int8"):
        raise ModelConfigError(
            f"voice {voice!r} has {num_speakers} speakers: multi-speaker voices run on the "
            f"onnxruntime engine at float32 only (this profile: engine {options.engine}, dtype "
            f"{options.dtype}); serve it with a float32 ONNX Runtime profile or leave it out"
        )


def torch_options(options: EngineSettings, device_id: int = 0, graph_budget: int = 0):
    from tts_serving.engines.torch_engine import TorchOptions

    return TorchOptions(
        device=options.device,
        device_id=device_id,
        dtype=options.dtype,
        threads=options.intra_op_threads,
        graph_batches=options.graph_batches,
        graph_frames=options.graph_frames,
        graph_phonemes=getattr(options, "graph_phonemes", ()),
        graph_budget=graph_budget,
    )


def load_acoustic(
    path: str | Path,
    options: EngineSettings,
    device_id: int = 0,
    gate: Gate | None = None,
    log: Callable[[str], None] | None = None,
    like: AcousticModel | None = None,
    alone: Callable[[], bool] | None = None,
) -> AcousticModel:
    """The acoustic half in ``path`` (``model_file(options)`` of a voice) on its engine;
    ``gate``: the copy for bulk work, each call through it, on ``like``'s ONNX Runtime
    sessions if given (:func:`sessions`); ``log``: hears when a batch runs on more lanes
    because other processes keep the CPU busy; ``alone``: see :func:`sessions`."""
    if options.engine == "torch":
        from tts_serving.engines.torch_engine import TorchAcousticNet

        # The encoder's lengths are phoneme ids, its graphs' phonemes axis.
        net = TorchAcousticNet(path, torch_options(options, device_id, options.max_padded_length))
        return AcousticModel(net, options)
    if options.engine == "null":
        return AcousticModel(NullAcousticNet(), options)
    net, side_by_side = sessions(path, options, OrtAcousticNet, gate, like, log, alone)
    return AcousticModel(net, options, side_by_side)


def load_vocoder(
    path: str | Path,
    hop_length: int,
    options: EngineSettings,
    device_id: int = 0,
    gate: Gate | None = None,
    log: Callable[[str], None] | None = None,
    like: VocoderModel | None = None,
    alone: Callable[[], bool] | None = None,
) -> VocoderModel:
    """The vocoder half in ``path`` (``model_file(options)`` of a voice) on its engine;
    ``gate``: the copy for bulk work, each call through it, on ``like``'s ONNX Runtime
    sessions if given (:func:`sessions`); ``log``: hears when a batch runs on more lanes
    because other processes keep the CPU busy; ``alone``: see :func:`sessions`."""
    if options.engine == "torch":
        from tts_serving.engines.torch_engine import TorchVocoderNet

        # The vocoder's lengths are latent frames, its graphs' frames axis.
        net = TorchVocoderNet(path, torch_options(options, device_id, options.max_padded_length))
        return VocoderModel(net, hop_length, options)
    if options.engine == "null":
        return VocoderModel(NullVocoderNet(hop_length), hop_length, options)
    split = not isinstance(options, VocoderSettings) or options.split_items
    net, side_by_side = sessions(path, options, OrtVocoderNet, gate, like, log, alone)
    return VocoderModel(net, hop_length, options, side_by_side, split)


def sessions(
    path: str | Path,
    options: EngineSettings,
    kind,
    gate: Gate | None,
    like=None,
    log: Callable[[str], None] | None = None,
    alone: Callable[[], bool] | None = None,
) -> tuple:
    """(net, its SideBySide) of an ONNX Runtime half: the session of
    ``intra_op_threads``, the single-thread ones that run items side by side, and the lanes a
    batch also runs on while other processes keep the CPU busy (``busy_cpu_lanes``): the same
    single-thread sessions again. ONNX Runtime runs concurrent calls of one session side by
    side, each on its caller's thread, so more lanes, and the bulk copy (``like``: the model
    whose sessions it calls, each call through ``gate``), cost no memory and none of the
    seconds an acoustic session takes to load. The bulk copy runs on the quiet lanes only:
    every interactive arrival stops all its running calls, and each stopped call's work is
    lost, so more of them lose more (docs/history (notebook), "Bulk work on the quiet lanes").
    ``alone``: whether a lone item is the only request in the server's stages; with
    ``spin_when_alone`` it then runs on a spinning twin of the multi-thread session unless
    other processes keep the CPU busy (:class:`SpinWhenAlone`; bulk work never does)."""
    if like is not None and isinstance(like.net, kind):
        main = like.net.session
        if isinstance(main, SpinWhenAlone):
            main = main.session
        items = [n.session for n in like.side_by_side.nets]
    else:
        reuse = kind.plan_memory_reuse
        twin = alone is not None and _spins_when_alone(options)
        # The twin and the session it stands in for share one arena: the twin runs only while
        # its item is alone, so together they need about the buffers of one, and a warm-up
        # on either warms both.
        main = create_session(path, options, reuse, shared_arena=twin)
        items = [create_session(path, o, reuse) for o in _item_sessions(options)]
        if twin:
            spinning = create_session(
                path, replace(options, allow_spinning=True), reuse, shared_arena=True
            )
            main = SpinWhenAlone(main, spinning, alone, process_share().others_busy)

    def net(session):
        return kind(session if gate is None else GatedSession(session, gate))

    lanes = [net(session) for session in items]
    more = lanes * max(0, options.busy_cpu_lanes - 1) if gate is None else []
    return net(main), SideBySide(lanes, more, process_share() if more else None, log)


def _spins_when_alone(options: EngineSettings) -> bool:
    """Whether a lone item gets a spinning twin session: on the CPU, with several threads
    (one thread has none to wait on) and no spinning already."""
    return (
        options.spin_when_alone
        and options.intra_op_threads > 1
        and not options.allow_spinning
        and providers(options)[0] == "CPUExecutionProvider"
    )


def _item_sessions(options: EngineSettings) -> list[EngineSettings]:
    """The options of each single-thread session that runs items side by side: one per
    ``intra_op_threads``, on ONNX Runtime on the CPU with ``items_side_by_side`` (none on
    CUDA, where one padded call uses the device best, or with one thread)."""
    if not options.items_side_by_side or options.intra_op_threads < 2:
        return []
    if providers(options)[0] != "CPUExecutionProvider":
        return []
    return [replace(options, intra_op_threads=1)] * options.intra_op_threads


class SideBySide:
    """A half's sessions that run several items one each, side by side (``nets``), with
    the threads that call them; a lone item goes to the half's multi-thread session.
    ``more``: lanes a batch also runs on while other processes keep the CPU busy (``share``):
    the kernel shares a busy CPU by runnable threads (cpu_share.py); ``log`` hears each turn."""

    def __init__(
        self,
        nets: Sequence = (),
        more: Sequence = (),
        share: CpuShare | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.nets = list(nets)
        self.more = list(more) if share is not None else []
        self.share = share
        lanes = len(self.nets) + len(self.more)
        self.pool = ThreadPoolExecutor(lanes) if len(self.nets) > 1 else None
        if self.more and share is not None and log is not None:
            share.listen(self._heard(log), failed=log)

    def _heard(self, log: Callable[[str], None]) -> Callable[[bool, float], None]:
        def heard(busy: bool, cores: float) -> None:
            count = len(self.nets) + len(self.more) if busy else len(self.nets)
            log(f"other processes took {cores:.1f} cores: a batch runs on {count} lanes")

        return heard

    def applies(self, count: int) -> bool:
        return self.pool is not None and count > 1

    def lanes(self) -> list:
        """The sessions a batch runs on now: ``more`` too while others keep the CPU busy."""
        if self.more and self.share is not None and self.share.others_busy():
            return self.nets + self.more
        return self.nets

    def run(
        self,
        items: Sequence,
        lengths: Sequence[int],
        call,
        nets: Sequence = (),
        call_cost: int = 0,
    ) -> list:
        """``call(net, [item]) -> [result]`` for each item on a free net of ``nets``
        (``lanes()`` when none are given); ``call_cost``: what a call costs whatever its
        size, in ``lengths``' units: similar items share a padded call where that saves work
        (:func:`shared_calls`)."""
        assert self.pool is not None
        runners = [partial(call, net) for net in (nets or self.lanes())]
        groups = shared_calls(lengths, len(runners), call_cost)
        return run_side_by_side(items, lengths, runners, self.pool, groups)


@dataclass(frozen=True)
class AcousticResult:
    """One item of the acoustic half: its latent and the frames each of its ids got."""

    latent: np.ndarray  # float32 [192, T] (a torch tensor on its device with device_tensors)
    durations: np.ndarray  # int32 [L]: frames per phoneme id; they sum to T (at least 1)


def with_speed(scales: np.ndarray) -> np.ndarray:
    """Scales [B, 4] (noise, length, noise_w, speed) from [B, 3] or [B, 4]: a missing speed is
    1 (the durations as the length scale gives them, Piper's own)."""
    if scales.ndim != 2 or scales.shape[1] not in (3, 4):
        raise ValueError(f"scales must be [B, 3] or [B, 4], got {list(scales.shape)}")
    if scales.shape[1] == 4:
        return scales
    return np.concatenate([scales, np.ones((len(scales), 1), np.float32)], axis=1)


class AcousticModel:
    """Phoneme ids + per-item scales (+ speakers) -> latent frames [192, T_i] per item."""

    def __init__(
        self,
        net,
        options: EngineSettings,
        side_by_side: SideBySide | None = None,
    ) -> None:
        """``net``: an OrtAcousticNet, a TorchAcousticNet, or an ONNX Runtime session;
        ``side_by_side``: single-thread nets that run several items side by side (CPU)."""
        self.net = OrtAcousticNet(net) if isinstance(net, ort.InferenceSession) else net
        self.side_by_side = side_by_side or SideBySide()
        self.options = options
        # What a call costs whatever its size, in ids (AcousticSettings; 0: an item a call).
        self.call_cost = getattr(options, "shared_call_ids", 0)
        # The torch engine can keep the latents on its device (the DLPack hand-off).
        self.net_options = {"on_device": True} if options.device_tensors else {}
        self.multi_speaker = bool(getattr(self.net, "takes_speakers", False))

    def __call__(
        self, ids: Sequence[np.ndarray], scales: np.ndarray, speakers: Sequence[int] | None = None
    ) -> list[np.ndarray]:
        """``ids``: int64 arrays [L_i]; ``scales``: float32 [B, 4] = (noise, length, noise_w,
        speed), or [B, 3] without the speed (1: the voice's own durations); ``speakers``: each
        item's speaker id of a multi-speaker voice (None: the first)."""
        return [r.latent for r in self.run(ids, scales, speakers)]

    def run(
        self, ids: Sequence[np.ndarray], scales: np.ndarray, speakers: Sequence[int] | None = None
    ) -> list[AcousticResult]:
        """Each item's latent with the frames per id it was built from (word timings)."""
        scales = with_speed(np.asarray(scales, dtype=np.float32).reshape(len(ids), -1))
        sids = speaker_ids(self.multi_speaker, speakers, len(ids))
        items = [(np.asarray(x, dtype=np.int64), scales[i], sids[i]) for i, x in enumerate(ids)]

        lengths = [len(x) for x in ids]
        if self.side_by_side.applies(len(items)):
            return self.side_by_side.run(items, lengths, self._call, call_cost=self.call_cost)

        def run_halving(bucket: list) -> list[AcousticResult]:
            return halve_on_error(partial(self._call, self.net), bucket, self.net.is_out_of_memory)

        o = self.options
        return run_in_buckets(items, lengths, run_halving, o.bucket_max_waste, o.max_padded_length)

    def _call(self, net, bucket: list[tuple[np.ndarray, np.ndarray, int]]) -> list[AcousticResult]:
        """One padded call of ``net`` on ``bucket``'s items (ids, scales, speaker)."""
        padded, lengths = pad_stack([b[0] for b in bucket])
        scales = np.stack([b[1] for b in bucket])
        options = dict(self.net_options)
        if self.multi_speaker:
            options["speakers"] = np.array([b[2] for b in bucket], np.int64)
        latent, frames, durations = net(padded, lengths, scales, **options)
        latents = split_by_lengths(latent, frames)
        return [
            AcousticResult(lat, durations[k, : lengths[k]].astype(np.int32))
            for k, lat in enumerate(latents)
        ]


def speaker_ids(multi_speaker: bool, speakers: Sequence[int] | None, count: int) -> list[int]:
    """Each item's speaker id (0 where none is given); ValueError for a speaker other than 0
    of a network with one speaker (the voice table refuses those with a clear message first)."""
    sids = [0] * count if speakers is None else [int(s) for s in speakers]
    if len(sids) != count:
        raise ValueError(f"{len(sids)} speakers for {count} items")
    if not multi_speaker and any(sids):
        raise ValueError("this voice's network has one speaker")
    return sids


class VocoderModel:
    """Latent frames [192, T_i] (+ speakers) -> audio, exactly T_i * hop_length samples per item."""

    def __init__(
        self,
        net,
        hop_length: int,
        options: EngineSettings,
        side_by_side: SideBySide | None = None,
        split_items: bool = True,
    ) -> None:
        """``net``: an OrtVocoderNet, a TorchVocoderNet, or an ONNX Runtime session;
        ``side_by_side``: single-thread nets that run several items side by side (CPU);
        ``split_items``: items cut into equal stretches over them (``split_for_lanes``)."""
        self.net = OrtVocoderNet(net) if isinstance(net, ort.InferenceSession) else net
        self.side_by_side = side_by_side or SideBySide()
        self.hop_length = hop_length
        self.options = options
        self.multi_speaker = bool(getattr(self.net, "takes_speakers", False))
        # Frames of context a span of an item is computed with to equal the whole item's
        # audio there (None: the network's reach is too wide to split items; they run whole).
        self.context = None
        if split_items and self.side_by_side.pool is not None:
            reach = receptive_field(partial(self._call, self.side_by_side.nets[0]), hop_length)
            self.context = None if reach is None else reach + CONTEXT_MARGIN

    def __call__(
        self, latents: Sequence[np.ndarray], speakers: Sequence[int] | None = None
    ) -> list[np.ndarray]:
        """``speakers``: each item's speaker id of a multi-speaker voice (None: the first)."""
        sids = speaker_ids(self.multi_speaker, speakers, len(latents))
        items = list(zip(latents, sids))
        lengths = [lat.shape[-1] for lat in latents]
        if self.context is not None:
            # Every lane the same work: the items end to end, cut in equal stretches (a lone
            # item long enough runs on every lane too; docs/performance.md).
            nets = self.side_by_side.lanes()
            spans = split_for_lanes(
                lengths, len(nets), self.context, MIN_SPAN_CONTEXTS * self.context
            )
            if len(spans) > 1:
                units = [(items[s.item][0][..., s.lo : s.hi], items[s.item][1]) for s in spans]
                lengths = [s.hi - s.lo for s in spans]
                outputs = self.side_by_side.run(units, lengths, self._call, nets)
                return join_spans(spans, outputs, len(items), self.hop_length)
        elif self.side_by_side.applies(len(items)):
            return self.side_by_side.run(items, lengths, self._call)

        def run_halving(bucket: list) -> list[np.ndarray]:
            return halve_on_error(partial(self._call, self.net), bucket, self.net.is_out_of_memory)

        o = self.options
        return run_in_buckets(items, lengths, run_halving, o.bucket_max_waste, o.max_padded_length)

    def _call(self, net, bucket: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """One padded call of ``net`` on ``bucket``'s items (latent, speaker)."""
        padded, frames = pad_stack([b[0] for b in bucket], axis=-1)
        if self.multi_speaker:
            audio = net(padded, np.array([b[1] for b in bucket], np.int64))
        else:
            audio = net(padded)
        # Past an item's own frames a padded batch holds a non-silent tail: cut it off.
        return split_by_lengths(audio, frames * self.hop_length)


# Frames of context beyond the network's measured reach (its last frames' influence is tiny).
CONTEXT_MARGIN = 2
# A span keeps at least this many contexts of frames: shorter ones cost more in context than
# a second lane saves (docs/history (notebook), "Equal stretches per session").
MIN_SPAN_CONTEXTS = 3
# The widest reach an item is split at (frames each side; Piper's vocoders reach about 10).
MAX_REACH = 48


def receptive_field(call, hop_length: int, channels: int = 192) -> int | None:
    """Frames each side a latent frame changes the vocoder's audio at, measured: one frame of
    a random latent changed, the frames whose audio differs counted (a convolutional
    network's reach is finite; past it the audio is bit for bit the same). None when it
    reaches the window's ends (wider than MAX_REACH). ``call([(latent, speaker)])`` runs one
    item."""
    frames = 2 * MAX_REACH + 9
    middle = frames // 2
    rng = np.random.default_rng(0)
    latent = (0.8 * rng.standard_normal((channels, frames))).astype(np.float32)
    changed = latent.copy()
    changed[:, middle] += 1.0
    (before,) = call([(latent, 0)])
    (after,) = call([(changed, 0)])
    differs = np.abs(after - before).reshape(frames, hop_length).max(axis=1) > 0
    where = np.nonzero(differs)[0]
    if not len(where) or where[0] == 0 or where[-1] == frames - 1:
        return None
    return int(max(middle - where[0], where[-1] - middle))
