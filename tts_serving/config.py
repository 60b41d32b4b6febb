"""Model config ``parameters`` into typed dataclasses (no Triton import: usable anywhere)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from .errors import ModelConfigError

T = TypeVar("T")

_PARAMETER = re.compile(
    r'parameters\s*:?\s*\{\s*key:\s*"([^"]+)"\s*,?\s*value:?\s*\{\s*string_value:\s*"([^"]*)"'
)


def pbtxt_parameters(path: str | Path) -> dict[str, str]:
    """The string ``parameters`` of a config.pbtxt, read without Triton's protobuf classes.

    Export runs where tritonclient may be missing (the NGC image); a unit test checks this
    against Triton's own parser for every config in the repository.
    """
    text = re.sub(r"#[^\n]*", "", Path(path).read_text())
    return dict(_PARAMETER.findall(text))


def config_parameters(model_config: dict) -> dict[str, str]:
    """``parameters { key: "k" value { string_value: "v" } }`` as a plain dict."""
    return {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}


def parse_dataclass(cls: type[T], params: dict[str, str], prefix: str = "") -> T:
    """Fill a dataclass from string parameters by field type; unknown values raise."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        key = prefix + f.name
        if key not in params:
            continue
        raw = params[key]
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        try:
            if kind == "bool":
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                kwargs[f.name] = raw.lower() in ("true", "1")
            elif kind == "int":
                kwargs[f.name] = int(raw)
            elif kind == "float":
                kwargs[f.name] = float(raw)
            else:
                kwargs[f.name] = raw
        except ValueError:
            raise ModelConfigError(f"parameter {key}={raw!r} is not a valid {kind}") from None
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ModelConfigError(f"bad parameters: {e}") from None
