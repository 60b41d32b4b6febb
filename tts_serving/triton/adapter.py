"""What every ``model.py`` shares: model context, per-request validation, one response each.

Imported only inside the Python-backend stub (or under a fake ``triton_python_backend_utils``
in the adapter tests), so ``pb_utils`` is imported here at module level.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_serving.engines.batching import is_numpy
from tts_serving.model_config import config_parameters, parse_settings
from tts_triton.statistics import LEVEL_BATCHES_METRIC, LEVEL_ITEMS_METRIC
from tts_wire import (
    BULK_PARAMETER,
    ITEMS_PER_REQUEST,
    LATER_PARAMETER,
    STREAM_FIRST_PARAMETER,
    SynthesisOptions,
    batch_size_error,
)
from tts_wire.tensors import MODEL_IO, OPTIONS, ModelIO

from ..errors import CorruptInputError, InvalidInputError, ModelConfigError
from ..levels import Gate, InteractiveCount, count_path
from ..voices import VoiceFiles, decode_name, discover, exported

T = TypeVar("T")
S = TypeVar("S")


@dataclass(frozen=True)
class ModelContext(Generic[S]):
    """What ``initialize`` learns from ``args``: config, typed settings, the version folder."""

    name: str
    config: dict
    settings: S
    version_dir: Path
    instance_kind: str
    device_id: int = 0  # the GPU of a KIND_GPU instance

    @classmethod
    def from_args(cls, args: dict, settings_cls: type[S]) -> ModelContext[S]:
        """Parse ``args["model_config"]`` once; a bad or unknown parameter raises here."""
        check_numpy()
        config = json.loads(args["model_config"])
        settings = parse_settings(settings_cls, config_parameters(config), config["name"])
        kind = args.get("model_instance_kind", "CPU")
        if kind == "GPU" and getattr(settings, "device", None) == "cpu":
            raise ModelConfigError("instance_group is KIND_GPU but parameter device is cpu")
        version_dir = Path(args["model_repository"]) / args["model_version"]
        device_id = int(args.get("model_instance_device_id", 0) or 0)
        return cls(config["name"], config, settings, version_dir, kind, device_id)

    def file(self, name: str) -> Path:
        return exported(self.version_dir / name)

    def voices(self) -> list[VoiceFiles]:
        """This model's voices (tts_serving.voices), default first; missing files raise."""
        self.file("voice.json")  # the export's own message when nothing was exported
        return discover(self.version_dir)

    def require_io(self, io: ModelIO) -> None:
        """The config's inputs and outputs are exactly the tensors this model reads and writes
        (tts_wire.tensors): names, data types, dims and flags. An input renamed in
        config.pbtxt fails the load instead of being read as absent (its default silently
        used); a changed type or shape fails it instead of the first request."""
        for kind, tensors in (("input", io.inputs), ("output", io.outputs)):
            want = {t.name: t for t in tensors}
            have = {tensor["name"]: tensor for tensor in self.config.get(kind, [])}
            if set(have) != set(want):
                raise ModelConfigError(
                    f"{self.name}: config.pbtxt has {kind}s {sorted(have)}, this model uses "
                    f"{sorted(want)} (missing {sorted(set(want) - set(have))}, unknown "
                    f"{sorted(set(have) - set(want))})"
                )
            for name, tensor in want.items():
                found = have[name]
                declared = (f"TYPE_{tensor.dtype}", tensor.dims, tensor.optional, tensor.ragged)
                got = (
                    found.get("data_type"),
                    tuple(int(d) for d in found.get("dims", ())),
                    bool(found.get("optional", False)),
                    bool(found.get("allow_ragged_batch", False)),
                )
                if got != declared:
                    raise ModelConfigError(
                        f"{self.name}: {kind} {name!r} is (data type, dims, optional, ragged) "
                        f"{got} in config.pbtxt, {declared} in tts_wire.tensors; run python -m "
                        "tts_launcher.profiles to write config.pbtxt from the declarations"
                    )

    def require_max_batch_size(self, minimum: int) -> int:
        mbs = int(self.config.get("max_batch_size", 0))
        if mbs < minimum:
            raise ModelConfigError(f"{self.name}: max_batch_size must be >= {minimum}, got {mbs}")
        return mbs


def check_numpy(version: str = np.__version__) -> None:
    """Refuse to load under numpy 2: Triton 2.51's Python-backend stub then sends every output
    tensor empty, with no error on either side (tts_triton.workarounds)."""
    if int(version.split(".")[0]) >= 2:
        raise ModelConfigError(
            f"numpy {version} is installed where the Python backend stub runs; Triton 2.51's "
            "stub then returns every output empty. Install numpy<2 there (requirements.txt "
            "pins numpy 1.26.4; for a GPU machine see docs/gpu.md)"
        )


def single_item(
    request, name: str, optional: bool = False, device: bool = False
) -> np.ndarray | None:
    """The one item of input ``name`` in ``request`` (batch dimension removed). ``device``:
    a tensor the backend left on a GPU (``FORCE_CPU_ONLY_INPUT_TENSORS: no``) comes as a
    torch tensor there, by DLPack, with no copy."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if optional:
            return None
        raise InvalidInputError(f"input {name!r} is missing")
    if device and not tensor.is_cpu():
        import torch

        # Copied on the device at once: nothing of the batch then reads Triton's buffer (a
        # mapping of another process's memory) after this call; a latent is ~0.3 MB.
        array = torch.from_dlpack(tensor.to_dlpack()).clone()
    else:
        array = tensor.as_numpy()
    if array.shape[0] != ITEMS_PER_REQUEST:
        raise InvalidInputError(batch_size_error(name, array.shape[0]))
    return array[0]


def one_value(request, name: str, batched: bool = True):
    """The one value of input ``name`` (None: absent): a batched model's [1, 1] or
    ``tts_stream``'s [1]. Bytes stay bytes, numbers and flags stay numpy scalars."""
    if batched:
        item = single_item(request, name, optional=True)
    else:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        item = None if tensor is None else tensor.as_numpy()
    if item is None:
        return None
    if item.size != 1:
        raise InvalidInputError(f"input {name!r} must hold one value, got {item.size}")
    return item.reshape(-1)[0]


# An option's value from its data type (tts_wire.tensors.OPTIONS); an empty string is absent.
_READ: dict[str, Callable[[Any, str], Any]] = {
    "FP32": lambda raw, _: float(raw),
    "BOOL": lambda raw, _: bool(raw),
    "STRING": decode_name,
}
_OPTION_NAMES = {o.name for o in OPTIONS}


def request_options(request, model: str) -> SynthesisOptions:
    """The options a request to ``model`` set, read and checked once (the same object as the
    client's and the gateway's; absent ones at its defaults): the one reader of the batched
    stages and ``tts_stream``, for the options ``model`` declares (tts_wire.tensors)."""
    batched = model != "tts_stream"
    values = {}
    for tensor in MODEL_IO[model].inputs:
        if tensor.name in _OPTION_NAMES:
            raw = one_value(request, tensor.name, batched)
            if raw is not None:
                values[tensor.name] = _READ[tensor.dtype](raw, tensor.name)
    try:
        return SynthesisOptions(**values)
    except ValueError as e:
        raise InvalidInputError(str(e)) from None


def all_finite(array: np.ndarray) -> bool:
    """No NaN or infinity in ``array`` when its sum is finite (one pass, no temporary array);
    a sum that is not finite may also be an overflow of huge values: count them then. A torch
    tensor (the DLPack path) is summed on its device."""
    with np.errstate(over="ignore", invalid="ignore"):
        return math.isfinite(float(array.sum()))


def latent_check(latent) -> np.ndarray:
    """(sum, sum of |x|) of a latent in float64 (tts_wire.LATENT_CHECK), computed where it
    lies: acoustic sends it beside the latent and the vocoder recomputes it."""
    if is_numpy(latent):
        return np.array(
            [np.sum(latent, dtype=np.float64), np.sum(np.abs(latent), dtype=np.float64)]
        )
    import torch

    x = latent.double()
    return torch.stack([x.sum(), x.abs().sum()]).cpu().numpy()


def check_matches(sent: np.ndarray, got: np.ndarray) -> bool:
    """Whether a latent's recomputed check equals the one sent with it (to 1e-9 of its size:
    the same sum over the same values in another order differs by far less, a changed latent
    by far more; NaN never matches)."""
    sent, got = np.asarray(sent, np.float64).reshape(-1), np.asarray(got, np.float64).reshape(-1)
    tolerance = 1e-9 * (abs(float(sent[-1])) + 1.0)
    return sent.shape == got.shape and bool(np.all(np.abs(sent - got) <= tolerance))


def count_non_finite(array) -> int:
    if is_numpy(array):
        return int(np.size(array) - np.count_nonzero(np.isfinite(array)))
    import torch

    return int((~torch.isfinite(array)).sum())


def output_tensor(name: str, array) -> pb_utils.Tensor:
    """An output tensor of one item (batch dimension added); a torch tensor is handed over by
    DLPack where it lies (on a GPU: no copy to the host). The tensor itself, not a capsule:
    given an object with ``__dlpack__`` the stub has its own stream wait for the kernels that
    wrote it, and synchronizes (a capsule carries no stream, and none is waited for)."""
    if is_numpy(array):
        return pb_utils.Tensor(name, array[None])
    return pb_utils.Tensor.from_dlpack(name, array[None].contiguous())


class NonFiniteOutput(Exception):
    """Returned by ``run`` in place of an item's outputs: NaN or infinity came out of it."""


def output_or_error(
    name: str,
    array: np.ndarray,
    finish: Callable[[np.ndarray], np.ndarray] | None = None,
    total: float | None = None,
) -> list | NonFiniteOutput:
    """One item's output tensor list, or the error to send when it holds NaN or infinity
    (a non-finite result is an INTERNAL error, never a 200). ``total``: its sum, when the
    caller has it already (one pass over the array, one device sync, fewer)."""
    finite = all_finite(array) if total is None else math.isfinite(total)
    if not finite:  # counted only then: a sum of huge values may overflow alone
        bad = count_non_finite(array)
        if bad:
            return NonFiniteOutput(f"{name} holds {bad} non-finite values")
    return [output_tensor(name, finish(array) if finish else array)]


def error_response(message: str, code) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def parse_or_respond(request, parse: Callable[[Any], T], logger, model_name: str):
    """(the item, None) of a valid request, or (None, the error response it gets)."""
    try:
        return parse(request), None
    except InvalidInputError as e:
        return None, error_response(str(e), pb_utils.TritonError.INVALID_ARG)
    except CorruptInputError as e:
        logger.log_error(f"{model_name}: {e}")
        return None, error_response(str(e), pb_utils.TritonError.INTERNAL)


def run_and_respond(
    items: list[T], run: Callable[[list[T]], list[list]], logger, model_name: str
) -> list:
    """A response per item of ``run(items)``: its outputs, or its own error (see
    :func:`execute_batched`); a failure of the whole run is an error for each."""
    try:
        outputs = run(items)
    except InvalidInputError as e:
        return [error_response(str(e), pb_utils.TritonError.INVALID_ARG)] * len(items)
    except Exception as e:  # a failure is an error for each request, never silence
        logger.log_error(f"{model_name}: batch of {len(items)} failed: {e!r}")
        message = f"{model_name} failed on this batch ({type(e).__name__}); see the server log"
        return [error_response(message, pb_utils.TritonError.INTERNAL)] * len(items)
    responses = []
    for output in outputs:
        if isinstance(output, InvalidInputError):
            responses.append(error_response(str(output), pb_utils.TritonError.INVALID_ARG))
        elif isinstance(output, Exception):
            logger.log_error(f"{model_name}: {type(output).__name__}: {output}")
            message = f"{model_name} produced no valid output for this item; see the server log"
            responses.append(error_response(message, pb_utils.TritonError.INTERNAL))
        else:
            responses.append(pb_utils.InferenceResponse(output_tensors=output))
    return responses


def execute_batched(
    requests: Sequence,
    parse: Callable[[Any], T],
    run: Callable[[list[T]], list[list]],
    logger,
    model_name: str,
) -> list:
    """One response per request: bad requests get INVALID_ARG, the rest run as one batch.

    ``parse(request)`` validates one request (raising InvalidInputError); ``run(items)``
    returns, per item, the list of output ``pb_utils.Tensor``s, or the exception of that item
    alone: an InvalidInputError gets INVALID_ARG with its message, any other (NonFiniteOutput,
    a worker's failure) INTERNAL.
    """
    responses: list = [None] * len(requests)
    valid: list[tuple[int, T]] = []
    for i, request in enumerate(requests):
        item, responses[i] = parse_or_respond(request, parse, logger, model_name)
        if responses[i] is None:
            valid.append((i, item))
    if valid:
        answered = run_and_respond([item for _, item in valid], run, logger, model_name)
        for (i, _), response in zip(valid, answered):
            responses[i] = response
    # No log line per batch: the stub sends every pb_utils log message to tritonserver, verbose
    # or not, which cost 5-11 % of a stage's time on the null engine (docs/performance.md).
    # Triton's statistics count the batches and their times instead.
    return responses


def flags(request, *names: str) -> tuple[bool, ...]:
    """For each of ``names``, whether ``request`` carries that request parameter set to true
    (the front door's ``BULK_PARAMETER`` and ``LATER_PARAMETER``); the JSON parsed once."""
    try:
        parameters = json.loads(request.parameters() or "{}")
    except ValueError:
        parameters = {}
    if not isinstance(parameters, dict):
        parameters = {}
    return tuple(parameters.get(name) is True for name in names)


def flag(request, name: str) -> bool:
    """Whether ``request`` carries the request parameter ``name`` set to true."""
    return flags(request, name)[0]


def is_bulk(request) -> bool:
    """Whether the front door sent ``request`` at the bulk level (``BULK_PARAMETER``)."""
    return flag(request, BULK_PARAMETER)


# The order a stage scheduling by levels takes interactive requests in: a stream's first
# chunk (STREAM_FIRST_PARAMETER), then everyone's first pieces (`tts`), then later pieces.
AHEAD, FIRST, LATER = 0, 1, 2


def rank(stream_first: bool, later: bool) -> int:
    """Where a request flagged so waits among the interactive ones (AHEAD, FIRST or LATER)."""
    return LATER if later else AHEAD if stream_first else FIRST


def take(waiting: list, most: int, later_most: int | None = None) -> list:
    """Up to ``most`` of ``waiting``'s (sender, item, rank) entries of its lowest rank, in
    their order, removed from it: streams' first chunks (AHEAD) while any wait, else first
    pieces, else up to ``later_most`` later ones. A batch holds one rank because it lasts as
    long as its longest item: a stream's first chunk batched with 15 of a flood's sentences
    took as long as the flood's own batch (a first piece that comes meanwhile waits for that
    batch only)."""
    if not waiting:
        return []
    lowest = min(entry[2] for entry in waiting)
    limit = min(most, later_most or most) if lowest == LATER else most
    taken = [entry for entry in waiting if entry[2] == lowest][:limit]
    ids = {id(entry) for entry in taken}
    waiting[:] = [entry for entry in waiting if id(entry) not in ids]
    return taken


def prefetch_blockers(config: dict) -> list[str]:
    """What in a model config's ``dynamic_batching`` (Triton's JSON of it) turns Triton's
    prefetching off: priority levels or a queue policy. Without prefetching Triton 2.51's
    batcher can miss an instance's wake-up and hold a request 500 ms (docs/performance.md)."""
    batching = config.get("dynamic_batching") or {}
    policy = batching.get("default_queue_policy") or {}
    found = []
    if int(batching.get("priority_levels") or 0) > 0:
        found.append("priority_levels")
    if batching.get("priority_queue_policy"):
        found.append("priority_queue_policy")
    if int(policy.get("max_queue_size") or 0) > 0:
        found.append("default_queue_policy.max_queue_size")
    if int(policy.get("default_timeout_microseconds") or 0) > 0:
        found.append("default_queue_policy.default_timeout_microseconds")
    if policy.get("allow_timeout_override"):
        found.append("default_queue_policy.allow_timeout_override")
    return found


LEVEL_NAMES = {False: "interactive", True: "bulk"}
# Later pieces per interactive batch, per lane (intra_op_threads): a batch runs no longer than
# about two items a lane, so a first piece never waits behind a whole batch of 16 rests
# (docs/history (notebook), "Home Assistant": the p90 of 16 satellites' first audio).
LATER_PER_LANE = 2


class LevelScheduler:
    """A stage's ``execute`` with ``scheduling: levels`` (tts_serving.levels): it takes the
    requests, answers each through its response sender when its work is done, and returns at
    once, so Triton hands it the next requests while it runs. Interactive and bulk requests
    wait in two queues and run on two workers, each taking up to ``max_batch`` of its own at a
    time (interactive later pieces up to ``LATER_PER_LANE`` per lane); bulk work runs on the
    stage's bulk copies of its models (:meth:`bulk_copy`), whose calls run only while no
    interactive work is in the server (tts_serving.levels.Gate). More than ``max_queue``
    waiting: UNAVAILABLE at once, as Triton's full queue."""

    @classmethod
    def of(cls, ctx: ModelContext, logger) -> LevelScheduler | None:
        """The stage's scheduler when it schedules by levels (EngineSettings.levels), else
        None (batches)."""
        return cls(ctx, logger) if ctx.settings.levels else None

    def __init__(self, ctx: ModelContext, logger) -> None:
        if getattr(ctx.settings, "engine", None) != "onnxruntime":
            raise ModelConfigError(f"{ctx.name}: scheduling levels needs the onnxruntime engine")
        self.name, self.logger = ctx.name, logger
        self.max_batch = ctx.require_max_batch_size(1)
        self.later_most = LATER_PER_LANE * max(1, ctx.settings.intra_op_threads)
        self.max_queue = ctx.settings.max_queue_size
        blockers = prefetch_blockers(ctx.config)
        if blockers:
            logger.log_warn(
                f"{self.name}: scheduling levels with {', '.join(blockers)} in its "
                "dynamic_batching: that turns Triton's prefetching off, and Triton 2.51 then "
                "holds some requests 500 ms; leave them out (the stage keeps its own queue, "
                "levels and limit: max_queue_size)"
            )
        self.count = InteractiveCount(count_path())
        self.gate = Gate(self.count)
        self.bulk_of: dict[int, Any] = {}
        self.waiting: dict[bool, list] = {False: [], True: []}
        self.ready = threading.Condition()
        self.stopping = False
        self.workers: list[threading.Thread] = []
        # Triton's statistics time only the hand-over here (each execute takes what came):
        # the batches the workers run are counted on Triton's metrics port instead. The
        # families are kept: a Metric whose family was collected refuses to count.
        self.families = [
            pb_utils.MetricFamily(name=name, description=what, kind=pb_utils.MetricFamily.COUNTER)
            for name, what in (
                (LEVEL_BATCHES_METRIC, "batches a stage scheduling by levels ran"),
                (LEVEL_ITEMS_METRIC, "requests in the batches a stage scheduling by levels ran"),
            )
        ]
        self.batches, self.items = (
            {
                bulk: family.Metric(labels={"model": self.name, "level": level})
                for bulk, level in LEVEL_NAMES.items()
            }
            for family in self.families
        )

    def alone(self) -> bool:
        """Whether at most one interactive request is in the server's stages (the one a
        stage runs now): no other stage's work waits on the cores."""
        return self.count.total() <= 1

    def bulk_copy(self, model, load: Callable[[Gate], Any]) -> None:
        """``load(gate)``: ``model``'s copy for bulk work, its calls through ``gate``."""
        self.bulk_of[id(model)] = load(self.gate)

    def bulk_model(self, model):
        """``model``'s copy for bulk work (:meth:`bulk_copy`)."""
        return self.bulk_of[id(model)]

    def start(self, parse: Callable[[Any], T], run: Callable[..., list[list]]) -> None:
        """``run(items, bulk=...)`` answers a batch of one level."""
        self.parse, self.run = parse, run
        for bulk, kind in LEVEL_NAMES.items():
            worker = threading.Thread(
                target=self._work, args=(bulk,), name=f"{self.name}-{kind}", daemon=True
            )
            worker.start()
            self.workers.append(worker)

    def execute(self, requests: Sequence) -> None:
        for request in requests:
            sender = request.get_response_sender()
            item, error = parse_or_respond(request, self.parse, self.logger, self.name)
            if error is not None:
                sender.send(error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            bulk, later, ahead = flags(
                request, BULK_PARAMETER, LATER_PARAMETER, STREAM_FIRST_PARAMETER
            )
            with self.ready:
                if sum(len(q) for q in self.waiting.values()) >= self.max_queue:
                    full = (
                        f"{self.name}: its queue is full ({self.max_queue} waiting, "
                        "max_queue_size); retry later"
                    )
                    sender.send(
                        error_response(full, pb_utils.TritonError.UNAVAILABLE),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    continue
                if not bulk:
                    self.count.add(1)
                self.waiting[bulk].append((sender, item, rank(ahead, later)))
                self.ready.notify_all()
        return None

    def _work(self, bulk: bool) -> None:
        while True:
            with self.ready:
                while not self.waiting[bulk] and not self.stopping:
                    self.ready.wait()
                if not self.waiting[bulk]:
                    return
            # Bulk work waits for its turn before it takes a batch; starved (interactive work
            # all the while), it takes a short one, run to its end beside interactive work.
            starved = bulk and not self.stopping and self.gate.wait_turn()
            with self.ready:
                later_most = None if bulk else self.later_most
                most = self.later_most if starved else self.max_batch
                taken = take(self.waiting[bulk], most, later_most)
            run = functools.partial(self.run, bulk=bulk)
            with self.gate.starved_batch() if starved else contextlib.nullcontext():
                responses = run_and_respond([e[1] for e in taken], run, self.logger, self.name)
            for (sender, _, _), response in zip(taken, responses):
                try:
                    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except Exception as e:  # the client is gone: nothing to tell it
                    self.logger.log_warn(f"{self.name}: a response was not sent: {e}")
            if not bulk:
                self.count.add(-len(taken))
            try:
                self.batches[bulk].increment(1)
                self.items[bulk].increment(len(taken))
            except Exception as e:  # a count lost must not stop the worker
                self.logger.log_warn(f"{self.name}: batch not counted: {e}")

    def close(self) -> None:
        """Finish what waits, then stop the workers."""
        with self.ready:
            self.stopping = True
            self.ready.notify_all()
        for worker in self.workers:
            worker.join()
        self.batches = self.items = {}  # the metrics before their families (the stub's order)
        self.families = []
        self.gate.close()
        self.count.close()
