"""The gRPC proxy's pure parts: the deadline a request is admitted against."""

from __future__ import annotations

import pytest

from tts_front.grpc_proxy import message_deadline

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
