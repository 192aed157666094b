"""The management API client's rules: address, credentials, vhost quoting, errors.

Pure tests of the rules, and requests to a small HTTP server on loopback that
this module starts (no broker): it answers what each test tells it to.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme

from delayed_retry.admin import management
from delayed_retry.admin.management import (
    DEFAULT_TIMEOUT,
    ManagementClient,
    ManagementError,
    management_url_for,
)
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli.chain import bound_chains
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.rabbitmq.urls import vhost_of
from delayed_retry.web.discovery import discover_queues
from harness import free_port


@pytest.mark.parametrize(
    ("amqp_url", "api"),
    [
        ("amqp://guest:guest@rabbit:5672/", "http://guest:guest@rabbit:15672/"),
        ("amqp://u:p@rabbit:5673/vh", "http://u:p@rabbit:15672/"),  # the AMQP port says nothing
        ("amqps://u:p%40ss@mq.internal:5671/vh", "https://u:p%40ss@mq.internal:15671/"),
        ("amqps://mq.internal", "https://mq.internal:15671/"),
        ("amqp://[::1]:5672/", "http://[::1]:15672/"),
    ],
)
def test_the_default_address_is_rabbitmqs_port_for_the_scheme(amqp_url: str, api: str) -> None:
    assert management_url_for(amqp_url) == api


@pytest.mark.parametrize(
    ("url", "vhost"),
    [("amqp://h", "/"), ("amqp://h/", "/"), ("amqp://h/%2F", "/"), ("amqp://h/a%2Fb", "a/b")],
)
def test_the_vhost_comes_from_the_broker_url(url: str, vhost: str) -> None:
    assert vhost_of(url) == vhost
    assert ManagementClient.for_broker(url).vhost == vhost


def test_credentials_come_from_the_management_url_else_the_broker_url() -> None:
    broker = "amqps://app:s3cret@mq:5671/vh?cafile=/nonexistent/ca.pem"
    own = ManagementClient.for_broker(broker, management_url="http://ops:pw@mq:15672/")
    assert (own.user, own.url) == ("ops", "http://ops:***@mq:15672/")
    given = ManagementClient.for_broker(broker, management_url="http://mq:15672/")
    assert (given.user, given.url) == ("app", "http://app:***@mq:15672/")
    assert ManagementClient("http://mq:15672/").user == "guest"
    assert ManagementClient.for_broker("amqp://mq/").timeout == DEFAULT_TIMEOUT


def test_a_broker_urls_cafile_is_trusted_for_https() -> None:
    # It is loaded at once, so a wrong path shows before any request.
    with pytest.raises(ConfigurationError, match=r"cafile '/nonexistent/ca\.pem' cannot be read"):
        ManagementClient.for_broker("amqps://u:p@mq:5671/?cafile=/nonexistent/ca.pem")
    ManagementClient.for_broker("amqp://u:p@mq:5672/?cafile=/nonexistent/ca.pem")  # http


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("amqp://u:s3cret@mq:5672/", "is not an http:// or https:// URL"),
        ("http://u:s3cret@:15672/", "with a host"),
        ("http://u:s3cret@mq:port/", "is not a URL"),
    ],
)
def test_a_malformed_management_url_is_a_configuration_error(url: str, text: str) -> None:
    with pytest.raises(ConfigurationError, match=text) as caught:
        ManagementClient(url)
    assert "s3cret" not in str(caught.value) and "u:***@" in str(caught.value)
    assert "http://user:password@host:15672/" in str(caught.value)


# -- against a server on loopback ---------------------------------------------------
@dataclass
class Api:
    """A stand-in management API: ``answers`` maps a request path to (status, body)."""

    url: str
    answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    delay: float = 0.0


@contextmanager
def _serving(tls: ssl.SSLContext | None = None) -> Iterator[Api]:
    state = Api(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append((self.path, self.headers.get("Authorization")))
            if state.delay:
                time.sleep(state.delay)  # a server that answers too late
            status, body = state.answers.get(self.path, (404, b'{"error":"Object Not Found"}'))
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting: what the timeout test wants

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    scheme = "http" if tls is None else "https"
    state.url = f"{scheme}://admin:s3cret@127.0.0.1:{server.server_address[1]}/"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def api() -> Iterator[Api]:
    with _serving() as state:
        yield state


def _json(value: object) -> tuple[int, bytes]:
    return 200, json.dumps(value).encode()


async def test_names_are_quoted_whole_and_the_broker_credentials_sent(api: Api) -> None:
    path = "/api/queues/a%2Fb/q%20%231/bindings"
    api.answers[path] = _json(
        [
            {"source": "", "destination": "q #1", "destination_type": "queue", "routing_key": ""},
            {
                "source": "p.delivery-6",
                "destination": "q #1",
                "destination_type": "queue",
                "routing_key": "*.*.*.*.*.*.q #1",
                "arguments": {},
                "properties_key": "k",
            },
        ]
    )
    without_credentials = api.url.replace("admin:s3cret@", "")
    client = ManagementClient.for_broker(
        "amqp://app:pw@127.0.0.1:5672/a%2Fb", management_url=without_credentials
    )
    (binding,) = await client.queue_bindings("q #1")  # the default exchange's is left out
    assert (binding.source, binding.routing_key, binding.properties_key) == (
        "p.delivery-6",
        "*.*.*.*.*.*.q #1",
        "k",
    )
    assert api.requests == [(path, "Basic YXBwOnB3")]  # app:pw
    assert await bound_chains(client, "q #1") == [("p", 6)]


@pytest.mark.parametrize(
    ("status", "texts"),
    [
        (401, ["answered 401", "refused user 'admin'", "check the user and password"]),
        (403, ["answered 403", "'monitoring' tag", "set_user_tags admin monitoring"]),
        (404, ["answered 404", "no exchange 'orders' found in vhost '/'", "check the name"]),
        (500, ["answered 500", "see the broker's log"]),
    ],
)
async def test_an_error_answer_names_the_url_the_object_and_the_fix(
    api: Api, status: int, texts: list[str]
) -> None:
    api.answers["/api/exchanges/%2F/orders"] = (status, b"{}")
    client = ManagementClient(api.url)
    with pytest.raises(ManagementError) as caught:
        await client.exchange("orders")
    error = caught.value
    assert isinstance(error, DelayedRetryError) and error.status == status
    message = str(error)
    assert error.url == api.url.replace("s3cret", "***")
    assert message.startswith(f"the management API at {error.url} answered {status} ")
    assert "s3cret" not in message
    for text in texts:
        assert text in message


async def test_an_answer_that_is_not_json_is_not_the_management_api(api: Api) -> None:
    api.answers["/api/queues/%2F?columns=name"] = (200, b"<html>hello</html>")
    with pytest.raises(ManagementError, match="is not JSON: it is not the management API"):
        await ManagementClient(api.url).queue_names()


async def test_a_late_answer_times_out_naming_the_wait(api: Api) -> None:
    api.delay = 1.0
    client = ManagementClient(api.url, timeout=0.2)
    with pytest.raises(ManagementError, match=r"did not answer within 0\.2 s") as caught:
        await client.queue_names()
    assert caught.value.status is None


async def test_a_refused_connection_says_how_the_address_was_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()  # claimed, so nothing listens there
    given = ManagementClient(f"http://admin:s3cret@127.0.0.1:{port}/")
    with pytest.raises(ManagementError) as caught:
        await given.queue_names()
    message = str(caught.value)
    assert message.startswith(f"the management API at http://admin:***@127.0.0.1:{port}/ ")
    assert "cannot be reached" in message and "s3cret" not in message
    assert "rabbitmq-plugins enable rabbitmq_management" in message
    assert "--management-url" in message and "derived from the broker URL" not in message

    monkeypatch.setattr(management, "DEFAULT_HTTP_PORT", port)
    derived = ManagementClient.for_broker("amqp://admin:s3cret@127.0.0.1:5672/")
    with pytest.raises(ManagementError, match=rf"http on {port} for amqp://, https on 15671"):
        await derived.queue_names()


async def test_callers_that_can_do_without_the_api_catch_its_error(api: Api) -> None:
    client = ManagementClient(api.url)
    api.answers["/api/queues/%2F/orders/bindings"] = (500, b"{}")
    assert await bound_chains(client, "orders") is None  # the chain check is skipped

    api.answers["/api/queues/%2F?columns=name"] = (401, b"{}")
    broker = "amqp://admin:s3cret@127.0.0.1:5672/"
    with pytest.raises(ConfigurationError, match=r"answered 401.*work queues with --queue"):
        await discover_queues(broker, topology=DelayTopology(), management_url=api.url)


async def test_https_trusts_the_ca_the_broker_url_names(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    with _serving(tls=server) as api:
        api.answers["/api/queues/%2F?columns=name"] = _json([{"name": "orders.parking"}])
        broker = f"amqps://admin:s3cret@127.0.0.1:5671/?cafile={tmp_path / 'ca.pem'}"
        trusting = ManagementClient.for_broker(broker, management_url=api.url)
        assert await trusting.queue_names() == ["orders.parking"]

        system_cas_only = ManagementClient(api.url)
        with pytest.raises(ManagementError, match="CERTIFICATE_VERIFY_FAILED") as caught:
            await system_cas_only.queue_names()
        assert caught.value.url.startswith("https://admin:***@127.0.0.1:")
