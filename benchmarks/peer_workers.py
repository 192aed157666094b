"""Consumers that retry with exponential backoff, one per peer, each run as its own process.

Every subject consumes one queue with a handler that fails while the message's
attempt number (as the peer itself counts it) is below ``--fail``, then
succeeds; the backoff before retry ``r`` (0-based) is ``base * 2**r`` seconds.
Run as a process (``python peer_workers.py SUBJECT ...``) so a benchmark can
``kill -9`` it and start it again; the parent sends the messages with
:func:`send`, which uses the same peer's own API.

The worker appends one line per event to ``--log`` (``O_APPEND``, one
``write`` per line, so nothing written is lost when the process is killed)::

    ready - 0 <epoch seconds>
    try <id> <attempt> <epoch seconds>     the handler was called
    ok <id> <attempt> <epoch seconds>      the handler succeeded
    closed - 0 <epoch seconds> <reason>    the broker closed a channel (aio-pika subjects)

Subjects:

* ``delayed-retry``: ``@with_delayed_retry`` (tenacity ``wait_exponential``),
  the delays in the library's quorum TTL chain.
* ``sleep``: hand-rolled aio-pika: ``asyncio.sleep(backoff)`` holding the
  delivery, then publish a confirmed copy with the attempt in a header, ack.
* ``ttl-queue``: hand-rolled aio-pika: one classic queue per delay value with
  ``x-message-ttl`` dead-lettering back to the work queue; publish a confirmed
  copy there, ack.
* ``celery-classic``: Celery ``autoretry_for`` + ``retry_backoff``, classic
  queue on a direct exchange: the retry's ETA is held in the worker.
* ``celery-quorum``: the same on a quorum queue bound to a topic exchange:
  Celery sends the retry through Kombu's native delayed delivery ladder
  (``celery_delayed_27`` … ``0``, whole seconds) and the worker holds only the
  last fraction of a second.
* ``dramatiq``: Dramatiq's ``Retries`` middleware with its RabbitMQ broker:
  the retry waits in the ``.DQ`` queue, whose consumer holds it until due.
* ``plain`` (a baseline, never fails): an aio-pika consumer that acks.

Concurrency alike where a peer lets one choose: aio-pika prefetch 100, Celery's
threads pool with 8 threads (prefetch 4 per thread, Celery's default
multiplier), Dramatiq's worker with 8 threads. Celery publishes its retries
with confirms (``confirm_publish``), as every other subject does; its tasks
keep Celery's default early ack (``acks_late=False``).

Backoffs as each peer can express them: Celery's ``retry_backoff`` factor is
``int(max(1.0, retry_backoff))`` seconds, so its smallest base is 1 s and the
base must be whole seconds; Dramatiq jitters every backoff (uniform in the
upper half of ``min_backoff * 2**retries``), so it waits 50–100 % of the
schedule here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

SUBJECTS = ("delayed-retry", "sleep", "ttl-queue", "celery-classic", "celery-quorum", "dramatiq")
ATTEMPT = "x-bench-attempt"
PREFETCH = 100


class Boom(Exception):
    """The failure every subject's handler raises while it should still fail."""


@dataclass(frozen=True, kw_only=True)
class Job:
    """What one worker process does: which peer, where, and how it fails."""

    subject: str
    url: str
    queue: str
    fail: int
    base: float
    prefix: str = "bench-storm"


class EventLog:
    """Append-only event lines, safe across threads and across ``kill -9``."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, ident: object = "-", attempt: int = 0, extra: str = "") -> None:
        line = f"{kind} {ident} {attempt} {time.time():.6f}"
        if extra:
            line += " " + extra.replace("\n", " ")
        os.write(self._fd, (line + "\n").encode())


@dataclass(frozen=True)
class Event:
    kind: str
    ident: str
    attempt: int
    at: float
    extra: str


def read_events(path: str) -> list[Event]:
    """The events a worker (or several runs of it) wrote to ``path``."""
    events = []
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        parts = line.split(" ", 4)
        try:
            events.append(
                Event(parts[0], parts[1], int(parts[2]), float(parts[3]), "".join(parts[4:]))
            )
        except (IndexError, ValueError):
            continue  # a line cut short by kill -9
    return events


# --- aio-pika subjects ---------------------------------------------------


async def _aio_pika(job: Job, log: EventLog) -> None:
    import aio_pika
    from aio_pika.abc import AbstractIncomingMessage

    connection = await aio_pika.connect_robust(job.url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=PREFETCH)

    def on_close(_: object, reason: BaseException | None) -> None:
        log.write("closed", extra=repr(reason))
        print(f"channel closed: {reason!r}", file=sys.stderr, flush=True)

    channel.close_callbacks.add(on_close)
    queue = await channel.declare_queue(job.queue, durable=True)

    if job.subject == "delayed-retry":
        from tenacity import wait_exponential

        from delayed_retry import DelayTopology, consume, current_retry_state, with_delayed_retry

        @with_delayed_retry(
            wait=wait_exponential(multiplier=job.base, max=86_400),
            max_retries=job.fail + 5,
            topology=DelayTopology(prefix=job.prefix),
        )
        async def handler(message: AbstractIncomingMessage) -> None:
            state = current_retry_state()
            attempt = state.attempt - 1 if state is not None else 0
            log.write("try", message.message_id, attempt)
            if attempt < job.fail:
                raise Boom(message.message_id)
            log.write("ok", message.message_id, attempt)

        await consume(queue, handler)
    else:
        declared: set[str] = set()

        async def retry_copy(message: AbstractIncomingMessage, attempt: int) -> None:
            backoff = job.base * 2**attempt
            copy = aio_pika.Message(
                message.body,
                headers={ATTEMPT: attempt + 1},
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            if job.subject == "sleep":
                await asyncio.sleep(backoff)
                await channel.default_exchange.publish(copy, routing_key=job.queue)
                return
            delay_ms = round(backoff * 1000)
            name = f"{job.queue}.delay.{delay_ms}"
            if name not in declared:
                await channel.declare_queue(
                    name,
                    durable=True,
                    arguments={
                        "x-message-ttl": delay_ms,
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": job.queue,
                    },
                )
                declared.add(name)
            await channel.default_exchange.publish(copy, routing_key=name)

        async def plain_handler(message: AbstractIncomingMessage) -> None:
            value = message.headers.get(ATTEMPT, 0)
            attempt = value if isinstance(value, int) else 0
            log.write("try", message.message_id, attempt)
            if attempt < job.fail:
                await retry_copy(message, attempt)
                await message.ack()
                return
            log.write("ok", message.message_id, attempt)
            await message.ack()

        await queue.consume(plain_handler)
    log.write("ready")
    await asyncio.Event().wait()


# --- Celery --------------------------------------------------------------


def celery_app(job: Job, log: EventLog | None) -> Any:
    """The Celery app of a Celery subject, for the worker and for the sender alike."""
    from celery import Celery
    from kombu import Exchange, Queue  # type: ignore[attr-defined]

    app = Celery("bench", broker=job.url, set_as_current=False)
    if job.subject == "celery-quorum":
        queue = Queue(  # type: ignore[no-untyped-call]
            job.queue,
            Exchange(job.queue, type="topic"),  # type: ignore[no-untyped-call]
            routing_key=job.queue,
            queue_arguments={"x-queue-type": "quorum"},
        )
    else:
        direct = Exchange(job.queue, type="direct")  # type: ignore[no-untyped-call]
        queue = Queue(job.queue, direct, routing_key=job.queue)  # type: ignore[no-untyped-call]
    app.conf.update(
        task_queues=[queue],
        task_default_queue=job.queue,
        task_ignore_result=True,
        worker_detect_quorum_queues=True,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_heartbeat=0,
        # Celery sends a retry without waiting for a confirm unless told to.
        broker_transport_options={"confirm_publish": True},
    )
    fail = job.fail

    @app.task(  # type: ignore[misc,untyped-decorator,unused-ignore]
        name="bench.storm",
        bind=True,
        autoretry_for=(Boom,),
        retry_backoff=max(1, round(job.base)),
        retry_backoff_max=86_400,
        retry_jitter=False,
        max_retries=fail + 5,
    )
    def storm(self: Any, ident: str) -> None:
        attempt = int(self.request.retries)
        if log is not None:
            log.write("try", ident, attempt)
        if attempt < fail:
            raise Boom(ident)
        if log is not None:
            log.write("ok", ident, attempt)

    app.bench_task = storm
    return app


def _celery(job: Job, log: EventLog) -> None:
    from celery.signals import worker_ready

    app = celery_app(job, log)

    @worker_ready.connect  # type: ignore[misc,untyped-decorator,unused-ignore]
    def ready(**_: Any) -> None:
        log.write("ready")

    app.worker_main(
        [
            "worker",
            "--pool=threads",
            "--concurrency=8",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            job.queue,
        ]
    )


# --- Dramatiq ------------------------------------------------------------


def dramatiq_actor(job: Job, log: EventLog | None) -> Any:
    """Broker and actor of the Dramatiq subject, for the worker and the sender alike."""
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.middleware import CurrentMessage, Retries

    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
    broker = RabbitmqBroker(url=job.url)
    for middleware in list(broker.middleware):
        if isinstance(middleware, Retries):
            broker.middleware.remove(middleware)
    # Retry r (1-based) waits uniform(0.5, 1) * min_backoff * 2**r ms: with min_backoff
    # = base/2 the longest wait is the schedule's base * 2**(r-1).
    broker.add_middleware(
        Retries(
            min_backoff=max(1, round(job.base * 500)),
            max_backoff=86_400_000,
            max_retries=job.fail + 5,
        )
    )
    broker.add_middleware(CurrentMessage())
    fail = job.fail

    def storm(ident: str) -> None:
        message = CurrentMessage.get_current_message()
        attempt = int(message.options.get("retries", 0)) if message is not None else 0
        if log is not None:
            log.write("try", ident, attempt)
        if attempt < fail:
            raise Boom(ident)
        if log is not None:
            log.write("ok", ident, attempt)

    return dramatiq.actor(broker=broker, queue_name=job.queue, actor_name="bench_storm")(storm)


def _dramatiq(job: Job, log: EventLog) -> None:
    import dramatiq

    actor = dramatiq_actor(job, log)
    worker = dramatiq.Worker(actor.broker, queues={job.queue}, worker_threads=8)
    worker.start()
    log.write("ready")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    worker.stop()


# --- sending, from the parent ---------------------------------------------


def send(
    job: Job, idents: list[str], *, due: Callable[[int], datetime | None] | None = None
) -> dict[str, str]:
    """Send one message per id through the subject's own API (blocking).

    ``due(i)`` gives an optional due time for message ``i`` (precision runs):
    Celery's ``eta=``, Dramatiq's ``delay=``; ``None`` sends at once. Returns
    the ids the peer refused to send, with the error it raised.
    """
    refused: dict[str, str] = {}
    if job.subject.startswith("celery"):
        app = celery_app(job, None)
        with app.producer_or_acquire() as producer:
            for i, ident in enumerate(idents):
                eta = due(i) if due is not None else None
                try:
                    app.bench_task.apply_async(args=(ident,), eta=eta, producer=producer)
                except ValueError as error:
                    # Celery 5.7 on a quorum queue: an ETA under 1 s ahead makes
                    # int(countdown) == 0, which Kombu's calculate_routing_key refuses.
                    refused[ident] = repr(error)
        app.close()
        return refused
    if job.subject == "dramatiq":
        actor = dramatiq_actor(job, None)
        for i, ident in enumerate(idents):
            eta = due(i) if due is not None else None
            delay = None
            if eta is not None:
                delay = max(0, round((eta.timestamp() - time.time()) * 1000))
            actor.send_with_options(args=(ident,), delay=delay)
        actor.broker.close()
        return refused
    asyncio.run(_send_aio_pika(job, idents))
    return refused


async def _send_aio_pika(job: Job, idents: list[str]) -> None:
    import aio_pika

    connection = await aio_pika.connect(job.url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(job.queue, durable=True)
        pending = []
        for ident in idents:
            message = aio_pika.Message(
                ident.encode(), message_id=ident, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            pending.append(channel.default_exchange.publish(message, routing_key=job.queue))
            if len(pending) == 500:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)


# --- the worker process --------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("subject", choices=(*SUBJECTS, "plain"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail", type=int, default=0, help="failures before success")
    parser.add_argument("--base", type=float, default=1.0, help="first backoff, seconds")
    parser.add_argument("--prefix", default="bench-storm", help="delayed-retry topology prefix")
    args = parser.parse_args(argv)
    job = Job(
        subject=args.subject,
        url=args.url,
        queue=args.queue,
        fail=0 if args.subject == "plain" else args.fail,
        base=args.base,
        prefix=args.prefix,
    )
    log = EventLog(args.log)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if job.subject.startswith("celery"):
        _celery(job, log)
    elif job.subject == "dramatiq":
        _dramatiq(job, log)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_aio_pika(job, log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
