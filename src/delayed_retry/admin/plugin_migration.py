"""Move an exchange off the delayed-message plugin onto the front door.

Two stages, because an exchange cannot change type in place and the plugin
holds its delayed messages inside the exchange:

1. **prepare** (:func:`prepare`): declare ``X.delay``, its queue and parking,
   next to the plugin exchange ``X``. A front door started now delivers into
   ``X`` itself: the copies it delivers carry a negative ``x-delay``, which
   the plugin routes at once. Producers move to ``X.delay`` one by one.
2. **swap** (:func:`swap`), once the plugin holds no delayed message: delete
   ``X`` and declare it again as an ordinary exchange of its ``x-delayed-type``
   with the same bindings; bindings *into* ``X`` from other exchanges (which
   carried ``x-delay`` messages) move to ``X.delay``.

The plugin exchange's definition and bindings are read through the
management HTTP API (:func:`read_exchange`, through
:class:`~delayed_retry.admin.management.ManagementClient`); planning is pure
(:func:`plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiormq
from aio_pika.abc import AbstractConnection

from delayed_retry.admin.live_chain import Binding
from delayed_retry.admin.management import ManagementClient, ManagementError
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.delivery.front_door import FrontDoor, delay_exchange_name
from delayed_retry.errors import ConfigurationError, DelayedRetryError

__all__ = [
    "PLUGIN_TYPE",
    "ExchangeDefinition",
    "MigrationError",
    "manual_steps",
    "plan",
    "prepare",
    "read_exchange",
    "swap",
]

PLUGIN_TYPE = "x-delayed-message"
"""The exchange type the delayed-message plugin registers."""


class MigrationError(DelayedRetryError):
    """The plugin exchange cannot be migrated as asked; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class ExchangeDefinition:
    """What the management API says about the plugin exchange."""

    name: str
    type: str
    delayed_type: str
    durable: bool
    arguments: dict[str, Any]
    outgoing: tuple[Binding, ...]
    incoming: tuple[Binding, ...]
    messages_delayed: int | None

    @property
    def is_plugin(self) -> bool:
        """Whether this is the plugin's type (not a stand-in declared for a rehearsal)."""
        return self.type == PLUGIN_TYPE


async def read_exchange(client: ManagementClient, *, exchange: str) -> ExchangeDefinition:
    """Read ``exchange`` and its bindings through the management HTTP API.

    Raises :class:`MigrationError` naming the exchange when it is missing or
    is neither the plugin's type nor carries ``x-delayed-type``, and
    :class:`~delayed_retry.admin.management.ManagementError` when the API
    cannot be read.
    """
    try:
        info = await client.exchange(exchange)
    except ManagementError as exc:
        if exc.status == 404:
            raise MigrationError(
                f"exchange {exchange!r} does not exist in vhost {client.vhost!r}; check "
                "--exchange and the vhost at the end of --url ('/' is %2F)"
            ) from exc
        raise
    arguments = dict(info.get("arguments") or {})
    delayed_type = arguments.get("x-delayed-type")
    if not isinstance(delayed_type, str):
        raise MigrationError(
            f"exchange {exchange!r} is of type {info.get('type')!r} without an x-delayed-type "
            "argument: it is not a delayed-message plugin exchange, nothing to migrate"
        )
    outgoing = await client.exchange_bindings(exchange, direction="source")
    incoming = await client.exchange_bindings(exchange, direction="destination")
    delayed = info.get("messages_delayed")
    return ExchangeDefinition(
        name=exchange,
        type=info["type"],
        delayed_type=delayed_type,
        durable=bool(info.get("durable", True)),
        arguments={k: v for k, v in arguments.items() if k != "x-delayed-type"},
        outgoing=tuple(outgoing),
        incoming=tuple(incoming),  # the default exchange's implicit bindings are left out
        messages_delayed=delayed if isinstance(delayed, int) else None,
    )


def plan(definition: ExchangeDefinition, *, stage: str) -> list[str]:
    """The automated steps of ``stage`` (``prepare`` or ``swap``), as lines to print. Pure."""
    x = definition.name
    delay = delay_exchange_name(x)
    if stage == "prepare":
        return [
            f"declare exchange {delay!r} (fanout) and queue {delay!r} bound to it",
            f"declare queue {delay + '.parking'!r} for x-delay values that are not delays",
            f"leave {x!r} ({definition.type}) in place: the front door delivers into it",
        ]
    steps = [
        f"delete exchange {x!r} ({definition.type}, x-delayed-type={definition.delayed_type})",
        f"declare exchange {x!r} ({definition.delayed_type}, durable={definition.durable})",
    ]
    steps += [
        f"bind {b.destination_type} {b.destination!r} to {x!r} with key {b.routing_key!r}"
        + (f" and arguments {b.arguments}" if b.arguments else "")
        for b in definition.outgoing
    ]
    steps += [
        f"bind exchange {delay!r} to {b.source!r} with key {b.routing_key!r} "
        f"(was bound to {x!r}: its messages carry x-delay)"
        for b in definition.incoming
    ]
    return steps


def manual_steps(definition: ExchangeDefinition) -> list[str]:
    """What only people can do, in order."""
    x = definition.name
    delay = delay_exchange_name(x)
    return [
        f"run the front door: delayed-retry front-door --exchange {x} "
        f"--exchange-type {definition.delayed_type} (one or more instances)",
        f"switch every producer from exchange {x!r} to {delay!r} (same x-delay header, "
        "same routing key); producers that send without x-delay may keep using "
        f"{x!r}",
        f"let the plugin's delayed messages drain: watch 'rabbitmqctl list_exchanges name "
        f"messages_delayed' for {x!r} (or the management UI) until it shows 0; the longest "
        "x-delay in flight bounds the wait",
        "stop the front doors (their messages wait in their queues meanwhile), run "
        f"delayed-retry migrate-plugin --exchange {x} --swap, then start them again",
        "disable the plugin (rabbitmq-plugins disable rabbitmq_delayed_message_exchange) "
        "once no exchange of type x-delayed-message is left",
    ]


async def prepare(
    connection: AbstractConnection,
    definition: ExchangeDefinition,
    *,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
) -> None:
    """Declare ``X.delay``, its queue and parking beside the plugin exchange (idempotent)."""
    door = FrontDoor(
        connection,
        exchange=definition.name,
        exchange_type=definition.delayed_type,  # type: ignore[arg-type]
        topology=topology,
    )
    await door.declare()


async def swap(connection: AbstractConnection, definition: ExchangeDefinition) -> None:
    """Replace the plugin exchange by an ordinary one with the same bindings.

    Raises :class:`MigrationError` while the plugin still holds delayed
    messages: deleting the exchange would delete them.
    """
    if definition.messages_delayed:
        raise MigrationError(
            f"exchange {definition.name!r} still holds {definition.messages_delayed} delayed "
            "message(s); deleting it now would lose them. Wait until messages_delayed is 0"
        )
    delay = delay_exchange_name(definition.name)
    channel = await connection.channel(publisher_confirms=False)
    try:
        # Deleting X deletes every binding from and into it; they are re-created below.
        await channel.declare_exchange(delay, "fanout", durable=True)
        await channel.exchange_delete(definition.name)
        x = await channel.declare_exchange(
            definition.name,
            definition.delayed_type,
            durable=definition.durable,
            arguments=definition.arguments,
        )
        underlay = await channel.get_underlay_channel()
        for b in definition.outgoing:
            if b.destination_type == "queue":
                await underlay.queue_bind(
                    b.destination, x.name, routing_key=b.routing_key, arguments=dict(b.arguments)
                )
            else:
                await underlay.exchange_bind(
                    b.destination, x.name, routing_key=b.routing_key, arguments=dict(b.arguments)
                )
        for b in definition.incoming:
            await underlay.exchange_bind(
                delay, b.source, routing_key=b.routing_key, arguments=dict(b.arguments)
            )
    except aiormq.exceptions.ChannelClosed as exc:
        raise ConfigurationError(
            f"swapping exchange {definition.name!r} failed: {exc}. Its definition was: "
            f"{definition}; re-create what is missing from it by hand"
        ) from exc
    finally:
        if not channel.is_closed:
            await channel.close()
