"""The throttle's metrics on a service's ``/metrics`` page (in a process of its own).

``ServiceMetrics`` replaces the global meter provider, which OpenTelemetry
allows once per process: the check runs in a child interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio

    from delayed_retry import DelayTopology, Throttle
    from delayed_retry.cli.service_metrics import ServiceMetrics
    from delayed_retry.consumer.throttle import ThrottleControl
    from delayed_retry.testing import FakeChannel, fake_message

    metrics = ServiceMetrics(
        service="forwarder", counts=lambda: {}, held=lambda: 0, ready=lambda: True
    )

    async def main() -> None:
        control = ThrottleControl(
            Throttle(consecutive=2), queue="orders", topology=DelayTopology(), publish_timeout=1.0
        )
        channel = FakeChannel()
        for _ in range(2):
            control.observe(fake_message(channel), ConnectionError("down"))
        assert control.throttled
        await control.stop()

    asyncio.run(main())
    print(metrics.page().body.decode())
    """
)


def test_a_trip_shows_on_the_metrics_page() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    trips = [line for line in lines if line.startswith("delayed_retry_throttle_trips_total{")]
    throttled = [line for line in lines if line.startswith("delayed_retry_throttled{")]
    assert len(trips) == 1 and trips[0].endswith(" 1.0"), done.stdout
    assert 'messaging_destination_name="orders"' in trips[0]
    assert len(throttled) == 1 and throttled[0].endswith(" 1.0"), done.stdout
