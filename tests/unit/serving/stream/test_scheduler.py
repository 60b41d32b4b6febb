"""The stream scheduler with fakes: order, window, cancellation, errors, the final flag.

No timing windows: each fake synthesis waits on an asyncio.Event the test sets, so the test
decides the order in which syntheses finish.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from tts_client.protocol import CANCELLED, INTERNAL, INVALID_ARGUMENT, UNAVAILABLE
from tts_serving.errors import InvalidInputError
from tts_serving.stream.scheduler import InFlight, Parts, StageError, run_stream


class Fake:
    """Controllable synthesize/send/is_cancelled for one stream."""

    def __init__(self, n: int, fail_at: dict[int, Exception] | None = None) -> None:
        self.n = n
        self.fail_at = fail_at or {}
        self.release = {i: asyncio.Event() for i in range(n)}
        self.started: list[int] = []
        self.running = 0
        self.max_running = 0
        self.cancelled_syntheses: list[int] = []
        self.sent: list = []
        self.cancel = False
        self.planned = 0

    def plan(self):
        for i in range(self.n):
            self.planned += 1
            yield i

    async def synthesize(self, i: int) -> str:
        self.started.append(i)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await self.release[i].wait()
            if i in self.fail_at:
                raise self.fail_at[i]
            return f"audio{i}"
        except asyncio.CancelledError:
            self.cancelled_syntheses.append(i)
            raise
        finally:
            self.running -= 1

    def send(self, response) -> None:
        self.sent.append(response)

    def is_cancelled(self) -> bool:
        return self.cancel

    @property
    def chunks(self) -> list[int]:
        return [r.chunk for r in self.sent if r.chunk is not None]

    @property
    def errors(self) -> list[tuple[str, str]]:
        return [(r.error_code, r.error_message) for r in self.sent if r.error_code]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def start(fake: Fake, max_in_flight: int = 2, plan=None, log=None):
    return asyncio.ensure_future(
        run_stream(
            plan if plan is not None else fake.plan(),
            fake.synthesize,
            fake.send,
            fake.is_cancelled,
            max_in_flight,
            log or (lambda _m: None),
        )
    )


def assert_ends_with_one_final(fake: Fake) -> None:
    assert [r.final for r in fake.sent].count(True) == 1
    assert fake.sent[-1].final


def test_order_is_kept_when_syntheses_finish_out_of_order():
    async def go():
        fake = Fake(5)
        task = start(fake, max_in_flight=3)
        await settle()
        fake.release[0].set()  # the first chunk goes alone
        await settle()
        assert fake.started == [0, 1, 2, 3]  # then the window of 3 fills
        for i in (3, 2, 1):  # finish backwards: nothing may be sent before chunk 1
            fake.release[i].set()
            await settle()
            if i != 1:
                assert fake.chunks == [0]
        fake.release[4].set()
        outcome = await task
        assert fake.chunks == [0, 1, 2, 3, 4]
        assert [r.audio for r in fake.sent if r.chunk is not None] == [
            f"audio{i}" for i in range(5)
        ]
        assert [r.last for r in fake.sent if r.chunk is not None] == [False] * 4 + [True]
        assert outcome.sent == 5 and outcome.error_code is None
        assert_ends_with_one_final(fake)

    asyncio.run(go())


def test_the_window_bounds_work_in_flight_and_the_first_chunk_goes_alone():
    async def go():
        fake = Fake(8)
        task = start(fake, max_in_flight=2)
        await settle()
        assert fake.started == [0] and fake.planned == 1  # planning is lazy too
        for i in range(8):
            fake.release[i].set()
            await settle()
            assert fake.running <= 2
        await task
        assert fake.max_running == 2
        assert fake.chunks == list(range(8))

    asyncio.run(go())


class PartsFake(Fake):
    """Chunk 0 comes in ``parts`` parts (the vocoder's windows), each released on its own;
    ``fail_part``: the part that fails."""

    def __init__(self, n: int, parts: int, fail_part: int | None = None) -> None:
        super().__init__(n)
        self.parts = {k: asyncio.Event() for k in range(parts)}
        self.fail_part = fail_part
        self.cancelled_parts: list[int] = []

    async def part(self, k: int) -> str:
        try:
            await self.parts[k].wait()
        except asyncio.CancelledError:
            self.cancelled_parts.append(k)
            raise
        if k == self.fail_part:
            raise RuntimeError("the vocoder failed")
        return f"audio0.{k}"

    async def synthesize(self, i: int):
        audio = await super().synthesize(i)
        if i:
            return audio
        return Parts([asyncio.ensure_future(self.part(k)) for k in range(len(self.parts))])


def test_parts_are_sent_as_they_finish_in_order_and_the_last_part_ends_the_chunk():
    async def go():
        fake = PartsFake(2, parts=3)
        task = start(fake, max_in_flight=2)
        await settle()
        fake.release[0].set()  # the acoustic half: the parts' work is issued
        await settle()
        assert fake.sent == []
        fake.parts[1].set()  # a later part first: nothing may leave before part 0
        await settle()
        assert fake.sent == []
        fake.parts[0].set()
        await settle()
        assert [(r.audio, r.part, r.parts) for r in fake.sent] == [
            ("audio0.0", 0, 3),
            ("audio0.1", 1, 3),
        ]
        assert fake.started == [0]  # the next chunk waits for the first one's last part
        fake.parts[2].set()
        await settle()
        assert fake.started == [0, 1]
        fake.release[1].set()
        outcome = await task
        chunks = [(r.chunk, r.audio, r.part, r.parts, r.last) for r in fake.sent if r.audio]
        assert chunks == [
            (0, "audio0.0", 0, 3, False), (0, "audio0.1", 1, 3, False),
            (0, "audio0.2", 2, 3, False), (1, "audio1", 0, 1, True),
        ]  # fmt: skip
        assert outcome.sent == 2
        assert_ends_with_one_final(fake)

    asyncio.run(go())


def test_a_failed_part_sends_the_parts_before_it_then_the_error_and_cancels_the_rest():
    async def go():
        fake = PartsFake(2, parts=3, fail_part=1)
        task = start(fake, max_in_flight=2)
        fake.release[0].set()
        await settle()
        fake.parts[0].set()
        fake.parts[1].set()
        outcome = await task
        assert [r.audio for r in fake.sent if r.audio] == ["audio0.0"]
        assert fake.errors and fake.errors[0][0] == INTERNAL
        assert fake.cancelled_parts == [2] and outcome.error_code == INTERNAL
        assert_ends_with_one_final(fake)

    asyncio.run(go())


def test_cancelling_between_parts_cancels_the_parts_not_yet_sent():
    async def go():
        fake = PartsFake(1, parts=3)
        task = start(fake)
        fake.release[0].set()
        await settle()
        fake.parts[0].set()
        await settle()
        fake.cancel = True
        outcome = await task
        assert [r.audio for r in fake.sent if r.audio] == ["audio0.0"]
        assert sorted(fake.cancelled_parts) == [1, 2] and outcome.error_code == CANCELLED
        assert_ends_with_one_final(fake)

    asyncio.run(go())


@pytest.mark.parametrize("cancel_after", [0, 1, 3, 5])
def test_cancellation_at_every_point_stops_work_and_ends_with_cancelled(cancel_after):
    async def go():
        fake = Fake(6)
        task = start(fake, max_in_flight=2)
        for i in range(cancel_after):
            fake.release[i].set()
            await settle()
        fake.cancel = True
        outcome = await asyncio.wait_for(task, timeout=5)  # never hangs on unreleased work
        assert fake.chunks == list(range(min(cancel_after, 6)))
        if cancel_after < 6:
            assert fake.errors == [(CANCELLED, "request cancelled")]
            assert outcome.error_code == CANCELLED
            assert fake.running == 0  # in-flight syntheses were cancelled, not left running
            assert max(fake.started, default=-1) <= cancel_after + 1  # no new work after the cancel
        assert_ends_with_one_final(fake)

    asyncio.run(go())


def test_cancel_after_the_last_chunk_is_a_plain_end():
    async def go():
        fake = Fake(2)
        task = start(fake)
        for i in range(2):
            fake.release[i].set()
        outcome = await task
        fake.cancel = True
        assert outcome.error_code is None and fake.chunks == [0, 1]
        assert_ends_with_one_final(fake)

    asyncio.run(go())


@pytest.mark.parametrize(
    "error, code, message",
    [
        (InvalidInputError("a word is too long"), INVALID_ARGUMENT, "a word is too long"),
        (StageError(UNAVAILABLE, "acoustic: queue full"), UNAVAILABLE, "acoustic: queue full"),
        (RuntimeError("onnxruntime exploded"), INTERNAL, "stream failed after 2 chunks"),
    ],
)
def test_an_error_in_chunk_k_sends_earlier_chunks_then_the_error_then_final(error, code, message):
    async def go():
        logged: list[str] = []
        fake = Fake(5, fail_at={2: error})
        task = start(fake, max_in_flight=2, log=logged.append)
        for i in range(5):
            fake.release[i].set()
        outcome = await task
        assert fake.chunks == [0, 1]  # nothing after chunk 2, even if chunk 3 finished
        ((sent_code, sent_message),) = fake.errors
        assert sent_code == code and sent_message.startswith(message)
        assert outcome == type(outcome)(2, code)
        assert_ends_with_one_final(fake)
        if code == INTERNAL:
            assert "see the server log" in sent_message
            assert "onnxruntime exploded" not in sent_message  # details stay in the log
            assert any("onnxruntime exploded" in m for m in logged)

    asyncio.run(go())


def test_a_planning_error_comes_after_the_chunks_planned_before_it():
    def plan():
        yield 0
        yield 1
        raise InvalidInputError("a single word is longer than the chunk limit")

    async def go():
        fake = Fake(2)
        for e in fake.release.values():
            e.set()
        outcome = await start(fake, max_in_flight=3, plan=plan())
        assert fake.chunks == [0, 1]
        assert [r.last for r in fake.sent if r.chunk is not None] == [False, False]
        assert fake.errors == [(INVALID_ARGUMENT, "a single word is longer than the chunk limit")]
        assert outcome.error_code == INVALID_ARGUMENT
        assert_ends_with_one_final(fake)

    asyncio.run(go())


def test_an_empty_plan_sends_only_the_final_flag():
    async def go():
        fake = Fake(0)
        outcome = await start(fake, plan=iter(()))
        assert outcome.sent == 0 and fake.sent == [type(fake.sent[0])(final=True)]

    asyncio.run(go())


def test_an_invalid_text_from_the_first_plan_step_is_invalid_argument():
    def plan():
        raise InvalidInputError("text is empty")
        yield  # pragma: no cover

    async def go():
        fake = Fake(0)
        await start(fake, plan=plan())
        assert fake.errors == [(INVALID_ARGUMENT, "text is empty")]
        assert_ends_with_one_final(fake)

    asyncio.run(go())


def test_in_flight_counts_streams_and_waits_for_them():
    tracker = InFlight()
    assert tracker.wait_idle(0)
    entered, release = threading.Event(), threading.Event()

    def stream():
        with tracker:
            entered.set()
            release.wait()

    worker = threading.Thread(target=stream)
    worker.start()
    entered.wait()
    assert tracker.count == 1 and not tracker.wait_idle(0.01)
    release.set()
    assert tracker.wait_idle(10)
    worker.join()
