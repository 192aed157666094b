"""What the demo tells a user to paste: pure, no broker."""

from __future__ import annotations

import shlex

from delayed_retry.cli.demo import DEMO_QUEUE, DEMO_TOPOLOGY, left_behind


def test_the_removal_hint_names_the_vhost_the_demo_ran_on() -> None:
    lines = left_behind(DEMO_TOPOLOGY, DEMO_QUEUE, vhost="team a").splitlines()
    assert shlex.split(lines[-1].strip()) == [
        "rabbitmqctl",
        "delete_queue",
        "-p",
        "team a",
        DEMO_QUEUE,
    ]
