"""Reading model configs: ``config.pbtxt`` with Triton's schema, string parameters into the
settings dataclasses of ``tts_serving.settings`` (no pb_utils: usable anywhere)."""

from __future__ import annotations

from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any, TypeVar

from .errors import ModelConfigError

T = TypeVar("T")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def doc(text: str) -> dict[str, str]:
    """Field metadata holding the knob's description (docs/configuration.md's table reads it)."""
    return {"doc": text}


def parse_bool(raw: str, what: str = "value") -> bool:
    """The one boolean parser for string parameters."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{what}={raw!r} is not a boolean (true/false, 1/0)")


# Parameters the Python backend reads itself, not this project's settings.
TRITON_PARAMETERS = ("FORCE_CPU_ONLY_INPUT_TENSORS",)


def _own_parameters(params: dict[str, str]) -> dict[str, str]:
    """``params`` but the Python backend's own (``TRITON_PARAMETERS``)."""
    return {k: v for k, v in params.items() if k not in TRITON_PARAMETERS}


def config_parameters(model_config: dict) -> dict[str, str]:
    """``parameters { key: "k" value { string_value: "v" } }`` of a JSON model config, but
    the Python backend's own."""
    return _own_parameters(
        {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
    )


def cpu_only_inputs(model_config: dict) -> bool:
    """Whether the Python backend hands this model its inputs in CPU memory (its default);
    ``FORCE_CPU_ONLY_INPUT_TENSORS: no`` lets GPU tensors through as they are."""
    raw = model_config.get("parameters", {}).get("FORCE_CPU_ONLY_INPUT_TENSORS", {})
    return raw.get("string_value", "yes").lower() not in ("no", "false", "0")


def read_model_config(path: str | Path):
    """A ``config.pbtxt`` parsed with Triton's own protobuf schema (``ModelConfig``)."""
    return parse_model_config(Path(path).read_text(), str(path))


def parse_model_config(text: str, where: str = "config.pbtxt"):
    """``config.pbtxt`` text parsed with Triton's own protobuf schema; ``where`` names it in
    the error."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ModelConfigError(f"{where}: {e}") from None
    return config


def pbtxt_parameters(path: str | Path) -> dict[str, str]:
    """The string ``parameters`` of a ``config.pbtxt`` (parsed with Triton's schema), but the
    Python backend's own."""
    return own_parameters(read_model_config(path))


def own_parameters(config) -> dict[str, str]:
    """The string ``parameters`` of a parsed ``ModelConfig``, but the Python backend's own."""
    return _own_parameters({k: v.string_value for k, v in config.parameters.items()})


def _field_kind(f: Field) -> type:
    kind = f.type
    if isinstance(kind, str):  # from __future__ annotations: resolve the simple names we use
        kind = {"bool": bool, "int": int, "float": float, "str": str}.get(kind, str)
    return kind


def _convert(kind: type, raw: str, key: str) -> Any:
    try:
        if kind is bool:
            return parse_bool(raw, key)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ModelConfigError(f"parameter {key}={raw!r} is not a valid {kind.__name__}") from None
    return raw


def parse_settings(cls: type[T], params: dict[str, str], model: str = "") -> T:
    """Fill the settings dataclass ``cls`` from string parameters.

    Unknown keys are refused by name (a typo must not silently fall back to a default), and
    the dataclass's own ``__post_init__`` checks ranges; both raise ModelConfigError.
    """
    where = f"{model}: " if model else ""
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ModelConfigError(
            f"{where}unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    kwargs = {k: _convert(_field_kind(known[k]), v, k) for k, v in params.items()}
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ModelConfigError(f"{where}bad parameters: {e}") from None


def format_value(value: Any) -> str:
    """How a default is written in config.pbtxt and the knob table (``true``, ``400``, ``0.5``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def defaults(cls: type) -> dict[str, str]:
    """Every field's default, formatted as config.pbtxt writes it."""
    out = {}
    for f in fields(cls):
        if f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} needs a default")
        out[f.name] = format_value(f.default)
    return out
