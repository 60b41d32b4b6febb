"""Weights for the torch engine: the voice's safetensors file, filled into the modules.

``python -m export`` writes ``weights.safetensors`` beside each ``model.onnx`` (conversion in
``export/torch_weights.py``); the torch engine loads it at ``initialize``. Loading is strict
both ways: every tensor must land in a module parameter of the same shape, and every
parameter must be filled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file

from ..errors import ModelConfigError


def fill(module: torch.nn.Module, weights: dict[str, np.ndarray], source: str) -> None:
    """Copy ``weights`` into ``module``'s parameters: every one used, every parameter filled."""
    params = dict(module.named_parameters())
    unused = sorted(set(weights) - set(params))
    missing = sorted(set(params) - set(weights))
    if unused or missing:
        raise ModelConfigError(
            f"{source}: weights do not match the torch modules "
            f"(unused: {unused[:5]}{'...' if len(unused) > 5 else ''}; "
            f"missing: {missing[:5]}{'...' if len(missing) > 5 else ''})"
        )
    with torch.no_grad():
        for name, param in params.items():
            value = torch.from_numpy(np.array(weights[name], dtype=np.float32))
            if value.shape != param.shape:
                raise ModelConfigError(
                    f"{source}: {name} has shape {tuple(value.shape)}, "
                    f"the module expects {tuple(param.shape)}"
                )
            param.copy_(value)


def load(module: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """``module`` filled from a weights file written by ``convert``."""
    if not Path(path).exists():
        raise ModelConfigError(f"{path} is missing: run `make export` (the torch engine needs it)")
    fill(module, load_file(str(path)), str(path))
    return module.eval()
