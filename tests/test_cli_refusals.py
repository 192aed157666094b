"""How the command line words a broker refusal. No broker."""

from __future__ import annotations

import aiormq
import pytest

from delayed_retry.cli.connection import explain_broker_refusal, explain_connection_error

URL = "amqp://guest:s3cret@broker.example:5672/"
QUORUM_DELETE = (
    "NOT_IMPLEMENTED - cannot delete queue 'P.level.00' in vhost '/'. queue.delete operations "
    "with if-empty flag set are not supported by quorum queues"
)


def test_a_refusal_that_closes_the_connection_is_not_an_unreachable_broker() -> None:
    # What aiormq raises for the broker's connection.close 540 after queue.delete if-empty.
    exc = aiormq.exceptions.ConnectionNotImplemented(QUORUM_DELETE)
    line = explain_connection_error(exc, URL)
    assert line is not None and line == explain_broker_refusal(exc, URL)
    assert "refused an operation of this command and closed the connection" in line
    assert QUORUM_DELETE in line
    assert "cannot reach" not in line and "check the host and port" not in line
    assert "s3cret" not in line


@pytest.mark.parametrize(
    "exc",
    [
        aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - no queue 'orders' in vhost '/'"),
        aiormq.exceptions.ChannelPreconditionFailed(
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'P.level.07'"
        ),
        aiormq.exceptions.ChannelAccessRefused("ACCESS_REFUSED - access to queue 'q' refused"),
        aiormq.exceptions.ChannelClosed(406, "PRECONDITION_FAILED - unknown delivery tag 1"),
    ],
)
def test_a_channel_refusal_names_what_the_broker_refused(exc: BaseException) -> None:
    line = explain_broker_refusal(exc, URL)
    assert line is not None
    assert line.startswith(
        "the broker at 'amqp://guest:***@broker.example:5672/' refused an operation"
    )
    assert str(exc.args[-1]) in line and "cannot reach" not in line


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)"),
        aiormq.exceptions.AMQPConnectionError("Connection lost"),
        aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - broker forced shutdown"),
    ],
)
def test_connection_failures_keep_their_wording(exc: BaseException) -> None:
    assert explain_broker_refusal(exc, URL) is None
    line = explain_connection_error(exc, URL)
    assert line is not None and line.startswith("cannot reach the broker at")
