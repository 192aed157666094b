"""``delayed-retry router``: delayed retries for queues whose consumers only reject."""

from __future__ import annotations

import argparse

import tenacity
from aio_pika.abc import AbstractRobustConnection
from tenacity.wait import wait_base

from delayed_retry.admin.chain_probe import queue_depth
from delayed_retry.amqp.channels import close_quietly
from delayed_retry.cli import common
from delayed_retry.cli.command import Command
from delayed_retry.cli.service import add_service_args, run_service
from delayed_retry.cli.service_state import Running
from delayed_retry.cli.startup import Startup
from delayed_retry.consumer.options import RouterOptions, option_specs
from delayed_retry.consumer.router import RetryRouter
from delayed_retry.durations import parse_duration
from delayed_retry.errors import ConfigurationError, NotFoundError, queue_not_found

__all__ = ["parse_wait", "COMMAND"]

WAIT_HELP = (
    "backoff: 'exponential:INITIAL:MAX' (doubling from INITIAL up to MAX, plus up to 1 s of "
    "jitter; the default is exponential:1s:1h) or 'fixed:DELAY'; durations like 500ms, 90s, "
    "15m, 1h, 2d"
)


def _seconds(text: str, spec: str) -> float:
    return parse_duration(text, name=f"--wait {spec!r}: {text!r}")


def parse_wait(spec: str) -> wait_base:
    """The tenacity wait strategy a ``--wait`` option describes (see :data:`WAIT_HELP`)."""
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if kind == "fixed" and len(parts) == 1:
        return tenacity.wait_fixed(_seconds(parts[0], spec))
    if kind == "exponential" and len(parts) <= 2:
        initial = _seconds(parts[0], spec) if parts else 1.0
        maximum = _seconds(parts[1], spec) if len(parts) == 2 else 3600.0
        if maximum < initial:
            raise ConfigurationError(
                f"--wait {spec!r}: the maximum is shorter than the first wait; swap them"
            )
        return tenacity.wait_exponential_jitter(multiplier=initial, max=maximum, jitter=1)
    raise ConfigurationError(
        f"--wait {spec!r} is not a backoff; use exponential:1s:1h or fixed:30s"
    )


def wait_type(spec: str) -> wait_base:
    """argparse ``type=`` for ``--wait``: a usage error (exit 2) when it cannot be read."""
    try:
        return parse_wait(spec)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _options(parser: argparse.ArgumentParser) -> None:
    common.add_topology_args(parser)
    common.add_queues_option(
        parser,
        help="a queue whose rejections to retry (repeatable; the only possible destinations)",
        required=True,
    )
    options = option_specs(RouterOptions)
    for name in ("max_retries", "prefetch"):
        spec = options[name]
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=spec.default,
            help=f"{spec.help} (%(default)s)",
        )
    parser.add_argument("--wait", type=wait_type, default=None, metavar="BACKOFF", help=WAIT_HELP)
    add_service_args(parser)


async def _router(args: argparse.Namespace) -> int:
    retry_router = RetryRouter(
        queues=args.queue,
        max_retries=args.max_retries,
        topology=common.topology_from_args(args),
        prefetch=args.prefetch,
        **({"wait": args.wait} if args.wait is not None else {}),
    )

    async def start(connection: AbstractRobustConnection | None) -> Running:
        assert connection is not None
        for queue in retry_router.queues:
            if await queue_depth(connection, queue) is None:
                raise NotFoundError(
                    queue_not_found(queue, so="its rejections cannot be sent back to it")
                )
        channel = await connection.channel()
        await retry_router.start(channel)

        async def stop(grace: float) -> None:
            await retry_router.stop_consuming()
            await retry_router.in_flight.wait_idle(grace)
            await close_quietly(channel)

        routes = f"routing rejections of {', '.join(map(repr, retry_router.queues))}"
        return Running(
            startup=Startup(
                command="router",
                topology=retry_router.topology,
                consumes=(retry_router.topology.rejected_queue,),
            ),
            stop=stop,
            consumers=lambda: (retry_router.consumer,) if retry_router.consumer else (),
            extra=(routes, "Ctrl-C to stop"),
        )

    return await run_service(args, command="router", start=start)


COMMAND = Command(
    name="router",
    help="retry what consumers in any language reject (x-dead-letter-exchange routing)",
    description="Consume <prefix>.rejected and send each rejected message of the named "
    "queues back through the delay chain after the backoff, or to QUEUE.parking past "
    "--max-retries. A team adds one argument to its queue: x-dead-letter-exchange = "
    "<prefix>.rejected. Messages of other queues are kept in <prefix>.unroutable. Runs "
    "until interrupted (Ctrl-C or SIGTERM).",
    options=_options,
    run=_router,
)
