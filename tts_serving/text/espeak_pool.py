"""espeak-ng in worker processes: a text that crashes it costs that request, never the stage.

espeak-ng is C code inside piper-tts and has segfaulted on hostile texts (runs of spelled
letters or symbols; ``voice.shape_for_espeak`` rewrites the known shapes first). In-process,
a segfault kills the Triton stub, and every request batched or queued with the crasher fails
until the stub is healed. Here each model instance phonemizes through a small pool of child
processes instead. When a worker dies on a text, it is replaced at once and the text is tried
once more on the fresh worker (a death can have other causes, such as the OOM killer); a text
that kills that one too is the text's fault: it is refused with ``PhonemizerCrashError``
(``INVALID_ARG``), remembered, and refused at once if sent again. Every other request is served.

Run as ``python -m tts_serving.text.espeak_pool CONFIG_JSON`` this module is the worker itself.
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
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from piper.config import PiperConfig

from tts_serving.text.phonemize import Phonemizer, check_script, speaks_english
from tts_serving.voices import load_voice_config

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


# (voice, text to phonemize, original text for word rows or None)
Job = tuple[str, str, str | None]
# Jobs written to a worker before its answers are read: their bytes stay under a pipe's 64 KiB,
# so the write never blocks while the worker blocks on answers nobody reads yet.
PIPELINE_BYTES = 48 * 1024


def encode(job: Job) -> bytes:
    voice, text, original = job
    message = [voice, text] if original is None else [voice, text, original]
    return json.dumps(message).encode() + b"\n"


def result(answer: dict) -> dict:
    """A worker's answer as the caller's result: ``ids`` (and ``words``), or the error raised."""
    if "ids" in answer:
        return answer
    if "invalid" in answer:
        raise InvalidInputError(answer["invalid"])
    raise RuntimeError(answer.get("error", "phonemizer worker answered nothing"))


class Worker:
    """One child process; jobs go in as JSON lines, answers come back in order."""

    def __init__(self, spec: WorkerSpec, python: str) -> None:
        self.spec = spec
        self.python = python
        self.ready = False
        self.unread = b""  # bytes read from the worker past the last answer returned
        self.proc = subprocess.Popen(
            [python, "-m", __name__, json.dumps(spec.__dict__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the worker's own errors land in the server log
            start_new_session=True,  # a signal to the stub's process group does not reach it
        )

    def _read(self, timeout: float) -> dict:
        # Raw reads into our own buffer: several answers can arrive in one read, and a line
        # left in a file object's buffer would be invisible to select().
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self.unread:
            remaining = deadline - time.monotonic()
            readable = remaining > 0 and select.select([self.proc.stdout], [], [], remaining)[0]
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16) if readable else b""
            if not chunk:
                self.kill()
                raise WorkerDied("timed out" if not readable else f"exit {self.proc.returncode}")
            self.unread += chunk
        line, _, self.unread = self.unread.partition(b"\n")
        return json.loads(line)

    def wait_ready(self) -> None:
        if not self.ready:
            answer = self._read(START_TIMEOUT_S)
            if "ready" not in answer:
                self.kill()
                raise ModelConfigError(f"phonemizer worker failed to start: {answer.get('error')}")
            self.ready = True

    def send(self, messages: list[bytes]) -> None:
        """Write encoded jobs (``encode``) in one go; their answers come back in order."""
        self.wait_ready()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"".join(messages))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerDied(f"exit {self.proc.returncode}") from None

    def receive(self) -> dict:
        """The next answer, within the time one text may take."""
        return self._read(self.spec.timeout_s)

    def call(self, job: Job) -> dict:
        """The worker's answer to one job: ``ids``, and ``words`` when it has an original."""
        self.send([encode(job)])
        return result(self.receive())

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
        (answer,) = self.phonemize_many([(voice, text, original)])
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _known_crasher(self, job: Job) -> bool:
        key = self._key(job[0], job[1])
        with self.lock:
            if key in self.crashers:
                self.crashers.move_to_end(key)
                return True
        return False

    def _retry_alone(self, worker: Worker, job: Job) -> tuple[Worker, dict | Exception]:
        """A job its worker died on, once more on the fresh ``worker``: dying again makes it
        a remembered crasher (the text's fault, not the OOM killer's)."""
        try:
            return worker, _answer_or_error(lambda: worker.call(job))
        except WorkerDied as e:
            worker = self._replace(worker, str(e), job[1])
            with self.lock:
                self.crashers[self._key(job[0], job[1])] = None
                while len(self.crashers) > REMEMBERED_CRASHERS:
                    self.crashers.popitem(last=False)
            return worker, PhonemizerCrashError(crash_message(job[1]))

    def phonemize_many(self, jobs: list[Job]) -> list[dict | Exception]:
        """Each job's answer (as ``phonemize``) or the exception it raised, in order.

        The jobs go through one worker pipelined, a window of ``PIPELINE_BYTES`` written at
        once and the answers read after: one wake-up per window instead of a round trip per
        text. The worker answers in order, so when it dies the first unanswered job is the one
        it died on: that job is retried alone as ``phonemize`` does, the rest are sent again.
        """
        results: list[dict | Exception | None] = [None] * len(jobs)
        pending = []
        for i, job in enumerate(jobs):
            if self._known_crasher(job):
                results[i] = PhonemizerCrashError(crash_message(job[1]))
            else:
                pending.append(i)
        worker = self.idle.get()
        try:
            while pending:
                window, size = [], 0
                for i in pending:
                    message = encode(jobs[i])
                    if window and size + len(message) > PIPELINE_BYTES:
                        break
                    window.append((i, message))
                    size += len(message)
                pending = pending[len(window) :]
                answered = 0
                try:
                    worker.send([message for _, message in window])
                    for i, _ in window:
                        results[i] = _answer_or_error(lambda w=worker: result(w.receive()))
                        answered += 1
                except WorkerDied as e:
                    first = window[answered][0]
                    worker = self._replace(worker, str(e), jobs[first][1])
                    worker, results[first] = self._retry_alone(worker, jobs[first])
                    rest = [i for i, _ in window if results[i] is None]
                    pending = rest + pending
        finally:
            self.idle.put(worker)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return


def _answer_or_error(call: Callable[[], dict]) -> dict | Exception:
    """``call()``'s answer, or the InvalidInputError or RuntimeError it raised (a worker that
    died still raises)."""
    try:
        return call()
    except (InvalidInputError, RuntimeError) as e:
        return e


class IsolatedPhonemizer:
    """One voice's ``phonemize.VoicePhonemizer``, phonemizing in ``pool``'s workers."""

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

    def check_script(self, text: str) -> None:
        check_script(text, self.config)

    def ids_and_words(self, text: str, original: str) -> tuple[list[int], list[list[int]]]:
        answer = self.pool.phonemize(self.name, text, original)
        return answer["ids"], answer["words"]


def local_answer(phonemizer: Phonemizer, text: str, original: str | None) -> dict:
    """A worker's answer, computed in this process: ``ids``, and ``words`` for an original."""
    if original is None:
        return {"ids": phonemizer.ids(text)}
    ids, words = phonemizer.ids_and_words(text, original)
    return {"ids": ids, "words": words}


def phonemize_jobs(
    voices: VoiceTable, pool: PhonemizerPool | None, jobs: list[Job]
) -> list[dict | Exception]:
    """Each job's answer or the error it raised: pipelined through ``pool``'s workers, or in
    this process where there is no pool (``espeak_workers`` 0)."""
    if pool is not None:
        return pool.phonemize_many(jobs)
    return [
        _answer_or_error(lambda job=job: local_answer(voices.pick(job[0])[1], job[1], job[2]))
        for job in jobs
    ]


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
            answer = local_answer(phonemizers[voice], text, original[0] if original else None)
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
