"""A Spark standalone cluster on loopback: one master and workers, each a JVM of its own.

Started from PySpark's own launcher (``pyspark/bin/spark-class``), so it needs nothing but
the ``spark`` extra and Java. Use it for tests that must run the Spark jobs as a cluster
runs them: executors in JVMs of their own, Python workers started by them, a work folder per
worker. Every JVM it starts is stopped by its process id (:meth:`SparkStandalone.stop`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from harness import free_port, release_port

__all__ = ["SparkStandalone", "SparkStandaloneError", "spark_class"]

START_TIMEOUT = 90.0
"""How long the master and its workers get to start and register (a loaded 2-core machine)."""

DAEMON_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The master and workers only place executors: a JVM made for a short run is enough."""


class SparkStandaloneError(RuntimeError):
    """The cluster did not start; the message holds the tail of the JVM's log."""


def spark_class() -> Path:
    """PySpark's ``spark-class`` launcher (the distribution inside the pyspark package)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    ports: tuple[int, ...]

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return f"({self.log} is missing)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class SparkStandalone:
    """A master and ``workers`` workers of ``cores`` cores each, under ``folder``.

    ``start()`` returns once every worker registered with the master;
    ``stop()`` stops the workers' executors, the workers and the master,
    each by its process id. :attr:`url` is the ``--master`` to pass.
    """

    folder: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    _master: _Daemon | None = None
    _workers: list[_Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``spark://127.0.0.1:PORT``: the master to pass as ``--master``."""
        if self._master is None:
            raise SparkStandaloneError("the Spark standalone cluster is not started; call start()")
        return f"spark://127.0.0.1:{self._master.ports[0]}"

    def start(self) -> None:
        """Start the master, then the workers, and wait until every worker is registered."""
        port, web = free_port(), free_port()
        self._master = self._launch(
            "master",
            ["org.apache.spark.deploy.master.Master"],
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web)],
            (port, web),
        )
        for index in range(self.workers):
            work = self.folder / f"worker-{index}"
            work.mkdir(parents=True, exist_ok=True)
            wport, wweb = free_port(), free_port()
            self._workers.append(
                self._launch(
                    f"worker-{index}",
                    ["org.apache.spark.deploy.worker.Worker", self.url],
                    [
                        *("--host", "127.0.0.1", "--port", str(wport)),
                        *("--webui-port", str(wweb), "--cores", str(self.cores)),
                        *("--memory", self.memory, "--work-dir", str(work)),
                    ],
                    (wport, wweb),
                )
            )
        self._wait_for_workers()

    def _launch(
        self, name: str, main: list[str], args: list[str], ports: tuple[int, ...]
    ) -> _Daemon:
        log = self.folder / f"{name}.log"
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTIONS,
            # Each daemon's own state (and Spark's pid and log folders) stays in the test's folder.
            "SPARK_LOG_DIR": str(self.folder),
            "SPARK_PID_DIR": str(self.folder),
            "SPARK_WORKER_DIR": str(self.folder),
        }
        with open(log, "wb") as out:
            # spark-class execs the JVM: the pid is the daemon's JVM itself.
            process = subprocess.Popen(
                [str(spark_class()), *main, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        return _Daemon(name, process, log, ports)

    def _wait_for_workers(self) -> None:
        assert self._master is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for daemon in (self._master, *self._workers):
                if daemon.process.poll() is not None:
                    raise SparkStandaloneError(
                        f"Spark {daemon.name} exited with {daemon.process.returncode}; "
                        f"its log ({daemon.log}) ends:\n{daemon.tail()}"
                    )
            if self.alive_workers() >= self.workers:
                return
            time.sleep(0.2)
        raise SparkStandaloneError(
            f"only {self.alive_workers()} of {self.workers} Spark workers registered with "
            f"{self.url} within {START_TIMEOUT:.0f} s; the master's log ends:\n"
            f"{self._master.tail()}"
        )

    def status(self) -> dict[str, object]:
        """The master's JSON status (workers, applications), from its web UI."""
        assert self._master is not None
        address = f"http://127.0.0.1:{self._master.ports[1]}/json/"
        with urllib.request.urlopen(address, timeout=5) as response:
            status: dict[str, object] = json.load(response)
            return status

    def alive_workers(self) -> int:
        """How many workers the master knows as alive (0 while its web UI is not up)."""
        try:
            workers = self.status().get("workers", [])
        except (OSError, ValueError):  # not listening yet, or an answer cut short
            return 0
        assert isinstance(workers, list)
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def executor_pids(self) -> dict[int, list[int]]:
        """The executor JVMs running now, by worker index: the workers' child processes."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat.rpartition(")")[2].split()
                if fields[0] == "Z":
                    continue
                command = (entry / "cmdline").read_bytes()
                if b"CoarseGrainedExecutorBackend" in command:
                    children.setdefault(int(fields[1]), []).append(int(entry.name))
        return {
            index: children.get(worker.process.pid, [])
            for index, worker in enumerate(self._workers)
        }

    def executor_logs(self, worker: int) -> list[Path]:
        """The stderr files of the executors worker ``worker`` ran, every application's."""
        return sorted((self.folder / f"worker-{worker}").glob("app-*/*/stderr"))

    def stop(self) -> None:
        """Stop every executor, worker and the master, by process id; give the ports back."""
        executors = [pid for pids in self.executor_pids().values() for pid in pids]
        for daemon in self._workers:
            _stop(daemon.process)
        for pid in executors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._master is not None:
            _stop(self._master.process)
        for daemon in (*self._workers, *([self._master] if self._master else [])):
            for port in daemon.ports:
                release_port(port)
        self._workers = []
        self._master = None

    def logs(self) -> str:
        """The end of every daemon's log: what to print when a test on the cluster fails."""
        daemons: list[_Daemon] = [*([self._master] if self._master else []), *self._workers]
        return "\n".join(f"--- {d.name} ({d.log})\n{d.tail()}" for d in daemons)


def _stop(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
