"""Model.py adapters loaded as the Python-backend stub loads them, under the fake pb_utils."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
from google.protobuf.json_format import MessageToDict

from tests.support import pb_utils as pb
from tts_serving.model_config import read_model_config


def load_model(repository, name, params=None, max_batch_size=16):
    """Import model_repository/<name>/1/model.py and initialize it like the stub does. The
    batched stages schedule by batches unless ``params`` name levels: their ``execute``
    then returns the responses (by levels it answers through response senders:
    tests/adapter/test_levels.py)."""
    params = dict(params or {})
    if name in ("acoustic", "vocoder") and params.get("scheduling", "auto") == "auto":
        params["scheduling"] = "batch"
    spec = importlib.util.spec_from_file_location(
        f"model_{name}", repository / name / "1" / "model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pbtxt = read_model_config(repository / name / "config.pbtxt")
    # The tensors as Triton hands them to the stub (protobuf's JSON: int64 dims as strings).
    tensors = MessageToDict(pbtxt, preserving_proto_field_name=True)
    config = {
        "name": name,
        "input": tensors.get("input", []),
        "output": tensors.get("output", []),
        "max_batch_size": max_batch_size,
        "model_transaction_policy": tensors.get("model_transaction_policy", {}),
        "parameters": {k: {"string_value": v} for k, v in (params or {}).items()},
    }
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(config),
            "model_repository": str(repository / name),
            "model_version": "1",
            "model_instance_kind": "CPU",
        }
    )
    return model


def text_request(text: bytes) -> pb.InferenceRequest:
    return pb.InferenceRequest(text=np.array([[text]], dtype=object))


def served_latents(repository, texts) -> list[np.ndarray]:
    """Each text's latent through the phonemizer and acoustic model.py, with the voice's own
    noise drawn once: vocoders compared on them get the same input, as served."""
    phonemizer = load_model(repository, "phonemizer")
    acoustic = load_model(repository, "acoustic")
    ids = [phonemizer.execute([text_request(t.encode())])[0].output("phoneme_ids") for t in texts]
    return [
        r.output("latent")
        for r in acoustic.execute([pb.InferenceRequest(phoneme_ids=x) for x in ids])
    ]
