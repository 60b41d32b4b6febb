"""The front door's pure parts: the admission queue (a fake clock) and the wire reader."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tts_front.admission import (
    HEADROOM,
    REQUEST_BASE_COST,
    Admission,
    work_done,
)
from tts_front.protowire import infer_request as infer_request_info, model_name, stream_response
from tts_front.settings import FrontSettings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(coroutine):
    return asyncio.run(coroutine)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def queued(admission: Admission, n: int, client: str = "a", cost: float = 1.0, **kw):
    """``n`` acquires started (each a task); the event loop run until they settled."""
    tasks = [asyncio.create_task(admission.acquire(cost, client, **kw)) for _ in range(n)]
    await settle()
    return tasks


def outcome(task: asyncio.Task) -> str:
    if not task.done():
        return "waiting"
    return "refused" if task.exception() else "admitted"


async def measure(admission: Admission, clock: Clock, per_second: int, seconds: int) -> None:
    """Keep every slot admission allows taken for ``seconds`` (a full batch until the rate is
    measured, then all), ``per_second`` requests of cost 1 completing each second, each
    replaced at once (a closed loop): a live rate of ``per_second``."""
    for _ in range(seconds * per_second):
        while admission.room(1.0):
            await admission.acquire(1.0, "warm")
        clock.now += 1.0 / per_second
        admission.release(1.0)
    while admission.room(1.0):
        await admission.acquire(1.0, "warm")


def test_a_full_batch_is_never_refused_and_without_a_rate_the_rest_wait():
    async def main():
        admission = Admission(slots=4, default_deadline_s=10, clock=Clock())
        tasks = await queued(admission, 5)
        # Nothing measured (a cold or idle server): nothing refused on a guess, and no more
        # than a full batch (half the slots) in flight until its completions measure a rate.
        assert [outcome(t) for t in tasks] == ["admitted"] * 2 + ["waiting"] * 3
        assert admission.waiting() == 3 and admission.refused == 0
        admission.release(1.0)
        await settle()
        assert [outcome(t) for t in tasks] == ["admitted"] * 3 + ["waiting"] * 2
        for task in tasks[3:]:
            task.cancel()
        await settle()
        assert admission.waiting() == 0 and admission.in_flight == 2  # no slot leaked

    run(main())


def test_clients_are_served_in_turn_not_in_order_of_arrival():
    async def main():
        admission = Admission(slots=1, default_deadline_s=10, clock=Clock())
        await admission.acquire(1.0, "flood")
        flood = await queued(admission, 20, "flood")
        other = await queued(admission, 1, "other")
        admission.release(1.0)  # the first free slot: the flood's oldest or the other's
        await settle()
        admission.release(1.0)
        await settle()
        assert outcome(other[0]) == "admitted"  # after at most one of the flood's 20
        assert sum(outcome(t) == "admitted" for t in flood) <= 1
        for task in flood:
            task.cancel()
        await settle()

    run(main())


def test_the_live_rate_refuses_at_once_what_would_finish_past_its_deadline():
    async def main():
        clock = Clock()
        admission = Admission(slots=4, default_deadline_s=10, clock=clock)
        await measure(admission, clock, per_second=4, seconds=3)
        assert admission.rate() == pytest.approx(4.0)
        # 4 in flight: the n-th waiting finishes after (4 + n) / 4 s; with a 10 s deadline of
        # the client's, n <= 28 fits 8 s (the estimate's headroom: 80 % of it).
        assert HEADROOM == 0.8
        tasks = await queued(admission, 40, deadline_s=10.0)
        assert [outcome(t) for t in tasks].count("waiting") == 28
        refused = [t for t in tasks if outcome(t) == "refused"]
        assert len(refused) == 12 and admission.refused == 12
        message = str(refused[0].exception())
        assert "about 8.2 s in all, within 20% of its 10 s deadline" in message, message

        # Another client is served next in turn (1.5 s), but not within its own 1 s deadline.
        short = await queued(admission, 1, "b", deadline_s=1.0)
        assert outcome(short[0]) == "refused"
        assert "past its 1 s deadline; retry later" in str(short[0].exception())
        for task in tasks:
            task.cancel()
        await settle()

        # Without a deadline of the client's (the default, 10 s here) no one gives up at 8 s:
        # refused only past the default, so n <= 36.
        tasks = await queued(admission, 40, "c")
        assert [outcome(t) for t in tasks].count("waiting") == 36
        refused = [t for t in tasks if outcome(t) == "refused"]
        message = str(refused[0].exception())
        assert len(refused) == 4 and "s in all, past its 10 s deadline" in message, message
        for task in tasks:
            task.cancel()
        await settle()

    run(main())


def test_a_slower_server_is_followed_and_waiting_requests_past_their_deadline_shed():
    async def main():
        clock = Clock()
        admission = Admission(slots=4, default_deadline_s=10, window_s=8, clock=clock)
        await measure(admission, clock, per_second=4, seconds=8)
        tasks = await queued(admission, 24)  # (4 + 24) / 4 = 7 s: all fit 80 % of 10 s
        assert all(outcome(t) == "waiting" for t in tasks)
        for _ in range(5):  # the machine gets busy: 1 completion a second now
            clock.now += 1.0
            admission.release(1.0)
            await settle()
        assert admission.rate() < 2.5  # within the 8 s window
        states = [outcome(t) for t in tasks]
        assert states[:5] == ["admitted"] * 5
        assert "refused" in states  # shed as soon as the rate says they cannot make it
        for task in tasks:
            task.cancel()
        await settle()

    run(main())


def test_the_pipeline_filling_is_not_counted_as_slowness():
    """A burst's first batch takes its whole latency to come back; counting that time measured
    a third of the rate, and requests that would have made their deadlines were shed."""

    async def main():
        clock = Clock()
        admission = Admission(slots=4, default_deadline_s=60, clock=clock)
        tasks = await queued(admission, 16)
        clock.now += 3.0  # the first batch: 3 s of filling, then one completion each 0.25 s
        for _ in range(13):
            admission.release(1.0)
            await settle()
            clock.now += 0.25
        assert admission.rate() == pytest.approx(4.0)  # not 12 / 6 s
        for task in tasks:
            task.cancel()
        await settle()

    run(main())


def test_a_batch_that_ends_the_filling_is_not_counted_as_work_done_in_no_time():
    """Completions come a batch at a time; the first batch of a busy spell ends its filling.
    Counted with the time after it, its completions overstated the rate by a batch a window,
    and on 2 busy cores (two batches a window) requests admitted by it missed their deadlines."""

    async def main():
        clock = Clock()
        admission = Admission(slots=8, default_deadline_s=60, clock=clock)
        tasks = await queued(admission, 40)
        clock.now += 3.0  # filling
        for _ in range(4):  # a batch of 4 a second, its completions milliseconds apart
            for _ in range(4):
                admission.release(1.0)
                await settle()
                clock.now += 0.01
            clock.now += 0.96
        assert admission.rate() == pytest.approx(4.0, rel=0.05)  # not 15 / 3 s
        for task in tasks:
            task.cancel()
        await settle()

    run(main())


def test_a_bursts_filling_after_a_lone_request_is_not_read_as_a_slower_server():
    """A burst right after a closed loop's last batch: a request let through alone ended the
    lull, so the live rate counted the burst's first batch filling as slowness (a third of
    what was served: on 2 busy cores two of 48 were refused that came back within 18 s of 60).
    The work each request found ahead of it over its time in Triton carries the estimate."""

    async def main():
        clock = Clock()
        admission = Admission(slots=32, default_deadline_s=30, clock=clock)
        entered = [t.result() for t in await queued(admission, 16, "loop")]
        assert entered == [float(n) for n in range(1, 17)]  # the work ahead, its own with it
        for replace in [True] * 4 + [False] * 2:  # batches of 8 each 2 s; then the loop stops
            clock.now += 2.0
            for _ in range(8):  # a batch's completions, a millisecond apart
                admission.release(1.0, seconds=4.0, ahead=entered.pop(0))
                if replace:
                    entered.append(await admission.acquire(1.0, "loop"))
                clock.now += 0.001
        assert admission.in_flight == 0
        assert admission.through_rate() == pytest.approx(4.0)  # 16 ahead, 4 s in Triton
        clock.now += 0.5
        lone = await queued(admission, 1, "lone")
        burst = await queued(admission, 47, "burst")
        clock.now += 0.3
        admission.release(1.0, seconds=0.3, ahead=lone[0].result())  # alone in its batch
        clock.now += 5.5  # the burst's first batch fills
        admission.release(1.0, seconds=5.8, ahead=burst[0].result())
        await settle()
        assert admission.rate() < 1.5  # the filling, counted
        # At 4 a second the 47th is answered within 13 s, well within 80 % of 30 s.
        assert admission.estimated_wait(1.0, "burst") == pytest.approx(47 / 4.0, abs=1.0)
        assert admission.refused == 0
        assert [outcome(t) for t in burst].count("waiting") == 14
        for task in burst:
            task.cancel()
        await settle()

    run(main())


def test_work_that_came_in_behind_a_request_does_not_shorten_the_estimates():
    """Triton serves in order of arrival: a request that found 16 ahead and took 4 s says 4 a
    second, however many came in behind it (counting those, 8 a second, let in requests at 2x
    load that ran past 10 s deadlines on 2 busy cores)."""

    async def main():
        clock = Clock()
        admission = Admission(slots=32, default_deadline_s=12, clock=clock)
        await measure(admission, clock, per_second=4, seconds=3)  # the live rate: 4 a second
        while admission.in_flight:
            admission.release(1.0, served=False)
        first = [t.result() for t in await queued(admission, 16, "a")]
        behind = await queued(admission, 16, "b")  # 32 in flight
        assert all(outcome(t) == "admitted" for t in behind)
        clock.now += 4.0  # the first batch: 16 ahead of its last, 4 s
        for ahead in first:
            admission.release(1.0, seconds=4.0, ahead=ahead)
        assert admission.drain_rate() > 7.0  # what came in behind, counted
        assert admission.through_rate() == pytest.approx(3.5)  # (the 90th percentile)
        rate = admission.rate()
        assert rate == pytest.approx(4.0, rel=0.1) and admission.serving_rate() == rate
        # 16 in flight: the n-th sent ends after (16 + n) / rate s, within 80 % of 12 s for
        # n <= 22 (at 8 a second, all 24 would be let in).
        waiting = await queued(admission, 24, "c", deadline_s=12.0)
        fit = int(HEADROOM * 12 * rate - 16)
        assert [outcome(t) for t in waiting].count("refused") == 24 - fit > 0
        for task in waiting:
            task.cancel()
        await settle()

    run(main())


def test_a_free_slot_beyond_a_full_batch_is_refused_when_it_cannot_make_the_deadline():
    """32 in flight took 10 s on 2 busy cores: requests that took the last free slots ran past
    their clients' deadlines. Below a full batch nothing is refused."""

    async def main():
        clock = Clock()
        admission = Admission(slots=8, default_deadline_s=60, clock=clock)
        await measure(admission, clock, per_second=4, seconds=4)
        assert admission.rate() == pytest.approx(4.0)
        while admission.in_flight > 4:
            admission.release(1.0, served=False)  # (no work the rate counts)
        # 4 in flight, 4 slots free: the next finishes after (4 + 1) / 4 s.
        tight = await queued(admission, 1, "b", deadline_s=1.0)
        fits = await queued(admission, 1, "c", deadline_s=2.0)
        assert (outcome(tight[0]), outcome(fits[0])) == ("refused", "admitted")
        while admission.in_flight:
            admission.release(1.0)
        few = await queued(admission, 4, "d", deadline_s=0.01)  # fewer than a full batch
        assert [outcome(t) for t in few] == ["admitted"] * 4

    run(main())


def test_one_clients_flood_leaves_in_triton_only_what_anothers_deadline_can_wait_behind():
    """Triton serves in order of arrival: with every slot held by one client's flood, another
    client with a 15 s deadline was refused for as long as the flood lasted. The work in
    flight is kept to what Triton works through in half the deadline's headroom, so the
    other client's request, next in turn, fits behind it."""

    async def main():
        clock = Clock()
        admission = Admission(slots=32, default_deadline_s=15, clock=clock)
        assert admission.depth_s == pytest.approx(0.5 * HEADROOM * 15)
        flood = await queued(admission, 60, "flood")
        for _ in range(20):  # 2 completions a second; the flood's closed loop sends on
            clock.now += 0.5
            # Each took what those in flight take at 2 a second (Little's law).
            admission.release(1.0, seconds=admission.in_flight / 2)
            await settle()
            flood += await queued(admission, 1, "flood")
        rate = admission.rate()
        assert rate == pytest.approx(2.0) and admission.drain_rate() == pytest.approx(2.0)
        # In Triton: at most what 2 per second complete in 6 s (a full batch, 16, before the
        # first completion; without the bound every slot, 32).
        assert admission.work / rate <= admission.depth_s
        other = await queued(admission, 1, "other")
        assert outcome(other[0]) == "waiting"  # (the flood's requests are first in Triton)
        clock.now += 0.5
        admission.release(1.0, seconds=admission.in_flight / 2)
        await settle()
        assert outcome(other[0]) == "admitted"  # the next free slot, within 6.5 s of work
        assert sum(outcome(t) == "refused" for t in flood) > 0  # the flood waits on its own
        for task in flood:
            task.cancel()
        await settle()

    run(main())


def test_a_starved_server_keeps_in_triton_only_what_it_works_through_in_time():
    """A server that completes a batch every half minute has a rate (8 completions in the
    window) only in the seconds after each: it ran a full batch at a time, 16 long requests in
    36 s, and another client's requests with a 15 s deadline were refused by that latency for
    as long as one client's flood lasted. One batch's completions say how fast Triton works
    through what is in it (Little's law): from then on, only what it does in 6 s goes in."""

    async def main():
        clock = Clock()
        admission = Admission(slots=32, default_deadline_s=15, clock=clock)
        flood = await queued(admission, 40, "flood")
        assert admission.in_flight == 16  # a full batch: nothing measured yet
        clock.now += 36.0
        for _ in range(16):  # the batch ends
            admission.release(1.0, seconds=36.0)
        await settle()
        assert admission.drain_rate() == pytest.approx(14 / 36)  # (the 90th percentile)
        # The 24 waiting cannot make it (a slot takes 36 s); the flood sends 20 again: 2 go
        # in, as (2 + 1) / (14 / 36) s > 6 s; the rest wait (no rate yet to refuse by).
        assert admission.in_flight == 0 and admission.waiting() == 0
        flood += await queued(admission, 20, "flood")
        assert admission.in_flight == 2 and admission.waiting() == 18
        for i in range(12):  # one ends every 2.4 s (16 in 36 s), each after two turns
            clock.now += 2.4
            admission.release(1.0, seconds=4.8)
            await settle()
            flood += await queued(admission, 1, "flood")
            assert admission.in_flight <= 2
            if i == 5:  # the batch's 36 s out of the window: the other client arrives
                other = await queued(admission, 1, "other")
                assert outcome(other[0]) == "waiting"
        assert outcome(other[0]) == "admitted"
        for task in flood:
            task.cancel()
        await settle()

    run(main())


def test_idling_forgets_the_rate_and_nothing_measured_once_is_kept():
    async def main():
        clock = Clock()
        admission = Admission(slots=2, default_deadline_s=10, window_s=5, clock=clock)
        await measure(admission, clock, per_second=2, seconds=5)
        while admission.in_flight:
            admission.release(1.0)
        assert admission.rate() is not None
        clock.now += 6  # idle past the window
        tasks = await queued(admission, 40)
        assert admission.rate() is None
        assert [outcome(t) for t in tasks].count("refused") == 0  # waits for a fresh rate
        for task in tasks:
            task.cancel()
        await settle()

    run(main())


def test_failed_and_unmeasured_requests_count_towards_no_rate():
    async def main():
        clock = Clock()
        admission = Admission(slots=1, default_deadline_s=10, clock=clock)
        for served, measured in ((False, True), (True, False)):
            for _ in range(20):
                await admission.acquire(1.0, "a", measured=measured)
                clock.now += 0.01
                admission.release(1.0, served=served, measured=measured)
        assert admission.rate() is None

    run(main())


def test_an_estimate_is_no_sooner_than_the_latency_requests_took_lately():
    """Completions come a batch at a time: the rate alone said 5 s to a request that found 16
    in flight and took 9. The time in Triton of the requests served lately is a floor."""

    async def main():
        clock = Clock()
        admission = Admission(slots=8, default_deadline_s=60, clock=clock)
        for _ in range(16):  # a rate of 4 a second, each request 6 s in Triton
            while admission.room(1.0):
                await admission.acquire(1.0, "warm")
            clock.now += 0.25
            admission.release(1.0, seconds=6.0)
        assert admission.rate() == pytest.approx(4.0) and admission.latency() == 6.0
        while admission.in_flight > 4:
            admission.release(1.0, served=False)
        assert admission.estimated_wait(1.0, "b") == pytest.approx(6.0)  # not (4 + 1) / 4
        refused = await queued(admission, 1, "b", deadline_s=7.0)  # 6 s > 80 % of 7 s
        admitted = await queued(admission, 1, "c", deadline_s=8.0)
        assert (outcome(refused[0]), outcome(admitted[0])) == ("refused", "admitted")

    run(main())


def test_without_a_rate_a_slot_is_not_given_to_a_request_that_waited_too_long_for_it():
    """The start of a busy spell: a full batch in flight, no rate yet. When the first of its
    completions frees a slot, a request that has waited through the batch and would take as
    long again is refused, not sent on to miss its client's deadline."""

    async def main():
        clock = Clock()
        admission = Admission(slots=4, default_deadline_s=10, clock=clock)
        await queued(admission, 2, "a")  # a full batch: never refused
        early = await queued(admission, 1, "b")
        clock.now += 2.0
        late = await queued(admission, 1, "c", deadline_s=5.0)
        clock.now += 4.0  # the batch took 6 s
        admission.release(1.0, seconds=6.0)
        await settle()
        assert admission.rate() is None
        # b: 6 s waited + 6 s in Triton > 8 s (80 % of 10); c: 4 + 6 > 4 s
        assert (outcome(early[0]), outcome(late[0])) == ("refused", "refused")
        assert "in all, past its 10 s deadline" in str(early[0].exception())

    run(main())


def test_a_spell_that_starts_anew_after_a_short_dip_is_measured_on():
    """A closed loop's client replaces each answered request within milliseconds: the dip
    below a full batch in between does not end the busy spell (the rate was never measured)."""

    async def main():
        clock = Clock()
        admission = Admission(slots=2, default_deadline_s=10, clock=clock)
        for _ in range(12):
            while admission.in_flight < 1:  # one batch of 1: every completion is a dip
                await admission.acquire(1.0, "loop")
            clock.now += 0.5
            admission.release(1.0)
            clock.now += 0.01  # the client's reply
        await admission.acquire(1.0, "loop")
        assert admission.rate() == pytest.approx(1 / 0.51, rel=0.05)
        clock.now += 0.5
        admission.release(1.0)
        clock.now += 1.0  # a real lull: the spell ends, and the rate is only what it measured
        await admission.acquire(1.0, "loop")
        clock.now += 0.5
        admission.release(1.0)
        assert admission.rate() == pytest.approx(1 / 0.51, rel=0.05)

    run(main())


def test_the_rate_counts_the_work_done_not_the_bytes_sent():
    """Finding C: text padded with spaces is charged many bytes but speaks little; counted by
    its bytes it inflated the measured capacity (then 3x load was admitted in full)."""

    async def main():
        clock = Clock()
        admission = Admission(slots=4, default_deadline_s=600, clock=clock)
        for _ in range(12):  # charged 50 each, each took the work of 1
            while admission.room(1.0):
                await admission.acquire(50.0, "padded")
            clock.now += 0.25
            admission.release(50.0, work=1.0)
        assert admission.rate() == pytest.approx(4.0)  # not 200

    run(main())


def test_shares_are_fair_by_the_work_each_client_caused():
    """Finding D: a text that costs few bytes but much audio (digits read slowly) was charged
    by its bytes; its client's later turns now move by the work it really took."""

    async def main():
        admission = Admission(slots=1, default_deadline_s=60, clock=Clock())
        await admission.acquire(1.0, "slow")
        slow = await queued(admission, 3, "slow")
        fair = await queued(admission, 3, "fair")
        admission.release(1.0, work=1.0, client="slow")
        await settle()
        assert outcome(slow[0]) == "admitted"  # its turn (tag 1), then it takes 10x its bytes
        admission.release(1.0, work=10.0, client="slow")  # the slot goes to fair[0]
        for _ in range(2):  # fair[1], fair[2]: every one of fair's before slow's next
            await settle()
            admission.release(1.0, work=1.0, client="fair")
        await settle()
        assert [outcome(t) for t in fair] == ["admitted"] * 3
        assert [outcome(t) for t in slow[1:]] == ["waiting"] * 2  # behind all of fair's
        for task in slow:
            task.cancel()
        await settle()

    run(main())


def test_a_waiting_request_is_refused_when_its_deadline_passes():
    async def main():
        admission = Admission(slots=1, default_deadline_s=10)
        await admission.acquire(1.0, "a")
        task = asyncio.create_task(admission.acquire(1.0, "b", deadline_s=0.05))
        await asyncio.sleep(0.2)
        assert outcome(task) == "refused"
        assert "waited" in str(task.exception()) and admission.waiting() == 0

    run(main())


def test_a_full_queue_refuses_at_once_in_all_and_per_client():
    async def main():
        admission = Admission(slots=1, default_deadline_s=10, max_waiting=5,
                              max_waiting_per_client=3, clock=Clock())  # fmt: skip
        tasks = await queued(admission, 6)
        assert [outcome(t) for t in tasks] == ["admitted"] + ["waiting"] * 3 + ["refused"] * 2
        assert "limit per client" in str(tasks[-1].exception())
        others = await queued(admission, 3, "b")
        assert [outcome(t) for t in others] == ["waiting"] * 2 + ["refused"]
        assert "its limit" in str(others[-1].exception())
        for task in tasks + others:
            task.cancel()
        await settle()

    run(main())


def test_costly_requests_wait_as_much_as_their_cost():
    async def main():
        clock = Clock()
        admission = Admission(slots=2, default_deadline_s=10, clock=clock)
        await measure(admission, clock, per_second=1, seconds=10)  # 1 cost per second
        long = await queued(admission, 1, "a", cost=12.0)  # 2 in flight + 12 s > 10 s
        short = await queued(admission, 1, "b", cost=2.0)
        assert (outcome(long[0]), outcome(short[0])) == ("refused", "waiting")
        short[0].cancel()
        await settle()

    run(main())


def infer_request(model: str, text: bytes = b"hello", **fields) -> bytes:
    inp = grpcclient.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text]], dtype=object))
    request = service_pb2.ModelInferRequest(model_name=model, id="r1", **fields)
    request.inputs.extend([inp._get_tensor()])
    request.raw_input_contents.extend([inp._get_content()])
    return request.SerializeToString()


def test_model_name_is_read_from_the_wire_format():
    assert model_name(infer_request("tts")) == "tts"
    assert model_name(infer_request("tts_stream", b"x" * 100_000, model_version="1")) == (
        "tts_stream"
    )
    # Field order on the wire is the sender's choice: model_name after the tensors.
    reordered = service_pb2.ModelInferRequest(id="r2").SerializeToString() + (
        service_pb2.ModelInferRequest(model_name="vocoder").SerializeToString()
    )
    assert model_name(reordered) == "vocoder"


def test_a_duplicate_model_name_is_read_as_protobuf_reads_it():
    """ "zz" prepended as a second model_name passed admission as "zz" while
    Triton served the last one, `tts` (150 concurrent all admitted)."""
    trick = b"\x0a\x02zz" + infer_request("tts")
    assert service_pb2.ModelInferRequest.FromString(trick).model_name == "tts"
    assert model_name(trick) == "tts"
    assert model_name(infer_request("tts") + b"\x0a\x02zz") == "zz"


@pytest.mark.parametrize("raw", [b"", b"\x0a", b"\x0a\xff\xff", b"\x0f\x00", b"\x0a\x02\xff\xfe"])
def test_model_name_of_a_malformed_message_is_none(raw):
    assert model_name(raw) is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_request_mib", 0.0001),
        ("deadline_s", 0),
        ("deadline_s", 1e9),
        ("slots", 0),
        ("max_streams_per_client", 0),
        ("max_grpc_streams_per_client", 0),
        ("warmup_requests", -1),
        ("window_s", 0),
    ],
)
def test_settings_refuse_nonsense(field, value):
    with pytest.raises(ValueError, match=field):
        FrontSettings(**{field: value})


def test_infer_request_counts_the_raw_input_bytes():
    info = infer_request_info(infer_request("tts", b"x" * 500))
    assert (info.model, info.id, info.input_bytes) == ("tts", "r1", 504)  # 4-byte length + text


def stream_reply(**fields) -> bytes:
    reply = service_pb2.ModelStreamInferResponse(**fields)
    return reply.SerializeToString()


def test_stream_responses_are_read_for_their_final_flag():
    final = service_pb2.ModelInferResponse(model_name="tts_stream", id="a")
    final.parameters["triton_final_response"].bool_param = True
    final.raw_output_contents.append(b"\x00" * 10_000)
    r = stream_response(stream_reply(infer_response=final))
    assert (r.error, r.model, r.id, r.final) == ("", "tts_stream", "a", True)
    middle = service_pb2.ModelInferResponse(model_name="tts_stream", id="a")
    middle.parameters["triton_final_response"].bool_param = False
    middle.parameters["other"].string_param = "x"
    assert stream_response(stream_reply(infer_response=middle)).final is False
    refused = stream_response(stream_reply(error_message="unknown model"))
    assert refused.error == "unknown model" and refused.final is None
    assert stream_response(b"\x0a\xff") is None


def test_tritons_timeout_parameter_is_read_as_a_deadline():
    request = service_pb2.ModelInferRequest(model_name="tts", id="t")
    request.parameters["priority"].int64_param = 1
    request.parameters["timeout"].int64_param = 2_500_000
    assert infer_request_info(request.SerializeToString()).timeout_us == 2_500_000
    request.parameters["timeout"].int64_param = -5  # negative: none
    assert infer_request_info(request.SerializeToString()).timeout_us == 0
    assert infer_request_info(infer_request("tts")).timeout_us == 0


def test_the_audio_a_reply_carries_is_read_without_its_samples():
    from tts_front.http_proxy import _audio_samples
    from tts_front.protowire import output_elements

    reply = service_pb2.ModelInferResponse(model_name="tts")
    for name, shape in (("marks", [1, 0]), ("audio", [1, 110250])):
        tensor = reply.outputs.add(name=name, datatype="FP32")
        tensor.shape.extend(shape)
    wire = reply.SerializeToString()
    assert output_elements(wire, "audio") == 110250 and output_elements(wire, "marks") == 0
    assert output_elements(wire, "words") is None and output_elements(b"\xff", "audio") is None
    head = b'{"model_name":"tts","outputs":[{"name":"audio","datatype":"FP32","shape":[1,2205],'
    assert _audio_samples(head + b'"data":[0.0') == 2205
    assert _audio_samples(head[:40]) is None  # not there yet: read on


def test_a_stream_chunks_audio_is_read_from_its_shape():
    chunk = service_pb2.ModelInferResponse(model_name="tts_stream", id="s")
    audio = chunk.outputs.add(name="audio", datatype="FP32")
    audio.shape.extend([22_050])
    chunk.outputs.add(name="chunk_text", datatype="BYTES").shape.extend([1])
    chunk.raw_output_contents.append(b"\x00" * 4 * 22_050)
    assert stream_response(stream_reply(infer_response=chunk)).samples == 22_050
    flag_only = service_pb2.ModelInferResponse(model_name="tts_stream", id="s")
    flag_only.parameters["triton_final_response"].bool_param = True
    assert stream_response(stream_reply(infer_response=flag_only)).samples is None


def test_a_streams_audio_is_charged_to_its_clients_share():
    """Finding F: a stream takes no slot and was charged one estimate for its whole life, so
    its client's other requests kept their place as if it did nothing. Each chunk's audio is
    now charged to the client: while others wait, its requests go after theirs."""

    async def main():
        admission = Admission(slots=1, default_deadline_s=60, clock=Clock())
        await admission.acquire(1.0, "other")
        streamer = await queued(admission, 2, "streamer")
        others = await queued(admission, 2, "other")
        admission.charge("streamer", work_done(10 * 22_050) - REQUEST_BASE_COST)  # 10 s of audio
        for _ in range(2):
            admission.release(1.0)
            await settle()
        assert [outcome(t) for t in others] == ["admitted"] * 2  # before the streamer's
        assert [outcome(t) for t in streamer] == ["waiting"] * 2
        admission.release(1.0)
        await settle()
        assert outcome(streamer[0]) == "admitted"  # nobody else waits: it goes on
        for task in streamer:
            task.cancel()
        await settle()
        admission.charge("streamer", 1e6)  # no one waits: nothing kept for the next spell
        assert "streamer" not in admission._finish

    run(main())
