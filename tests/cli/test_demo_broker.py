"""The demo without a broker: the command asks for one, the checkout's script starts one.

An installed wheel has no harness to start a throwaway node, so ``delayed-retry demo`` runs
only on a broker the user names, and says how to get one otherwise (``scripts/demo``). What
``scripts/demo`` runs, ``examples/demo.py``, starts a private node with the harness when no
``RABBITMQ_URL`` is given. The demo on a broker of the user's is in ``test_main_broker.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from delayed_retry.cli import main
from delayed_retry.cli.demo_cmd import NO_BROKER


def test_without_a_url_the_demo_starts_nothing_and_says_what_to_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RABBITMQ_URL", raising=False)
    assert main(["demo"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"delayed-retry: error: {NO_BROKER}\n"
    for advice in ("--url amqp://", "RABBITMQ_URL", "scripts/demo"):
        assert advice in err, advice


def test_a_url_that_names_no_broker_is_tried_and_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a URL, the demo connects there (and fails as any command does), never refuses.
    monkeypatch.delenv("RABBITMQ_URL", raising=False)
    assert main(["--url", "amqp://guest:guest@127.0.0.1:1/", "demo"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("delayed-retry: error: ") and "127.0.0.1:1" in err
    assert "scripts/demo" not in err


def test_the_command_works_where_the_harness_cannot_be_imported() -> None:
    # As in an installed wheel: importing the harness fails, the command line does not.
    script = (
        "import sys\n"
        "sys.modules['harness'] = None  # import harness raises ImportError\n"
        "import delayed_retry.cli.demo\n"
        "from delayed_retry.cli import main\n"
        "sys.exit(main(['demo']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RABBITMQ_URL"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr == f"delayed-retry: error: {NO_BROKER}\n"


@pytest.mark.broker
@pytest.mark.private_node
def test_the_checkouts_demo_starts_a_throwaway_node_of_its_own() -> None:
    demo = Path(__file__).resolve().parents[2] / "examples" / "demo.py"
    env = {k: v for k, v in os.environ.items() if k != "RABBITMQ_URL"}
    run = subprocess.run(
        [sys.executable, str(demo)], capture_output=True, text=True, env=env, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "order-2: done" in run.stdout and "2 message(s) parked" in run.stdout
    # Its first line comes before the node's seconds of start-up, and says what they are.
    lines = run.stdout.splitlines()
    assert "starting a throwaway RabbitMQ node for the demo" in lines[0]
    first = float(lines[0][1:].split("s]", 1)[0])
    next_stamped = next(line for line in lines[1:] if line.startswith("["))
    assert first < 1.0 and float(next_stamped[1:].split("s]", 1)[0]) >= first
    # The node goes away with everything on it: nothing to tell the user to remove.
    assert "left on the broker" not in run.stdout
