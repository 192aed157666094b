"""``delayed-retry parking edit`` against a real broker: the diff, the confirmation, the audit
line, the edited copy in the work queue; bad edits and ids move nothing."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from delayed_retry import DelayTopology
from delayed_retry.cli import main
from delayed_retry.headers import X_PARKED_REASON
from delayed_retry.headers.names import X_EDITED_BY, X_EDITED_HEADERS
from tests.support.queues import delete_all, drain, wait_for_depth

pytestmark = pytest.mark.broker


async def _park(url: str, queue: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        await channel.declare_queue(f"{queue}.parking", durable=True)
        for ident, body in (("order-7", b'{"order": 7, "amount": -5}'), ("order-8", b"{}")):
            await channel.default_exchange.publish(
                aio_pika.Message(
                    body,
                    message_id=ident,
                    headers={X_PARKED_REASON: "not-retryable", "x-retry": 2, "tenant": "eu"},
                ),
                routing_key=f"{queue}.parking",
            )


async def _arrived(url: str, queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    """The one message the edit replayed to ``queue``, once it is there."""
    await wait_for_depth(url, queue, 1)
    (copy,) = await drain(url, queue)
    return copy


def _ids(url: str, queue: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["--url", url, "parking", "list", "--queue", queue, "--json"]) == 0
    return sorted(r["id"] for r in json.loads(capsys.readouterr().out)["records"])


@pytest.fixture
def parked(rabbitmq_url: str, unique: str) -> Iterator[None]:
    topology = DelayTopology(prefix=unique, levels=4)
    asyncio.run(_park(rabbitmq_url, unique))
    assert main(["--url", rabbitmq_url, "declare", "--prefix", unique, "--levels", "4"]) == 0
    yield
    asyncio.run(delete_all(rabbitmq_url, queues=[unique], topology=topology))


@pytest.mark.usefixtures("parked")
def test_edit_shows_the_diff_asks_then_replays_with_the_audit_line(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = tmp_path / "body.json"
    body.write_text('{"order": 7, "amount": 5}')
    edit = [
        *("--url", rabbitmq_url, "parking", "edit", "order-7", "--queue", unique),
        *("--prefix", unique, "--levels", "4"),
        *("--body-file", str(body), "--set-header", "tenant=us"),
    ]
    capsys.readouterr()
    assert main([*edit, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '-  "amount": -5\n+  "amount": 5\n' in out and "+tenant: us" in out
    assert "dry run: order-7 stays parked" in out
    assert main(edit) == 2  # no terminal to ask on, no --yes: nothing moves
    assert "add --yes" in capsys.readouterr().err
    assert _ids(rabbitmq_url, unique, capsys) == ["order-7", "order-8"]

    assert main([*edit, "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"edited and replayed order-7 of {unique!r} to {unique!r} (body; set tenant) by " in out
    assert "@" in out.splitlines()[-1]
    assert _ids(rabbitmq_url, unique, capsys) == ["order-8"]
    copy = asyncio.run(_arrived(rabbitmq_url, unique))
    assert copy.body == b'{"order": 7, "amount": 5}' and copy.headers["tenant"] == "us"
    assert "@" in str(copy.headers[X_EDITED_BY])
    assert copy.headers[X_EDITED_HEADERS] == "set: tenant"


@pytest.mark.usefixtures("parked")
def test_the_editor_edits_the_json_body_indented(
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = tmp_path / "fix.py"
    script.write_text(
        "import sys, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "assert p.read_text().startswith('{\\n  \"order\": 7'), p.read_text()\n"
        "p.write_text(p.read_text().replace('-5', '5'))\n"
    )
    monkeypatch.setenv("VISUAL", f"{sys.executable} {script}")
    edit = [
        *("--url", rabbitmq_url, "parking", "edit", "order-7", "--queue", unique),
        *("--prefix", unique, "--levels", "4", "--editor", "--yes", "--json"),
    ]
    capsys.readouterr()
    assert main(edit) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["replayed"] and result["id"] == "order-7"
    copy = asyncio.run(_arrived(rabbitmq_url, unique))
    assert json.loads(copy.body) == {"order": 7, "amount": 5}


@pytest.mark.usefixtures("parked")
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["nope", "--set-header", "a=b"], 1, "no parked message with id 'nope'"),
        (["order-", "--set-header", "a=b"], 1, "'order-' selects 2 parked messages"),
        (["order-7", "--set-header", "x-retry=0"], 2, "header 'x-retry' cannot be edited"),
        (["order-7", "--unset-header", "x-parked-reason"], 2, "'x-parked-reason' cannot be"),
        (["order-7"], 2, "the edit changes nothing"),
        (["order-7", "--body-file", "BAD"], 2, r"not JSON (line 1 column 12: Expecting"),
    ],
)
def test_bad_edits_fail_and_move_nothing(
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    args: list[str],
    code: int,
    message: str,
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"order": 7')
    args = [str(bad) if a == "BAD" else a for a in args]
    base = ["--url", rabbitmq_url, "parking", "edit", "--queue", unique, "--prefix", unique]
    capsys.readouterr()
    assert main([*base, "--levels", "4", "--yes", *args]) == code
    assert message in capsys.readouterr().err
    assert _ids(rabbitmq_url, unique, capsys) == ["order-7", "order-8"]


@pytest.mark.usefixtures("parked")
def test_an_edit_to_a_missing_queue_is_refused_before_asking(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    edit = [
        *("--url", rabbitmq_url, "parking", "edit", "order-8", "--queue", unique),
        *("--prefix", unique, "--levels", "4", "--set-header", "a=b"),
    ]
    capsys.readouterr()
    assert main([*edit, "--to", f"{unique}-missing", "--dry-run"]) == 1
    assert f"queue '{unique}-missing' does not exist" in capsys.readouterr().err
    assert main([*edit, "--to", f"{unique}-missing"]) == 1  # no question asked: exit 1, not 2
    assert _ids(rabbitmq_url, unique, capsys) == ["order-7", "order-8"]
