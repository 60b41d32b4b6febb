"""tts_gateway.drain: the next chunk of a stream within its deadline and the drain, and the
process-wide slots."""

from __future__ import annotations

import asyncio

import pytest

from tts_client.errors import InferenceFailed
from tts_gateway.drain import CUT, Drain, DrainCut, Slots, cut_message, next_chunk
from tts_gateway.metrics import Metrics


async def chunks(delays: list[float]):
    for number, delay in enumerate(delays):
        await asyncio.sleep(delay)
        yield number


def test_chunks_come_in_order_until_the_end():
    async def run():
        loop, stream, drain = asyncio.get_running_loop(), chunks([0, 0.01, 0]), Drain(5)
        got = [await next_chunk(stream, loop.time() + 5, drain) for _ in range(3)]
        with pytest.raises(StopAsyncIteration):
            await next_chunk(stream, loop.time() + 5, drain)
        return got

    assert asyncio.run(run()) == [0, 1, 2]


def test_a_chunk_later_than_the_deadline_is_a_timeout_not_a_drain_cut():
    async def run():
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await next_chunk(chunks([10]), start + 0.1, Drain(5))
        return loop.time() - start

    assert 0.1 <= asyncio.run(run()) < 2


def test_a_drain_that_begins_while_waiting_cuts_at_its_own_limit():
    """A stream waiting with a far deadline is cut when the drain's seconds run out, not at
    its deadline: the drain wakes the wait."""

    async def run():
        loop, drain = asyncio.get_running_loop(), Drain(0.2)
        start = loop.time()
        loop.call_later(0.1, drain.begin, loop)
        with pytest.raises(DrainCut):
            await next_chunk(chunks([30]), start + 30, drain)
        return loop.time() - start

    assert 0.3 <= asyncio.run(run()) < 3


def test_a_deadline_before_the_drains_limit_is_still_a_timeout():
    async def run():
        loop, drain = asyncio.get_running_loop(), Drain(30)
        drain.begin(loop)
        with pytest.raises(asyncio.TimeoutError):
            await next_chunk(chunks([30]), loop.time() + 0.1, drain)

    asyncio.run(run())


def test_each_cut_says_why_and_is_one_of_the_planned_ones():
    for exc in (DrainCut(), InferenceFailed("[INTERNAL] it broke"), asyncio.TimeoutError()):
        assert isinstance(exc, CUT)
    assert "drain time ran out" in cut_message(DrainCut())
    assert cut_message(InferenceFailed("[INTERNAL] it broke")) == "[INTERNAL] it broke"
    assert "--request-timeout-s" in cut_message(asyncio.TimeoutError())


def test_a_slot_given_back_twice_counts_once():
    metrics = Metrics()
    slots = Slots(2, metrics)
    first, second = slots.take(), slots.take()
    assert slots.used == 2 and metrics.in_flight._value.get() == 2
    first()
    first()
    assert slots.used == 1 and metrics.in_flight._value.get() == 1
    second()
    assert slots.used == 0 and metrics.in_flight._value.get() == 0
