"""The gRPC proxy's pure parts: the deadline a request is admitted against."""

from __future__ import annotations

import logging

import pytest

from tts_front.grpc_proxy import GRPC_CORE_LOGGER, client_gone_as_info, message_deadline

DEFAULT_S = 60.0


@pytest.mark.parametrize(
    "own_s, call_left_s, stream, expected",
    [
        (None, None, False, None),  # none set: the default, without the headroom
        (5.0, None, False, 5.0),  # Triton's timeout parameter
        (None, 7.0, False, 7.0),  # the call's gRPC deadline
        (5.0, 3.0, False, 3.0),  # both: the sooner
        (90.0, None, False, 90.0),  # a client's own may be past the default
        # A stream's call deadline is its whole life, not each message's: a message with no
        # timeout of its own has the default, as a unary call without one has (it was given
        # the default as if its client had set it, and refused at 80 % of it).
        (None, None, True, None),
        (None, 3600.0, True, None),
        (None, DEFAULT_S, True, None),
        (None, 30.0, True, 30.0),  # unless the call ends sooner: then that is its deadline
        (5.0, 3600.0, True, 5.0),
        (5.0, 3.0, True, 3.0),
    ],
)
def test_a_request_is_admitted_against_the_deadline_its_client_set(
    own_s, call_left_s, stream, expected
):
    assert message_deadline(own_s, call_left_s, stream, DEFAULT_S) == expected


def test_a_priority_is_read_and_a_demotion_wins_as_protobuf_reads_it():
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    from tts_client.protocol import build_inputs
    from tts_front.protowire import infer_request, with_priority, without_stream_first

    request = service_pb2.ModelInferRequest(model_name="tts", id="7")
    request.parameters["priority"].uint64_param = 1
    request.parameters["timeout"].int64_param = 5_000_000
    for tensor in build_inputs(grpcclient, "Hello."):
        request.inputs.append(tensor._get_tensor())
        request.raw_input_contents.append(tensor._get_content())
    message = request.SerializeToString()
    assert infer_request(message).priority == 1
    demoted = with_priority(message, 2)
    assert infer_request(demoted).priority == 2
    parsed = service_pb2.ModelInferRequest.FromString(demoted)  # as Triton reads it
    assert parsed.parameters["priority"].uint64_param == 2
    # The stages see the level as the bulk flag (Triton passes request parameters on to an
    # ensemble's steps, not its priority); a client's own flag is overwritten either way.
    assert parsed.parameters["bulk"].bool_param is True
    request.parameters["bulk"].bool_param = True
    promoted = service_pb2.ModelInferRequest.FromString(
        with_priority(request.SerializeToString(), 1)
    )
    assert promoted.parameters["bulk"].bool_param is False
    assert promoted.parameters["later"].bool_param is False
    assert promoted.parameters["priority"].uint64_param == 1
    # A light listener's later piece: interactive, flagged so the stages take first pieces
    # first.
    later = service_pb2.ModelInferRequest.FromString(with_priority(message, 1, later=True))
    assert later.parameters["later"].bool_param is True
    assert later.parameters["bulk"].bool_param is False
    assert parsed.parameters["timeout"].int64_param == 5_000_000
    assert parsed.raw_input_contents == request.raw_input_contents
    plain = service_pb2.ModelInferRequest(model_name="tts").SerializeToString()
    assert infer_request(plain).priority == 0
    # Only tts_stream may ask for a stream's first place: a client's flag is cleared.
    assert without_stream_first(plain) == plain
    request.parameters["stream_first"].bool_param = True
    cleared = without_stream_first(request.SerializeToString())
    parsed = service_pb2.ModelInferRequest.FromString(cleared)
    assert parsed.parameters["stream_first"].bool_param is False
    assert parsed.parameters["priority"].uint64_param == 1


def test_the_server_sets_each_requests_level_from_its_clients_interactive_work():
    """Within a client's interactive work in flight, level 1 (whatever it asked, bulk aside);
    past it, 2: a light client's request goes ahead of a heavy client's queue in Triton."""
    import asyncio

    from tts_front.gatekeeper import Gatekeeper
    from tts_front.settings import FrontSettings

    async def main():
        keeper = Gatekeeper(FrontSettings(interactive_work_per_client=250.0, warmup_requests=0))
        mine = [await keeper.enter("tts", 100.0, client="a", priority=1) for _ in range(3)]
        other = await keeper.enter("tts", 100.0, client="b")
        bulk = await keeper.enter("tts", 10.0, client="c", priority=2)
        heavy = await keeper.enter("tts", 600.0, client="d")  # alone, still past the budget
        assert [keeper.level(t) for t in mine] == [1, 1, 2]
        assert [keeper.level(t) for t in (other, bulk, heavy)] == [1, 2, 2]
        keeper.leave(mine[0], "served")
        again = await keeper.enter("tts", 100.0, client="a")
        assert keeper.level(again) == 1  # work that ended is room again
        for ticket in [*mine[1:], other, bulk, heavy, again]:
            keeper.leave(ticket, "served")
        assert not keeper._interactive
        assert keeper.level(await keeper.enter("tts_stream", 1.0, client="a")) is None

    asyncio.run(main())


def test_the_gateways_first_pieces_and_rest_keep_the_level_it_sends():
    """The gateway (the launcher's token) sends a text's first piece at 1 and the rest at 2:
    kept whatever its caller's work in flight, so every listener's first audio goes ahead of
    the rest of anyone's text; an ordinary client's 1 stays within its budget."""
    import asyncio

    from tts_front.admission import GATEWAY
    from tts_front.gatekeeper import Gatekeeper
    from tts_front.settings import FrontSettings

    async def main():
        settings = FrontSettings(interactive_work_per_client=250.0, warmup_requests=0, slots=32)
        keeper = Gatekeeper(settings)
        caller = f"{GATEWAY}203.0.113.7"
        first = [await keeper.enter("tts", 100.0, client=caller, priority=1) for _ in range(5)]
        rest = await keeper.enter("tts", 10.0, client=caller, priority=2)
        unsaid = await keeper.enter("tts", 100.0, client=f"{GATEWAY}x")  # 0: the budget's
        direct = [await keeper.enter("tts", 100.0, client="a", priority=1) for _ in range(3)]
        assert [keeper.level(t) for t in first] == [1] * 5
        assert [keeper.level(t) for t in (rest, unsaid)] == [2, 1]
        assert [keeper.level(t) for t in direct] == [1, 1, 2]
        for ticket in [*first, rest, unsaid, *direct]:
            keeper.leave(ticket, "served")
        assert not keeper._interactive

    asyncio.run(main())


def test_a_stream_response_ends_only_a_ticket_of_its_own_model():
    from tts_front.admission import AdmissionTicket
    from tts_front.grpc_proxy import _match
    from tts_front.protowire import StreamInferResponse

    tts = AdmissionTicket("tts", 0.0, id="7", queued=True)
    other = AdmissionTicket("tts", 0.0, id="8", queued=True)
    unknown = StreamInferResponse("Request for unknown model: '' is not found", "", "7", None)
    assert _match([tts, other], unknown) is None
    assert _match([tts, other], StreamInferResponse("bad text", "tts", "8", True)) is other
    assert _match([tts, other], StreamInferResponse("", "tts", "", True)) is tts  # no id: oldest


def test_a_callers_long_texts_are_one_count_however_they_came_in():
    """The gateway's requests for a caller and that address's own gRPC streams count
    together (sessions took no count, and the gateway's own count ran beside the front
    door's): the one refusal names the limit; another caller, and the gateway's requests that
    name none, have their own."""
    import asyncio

    from tts_front.admission import GATEWAY, TooMany
    from tts_front.gatekeeper import Gatekeeper
    from tts_front.settings import FrontSettings

    async def main():
        keeper = Gatekeeper(FrontSettings(max_streams_per_client=2, warmup_requests=0))
        direct = await keeper.enter("tts_stream", 1.0, client="203.0.113.7")
        through = await keeper.enter("tts_stream", 1.0, client=f"{GATEWAY}203.0.113.7")
        for client in ("203.0.113.7", f"{GATEWAY}203.0.113.7"):
            try:
                await keeper.enter("tts_stream", 1.0, client=client)
            except TooMany as e:
                assert "already has 2 long-text (tts_stream) requests in progress" in str(e)
            else:
                raise AssertionError(f"{client} got a third stream")
        others = [await keeper.enter("tts_stream", 1.0, client=c) for c in ("203.0.113.8",
                  f"{GATEWAY}203.0.113.8", GATEWAY, GATEWAY)]  # fmt: skip
        keeper.leave(direct, "served")
        again = await keeper.enter("tts_stream", 1.0, client=f"{GATEWAY}203.0.113.7")
        for ticket in [through, again, *others]:
            keeper.leave(ticket, "served")
        assert len(keeper._streams) == 0

    asyncio.run(main())


def test_the_last_quarter_of_the_servers_streams_is_kept_for_clients_running_none():
    """Four addresses with four long texts each held all 16 of tts_stream's streams for minutes;
    now a client already running one takes none of the last four, a newcomer does."""
    import asyncio

    from tts_front.admission import TooMany
    from tts_front.gatekeeper import Gatekeeper
    from tts_front.settings import FrontSettings

    async def main():
        keeper = Gatekeeper(FrontSettings(warmup_requests=0))  # 4 per client, 16 in all
        assert keeper.streams_kept() == 4
        held = [await keeper.enter("tts_stream", 1.0, client=f"10.0.0.{k}")
                for k in range(3) for _ in range(4)]  # fmt: skip
        with pytest.raises(TooMany, match="the last 4 of the server's 16 are kept for clients"):
            await keeper.enter("tts_stream", 1.0, client="10.0.0.9")
            await keeper.enter("tts_stream", 1.0, client="10.0.0.9")
        newcomers = [await keeper.enter("tts_stream", 1.0, client=f"10.0.1.{k}") for k in range(3)]
        assert keeper._streams.total() == 16  # 12, the one 10.0.0.9 got, and three newcomers
        keeper.leave(held.pop(), "served")
        again = await keeper.enter("tts_stream", 1.0, client="10.0.1.7")  # one freed: a newcomer
        for ticket in [*held, *newcomers, again]:
            keeper.leave(ticket, "served")

    asyncio.run(main())


def test_with_express_only_a_light_clients_requests_are_interactive_and_go_in_at_once():
    """Where the stages run bulk work only while no interactive work is in the server
    (express_interactive), an interactive request goes to Triton at once, beside the slots;
    only a light client's are interactive: one with two in flight, or with requests waiting,
    goes at bulk whatever it asked, the gateway's callers too."""
    import asyncio

    from tts_front.admission import GATEWAY
    from tts_front.gatekeeper import EXPRESS_PER_CLIENT, Gatekeeper
    from tts_front.settings import FrontSettings

    async def main():
        settings = FrontSettings(warmup_requests=0, slots=8, express_interactive=True)
        keeper = Gatekeeper(settings)
        flood = [await keeper.enter("tts", 10.0, client="flood", priority=1) for _ in range(2)]
        assert [keeper.level(t) for t in flood] == [1] * EXPRESS_PER_CLIENT
        assert all(t.express for t in flood) and keeper.admission.in_flight == 2
        # The flood's third is bulk, and takes one of the slots left.
        third = await keeper.enter("tts", 10.0, client="flood", priority=1)
        assert keeper.level(third) == 2 and not third.express
        fourth = await keeper.enter("tts", 10.0, client="flood")
        # No room is left (4, a batch, with no rate measured yet): a light client's request
        # still goes in at once, at level 1.
        bystander = await asyncio.wait_for(keeper.enter("tts", 10.0, client="b"), 1)
        assert keeper.level(bystander) == 1 and bystander.express
        waiting = asyncio.ensure_future(keeper.enter("tts", 10.0, client="flood", priority=1))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # the flood's next waits for a slot
        keeper.leave(flood[0], "served")
        keeper.leave(flood[1], "served")
        # The flood has requests waiting: bulk, though it has no interactive work left.
        assert not keeper._is_interactive("flood", 1, 10.0)
        caller = f"{GATEWAY}203.0.113.7"
        first = await keeper.enter("tts", 10.0, client=caller, priority=1)
        rest = await keeper.enter("tts", 10.0, client=caller, priority=2)
        assert keeper.level(first) == keeper.level(rest) == 1  # a light caller's whole text
        for ticket in (third, fourth, bystander, first, rest):
            keeper.leave(ticket, "served")
        keeper.leave(await waiting, "served")
        assert keeper._express == 0 and not keeper._in_flight_of and not keeper._interactive

    asyncio.run(main())


def test_with_express_each_gateway_listener_behind_one_address_is_light_up_to_its_share():
    """A Home Assistant host's satellites come from one address, a Wyoming connection each:
    the gateway names each (LISTENER_HEADER) and each is light by its own requests, while
    the same address's requests without one (a flood of HTTP requests) go at bulk; one
    address's listeners take up to LISTENERS_SHARE of the room beside the slots, so a flood
    of connections leaves the rest to others. Only the gateway (its token) names listeners."""
    import asyncio

    from tts_front.admission import GATEWAY
    from tts_front.gatekeeper import LISTENERS_SHARE, Gatekeeper
    from tts_front.settings import FrontSettings
    from tts_wire import LISTENER_HEADER

    async def main():
        settings = FrontSettings(warmup_requests=0, slots=8, express_interactive=True)
        keeper = Gatekeeper(settings)
        home = f"{GATEWAY}203.0.113.7"
        assert keeper.listener({LISTENER_HEADER: "wyoming-1"}, "203.0.113.7") == "203.0.113.7"
        assert keeper.listener({}, home) == home
        share = int(LISTENERS_SHARE * settings.slots)
        satellites = []
        for n in range(share):
            listener = keeper.listener({LISTENER_HEADER: f"wyoming-{n}"}, home)
            satellites.append(
                await keeper.enter("tts", 1.0, client=home, priority=1, listener=listener)
            )
        assert all(keeper.level(t) == 1 and t.express for t in satellites)
        assert not keeper._is_interactive(home, 1, 1.0, f"{home}#wyoming-{share}")
        # A satellite's next piece beside its first: still light (one ahead).
        assert keeper._is_interactive(home, 1, 1.0, f"{home}#wyoming-0") is False  # share full
        keeper.leave(satellites.pop(), "served")
        assert keeper._is_interactive(home, 1, 1.0, f"{home}#wyoming-0")
        # Without a listener, the same address is one client: heavy from its second in flight.
        plain = [await keeper.enter("tts", 1.0, client=home, priority=1) for _ in range(2)]
        assert [keeper.level(t) for t in plain] == [1, 1]
        assert not keeper._is_interactive(home, 1, 1.0)
        # Another address still goes in at once.
        bystander = await asyncio.wait_for(keeper.enter("tts", 1.0, client="b"), 1)
        assert keeper.level(bystander) == 1 and bystander.express
        for ticket in (*satellites, *plain, bystander):
            keeper.leave(ticket, "served")
        assert not keeper._in_flight_of and not keeper._interactive and not keeper._listening

    asyncio.run(main())


def test_past_its_share_a_light_listener_waits_for_a_slot_and_goes_in_later_not_at_bulk():
    """Bulk work waits for all interactive work, its own address's too: 16 agent sessions
    from one host whose pieces went past the share at bulk heard gaps of 2-3 s. Past the
    share a light listener's request takes a slot (its fair turn) and goes in at 1, flagged
    later (behind every first piece). A listener is light by its own requests: its
    address's other requests waiting for a slot are not its own."""
    import asyncio

    from tts_front.admission import GATEWAY
    from tts_front.gatekeeper import LISTENERS_SHARE, Gatekeeper
    from tts_front.settings import FrontSettings
    from tts_wire import LISTENER_HEADER, PRIORITY_LEVELS

    async def main():
        settings = FrontSettings(warmup_requests=0, slots=8, express_interactive=True)
        keeper = Gatekeeper(settings)
        host = f"{GATEWAY}203.0.113.9"
        s = [keeper.listener({LISTENER_HEADER: f"s-{n}"}, host) for n in range(5)]
        assert int(LISTENERS_SHARE * settings.slots) == 4
        # Two plain requests and two of session 0's go in beside the slots: as many in
        # flight as a server with nothing measured yet lets in (half the slots).
        tickets = [await keeper.enter("tts", 1.0, client=host) for _ in range(2)]
        tickets += [
            await keeper.enter("tts", 1.0, client=host, priority=1, listener=s[0]) for _ in range(2)
        ]
        assert all(t.express and not t.later for t in tickets)
        assert keeper.admission.in_flight == keeper.admission.busy_at
        third = asyncio.ensure_future(
            keeper.enter("tts", 1.0, client=host, priority=1, listener=s[0])
        )
        await asyncio.sleep(0.05)
        assert keeper._queued == {s[0]: 1} and keeper.admission.waiting_of(host) == 1
        assert not keeper._is_interactive(host, 1, 1.0, s[0])  # two in flight, one waiting
        assert keeper._is_interactive(host, 1, 1.0, s[1])  # session 0's wait is not its own
        for n in (1, 2):
            tickets.append(await keeper.enter("tts", 1.0, client=host, priority=1, listener=s[n]))
        assert tickets[-1].express and keeper._listening[host] == 4  # the share, full
        assert keeper._level_of(host, 1, 1.0, s[3]) == (False, False)  # waits for a slot
        assert keeper._level_of(host, 1, 1.0, s[3], slot=True) == (True, True)  # then later
        assert keeper._level_of(host, PRIORITY_LEVELS, 1.0, s[3], slot=True) == (True, True)
        keeper.leave(tickets.pop(), "served")  # room in the share again
        assert keeper._level_of(host, 1, 1.0, s[3], slot=True) == (True, False)
        assert keeper._level_of(host, PRIORITY_LEVELS, 1.0, s[3]) == (True, True)
        keeper.leave(tickets.pop(0), "served")
        keeper.leave(tickets.pop(0), "served")
        tickets.append(await asyncio.wait_for(third, 1))  # session 0 has two in flight:
        assert keeper.level(tickets[-1]) == PRIORITY_LEVELS and not tickets[-1].later  # bulk
        for ticket in tickets:
            keeper.leave(ticket, "served")
        assert not keeper._in_flight_of and not keeper._listening and not keeper._queued

    asyncio.run(main())


def test_the_launcher_sends_interactive_work_at_once_only_to_stages_that_run_levels(tmp_path):
    from bench.baselines import baseline_repository
    from tts_launcher.served import levels_scheduled

    assert levels_scheduled(None)  # the default: scheduling auto, ORT on the CPU
    assert levels_scheduled("cpu-int8")
    for profile in ("cpu-interactive", "torch-cpu", "gpu"):
        assert not levels_scheduled(profile), profile
    baselines = baseline_repository(tmp_path / "baselines")
    assert levels_scheduled("cpu-padded", baselines)
    for profile in ("cpu-batch", "host-ceiling"):
        assert not levels_scheduled(profile, baselines), profile


def _core_record(message: str) -> logging.LogRecord:
    try:
        raise RuntimeError('Failed "execute_batch": (SendMessageOperation,)')
    except RuntimeError as e:
        failure = (type(e), e, e.__traceback__)
    return logging.getLogger(GRPC_CORE_LOGGER).makeRecord(
        GRPC_CORE_LOGGER, logging.ERROR, "server.pyx", 1, message, (), failure
    )


def test_grpcs_line_for_a_client_that_left_becomes_one_info_line_and_others_pass():
    """grpcio logs a response written after its client left at ERROR with a traceback (a race
    in its own check of the client's close): an operator would read a fault into it."""
    gone = _core_record(
        "ExecuteBatchError raised in core by servicer method "
        "[/inference.GRPCInferenceService/ModelStreamInfer]"
    )
    assert client_gone_as_info(gone)
    assert (gone.levelno, gone.exc_info) == (logging.INFO, None)
    assert gone.getMessage() == (
        "a client left before its response was written "
        "(/inference.GRPCInferenceService/ModelStreamInfer)"
    )
    assert "Traceback" not in logging.Formatter().format(gone)

    other = _core_record("Unexpected [KeyError] raised by servicer method [/x/Y]")
    assert client_gone_as_info(other)
    assert other.levelno == logging.ERROR and other.exc_info is not None


def test_a_short_texts_stream_is_admitted_as_tts_is_and_not_counted_among_long_texts():
    """A Home Assistant host's satellites each stream a sentence at once (early audio without
    cutting it): a short text's stream takes a slot at its spoken cost and the level due, and
    none of its client's long-text count; a long text's still does."""
    import asyncio

    from tts_front.admission import GATEWAY, spoken_cost
    from tts_front.gatekeeper import Gatekeeper
    from tts_front.settings import FrontSettings
    from tts_wire import SHORT_TEXT_CHARS, TEXT

    sentence = b"Turn on the living room lights, please."
    long = b"A sentence of a long text. " * (SHORT_TEXT_CHARS // 20)
    assert len(long) > SHORT_TEXT_CHARS

    async def main():
        keeper = Gatekeeper(FrontSettings(max_streams_per_client=2, warmup_requests=0))
        assert keeper.short_stream("tts_stream", {TEXT: [sentence]})
        assert not keeper.short_stream("tts_stream", {TEXT: [long]})
        assert not keeper.short_stream("tts", {TEXT: [sentence]})  # `tts` is admitted so anyway
        assert not keeper.short_stream("tts_stream", {TEXT: [sentence, sentence]})
        cost = await keeper.cost("tts_stream", 999, {TEXT: [sentence]})
        assert cost == spoken_cost([sentence], None)
        client = f"{GATEWAY}203.0.113.7"
        short = [
            await keeper.enter("tts_stream", cost, client=client, priority=1, short=True)
            for _ in range(6)  # more than the client's 2 long texts
        ]
        assert all(t.queued and t.measured for t in short)
        assert keeper.admission.in_flight == 6 and len(keeper._streams) == 0
        assert keeper.level(short[0]) == 1  # interactive, as a `tts` request within its work
        longs = [await keeper.enter("tts_stream", 1.0, client=client) for _ in range(2)]
        assert not any(t.queued for t in longs) and keeper._streams.total() == 2
        for ticket in short:
            keeper.leave(ticket, "served", samples=22_050)
        for ticket in longs:
            keeper.leave(ticket, "served")
        assert keeper.admission.in_flight == 0 and len(keeper._streams) == 0

    asyncio.run(main())


def test_a_short_texts_stream_is_measured_by_its_audio_summed_and_a_long_ones_charged():
    """The proxy's side: a short text's stream's chunks add up to the work it is measured by
    when it ends; a long text's chunks are charged to its client as they come."""
    import asyncio
    from types import SimpleNamespace

    from tritonclient.grpc import service_pb2

    from tts_front.gatekeeper import Gatekeeper
    from tts_front.grpc_proxy import _ProxiedStream
    from tts_front.settings import FrontSettings

    def reply(rid: str, samples: int | None, final: bool) -> bytes:
        response = service_pb2.ModelInferResponse(model_name="tts_stream", id=rid)
        if samples:
            output = response.outputs.add(name="audio", datatype="FP32")
            output.shape.extend([samples])
        if final:
            response.parameters["triton_final_response"].bool_param = True
        return service_pb2.ModelStreamInferResponse(infer_response=response).SerializeToString()

    async def main():
        keeper = Gatekeeper(FrontSettings(warmup_requests=0))
        left, charged = [], []
        keeper.leave = lambda ticket, outcome, samples=None: left.append((ticket.id, samples))
        keeper.admission.charge = lambda client, work: charged.append((client, work))
        proxy = SimpleNamespace(gatekeeper=keeper, settings=keeper.settings)

        async def no_messages():
            yield b""

        stream = _ProxiedStream(proxy, no_messages(), None, False, "10.0.0.1")
        short = await keeper.enter("tts_stream", 50.0, "s", "10.0.0.1", short=True)
        long = await keeper.enter("tts_stream", 1.0, "l", "10.0.0.1")
        stream.tickets += [short, long]
        for message in (reply("s", 1000, False), reply("l", 500, False), reply("s", 200, True)):
            stream.ended(message)
        assert left == [("s", 1200)] and [c for c, _ in charged] == ["10.0.0.1"]
        stream.ended(reply("l", None, True))
        assert left == [("s", 1200), ("l", None)] and len(charged) == 1

    asyncio.run(main())
