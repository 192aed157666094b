"""work_queue_arguments and what reads them back (pure): the defence of a work queue against a
message the AMQP client cannot decode, and the checks that say when a queue lacks it."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from delayed_retry import WORK_QUEUE_DELIVERY_LIMIT, ConfigurationError, work_queue_arguments
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.rabbitmq.delivery_limits import check_delivery_limit, undecodable_risk
from delayed_retry.rabbitmq.work_queues import dead_letter_target, work_queue_policy_command


def test_a_quorum_queue_that_dead_letters_into_its_own_queue_past_the_limit() -> None:
    assert work_queue_arguments("orders") == {
        "x-queue-type": "quorum",
        "x-delivery-limit": WORK_QUEUE_DELIVERY_LIMIT,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders.dead-letter",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    other = work_queue_arguments("orders", dead_letter_queue="poison", delivery_limit=12)
    assert other["x-dead-letter-routing-key"] == "poison"
    assert other["x-delivery-limit"] == 12
    assert DelayTopology.default_dead_letter_queue("orders") == "orders.dead-letter"


@pytest.mark.parametrize("limit", [0, -1, True, 2.5, "5", None])
def test_a_limit_that_is_not_a_count_is_refused_naming_it(limit: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"delivery_limit=.*'orders'"):
        work_queue_arguments("orders", delivery_limit=limit)


@pytest.mark.parametrize("queue", ["", "amq.gen-1"])
def test_a_queue_no_client_can_declare_is_refused(queue: str) -> None:
    with pytest.raises(ConfigurationError, match="cannot be declared"):
        work_queue_arguments(queue)


def test_a_queue_cannot_dead_letter_into_itself() -> None:
    with pytest.raises(ConfigurationError, match="itself"):
        work_queue_arguments("orders", dead_letter_queue="orders")


def test_dead_letter_target_reads_only_a_queue_through_the_default_exchange() -> None:
    assert dead_letter_target(work_queue_arguments("orders")) == "orders.dead-letter"
    assert (
        dead_letter_target({"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "q"})
        is None
    )
    assert dead_letter_target({"x-dead-letter-exchange": ""}) is None
    assert (
        dead_letter_target({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": 5}) is None
    )
    assert dead_letter_target(None) is None
    assert dead_letter_target("x-dead-letter-exchange") is None


def test_the_policy_command_sets_the_same_keys_on_that_queue_alone() -> None:
    words = shlex.split(work_queue_policy_command("orders.v2", vhost="shop"))
    assert words[:7] == [
        "rabbitmqctl",
        "set_policy",
        "--vhost",
        "shop",
        "--apply-to",
        "queues",
        "orders.v2.work-queue",
    ]
    assert words[7] == r"^orders\.v2$"
    assert json.loads(words[8]) == {
        "delivery-limit": WORK_QUEUE_DELIVERY_LIMIT,
        "dead-letter-exchange": "",
        "dead-letter-routing-key": "orders.v2.dead-letter",
        "dead-letter-strategy": "at-least-once",
        "overflow": "reject-publish",
    }


def test_the_small_limit_of_work_queue_arguments_is_not_a_delivery_limit_risk() -> None:
    # What passes it is kept in the dead-letter queue with the broker's record, not dropped.
    assert check_delivery_limit(queue="orders", arguments=work_queue_arguments("orders")) is None
    dropped = {"x-queue-type": "quorum", "x-delivery-limit": 5}
    assert check_delivery_limit(queue="orders", arguments=dropped) is not None


DEFENDED = work_queue_arguments("orders")


@pytest.mark.parametrize("major", [3, 4, None])
def test_a_defended_queue_is_not_reported(major: int | None) -> None:
    assert (
        undecodable_risk(
            queue="orders", queue_type="quorum", arguments=DEFENDED, policy=None, broker_major=major
        )
        is None
    )


def test_a_policy_defends_a_queue_like_arguments() -> None:
    policy = {"delivery-limit": 5, "dead-letter-exchange": "", "dead-letter-routing-key": "x"}
    risk = undecodable_risk(
        queue="orders", queue_type="quorum", arguments={"x-queue-type": "quorum"}, policy=policy
    )
    assert risk is None


@pytest.mark.parametrize("queue_type", ["classic", None, "stream"])
def test_a_queue_that_is_not_quorum_has_no_defence(queue_type: str | None) -> None:
    risk = undecodable_risk(queue="orders", queue_type=queue_type, arguments={}, policy={})
    assert risk is not None
    assert "queue 'orders' is a " in risk and "no delivery limit" in risk
    assert "work_queue_arguments('orders')" in risk


def test_no_limit_stalls_for_ever_on_3x_and_names_the_policy() -> None:
    risk = undecodable_risk(
        queue="orders", queue_type="quorum", arguments={}, policy={}, broker_major=3
    )
    assert risk is not None and "for ever on RabbitMQ 3.x" in risk
    assert work_queue_policy_command("orders") in risk


def test_on_4x_the_default_limit_drops_without_a_dead_letter_exchange() -> None:
    risk = undecodable_risk(
        queue="orders", queue_type="quorum", arguments={}, policy={}, broker_major=4
    )
    assert risk is not None
    assert "no dead-letter exchange" in risk and "default delivery limit of 20" in risk


def test_the_lower_of_argument_and_policy_limit_applies() -> None:
    risk = undecodable_risk(
        queue="orders",
        queue_type="quorum",
        arguments={"x-delivery-limit": 1_000_000_000},
        policy={"delivery-limit": 7},
    )
    assert risk is not None and "its delivery limit of 7 drops it" in risk


def test_a_limit_no_return_reaches_holds_the_queue_up_for_that_many_reconnects() -> None:
    arguments = {**DEFENDED, "x-delivery-limit": 1_000_000_000}
    risk = undecodable_risk(queue="orders", queue_type="quorum", arguments=arguments, policy={})
    assert risk is not None and "1000000000 reconnects" in risk


@pytest.mark.parametrize("junk", [None, "x", 5, ["x-delivery-limit"]])
def test_unreadable_reports_count_as_nothing_set(junk: Any) -> None:
    risk = undecodable_risk(queue="q", queue_type="quorum", arguments=junk, policy=junk)
    assert risk is not None and "no delivery limit" in risk
