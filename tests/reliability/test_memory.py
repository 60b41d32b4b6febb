"""Bad input, over and over, over gRPC and HTTP: every one a clear 4xx, the next request
served, no stub restarted, and no process's memory grown past a small bound. `make test` sends
each 5 times; `make test-reliability` 50 times."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.memory import rss_mb
from tts_front.sample_texts import hostile_texts
from tts_triton.probes import stubs_by_model

MODELS = ["phonemizer", "acoustic", "vocoder", "tts_stream"]
GROWTH_MB = {"stub": 20, "tritonserver": 50}  # after a warm-up round


def tensor(module, name: str, array: np.ndarray, datatype: str):
    t = module.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def text_request(module, text: bytes | str, speed: float | None = None):
    data = text.encode() if isinstance(text, str) else text
    inputs = [tensor(module, "text", np.array([[data]], dtype=object), "BYTES")]
    if speed is not None:
        inputs.append(tensor(module, "speed", np.array([[speed]], np.float32), "FP32"))
    return "tts", inputs


def bad_inputs() -> dict[str, tuple]:
    """name -> (model, inputs builder, the code a client must get)."""
    hostile = hostile_texts(2_000)
    cases = {
        "empty": (lambda m: text_request(m, b""), "400"),
        "not UTF-8": (lambda m: text_request(m, b"caf\xe9"), "400"),
        "2 MB of text": (lambda m: text_request(m, "a" * 2_000_000), "400"),
        "arabic only": (lambda m: text_request(m, "مرحبا بالعالم"), "400"),
        "speed NaN": (lambda m: text_request(m, "Hello.", float("nan")), "400"),
        "speed 9": (lambda m: text_request(m, "Hello.", 9.0), "400"),
        "dotted letters (espeak crasher)": (
            lambda m: text_request(m, "A.B.C.D.E.F.G.H.I.J.K.L.M.N.O.P.Q.R.S.T.U.V.W.X.Y.Z." * 4),
            "ok or 400",
        ),
        "ids out of range": (
            lambda m: (
                "acoustic",
                [tensor(m, "phoneme_ids", np.full((1, 10), 10_000, np.int64), "INT64")],
            ),
            "400",
        ),
        "3e38 latent": (
            lambda m: (
                "vocoder",
                [tensor(m, "latent", np.full((1, 192, 20), 3e38, np.float32), "FP32")],
            ),
            "400",
        ),
    }
    for name in ("a.a.a.", "one digit run", "a@a@", "dots", "1,1,1,"):
        cases[f"hostile {name}"] = (lambda m, t=hostile[name]: text_request(m, t), "400")
    return cases


CASES = bad_inputs()


def status(error: InferenceServerException) -> str:
    code = str(error.status())
    return {"StatusCode.INVALID_ARGUMENT": "400", "StatusCode.INTERNAL": "500"}.get(code, code)


def send(client, module, build, expected: str) -> None:
    model, inputs = build(module)
    try:
        client.infer(model, inputs)
    except InferenceServerException as e:
        assert status(e) in expected.split(" or "), (model, status(e), e.message())
        assert "Traceback" not in e.message()
    else:
        assert "ok" in expected, f"{model}: bad input was answered with success"


def memory(server) -> dict[str, float]:
    stubs = stubs_by_model(server.process.pid, MODELS)
    out = {"tritonserver": rss_mb(server.process.pid)}
    for model, pids in stubs.items():
        out[model] = sum(rss_mb(pid) for pid in pids)
    return out


@pytest.mark.parametrize(
    "rounds", [5, pytest.param(50, marks=pytest.mark.long)], ids=["5 rounds", "50 rounds"]
)
def test_bad_inputs_are_refused_without_growing_memory(server, rounds):
    clients = [
        (grpcclient.InferenceServerClient(f"localhost:{server.grpc_port}"), grpcclient),
        (httpclient.InferenceServerClient(f"localhost:{server.http_port}"), httpclient),
    ]
    stubs_before = stubs_by_model(server.process.pid, MODELS)

    def one_round() -> None:
        for client, module in clients:
            for build, expected in CASES.values():
                send(client, module, build, expected)
            model, inputs = text_request(module, "Still here.")
            assert client.infer(model, inputs).as_numpy("audio").size > 0

    one_round()  # warm-up: buffers and caches reach their working size
    before = memory(server)
    for _ in range(rounds):
        one_round()
    after = memory(server)
    growth = {k: round(after[k] - before[k], 1) for k in after}
    print(f"\nRSS growth over {rounds} rounds of {len(CASES)} bad inputs x 2 protocols: {growth}")
    assert stubs_by_model(server.process.pid, MODELS) == stubs_before  # no stub restarted
    for name, mb in growth.items():
        limit = GROWTH_MB["tritonserver" if name == "tritonserver" else "stub"]
        assert mb <= limit, (name, growth)
