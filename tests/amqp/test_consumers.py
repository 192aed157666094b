"""Every consumer the library runs comes back after a reconnect: one way to start one.

aio-pika's robust channel restores the consumers of the queues it tracks
only; a queue taken with ``get_queue(..., ensure=False)`` (or declared with
``robust=False``) is consumed again by nothing after a broker restart. So a
consumer is started in one place, :mod:`delayed_retry.amqp.consumers`, which
takes its queue the tracked way and checks a queue handed in; this test
keeps every other module from calling ``consume`` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import delayed_retry

PACKAGE = Path(delayed_retry.__file__).parent
HOME = PACKAGE / "amqp" / "consumers.py"
CONSUMING_CALLS = frozenset({"consume", "basic_consume", "iterator"})
"""Methods that start a consumer on a queue or channel (aio-pika, aiormq)."""


def consuming_calls(source: str, filename: str = "<module>") -> list[str]:
    """Each ``x.consume(...)``-like call and each ``robust=False`` argument in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in CONSUMING_CALLS:
            found.append(f"{filename}:{node.lineno}: .{func.attr}(...)")
        for keyword in node.keywords:
            if (
                keyword.arg == "robust"
                and isinstance(keyword.value, ast.Constant)
                and keyword.value.value is False
            ):
                found.append(f"{filename}:{node.lineno}: robust=False")
    return found


def violations(package: Path = PACKAGE, home: Path = HOME) -> list[str]:
    """Calls that start a consumer anywhere but in ``home``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == home:
            continue
        found += consuming_calls(path.read_text(), str(path.relative_to(package.parent)))
    return found


def test_only_the_consumers_module_starts_a_consumer() -> None:
    assert violations() == [], (
        "start consumers with delayed_retry.amqp.consumers.consume_queue (or start_consumer "
        "for a queue taken with declare_queue), so that a reconnect restores them and "
        "readiness sees them"
    )


def test_the_home_itself_consumes() -> None:
    # The guard stands on the home being where consuming happens: if it moved, say so.
    assert consuming_calls(HOME.read_text()), f"{HOME} no longer starts consumers"


def test_the_guard_catches_each_way_of_consuming(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "amqp").mkdir(parents=True)
    (package / "amqp" / "consumers.py").write_text("async def f(q, cb):\n    await q.consume(cb)\n")
    (package / "service.py").write_text(
        "async def start(channel, cb):\n"
        "    queue = await channel.get_queue('q', ensure=False)\n"
        "    await queue.consume(cb)\n"
        "    async with queue.iterator() as it:\n"
        "        pass\n"
        "    other = await channel.declare_queue('r', passive=True, robust=False)\n"
        "    await (await channel.get_underlay_channel()).basic_consume('r', cb)\n"
    )
    (package / "fine.py").write_text("async def peek(queue):\n    return await queue.get()\n")
    assert violations(package, package / "amqp" / "consumers.py") == [
        "pkg/service.py:3: .consume(...)",
        "pkg/service.py:4: .iterator(...)",
        "pkg/service.py:6: robust=False",
        "pkg/service.py:7: .basic_consume(...)",
    ]
