"""How the command line words a broker refusal, and what a teardown refusal advises. No broker."""

from __future__ import annotations

import aiormq
import pytest

from delayed_retry import DelayTopology
from delayed_retry.admin.teardown import deletion_order
from delayed_retry.cli.connection import explain_broker_refusal, explain_connection_error
from delayed_retry.cli.teardown_cmd import how_to_empty

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


@pytest.mark.parametrize(
    "detail",
    [
        "Could not unmarshal ContentHeader frame: year 58875 is out of range",
        "Could not unmarshal <Basic.GetOk object at 0x7f> frame: 'utf-8' codec can't decode byte",
    ],
)
def test_a_message_the_client_cannot_decode_is_named_with_where_to_look(detail: str) -> None:
    # What aiormq raises when pamqp cannot decode a delivery: the broker is fine.
    exc = aiormq.exceptions.InvalidFrameError(detail)
    line = explain_connection_error(exc, URL)
    assert line is not None
    assert "cannot be decoded by the AMQP client" in line and detail in line
    assert "Messages the client cannot decode" in line
    assert "cannot reach" not in line and "virtual host" not in line and "s3cret" not in line


def test_teardown_goes_down_the_levels_then_to_the_queues_the_chain_feeds() -> None:
    topology = DelayTopology(prefix="P", levels=3)
    names = [spec.name for spec in deletion_order(topology, ["orders"])]
    assert names == [
        "P.level.02",
        "P.level.01",
        "P.level.00",
        "orders.parking",
        "P.unroutable",
        "P.rejected",
        "P.parking.alerts",
        "P.parking.mutes",  # the stream of muted failure groups, declared when first used
    ]


def test_each_blocking_queue_gets_the_command_that_empties_it() -> None:
    topology = DelayTopology(prefix="P", levels=6)
    options = "--prefix P --levels 6 --unit-ms 1 --queue-type quorum"
    level = how_to_empty(topology, "P.level.03")
    assert f"'delayed-retry status {options}' says when" in level  # read from the messages
    assert "add --discard-waiting to remove them with the chain, never delivered" in level
    assert "topology migrate --prefix NEW --from delayed-retry --from-prefix P" in level
    assert "--purge-alerts" in how_to_empty(topology, "P.parking.alerts")
    assert (
        f"'delayed-retry parking purge --queue P.unroutable --parking-queue P.unroutable "
        f"--all {options}'"
    ) in how_to_empty(topology, "P.unroutable")
    assert "delayed-retry router --queue QUEUE" in how_to_empty(topology, "P.rejected")
    parking = how_to_empty(topology, "orders.parking", ["orders"])
    assert f"'delayed-retry parking purge --queue orders --all {options}'" in parking
    nsb = how_to_empty(DelayTopology.nservicebus(), DelayTopology.nservicebus().level_name(4))
    assert "--from nservicebus" in nsb
