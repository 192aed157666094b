"""``delayed-retry mute``: silence a failure group's alerts for a while, lift it, list mutes."""

from __future__ import annotations

import argparse
from datetime import timedelta

from delayed_retry.alerts.mute_store import read_mutes, record_mute
from delayed_retry.alerts.mutes import LONGEST_MUTE, Mute
from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect
from delayed_retry.cli.parking_move import who
from delayed_retry.durations import format_duration, utcnow

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group", nargs="?", metavar="GROUP", help="the failure group's key")
    parser.add_argument(
        "--for",
        dest="duration",
        type=output.duration_type,
        metavar="DURATION",
        help=f"how long, e.g. 2h, 3d (at most {LONGEST_MUTE.days} days)",
    )
    parser.add_argument("--reason", default="", help="why, for the people who see the mute")
    parser.add_argument("--lift", action="store_true", help="end GROUP's mute now")
    parser.add_argument("--list", action="store_true", help="list the mutes in force")
    output.add_json_option(parser)
    common.add_topology_args(parser)


def _checked(args: argparse.Namespace) -> None:
    if args.list:
        if args.group or args.duration is not None or args.lift:
            raise output.UsageError("mute --list takes no GROUP, --for or --lift")
        return
    if not args.group:
        raise output.UsageError("mute needs a GROUP (from 'parking list'), or --list")
    if args.lift == (args.duration is not None):
        raise output.UsageError("mute GROUP needs either --for DURATION or --lift")


async def _mute(args: argparse.Namespace) -> int:
    _checked(args)
    topology = common.topology_from_args(args)
    now = utcnow()
    mute = None
    if args.duration is not None:  # checked before connecting: a bad duration is a usage error
        mute = Mute(
            fingerprint=args.group,
            at=now,
            until=now + timedelta(seconds=args.duration),
            reason=args.reason,
            by=who(),
        )
    connection = await connect(args.url)
    async with connection:
        if args.list:
            table = await read_mutes(connection, topology=topology)
            return _print_mutes(table.active(now), args)
        if args.lift:
            known = (await read_mutes(connection, topology=topology)).get(args.group, now)
            if known is None:
                print(f"group {args.group!r} is not muted; nothing changed")
                return 0
            await record_mute(connection, known.lifted(at=now, by=who()), topology=topology)
            print(f"lifted the mute of group {args.group!r}: its arrivals are alerted again")
            return 0
        assert mute is not None
        await record_mute(connection, mute, topology=topology)
    print(
        f"muted group {args.group!r} for {format_duration(mute.until - mute.at)} (until "
        f"{mute.until.isoformat(timespec='seconds')}): its arrivals are counted, not alerted"
    )
    return 0


def _print_mutes(mutes: list[Mute], args: argparse.Namespace) -> int:
    if args.json:
        output.emit_json({"mutes": mutes})
        return 0
    if not mutes:
        print("no failure group is muted")
        return 0
    output.print_table(
        ("group", "until", "by", "reason"),
        [
            (m.fingerprint, m.until.isoformat(timespec="seconds"), m.by or "", m.reason)
            for m in mutes
        ],
    )
    return 0


COMMAND = Command(
    name="mute",
    help="silence a failure group's parking alerts for a while (or lift it, or list)",
    description="Mute failure group GROUP (the 'group' column of 'parking list') for "
    "--for DURATION: every 'delayed-retry alerts' process stops alerting on its arrivals "
    "and counts them instead; they are still parked and shown. Mutes are kept in a "
    "stream on the broker (PREFIX.parking.mutes), so every alerts process honours them "
    "and a restart keeps them. --lift ends a mute; --list shows the mutes in force.",
    options=_options,
    run=_mute,
)
