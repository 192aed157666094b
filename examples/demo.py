"""delayed-retry demo: a consumer that fails, backs off through the chain, succeeds or parks.

Run it with ``scripts/demo`` (sets everything up), or from a checkout made ready by
``scripts/bootstrap``: ``.venv/bin/python examples/demo.py``. Without ``RABBITMQ_URL`` it
starts a throwaway RabbitMQ node (the repository's broker harness) and removes it at the end;
with it (``RABBITMQ_URL=amqp://guest:guest@localhost:5672/``) it runs on that broker and says
what it left there. An installed package runs the same demo on a broker of yours with
``delayed-retry --url URL demo``.
"""

import os
import sys

from delayed_retry.cli.demo import introduce, main
from harness import broker_url


def run() -> int:
    given = os.environ.get("RABBITMQ_URL")
    if given:
        return main(given)
    introduce(None)  # before the node's few seconds of start-up
    with broker_url() as url:
        return main(url, throwaway=True, introduced=True)


if __name__ == "__main__":
    sys.exit(run())
