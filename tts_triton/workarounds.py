"""Every part of this project that exists because of the tritonserver release we embed (2.51,
from the nvidia-pytriton wheel), where it is, and what a newer release must do before it goes.

On an upgrade, read each ``remove_when``, try it against the new release (the test named in
``proof`` reproduces the fault where one can), and delete the parts whose condition holds.
``tests/unit/triton/test_workarounds.py`` keeps this list true: every place named exists, and
every product module that mentions the release is named here.
"""

from __future__ import annotations

from dataclasses import dataclass

RELEASE = "2.51"


@dataclass(frozen=True)
class Workaround:
    name: str
    fault: str  # what the release does
    where: tuple[str, ...]  # "package.module:attribute" or a file path relative to the root
    remove_when: str
    proof: str = ""  # a test that shows the fault or the defence


WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround(
        "size and connection limits before Triton",
        "no input-size flag: a 300 MB gRPC message (or a 190 KB gzip body inflating to 200 MB) "
        "is copied before it is refused, and the memory is kept",
        ("tts_front.door:Front", "tts_front.connections:ConnectionGuard"),
        "Triton refuses a message or an inflated body past a configured size while reading it",
        "tests/reliability/test_front.py",
    ),
    Workaround(
        "the dead-stream watch",
        "a decoupled model's stream whose stub died stays open, with no error and no final "
        "response",
        ("tts_front.stubs:StubWatch", "tts_front.grpc_proxy:_ProxiedStream.end_for_dead_stub"),
        "a stream whose stub dies ends with an error response",
        "tests/reliability/test_front.py",
    ),
    Workaround(
        "stub healing",
        "a Python-backend stub that dies (SIGKILL, OOM, a native segfault) is not restarted: "
        "its model fails every request while it and the server report ready",
        ("tts_launcher.stub_healing:Supervisor",),
        "Triton restarts a dead stub, or reports its model not ready",
        "tests/reliability/test_self_healing.py",
    ),
    Workaround(
        "streams held at stop",
        "a stream in flight when its stub died stays in flight for ever; closing the front "
        "door's connections while such a stream is served aborts the server (boost "
        "lock_exception)",
        (
            "tts_front.door:Front.close",
            "tts_launcher.children:_stop_in_order",
            "tts_launcher.server:triton_command",
        ),
        "a stop with such a stream in flight ends it and exits cleanly",
        "tests/reliability/test_drain.py",
    ),
    Workaround(
        "the admin key kept off the command line",
        "the restricted-API key is taken only as a command-line flag, readable by any local "
        "user in /proc",
        ("tts_launcher/server_shim.c", "tts_launcher.commands:server_command"),
        "the key can be given in the environment or a file",
        "tests/reliability/test_security.py",
    ),
    Workaround(
        "numpy 1 where the stub runs",
        "under numpy 2 the Python-backend stub sends every output empty",
        (
            "tts_serving.triton.adapter:check_numpy",
            "tts_tools.gpu_bundle:install",
        ),
        "the stub is built against numpy 2",
        "tests/adapter/test_torch_engine.py",
    ),
    Workaround(
        "no error with a stream's final flag",
        "an error response sent with the final flag, or a question asked of a request the "
        "stream already completed, crashed the server (segfault)",
        (
            "tts_serving.triton.tts_stream:TtsStream.stream",
            "tts_client.aio:_stream_ends",
            "tts_client.client:TTSClient._stream",
        ),
        "the final flag can ride on an error response and a completed stream can be asked",
        "tests/integration/test_stream.py",
    ),
    Workaround(
        "no queue policy or priority levels where Triton batches for levels",
        "without prefetching (off with a queue policy or priority levels) the dynamic batcher "
        "waits for a free instance on a condition variable under a mutex of its own, so a wake-up "
        "can be lost and the request held 500 ms: several times in each 2-second Wyoming burst",
        (
            "model_repository/phonemizer/config.pbtxt",
            "model_repository/acoustic/config.pbtxt",
            "model_repository/vocoder/config.pbtxt",
            "tts_serving.settings:EngineSettings",
            "tts_launcher.rendering:batch_queue",
            "tts_serving.triton.adapter:prefetch_blockers",
        ),
        "a request never waits for a wake-up the batcher missed (WaitForPayloadSlotAvailable "
        "waits under the mutex the notifier takes): then a queue policy may come back",
        "tests/unit/test_model_repository.py",
    ),
    Workaround(
        "no BLS after SIGTERM",
        "after SIGTERM the server refuses new requests, a stream's own BLS calls included",
        ("tts_serving.triton.tts_stream:stage_error",),
        "a draining server still serves the BLS calls of streams in flight",
        "tests/reliability/test_drain.py",
    ),
)
