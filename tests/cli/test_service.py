"""The service runner's refusals and endpoints, without a broker: ports, extras, logs."""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Iterator

import pytest

from delayed_retry.cli.json_logs import JsonFormatter
from delayed_retry.cli.main import main
from harness import free_port
from tests.support.services import get, start_command

SERVICES = ("front-door", "forwarder", "router", "alerts", "web")
NEEDS = {
    "front-door": ["--exchange", "x"],
    "forwarder": ["--exchange", "x"],
    "router": ["--queue", "q"],
    "alerts": [],
    "web": ["--queue", "q"],
}


@pytest.mark.parametrize("command", SERVICES)
def test_every_service_takes_the_service_options(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--health-port", "--metrics-port", "--log-format", "--stop-timeout"):
        assert option in text


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_port_that_is_not_a_port_is_a_usage_error(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["forwarder", "--exchange", "x", "--health-port", port]) == 2
    assert "is not a TCP port; use 1..65535" in capsys.readouterr().err


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("option", ["--health-port", "--metrics-port"])
def test_a_port_in_use_fails_before_connecting_naming_the_option(
    option: str, taken_port: int
) -> None:
    # Nothing listens on the broker port: the port check must come first.
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    proc = start_command(
        [
            *("--url", url, "forwarder", "--exchange", "x"),
            *("--service-host", "127.0.0.1", option, str(taken_port)),
        ]
    )
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, output
    assert f"{option} {taken_port}: cannot listen on 127.0.0.1:{taken_port}" in output
    assert f"choose another {option}" in output


def test_metrics_without_the_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A module set to None in sys.modules raises ImportError on import, as if not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.prometheus", None)
    code = main(["forwarder", "--exchange", "x", "--metrics-port", str(free_port())])
    assert code == 1
    err = capsys.readouterr().err
    assert "--metrics-port needs the 'service' extra" in err
    assert "pip install 'delayed-retry[service]'" in err


def test_an_unreachable_broker_at_start_exits_1_and_closes_the_ports() -> None:
    # A broker port where nothing listens: connecting fails after the ports are open,
    # and the command exits 1 with its usual one line.
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    port = free_port()
    proc = start_command(["--url", url, "forwarder", "--exchange", "x", "--health-port", str(port)])
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "cannot reach the broker" in output
    assert get(port, "/livez")[0] is None  # closed again on the way out


def test_json_log_lines_are_json() -> None:
    record = logging.LogRecord(
        "delayed_retry.x", logging.WARNING, __file__, 1, "a %s", ("b",), None
    )
    record.fields = {"queue": "q"}
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "warning" and line["message"] == "a b" and line["queue"] == "q"
    assert line["logger"] == "delayed_retry.x" and line["time"].endswith("+00:00")
