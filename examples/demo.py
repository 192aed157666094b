"""delayed-retry demo: a consumer that fails, backs off through the chain, succeeds or parks.

Run it with ``scripts/demo`` (sets everything up), ``delayed-retry demo``, or with a broker of
your own: ``RABBITMQ_URL=amqp://guest:guest@localhost:5672/ python examples/demo.py``.
Without ``RABBITMQ_URL`` it starts a throwaway RabbitMQ node and removes it at the end.
"""

import sys

from delayed_retry.cli.demo import main

if __name__ == "__main__":
    sys.exit(main())
