"""The torch engine: the voice's modules on CPU or CUDA, optionally in CUDA graphs.

``TorchAcousticNet`` and ``TorchVocoderNet`` have the same call shape as the ONNX Runtime nets
in ``onnx.py`` (padded numpy batch in, padded numpy batch out), so the sort/pad/trim
batching around them is shared. On CUDA the length-scaled work (the flow and the vocoder) runs
in ``dtype`` (float16 by default) and, when buckets are configured, as CUDA graphs captured
at start for a grid of (batch, frames) shapes; a batch is padded up to the smallest bucket
that holds it, and one larger than every bucket runs eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tts_serving.engines.torch_decoder import Decoder
from tts_serving.engines.torch_vits import VitsAcoustic
from tts_serving.engines.torch_weights import load

from ..errors import ModelConfigError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class TorchOptions:
    device: str = "auto"  # auto | cpu | cuda
    device_id: int = 0  # the GPU Triton gave this instance (model_instance_device_id)
    dtype: str = "auto"  # auto (float16 on CUDA, float32 on CPU) | float32 | float16 | bfloat16
    threads: int = 0  # CPU threads (0 = torch's default)
    graph_batches: tuple[int, ...] = ()
    graph_frames: tuple[int, ...] = ()
    graph_phonemes: tuple[int, ...] = ()  # the acoustic's encoder graphs (DurationGraphs)
    # The padded-call budget (items x longest frames; 0 = none) of a net whose lengths are
    # its graphs' frames (the vocoder): graphs no call within it can use are not captured.
    graph_budget: int = 0

    def torch_device(self) -> torch.device:
        if self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available()):
            if not torch.cuda.is_available():
                raise ModelConfigError("device=cuda but torch sees no CUDA device")
            return torch.device("cuda", self.device_id)
        return torch.device("cpu")

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float16 if device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]


def bind_device(device: torch.device) -> None:
    """Make ``device`` this process's current CUDA device. Each Triton instance is its own
    stub process; streams, graph pools and captures use the current device, so without this
    an instance placed on cuda:1 would capture its graphs on cuda:0."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def graph_cells(
    batches: Sequence[int], frames: Sequence[int], budget: int = 0
) -> list[tuple[int, int]]:
    """The (batch, frames) buckets some padded call can use, largest first.

    A call of B items padded to T frames uses the smallest bucket with b >= B and t >= T; with a
    ``budget`` (B x T <= budget) the bucket (b, t) is used only if a call just above the next
    smaller bucket on both axes fits it. The vocoder's GPU profile (batches 1..64, frames
    128..1024, budget 4096) had 6 such unusable graphs of 28, the largest of which sized the
    shared pool.
    """
    batches, frames = sorted(set(batches)), sorted(set(frames))
    cells = []
    for i, b in enumerate(batches):
        least_b = batches[i - 1] + 1 if i else 1
        for j, t in enumerate(frames):
            least_t = frames[j - 1] + 1 if j else 1
            if not budget or least_b * least_t <= budget:
                cells.append((b, t))
    return sorted(cells, key=lambda c: (c[0] * c[1], c), reverse=True)


def pick_bucket(
    cells: Sequence[tuple[int, int]], batch: int, frames: int
) -> tuple[int, int] | None:
    """The captured bucket a call of ``batch`` items x ``frames`` replays (None: eager)."""
    fitting = [(b, t) for b, t in cells if b >= batch and t >= frames]
    return min(fitting, key=lambda c: (c[0], c[1])) if fitting else None


def _no_tf32():
    """float32 stays float32: TF32 convolutions (cuDNN's default) moved latents by 0.08 on an
    H100 and durations by a frame, since frame counts are ceil() of them."""
    return torch.backends.cudnn.flags(enabled=True, allow_tf32=False)


def to_host(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a numpy array: from a GPU in one copy into pinned memory (torch's caching
    host allocator keeps the blocks), which the copy engine writes at full speed."""
    if tensor.device.type != "cuda":
        return tensor.numpy()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(tensor.device).synchronize()
    return host.numpy()


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError)


def capture_graph(
    fn: Callable, inputs: Sequence[torch.Tensor], pool
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn(*inputs)`` captured as a CUDA graph in ``pool``, after a warm-up run on a side
    stream (cuDNN and the allocator settle outside capture); the graph and its outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*inputs)
    return graph, out


class GraphBuckets:
    """CUDA graphs of ``fn`` at fixed (batch, frames) shapes, sharing one memory pool.

    ``fn`` takes tensors whose dim 0 is the batch and last dim the frames; ``scale`` is how
    many output steps one input frame makes (the vocoder's hop length, 1 for the flow).
    """

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        shapes: Sequence[tuple[int, ...]],  # per input: the shape between batch and frames
        dtypes: Sequence[torch.dtype],
        batches: Sequence[int],
        frames: Sequence[int],
        device: torch.device,
        scale: int = 1,
        budget: int = 0,
    ) -> None:
        self.fn, self.scale = fn, scale
        self.batches, self.frames = sorted(batches), sorted(frames)
        self.cells = graph_cells(batches, frames, budget)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, list, torch.Tensor]] = {}
        # Benchmark mode times cuDNN's algorithms for each fixed shape in the warm-up and keeps
        # the fastest that fits (its heuristic alone picked float16 kernels slower than float32
        # ones at batch 32 on an H100); no TF32, as in the eager path.
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):
            self._capture(shapes, dtypes, device)

    def _capture(self, shapes, dtypes, device) -> None:
        # Largest first: the pool then holds the biggest activations once and the smaller
        # graphs reuse that memory; a bucket that cannot fit fails here, not under load.
        for b, t in self.cells:
            inputs = [
                torch.zeros((b, *shape, t), dtype=dtype, device=device)
                for shape, dtype in zip(shapes, dtypes)
            ]
            graph, out = capture_graph(self.fn, inputs, self.pool)
            self.graphs[(b, t)] = (graph, inputs, out)

    def bucket(self, batch: int, frames: int) -> tuple[int, int] | None:
        return pick_bucket(self.cells, batch, frames)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor | None:
        """``fn(*inputs)`` by graph replay, or None when no bucket holds the batch."""
        batch, frames = inputs[0].shape[0], inputs[0].shape[-1]
        key = self.bucket(batch, frames)
        if key is None:
            return None
        graph, static, out = self.graphs[key]
        for dst, src in zip(static, inputs):
            dst.zero_()  # padding must be zeros, as in an eager padded batch
            dst[:batch, ..., :frames].copy_(src)
        graph.replay()
        return out[:batch, ..., : frames * self.scale].clone()


# What the padding rows of a duration graph's batch hold: one id, no noise, length and speed 1
# (finite everywhere; they are cut off before anything reads them).
_NEUTRAL_SCALES = (0.0, 1.0, 0.0, 1.0)


def pad_durations_inputs(
    ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, batch: int, phonemes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``VitsAcoustic.durations``' inputs padded to a (batch, phonemes) bucket: ids with zeros (the
    mask hides them, as in any padded batch), extra rows one id long, scales [b, 4] (a missing
    speed is 1, which leaves ceil()'d durations as they are)."""
    b, n = ids.shape
    if scales.shape[1] == 3:
        scales = torch.cat([scales, torch.ones_like(scales[:, :1])], dim=1)
    out_ids = ids.new_zeros((batch, phonemes))
    out_ids[:b, :n] = ids
    out_lengths = lengths.new_ones((batch,))
    out_lengths[:b] = lengths
    out_scales = scales.new_tensor(_NEUTRAL_SCALES).repeat(batch, 1)
    out_scales[:b] = scales
    return out_ids, out_lengths, out_scales


class DurationGraphs:
    """The encoder and the duration predictor (``VitsAcoustic.durations``) as CUDA graphs at fixed
    (batch, phoneme ids) shapes: eager, they are hundreds of small launches (20 of the 31 ms of
    a lone request on an H100 went there). float32 without TF32 and without cuDNN's benchmark
    mode, as eager: frame counts are ceil() of these durations.

    ``capture=False`` pads and cuts the same way but runs eagerly (no CUDA needed): how the
    tests check the buckets on a CPU."""

    def __init__(
        self,
        module,
        batches: Sequence[int],
        phonemes: Sequence[int],
        device: torch.device,
        budget: int = 0,
        capture: bool = True,
    ) -> None:
        self.module = module
        self.batches, self.phonemes = sorted(batches), sorted(phonemes)
        self.cells = graph_cells(batches, phonemes, budget)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple, tuple]] = {}
        if not capture:
            return
        pool = torch.cuda.graph_pool_handle()
        one = (
            torch.zeros((1, 1), dtype=torch.int64, device=device),
            torch.ones((1,), dtype=torch.int64, device=device),
            torch.tensor([_NEUTRAL_SCALES], device=device),
        )
        with _no_tf32():
            for b, n in self.cells:  # largest first, as GraphBuckets
                static = pad_durations_inputs(*one, b, n)
                graph, (m_p, logs_p, w, _) = capture_graph(module.durations, static, pool)
                self.graphs[(b, n)] = (graph, static, (m_p, logs_p, w))

    def __call__(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(m_p, logs_p, w) of the batch from its bucket, cut to its own shape; None: no
        bucket holds it (the caller runs it eagerly)."""
        b, n = ids.shape
        key = pick_bucket(self.cells, b, n)
        if key is None:
            return None
        padded = pad_durations_inputs(ids, lengths, scales, *key)
        if key in self.graphs:
            graph, static, outputs = self.graphs[key]
            for dst, src in zip(static, padded):
                dst.copy_(src)
            graph.replay()
        else:
            outputs = self.module.durations(*padded)[:3]
        m_p, logs_p, w = outputs
        return m_p[:b, :, :n].clone(), logs_p[:b, :, :n].clone(), w[:b, :n].clone()


class _TorchNet:
    def __init__(self, module: torch.nn.Module, options: TorchOptions) -> None:
        if options.threads > 0:
            torch.set_num_threads(options.threads)
        self.options = options
        self.device = options.torch_device()
        bind_device(self.device)
        self.dtype = options.torch_dtype(self.device)
        self.module = module.to(self.device).requires_grad_(False)
        self.graphs: GraphBuckets | None = None
        self.warmup_s = 0.0

    @property
    def description(self) -> str:
        graphs = (
            f", {len(self.graphs.cells)} CUDA graphs for batches {list(self.graphs.batches)} x "
            f"frames {list(self.graphs.frames)} captured in {self.warmup_s:.1f} s"
            if self.graphs
            else ""
        )
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"
        return f"torch {torch.__version__} on {self.device} ({name}), {self.dtype}{graphs}"

    def _capture(self, fn, shapes, dtypes, scale: int = 1, budget: int = 0) -> None:
        o = self.options
        if self.device.type != "cuda" or not (o.graph_batches and o.graph_frames):
            return
        free, total = torch.cuda.mem_get_info(self.device)
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                self.graphs = GraphBuckets(
                    fn,
                    shapes,
                    dtypes,
                    o.graph_batches,
                    o.graph_frames,
                    self.device,
                    scale,
                    budget,
                )
        except torch.OutOfMemoryError:
            raise ModelConfigError(
                f"CUDA graphs up to batch {max(o.graph_batches)} x {max(o.graph_frames)} frames "
                f"do not fit in the {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB: "
                "lower cuda_graph_batches / cuda_graph_frames or the instance count"
            ) from None
        self.warmup_s = time.perf_counter() - start

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Whether to retry in halves; frees the allocator's cached blocks first."""
        if not is_out_of_memory(error):
            return False
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return True


class TorchAcousticNet(_TorchNet):
    """Padded ids [B, L], lengths [B], scales [B, 4] -> (latent [B, 192, T] f32, frames [B],
    frames per id [B, L])."""

    def __init__(self, path: str | Path, options: TorchOptions) -> None:
        super().__init__(load(VitsAcoustic(), path), options)
        self.module.flow.to(self.dtype)  # the encoder and durations stay float32
        channels = self.module.flow.flows["0"].half * 2
        self._capture(self.module.decode, [(channels,), (1,)], [self.dtype, self.dtype])
        self.duration_graphs: DurationGraphs | None = None
        self.durations_note = ""
        o = options
        if self.device.type == "cuda" and o.graph_batches and o.graph_phonemes:
            start = time.perf_counter()
            try:
                with torch.inference_mode():
                    self.duration_graphs = DurationGraphs(
                        self.module, o.graph_batches, o.graph_phonemes, self.device, o.graph_budget
                    )
            except torch.OutOfMemoryError:
                raise ModelConfigError(
                    f"the encoder's CUDA graphs up to batch {max(o.graph_batches)} x "
                    f"{max(o.graph_phonemes)} phoneme ids do not fit: lower cuda_graph_batches "
                    "/ cuda_graph_phonemes or the instance count"
                ) from None
            except RuntimeError as e:
                # Served eagerly (correct, slower), and said in the ready line.
                self.durations_note = (
                    f"; WARNING: encoder and durations run eagerly, their CUDA graph capture "
                    f"failed: {str(e).splitlines()[0][:300]}"
                )
                torch.cuda.synchronize(self.device)
            else:
                cells = self.duration_graphs.cells
                self.durations_note = (
                    f"; encoder and durations: {len(cells)} CUDA graphs for batches "
                    f"{list(o.graph_batches)} x phoneme ids {list(o.graph_phonemes)} captured "
                    f"in {time.perf_counter() - start:.1f} s"
                )

    @property
    def description(self) -> str:
        return super().description + self.durations_note

    @torch.inference_mode()
    def __call__(
        self, ids: np.ndarray, lengths: np.ndarray, scales: np.ndarray, on_device: bool = False
    ) -> tuple[np.ndarray | torch.Tensor, np.ndarray, np.ndarray]:
        """``on_device``: the latent stays a float32 tensor on the engine's device (for the
        DLPack hand-off to the vocoder); frames and durations come to the host either way."""
        d = self.device
        inputs = (
            torch.from_numpy(ids).to(d),
            torch.from_numpy(np.asarray(lengths, np.int64)).to(d),
            torch.from_numpy(np.asarray(scales, np.float32)).to(d),
        )
        with _no_tf32():
            found = self.duration_graphs(*inputs) if self.duration_graphs else None
            if found is None:
                found = self.module.durations(*inputs)[:3]
            z_p, y_mask, frames, durations = self.module.regulate(*found, inputs[2])
        z_p, y_mask = z_p.to(self.dtype), y_mask.to(self.dtype)
        z = self.graphs(z_p, y_mask) if self.graphs else None
        if z is None:
            with _no_tf32():
                z = self.module.decode(z_p, y_mask)
        latent = z.float() if on_device else z.float().cpu().numpy()
        return latent, frames.cpu().numpy(), durations.cpu().numpy()


class TorchVocoderNet(_TorchNet):
    """Padded latents [B, 192, T] -> audio [B, T * hop] float32."""

    def __init__(self, path: str | Path, options: TorchOptions) -> None:
        super().__init__(load(Decoder(), path), options)
        self.module.to(self.dtype)
        self.hop_length = self.module.hop_length
        # Its calls are padded latents within the frames budget (run_in_buckets). The padding
        # is not masked: HiFi-GAN's convolutions let it reach at most the receptive field into
        # the real frames' edge, and each item is cut back to its own frames * hop samples.
        self._capture(
            self.module,
            [(192,)],
            [self.dtype],
            scale=self.hop_length,
            budget=options.graph_budget,
        )

    @torch.inference_mode()
    def __call__(self, latent: np.ndarray | torch.Tensor) -> np.ndarray:
        """A numpy batch, or a tensor already on a device (the DLPack path)."""
        if isinstance(latent, np.ndarray):
            latent = torch.from_numpy(np.ascontiguousarray(latent))
        return to_host(self.on_device(latent))

    @torch.inference_mode()
    def on_device(self, latent: torch.Tensor) -> torch.Tensor:
        """The audio [B, T * hop] float32, left on the engine's device (bench.gpu times it
        without any copy)."""
        x = latent.to(self.device, self.dtype)
        audio = self.graphs(x) if self.graphs else None
        if audio is None:
            with _no_tf32():
                audio = self.module(x)
        return audio.float().reshape(x.shape[0], -1)
