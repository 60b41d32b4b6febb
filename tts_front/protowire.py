"""The few fields of Triton's gRPC messages the front door needs, read from the protobuf wire
format without parsing (and copying) tensors.

Read as protobuf reads them: of a singular field given twice, the last wins (reading the first
let a request prefixed with another ``model_name`` pass admission as that model).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from tts_wire import BULK_PARAMETER, LATER_PARAMETER, PRIORITY_LEVELS, STREAM_FIRST_PARAMETER

# Field numbers (grpc_service.proto).
REQUEST_MODEL_NAME, REQUEST_ID, REQUEST_PARAMETERS, REQUEST_RAW_INPUT = 1, 3, 4, 7
REQUEST_INPUTS = 5
INPUT_NAME, INPUT_DATATYPE, INPUT_CONTENTS = 1, 2, 5  # InferInputTensor
CONTENTS_FP32, CONTENTS_BYTES = 6, 8  # InferTensorContents
BOOL_PARAM, INT64_PARAM, UINT64_PARAM = 1, 2, 5  # InferParameter's bool, int64, uint64
STREAM_ERROR, STREAM_RESPONSE = 1, 2
RESPONSE_MODEL_NAME, RESPONSE_ID, RESPONSE_PARAMETERS, RESPONSE_OUTPUTS = 1, 3, 4, 5
OUTPUT_NAME, OUTPUT_SHAPE = 1, 3  # InferOutputTensor
FINAL_RESPONSE = b"triton_final_response"


class Malformed(ValueError):
    """Not a protobuf message."""


def _varint(view: memoryview, i: int) -> tuple[int, int]:
    """The varint starting at ``view[i]`` and the index after it. Raises Malformed."""
    value = shift = 0
    n = len(view)
    while i < n and shift < 64:
        byte = view[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
    raise Malformed("truncated varint")


def fields(message: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of each field in order: an int for varints and fixed
    widths, a memoryview (no copy) for length-delimited ones. Raises Malformed."""
    view, i, n = memoryview(message), 0, len(message)

    def varint() -> int:
        nonlocal i
        value, i = _varint(view, i)
        return value

    while i < n:
        key = varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            yield number, kind, varint()
        elif kind in (1, 5):
            width = 8 if kind == 1 else 4
            if i + width > n:
                raise Malformed("truncated fixed-width field")
            yield number, kind, int.from_bytes(view[i : i + width], "little")
            i += width
        elif kind == 2:
            length = varint()
            if i + length > n:
                raise Malformed("a field runs past the end of the message")
            yield number, kind, view[i : i + length]
            i += length
        else:
            raise Malformed(f"wire type {kind}")


def _text(value: int | memoryview) -> str:
    if not isinstance(value, memoryview):
        raise Malformed("a string field is not length-delimited")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise Malformed("a string field is not UTF-8") from e


@dataclass(frozen=True)
class InferRequest:
    """What admission reads of a ModelInferRequest."""

    model: str | None
    id: str
    input_bytes: int  # raw_input_contents, or the whole message when tensors travel inline
    timeout_us: int = 0  # Triton's "timeout" request parameter (0: none)
    priority: int = 0  # Triton's "priority" request parameter (0: the model's default)
    # The inputs asked for by name: a BYTES tensor's elements, an FP32 tensor's values ({}
    # where their contents cannot be read: Triton answers for those).
    inputs: dict[str, list] = field(default_factory=dict)


def _parameter(entry: memoryview, name: bytes, kind: int) -> int | None:
    """The varint field ``kind`` of the InferParameter of a parameters map entry keyed
    ``name``; None for another key, or none given."""
    key, value = b"", None
    for number, _, v in fields(entry):
        if number == 1 and isinstance(v, memoryview):
            key = bytes(v)
        elif number == 2 and isinstance(v, memoryview):
            for inner, wire, x in fields(v):
                if inner == kind and wire == 0 and isinstance(x, int):
                    value = x
    return value if key == name else None


def _timeout(entry: memoryview) -> int | None:
    """A "timeout" entry's microseconds (a negative int64: none, 0)."""
    value = _parameter(entry, b"timeout", INT64_PARAM)
    return None if value is None else (value if value < 1 << 63 else 0)


def _priority(entry: memoryview) -> int | None:
    """A "priority" entry's level (tritonclient sends uint64, Triton also takes int64)."""
    value = _parameter(entry, b"priority", UINT64_PARAM)
    return value if value is not None else _parameter(entry, b"priority", INT64_PARAM)


def _encoded(number: int, kind: int, payload: bytes | int) -> bytes:
    """One protobuf field: a varint, or length-delimited bytes."""

    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
            value >>= 7
            if not value:
                return bytes(out)

    if kind == 0:
        return varint(number << 3) + varint(payload)  # type: ignore[arg-type]
    return varint(number << 3 | 2) + varint(len(payload)) + payload  # type: ignore[arg-type]


def with_priority(message: bytes, level: int, later: bool = False) -> bytes:
    """``message`` (a ModelInferRequest) sent at ``level``: a "priority" parameter appended,
    the ``BULK_PARAMETER`` flag (set at the bulk level) and the ``LATER_PARAMETER`` flag
    (``later``) for the stages, each winning over any before it (protobuf reads the last of a
    map's duplicate keys)."""
    value = _encoded(UINT64_PARAM, 0, level)
    entry = _encoded(1, 2, b"priority") + _encoded(2, 2, value)
    message = bytes(message) + _encoded(REQUEST_PARAMETERS, 2, entry)
    message = with_flag(message, BULK_PARAMETER, level == PRIORITY_LEVELS)
    return with_flag(message, LATER_PARAMETER, later)


def with_flag(message: bytes, name: str, flag: bool) -> bytes:
    """``message`` (a ModelInferRequest) with the bool request parameter ``name`` set to
    ``flag``, over any the client sent (the last of a map's duplicate keys wins)."""
    entry = _encoded(1, 2, name.encode()) + _encoded(2, 2, _encoded(BOOL_PARAM, 0, int(flag)))
    return bytes(message) + _encoded(REQUEST_PARAMETERS, 2, entry)


def without_stream_first(message: bytes) -> bytes:
    """``message`` with ``STREAM_FIRST_PARAMETER`` cleared where it may carry it (only
    tts_stream's own calls may: the stages take those first)."""
    message = message if isinstance(message, bytes) else bytes(message)
    if STREAM_FIRST_PARAMETER.encode() not in message:
        return message
    return with_flag(message, STREAM_FIRST_PARAMETER, False)


def infer_request(message: bytes, names: frozenset[str] = frozenset()) -> InferRequest | None:
    """The model, id, input size, timeout, priority and the inputs ``names`` of a serialized
    ModelInferRequest, in one walk over it; None when malformed."""
    model, rid, raw, timeout, priority = None, "", 0, 0, 0
    order: list[tuple[str, str]] = []  # (name, datatype) of each input, in order
    inline: dict[str, memoryview] = {}
    contents: list[memoryview] = []
    try:
        for number, _, value in fields(message):
            if number == REQUEST_MODEL_NAME:
                model = _text(value)
            elif number == REQUEST_ID:
                rid = _text(value)
            elif number == REQUEST_PARAMETERS and isinstance(value, memoryview):
                found = _timeout(value)
                timeout = found if found is not None else timeout
                level = _priority(value)
                priority = level if level is not None else priority
            elif number == REQUEST_INPUTS and isinstance(value, memoryview) and names:
                order.append(_input(value, inline))
            elif number == REQUEST_RAW_INPUT and isinstance(value, memoryview):
                raw += len(value)
                contents.append(value)
    except Malformed:
        return None
    inputs: dict[str, list] = {}
    try:
        for name, view in inline.items():
            if name in names:
                inputs[name] = _contents(view)
        for (name, datatype), view in zip(order, contents, strict=False):
            if name in names:
                inputs[name] = tensor_values(datatype, view)
    except Malformed:
        inputs = {}
    return InferRequest(model, rid, raw or len(message), timeout, priority, inputs)


def _input(tensor: memoryview, inline: dict[str, memoryview]) -> tuple[str, str]:
    """An InferInputTensor's (name, datatype); its inline contents, if any, into ``inline``."""
    name, datatype, contents = "", "", None
    for number, _, value in fields(tensor):
        if number == INPUT_NAME:
            name = _text(value)
        elif number == INPUT_DATATYPE:
            datatype = _text(value)
        elif number == INPUT_CONTENTS and isinstance(value, memoryview):
            contents = value
    if contents is not None:
        inline[name] = contents
    return name, datatype


def bytes_elements(raw: bytes | memoryview) -> list[bytes]:
    """The elements of a BYTES tensor's raw contents (each a 4-byte little-endian length, then
    the bytes). Raises Malformed."""
    view, i, out = memoryview(raw), 0, []
    while i < len(view):
        if i + 4 > len(view):
            raise Malformed("a BYTES element's length is cut off")
        size = int.from_bytes(view[i : i + 4], "little")
        if i + 4 + size > len(view):
            raise Malformed("a BYTES element runs past its tensor")
        out.append(bytes(view[i + 4 : i + 4 + size]))
        i += 4 + size
    return out


def tensor_values(datatype: str, raw: bytes | memoryview) -> list[bytes] | list[float]:
    """A BYTES tensor's elements or an FP32 tensor's values from its raw contents ([] for
    another type). Raises Malformed."""
    if datatype == "BYTES":
        return bytes_elements(raw)
    if datatype == "FP32":
        return [x[0] for x in struct.iter_unpack("<f", bytes(raw)[: len(raw) // 4 * 4])]
    return []


def _contents(view: memoryview) -> list[bytes] | list[float]:
    """An InferTensorContents' bytes elements, else its fp32 values."""
    strings, floats = [], []
    for number, kind, value in fields(view):
        if number == CONTENTS_BYTES and isinstance(value, memoryview):
            strings.append(bytes(value))
        elif number == CONTENTS_FP32 and isinstance(value, memoryview):  # packed
            floats += [x[0] for x in struct.iter_unpack("<f", bytes(value)[: len(value) // 4 * 4])]
        elif number == CONTENTS_FP32 and kind == 5 and isinstance(value, int):
            floats.append(struct.unpack("<f", value.to_bytes(4, "little"))[0])
    return strings or floats


def model_name(message: bytes) -> str | None:
    """Field 1 (``model_name``) of a serialized ModelInferRequest; None when absent or
    malformed."""
    request = infer_request(message)
    return request.model if request else None


@dataclass(frozen=True)
class StreamInferResponse:
    """What the front door reads of a ModelStreamInferResponse."""

    error: str  # "" when none
    model: str
    id: str
    final: bool | None  # the triton_final_response parameter; None when absent
    samples: int | None = None  # elements of its `audio` output; None when it has none


def _final(entry: memoryview) -> bool | None:
    value = _parameter(entry, FINAL_RESPONSE, BOOL_PARAM)
    return None if value is None else bool(value)


def stream_response(message: bytes) -> StreamInferResponse | None:
    """The error, model, id, final flag and audio samples (its shape, not its contents) of a
    ModelStreamInferResponse; None when malformed."""
    error, model, rid, final, samples = "", "", "", None, None
    try:
        for number, _, value in fields(message):
            if number == STREAM_ERROR:
                error = _text(value)
            elif number == STREAM_RESPONSE and isinstance(value, memoryview):
                samples = output_elements(value, "audio")  # tts_wire.AUDIO
                for inner, _, v in fields(value):
                    if inner == RESPONSE_MODEL_NAME:
                        model = _text(v)
                    elif inner == RESPONSE_ID:
                        rid = _text(v)
                    elif inner == RESPONSE_PARAMETERS and isinstance(v, memoryview):
                        flag = _final(v)
                        final = flag if flag is not None else final
    except Malformed:
        return None
    return StreamInferResponse(error, model, rid, final, samples)


def _packed(view: memoryview) -> list[int]:
    """The values of a packed repeated varint field (``shape``)."""
    values, i = [], 0
    while i < len(view):
        value, i = _varint(view, i)
        values.append(value)
    return values


def output_elements(message: bytes | memoryview, name: str) -> int | None:
    """How many elements the output ``name`` of a serialized ModelInferResponse holds (the
    product of its shape: the audio's samples); None when absent or malformed. The tensor's
    contents are not read."""
    wanted, found = name.encode(), None
    try:
        for number, _, value in fields(message):
            if number != RESPONSE_OUTPUTS or not isinstance(value, memoryview):
                continue
            tensor, shape = b"", []
            for inner, _, v in fields(value):
                if inner == OUTPUT_NAME and isinstance(v, memoryview):
                    tensor = bytes(v)
                elif inner == OUTPUT_SHAPE:
                    shape += _packed(v) if isinstance(v, memoryview) else [v]
            if tensor == wanted:
                found = math.prod(shape) if shape else 0
    except Malformed:
        return None
    return found
