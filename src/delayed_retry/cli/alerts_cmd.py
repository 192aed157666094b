"""``delayed-retry alerts``: run the parking alerts consumer until interrupted."""

from __future__ import annotations

import argparse

from aio_pika.abc import AbstractRobustConnection

from delayed_retry.alerts import AlertSink, LoggingSink, ParkingAlerts, WebhookSink
from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command
from delayed_retry.cli.service import add_service_args, run_service
from delayed_retry.cli.service_state import Running
from delayed_retry.cli.startup import Startup
from delayed_retry.errors import ConfigurationError

__all__ = ["COMMAND", "run_alerts"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--webhook", metavar="URL", help="POST each alert as JSON to URL")
    parser.add_argument(
        "--slack", action="store_true", help="send a Slack-compatible payload to --webhook"
    )
    parser.add_argument("--log", action="store_true", help="also log each alert (WARNING)")
    for flag, default, help_text in (
        ("--window", 30.0, "group arrivals within this long into one alert, e.g. 30s, 5m (30s)"),
        (
            "--retry-after",
            60.0,
            "when a sink keeps failing, try the alert again after this long, e.g. 5m (60s)",
        ),
    ):
        parser.add_argument(
            flag, type=output.duration_type, default=default, metavar="DURATION", help=help_text
        )
    parser.add_argument(
        "--once", action="store_true", help="exit after the first alert is delivered"
    )
    common.add_topology_args(parser)
    add_service_args(parser)


def _sinks(args: argparse.Namespace) -> list[AlertSink]:
    sinks: list[AlertSink] = []
    if args.slack and not args.webhook:
        raise ConfigurationError("--slack needs --webhook URL (the Slack incoming-webhook URL)")
    if args.webhook:
        sinks.append(WebhookSink(args.webhook, slack=args.slack))
    if args.log or not sinks:
        sinks.append(LoggingSink())
    return sinks


async def run_alerts(args: argparse.Namespace) -> int:
    """The command: consume until SIGINT/SIGTERM (or the first alert with ``--once``)."""
    sinks = _sinks(args)
    topology = common.topology_from_args(args)

    async def start(connection: AbstractRobustConnection | None) -> Running:
        assert connection is not None
        alerts = ParkingAlerts(
            connection,
            sinks=sinks,
            topology=topology,
            window=args.window,
            retry_after=args.retry_after,
            declare=False,
        )
        await alerts.start()

        async def stop(grace: float) -> None:
            del grace  # stop() alerts on what arrived with one round of sink tries
            await alerts.stop()

        return Running(
            startup=Startup(command="alerts", topology=topology, consumes=(topology.alerts_queue,)),
            stop=stop,
            consumers=lambda: alerts.consumers,
            counts=lambda: {"alerts_delivered": alerts.alerts_delivered},
            extra=(f"alerting to {', '.join(map(repr, sinks))}", "Ctrl-C to stop"),
            finished=alerts.wait_delivered(1) if args.once else None,
        )

    return await run_service(args, command="alerts", start=start)


COMMAND = Command(
    name="alerts",
    help="send an alert when messages are parked (webhook, Slack, log)",
    description="Consume the alert queue (a copy of every parked and unroutable message) "
    "and deliver one alert per window of arrivals. Copies are acked only after every sink "
    "delivered the alert; while a sink fails they stay in the alert queue.",
    options=_options,
    run=run_alerts,
)
