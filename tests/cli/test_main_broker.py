"""The command line against a real broker: declare, status, publish, parking, bad input."""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from delayed_retry.cli import main
from delayed_retry.cli.demo import DEMO_QUEUE, DEMO_TOPOLOGY
from delayed_retry.rabbitmq.urls import redact_url
from tests.support.queues import declare_queue, delete_all, exists

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://user:s3cret@host:5672/vh", "amqp://user:***@host:5672/vh"),
        ("amqps://user:p%40ss@host/", "amqps://user:***@host/"),
        ("amqp://user:a:b@c@host:5672/", "amqp://user:***@host:5672/"),
        ("amqp://user@host/", "amqp://user@host/"),
        ("amqp://host/", "amqp://host/"),
        ("amqp://user:s3cret@host:notaport/", "amqp://user:***@host:notaport/"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url_hides_the_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3cret" not in redact_url(url)


def test_declare_status_and_mismatch(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(declare_queue(rabbitmq_url, unique))
    topo = ["--prefix", unique, "--levels", "8"]
    assert main(["--url", rabbitmq_url, "declare", *topo, "--bind", unique]) == 0
    out = capsys.readouterr().out
    assert f"declared topology {unique!r}: 8 levels of 1 ms (quorum)" in out
    assert f"bound {unique!r}" in out

    assert main(["--url", rabbitmq_url, "status", *topo, "--queue", unique]) == 0
    out = capsys.readouterr().out
    assert f"delay chain {unique!r}: 8 levels of 1 ms, delays up to 255 ms" in out
    assert f"{unique}.level.07" not in out  # empty levels hidden
    assert "0 message(s) waiting in the chain (empty levels hidden" in out
    assert main(["--url", rabbitmq_url, "status", *topo, "--all-levels"]) == 0
    assert f"{unique}.level.07" in capsys.readouterr().out

    # Same prefix, another unit: refused, naming the queue and the option to change.
    code = main(
        ["--url", rabbitmq_url, "declare", "--prefix", unique, "--levels", "8", "--unit-ms", "2"]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert f"queue '{unique}.level.00' exists with other arguments" in err
    assert "use another prefix for the chain" in err and "DelayTopology" not in err


def test_status_and_replay_refuse_a_chain_that_is_not_there(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(declare_queue(rabbitmq_url, unique))
    assert main(["--url", rabbitmq_url, "declare", "--prefix", unique, "--levels", "6"]) == 0
    capsys.readouterr()
    assert main(["--url", rabbitmq_url, "status", "--prefix", unique, "--levels", "10"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"delayed-retry: error: the delay chain {unique!r} on this vhost has 6 levels, not 10; "
        "pass --levels 6"
    ]
    code = main(
        [
            "--url",
            rabbitmq_url,
            "parking",
            "replay",
            "--queue",
            unique,
            "--prefix",
            "nope-" + unique,
        ]
    )
    line = capsys.readouterr().err
    assert code == 1
    assert f"there is no delay chain 'nope-{unique}' on this vhost" in line
    assert "delayed-retry declare --prefix" in line


def test_status_shows_the_work_queue_and_what_is_due_when(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(declare_queue(rabbitmq_url, unique))
    topo = ["--prefix", unique, "--levels", "24", "--unit-ms", "1000"]
    assert main(["--url", rabbitmq_url, "declare", *topo, "--bind", unique]) == 0
    code = main(
        [
            "--url",
            rabbitmq_url,
            "publish",
            "--queue",
            unique,
            "--delay",
            "1h",
            "--body",
            "hi",
            "--header",
            "tenant=acme",
            *topo,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "the broker confirmed it" in out and "(in 1 h)" in out
    assert main(["--url", rabbitmq_url, "status", "--queue", unique, "--json", *topo]) == 0
    data = json.loads(capsys.readouterr().out)
    waiting = [level for level in data["chain"] if level["messages"]]
    # 3600 units enter at the highest 1 bit (level 11, 2048 s), due within 2^12 - 1 s.
    assert [(w["level"], w["messages"]) for w in waiting] == [(11, 1)]
    assert data["queues"] == [
        {
            "queue": unique,
            "messages": 0,
            "consumers": 0,
            "parked": 0,
            "throttled_consumers": 0,
            "dead_lettered": None,  # no unique.dead-letter
            "warning": None,  # the management API does not answer here: not checked
        }
    ]
    # When it comes due is read from its own header, not the level's bound (1 h 8 m 15 s).
    due = waiting[0]["due_in_seconds"]
    assert 3000 < due["earliest"] == due["latest"] <= 3600 and waiting[0]["due_read"] == 1
    assert main(["--url", rabbitmq_url, "status", "--queue", unique, *topo]) == 0
    out = capsys.readouterr().out
    assert re.search(r"34 m 8 s +1 +in (59 m \d+ s|1 h)$", out, re.MULTILINE), out
    assert "within" not in out
    # Not read: the level's bound, rounded up, and said to be one.
    assert main(["--url", rabbitmq_url, "status", "--queue", unique, "--no-peek", *topo]) == 0
    out = capsys.readouterr().out
    assert "within 1 h 9 m (level bound, not read)" in out
    # The peeks gave the message back: it still waits, where it was.
    assert main(["--url", rabbitmq_url, "status", "--queue", unique, "--json", *topo]) == 0
    again = [level for level in json.loads(capsys.readouterr().out)["chain"] if level["messages"]]
    assert [(w["level"], w["messages"]) for w in again] == [(11, 1)]


def test_publish_to_a_missing_queue_gives_command_line_advice(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = ["--prefix", unique, "--levels", "6"]
    assert main(["--url", rabbitmq_url, "declare", *topo]) == 0
    capsys.readouterr()
    code = main(
        ["--url", rabbitmq_url, "publish", "--queue", f"{unique}-x", "--delay", "50ms", *topo]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert f"queue '{unique}-x' does not exist" in err[0]
    assert f"delayed-retry declare --create --bind {unique}-x" in err[0]


def test_demo_runs_on_the_given_broker(
    rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", rabbitmq_url, "demo"]) == 0
    out = capsys.readouterr().out
    assert "order-2: done" in out and "2 message(s) parked" in out
    lines = out.splitlines()
    # It says at once where it runs and what each order will show, before any attempt.
    assert lines[0].endswith(
        f"the demo runs on the broker at {redact_url(rabbitmq_url)}, with names of its own"
    )
    first_attempt = next(i for i, line in enumerate(lines) if "attempt 1" in line)
    story = "\n".join(lines[:first_attempt])
    for order in ("order-1", "order-2", "order-3", "order-4", "order-5"):
        assert f"  {order}  " in story, order
    # Every line is the story's, the library's warnings included (no log format of its own).
    assert all(re.match(r"\[ *\d+\.\d\ds\] ", line) for line in lines if line[:1] != " "), out
    assert "delayed-retry warning: message order-4 on queue" in out
    # It ends with what to try next, then what it left on the user's broker and how to
    # remove all of it.
    after = "\n".join(lines[next(i for i, line in enumerate(lines) if line.endswith("next:")) :])
    assert "docs/getting-started.md" in after and "delayed-retry publish --queue" in after
    assert f"left on the broker to look at: queue {DEMO_QUEUE!r}" in after
    commands = [
        line.split(":", 1)[-1].strip() if ":" in line else line.strip() for line in lines[-3:]
    ]
    for command in commands[:2]:
        words = command.split()
        assert words[0] == "delayed-retry", command
        assert main(["--url", rabbitmq_url, *words[1:]]) == 0, command
    assert commands[2] == f"rabbitmqctl delete_queue -p / {DEMO_QUEUE}"
    asyncio.run(delete_all(rabbitmq_url, queues=[DEMO_QUEUE]))
    names = [spec.name for spec in DEMO_TOPOLOGY.queues()] + [f"{DEMO_QUEUE}.parking"]
    assert [name for name in names if asyncio.run(exists(rabbitmq_url, name))] == []


def test_bad_input_is_one_line_with_the_fix(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = rabbitmq_url.rstrip("/")
    cases = [
        ([f"{base}/novhost-{unique}"], 1, "refused to open virtual host"),
        (["garbage"], 2, "is not a URL"),
        (["http://localhost/"], 2, "is a http:// URL; the broker speaks AMQP"),
        (
            [base.replace("guest:guest", "guest:wrong") + "/"],
            1,
            "refused the user name or password",
        ),
        (["amqp://guest:guest@127.0.0.1:1/"], 1, "cannot reach the broker"),
    ]
    for url, code, text in cases:
        assert main(["--url", *url, "status"]) == code, url
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0], (url, err)
        assert "Traceback" not in err[0] and "wrong" not in err[0]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, text in [
        (["parking", "replay", "--queue", "q", "--delay", "soon"], "is not a duration"),
        (["parking", "replay", "--queue", "q", "--rate", "fast"], "write it like 100/s"),
        (["parking", "list", "--queue", "q", "--older-than=-1h"], "must not be negative"),
        (["parking", "list", "--queue", "q", "--older-than", "-1h"], "must not be negative"),
        (["parking", "list", "--queue", "q", "--limit", "-1"], "'-1' is not a whole number"),
        (["parking", "list", "--queue", "q", "--header", "novalue"], "is not name=value"),
        (["publish", "--queue", "q", "--at", "2026-12-01T09:00"], "has no timezone"),
        (["nonsense"], "invalid choice"),
    ]:
        assert main(argv) == 2, argv
        assert text in capsys.readouterr().err, argv
    assert main(["--help"]) == 0
    assert "2 the command line is wrong" in " ".join(capsys.readouterr().out.split())


def test_archive_refuses_a_work_queue_without_force(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    code = main(["archive", "--queue", "orders", "--to", str(tmp_path), "--max", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a parking queue" in err and "--force" in err


def test_publish_reads_the_body_from_stdin_and_the_message_arrives_when_due(
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asyncio.run(declare_queue(rabbitmq_url, unique))
    topo = ["--prefix", unique, "--levels", "10"]
    assert main(["--url", rabbitmq_url, "declare", *topo]) == 0
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\x00binary\xff")))
    argv = ["publish", "--queue", unique, "--delay", "200ms", "--body", "-", "--header", "k=v"]
    assert main(["--url", rabbitmq_url, *argv, "--json", *topo]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == 8
    message = asyncio.run(_get_one(rabbitmq_url, unique))
    assert message.body == b"\x00binary\xff" and message.headers["k"] == "v"


async def _get_one(url: str, name: str) -> aio_pika.abc.AbstractIncomingMessage:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, passive=True)
        async with asyncio.timeout(15):
            while True:
                message = await queue.get(fail=False, no_ack=True)
                if message is not None:
                    return message
                await asyncio.sleep(0.05)


def test_a_real_process_prints_one_line_and_no_library_logs(rabbitmq_url: str) -> None:
    # In-process tests share pytest's logging; a real process shows what users see.
    for url, code in [
        ("amqp://guest:guest@127.0.0.1:1/", 1),
        (rabbitmq_url.replace("guest:guest", "guest:wrong"), 1),
        (rabbitmq_url.rstrip("/") + "/novhost", 1),
    ]:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("delayed-retry")), "--url", url, "status"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == code, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("delayed-retry: error: "), lines
        assert done.stdout == ""
