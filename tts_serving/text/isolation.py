"""espeak-ng in worker processes: a text that crashes it costs that request, never the stage.

espeak-ng is C code inside piper-tts and has segfaulted on hostile texts (runs of spelled
letters or symbols; ``voice.shape_for_espeak`` rewrites the known shapes first). In-process,
a segfault kills the Triton stub, and every request batched or queued with the crasher fails
until the stub is healed. Here each model instance phonemizes through a small pool of child
processes instead. When a worker dies on a text, it is replaced at once and the text is tried
once more on the fresh worker (a death can have other causes, such as the OOM killer); a text
that kills that one too is the text's fault: it is refused with ``PhonemizerCrashError``
(``INVALID_ARG``), remembered, and refused at once if sent again. Every other request is served.

Run as ``python -m tts_serving.text.isolation CONFIG_JSON`` this module is the worker itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from piper.config import PiperConfig

from tts_serving.text.phonemize import Phonemizer, load_voice_config, speaks_english

from ..errors import InvalidInputError, ModelConfigError, PhonemizerCrashError
from ..voices import VoiceFiles, VoiceTable

WARM_UP_TEXT = "Warm up."
# A worker imports piper and loads espeak-ng data in about a second; allow for a busy machine.
START_TIMEOUT_S = 60.0
REMEMBERED_CRASHERS = 4096


class WorkerDied(Exception):
    """A worker ended (or overran its time) while phonemizing; it has been replaced."""


def crash_message(text: str) -> str:
    return (
        f"this text crashes or hangs the phonemizer (espeak-ng) and was not spoken ({len(text)} "
        "characters); remove long runs of single letters or symbols separated by punctuation, "
        "or split the text"
    )


def worker_python() -> str:
    """The interpreter for workers. Inside a Triton stub ``sys.executable`` can be the stub
    binary, so fall back to the environment's python, which the launcher puts first on PATH."""
    candidates = [sys.executable, str(Path(sys.prefix) / "bin" / "python3")]
    for candidate in candidates:
        if candidate and Path(candidate).name.startswith("python") and Path(candidate).exists():
            return candidate
    found = shutil.which("python3")
    if found:
        return found
    raise ModelConfigError(
        "no python3 found for the phonemizer's worker processes (sys.executable is "
        f"{sys.executable!r}); put the environment's bin/ first on PATH"
    )


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker loads: each voice's config file, and the id limit of ``Phonemizer``."""

    voices: dict[str, str]  # name -> path of its voice.json
    max_phoneme_ids: int
    timeout_s: float  # per text; a worker that overruns it is killed like one that crashed
    shape: bool = True  # False: espeak-ng sees texts unshaped (fuzzing espeak-ng itself)


class Worker:
    """One child process; ``call`` sends a text and returns its ids, or raises."""

    def __init__(self, spec: WorkerSpec, python: str) -> None:
        self.spec = spec
        self.python = python
        self.ready = False
        self.proc = subprocess.Popen(
            [python, "-m", __name__, json.dumps(spec.__dict__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the worker's own errors land in the server log
            start_new_session=True,  # a signal to the stub's process group does not reach it
        )

    def _read(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if readable else b""
        if not line:
            self.kill()
            raise WorkerDied("timed out" if not readable else f"exit {self.proc.returncode}")
        return json.loads(line)

    def wait_ready(self) -> None:
        if not self.ready:
            answer = self._read(START_TIMEOUT_S)
            if "ready" not in answer:
                self.kill()
                raise ModelConfigError(f"phonemizer worker failed to start: {answer.get('error')}")
            self.ready = True

    def call(self, voice: str, text: str, original: str | None = None) -> dict:
        """The worker's answer: ``ids``, and ``words`` when ``original`` is given."""
        self.wait_ready()
        assert self.proc.stdin is not None
        message = [voice, text] if original is None else [voice, text, original]
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerDied(f"exit {self.proc.returncode}") from None
        answer = self._read(self.spec.timeout_s)
        if "ids" in answer:
            return answer
        if "invalid" in answer:
            raise InvalidInputError(answer["invalid"])
        raise RuntimeError(answer.get("error", "phonemizer worker answered nothing"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # end of input: the worker exits by itself
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


class PhonemizerPool:
    """``size`` workers shared by every voice of a model instance; thread-safe. ``deaths``
    counts workers that died or overran their time."""

    def __init__(
        self, spec: WorkerSpec, size: int = 1, log: Callable[[str], None] | None = None
    ) -> None:
        if size < 1:
            raise ModelConfigError("the phonemizer pool needs at least one worker")
        self.spec = spec
        self.python = worker_python()
        self.log = log or (lambda message: None)
        self.idle: queue.Queue[Worker] = queue.Queue()
        self.crashers: OrderedDict[str, None] = OrderedDict()
        self.lock = threading.Lock()
        self.deaths = 0
        workers = [Worker(spec, self.python) for _ in range(size)]  # start in parallel
        for worker in workers:
            worker.wait_ready()
            self.idle.put(worker)

    @staticmethod
    def _key(voice: str, text: str) -> str:
        return hashlib.sha256(f"{voice}\0{text}".encode()).hexdigest()

    def _replace(self, dead: Worker, reason: str, text: str) -> Worker:
        with self.lock:
            self.deaths += 1
        self.log(
            f"phonemizer worker {dead.proc.pid} died ({reason}) on a {len(text)}-character text "
            f"starting {text[:40]!r}; replaced"
        )
        return Worker(self.spec, self.python)

    def ids(self, voice: str, text: str) -> list[int]:
        """Phoneme ids of ``text`` for ``voice``; InvalidInputError for bad text (crashers
        included); RuntimeError if a worker cannot answer at all."""
        return self.phonemize(voice, text)["ids"]

    def phonemize(self, voice: str, text: str, original: str | None = None) -> dict:
        """The worker's answer for ``text``: ``ids``, and ``words`` (see
        ``Phonemizer.ids_and_words``) when ``original`` is given; errors as ``ids``."""
        key = self._key(voice, text)
        with self.lock:
            if key in self.crashers:
                self.crashers.move_to_end(key)
                raise PhonemizerCrashError(crash_message(text))
        worker = self.idle.get()
        try:
            for attempt in (1, 2):
                try:
                    return worker.call(voice, text, original)
                except WorkerDied as e:
                    worker = self._replace(worker, str(e), text)
                    if attempt == 2:
                        with self.lock:
                            self.crashers[key] = None
                            while len(self.crashers) > REMEMBERED_CRASHERS:
                                self.crashers.popitem(last=False)
                        raise PhonemizerCrashError(crash_message(text)) from None
            raise AssertionError("unreachable")
        finally:
            self.idle.put(worker)

    def close(self) -> None:
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return


class IsolatedPhonemizer:
    """``voice.Phonemizer``'s interface (``config``, ``is_english``, ``check``, ``ids``) for one
    voice, phonemizing in ``pool``'s workers."""

    def __init__(self, name: str, config: PiperConfig, pool: PhonemizerPool) -> None:
        self.name = name
        self.config = config
        self.pool = pool

    @property
    def is_english(self) -> bool:
        return speaks_english(self.config)

    def check(self) -> None:
        """The worker checked each voice as it started; one round trip proves the pipe."""
        self.ids(WARM_UP_TEXT)

    def ids(self, text: str) -> list[int]:
        return self.pool.ids(self.name, text)

    def ids_and_words(self, text: str, original: str) -> tuple[list[int], list[list[int]]]:
        answer = self.pool.phonemize(self.name, text, original)
        return answer["ids"], answer["words"]


def voice_phonemizers(
    voices: list[VoiceFiles],
    max_phoneme_ids: int,
    workers: int,
    timeout_s: float,
    log: Callable[[str], None],
) -> tuple[VoiceTable[Phonemizer | IsolatedPhonemizer], PhonemizerPool | None]:
    """Each voice's phonemizer, sharing one pool of ``workers`` (0: in this process), checked
    once (espeak-ng data loaded before the first request), and the pool to close at unload."""
    if workers == 0:
        table = VoiceTable(voices, lambda v: Phonemizer(v.config, max_phoneme_ids))
        pool = None
    else:
        paths = {v.name: str(v.folder / "voice.json") for v in voices}
        pool = PhonemizerPool(WorkerSpec(paths, max_phoneme_ids, timeout_s), workers, log)
        table = VoiceTable(voices, lambda v: IsolatedPhonemizer(v.name, v.config, pool))
    for _, phonemizer in table:
        phonemizer.check()
    return table, pool


def serve(spec: WorkerSpec, stdin, stdout) -> None:
    """The worker's loop: one JSON ``[voice, text]`` line in (``[voice, text, original]`` for
    the words too), one JSON answer line out."""
    phonemizers = {}
    try:
        for name, path in spec.voices.items():
            config = load_voice_config(path)
            phonemizers[name] = Phonemizer(config, spec.max_phoneme_ids, spec.shape)
            phonemizers[name].check()
    except Exception as e:  # reported to the parent, which refuses to load
        stdout.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        stdout.flush()
        return
    stdout.write(json.dumps({"ready": os.getpid()}) + "\n")
    stdout.flush()
    for line in stdin:
        voice, text, *original = json.loads(line)
        try:
            if original:
                ids, words = phonemizers[voice].ids_and_words(text, original[0])
                answer: dict = {"ids": ids, "words": words}
            else:
                answer = {"ids": phonemizers[voice].ids(text)}
        except InvalidInputError as e:
            answer = {"invalid": str(e)}
        except Exception as e:
            answer = {"error": f"{type(e).__name__}: {e}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


def main() -> None:
    spec = WorkerSpec(**json.loads(sys.argv[1]))
    # Ctrl-C in a terminal reaches the whole foreground group; the parent decides when to stop.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(spec, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
