"""A stand-in for ``triton_python_backend_utils`` so model.py files run in plain pytest.

It mirrors the small part of the API the adapters use; the real server tests cover the rest.
"""

from __future__ import annotations

import sys
import types

import numpy as np


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)
    CANCELLED = 7

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, np.asarray(array)
        self._torch = None  # set by from_dlpack: the tensor, on its device

    @classmethod
    def from_dlpack(cls, name: str, capsule) -> Tensor:
        import torch

        tensor = torch.from_dlpack(capsule)
        made = cls(name, np.zeros(0))
        made._torch, made._array = tensor, None
        return made

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return self._torch is None or self._torch.device.type == "cpu"

    def to_dlpack(self):
        import torch

        source = self._torch if self._torch is not None else torch.from_numpy(self._array)
        return torch.utils.dlpack.to_dlpack(source)

    def as_numpy(self) -> np.ndarray:
        if self._torch is not None:
            if not self.is_cpu():  # as the real stub: a GPU tensor has no numpy view
                raise RuntimeError("as_numpy() of a GPU tensor")
            return self._torch.numpy()
        return self._array


TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class ResponseSender:
    """A decoupled model's sender: records each ``send`` as (response or None, flags)."""

    def __init__(self) -> None:
        self.sent: list[tuple[InferenceResponse | None, int]] = []

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.sent and self.sent[-1][1] & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise RuntimeError("send after the final flag")  # the real stub refuses it too
        self.sent.append((response, flags))


class Metric:
    def __init__(self) -> None:
        self.total = 0.0

    def increment(self, value: float) -> None:
        self.total += value

    def value(self) -> float:
        return self.total


class MetricFamily:
    """Fake custom metrics: a family's metrics by their labels, shared by name (as the stub's
    are in one server)."""

    COUNTER, GAUGE = "COUNTER", "GAUGE"
    families: dict[str, dict[tuple, Metric]] = {}  # noqa: RUF012 - the server's registry

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.metrics = MetricFamily.families.setdefault(name, {})

    def Metric(self, labels: dict[str, str] | None = None) -> Metric:
        return self.metrics.setdefault(tuple(sorted((labels or {}).items())), Metric())


class InferenceRequest:
    """Fake request: a dict of input name -> numpy array (with the batch dimension), or a
    Tensor as another model's response holds it (a DLPack one included)."""

    def __init__(self, **inputs: np.ndarray) -> None:
        self.inputs = {k: v if isinstance(v, Tensor) else Tensor(k, v) for k, v in inputs.items()}
        self.sender = ResponseSender()
        self.cancelled = False
        self.params = "{}"  # the request's parameters as JSON, as the stub gives them

    def parameters(self) -> str:
        return self.params

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.cancelled


class InferenceResponse:
    def __init__(self, output_tensors=None, error: TritonError | None = None) -> None:
        self.output_tensors = output_tensors or []
        self._error = error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def output(self, name: str) -> np.ndarray:
        return next(t.as_numpy() for t in self.output_tensors if t.name() == name)


class Logger:
    lines: list[tuple[str, str]] = []  # noqa: RUF012 - shared test log

    @classmethod
    def log_info(cls, msg: str) -> None:
        cls.lines.append(("info", msg))

    @classmethod
    def log_warn(cls, msg: str) -> None:
        cls.lines.append(("warn", msg))

    @classmethod
    def log_error(cls, msg: str) -> None:
        cls.lines.append(("error", msg))

    @classmethod
    def log_verbose(cls, msg: str) -> None:
        cls.lines.append(("verbose", msg))


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request.inputs.get(name)


def using_decoupled_model_transaction_policy(config: dict) -> bool:
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


def install() -> types.ModuleType:
    """Register this module as ``triton_python_backend_utils`` and return it."""
    module = sys.modules[__name__]
    sys.modules["triton_python_backend_utils"] = module
    return module
