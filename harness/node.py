"""A private RabbitMQ node run from the system's scripts, for tests that break their broker."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from .chroot import VERSION_ENV, ensure_chroot, ensure_mounts
from .ports import free_port, listening, release_port
from .probe import BrokerHarnessError, check_connect

log = logging.getLogger(__name__)

RABBITMQ_BIN_DIR = Path("/usr/lib/rabbitmq/bin")
"""Where Debian's ``rabbitmq-server`` package keeps the scripts that run as the caller.

``/usr/sbin/rabbitmq-server`` would switch to the ``rabbitmq`` user, which cannot
write the caller's temporary folder.
"""

NODE_HOST = "localhost"
"""Host part of the node names; the short name the system broker uses too."""


@dataclass(frozen=True, kw_only=True)
class TLSFiles:
    """PEM files for a node's TLS listener (``trustme`` can make them for a test).

    ``cacertfile`` is the CA that signed ``certfile``; :attr:`RabbitMQNode.tls_url`
    passes it to the client so the server certificate verifies. Set
    ``verify_peer`` to make the node ask clients for a certificate too.
    """

    certfile: Path
    keyfile: Path
    cacertfile: Path
    verify_peer: bool = False


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, read from /proc (Linux only)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; fields follow the last ')'.
        fields = stat.rpartition(")")[2].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} is missing)"
    return "\n".join(text.splitlines()[-lines:])


class RabbitMQNode:
    """A private RabbitMQ node run from the system's scripts in a temporary folder.

    Use it when a test needs a broker it may break: kill, stop, restart,
    fill up, or configure (TLS, extra ``rabbitmq.conf`` lines). For a broker
    that tests merely share, use :func:`broker_url`, which may not start
    anything. The node listens on 127.0.0.1 on free ports, with only the
    ``guest`` user, no plugins unless ``plugins`` names some, and its own
    Erlang cookie (pass ``home`` to share one, as a cluster must).
    ``rabbit_env`` sets what ``rabbitmq.conf`` has no key for (the ``rabbit``
    section of ``advanced.config``), e.g.
    ``{"dead_letter_worker_publisher_confirm_timeout": 10_000}``. Processes
    and folder are removed on :meth:`close`, on leaving the ``with`` block, or
    at interpreter exit.

    The methods block for seconds; from async code call them through
    ``asyncio.to_thread`` so the clients under test keep running meanwhile.
    """

    def __init__(
        self,
        *,
        name: str | None = None,
        base_dir: Path | None = None,
        home: Path | None = None,
        amqp_port: int | None = None,
        dist_port: int | None = None,
        tls: TLSFiles | None = None,
        plugins: Sequence[str] = (),
        config: Mapping[str, str] | None = None,
        rabbit_env: Mapping[str, int] | None = None,
        start_timeout: float = 120.0,
        bin_dir: Path = RABBITMQ_BIN_DIR,
        version: str | None = None,
    ) -> None:
        self.name = name or f"drtest-{secrets_hex()}@{NODE_HOST}"
        self.version = version if version is not None else os.environ.get(VERSION_ENV) or None
        self.root: Path | None = None
        if self.version not in (None, "3.10"):
            if tls is not None:
                raise BrokerHarnessError(
                    f"a RabbitMQ {self.version} node runs in a chroot and takes no TLS files "
                    "from outside it; test TLS on the system's broker (version=None)"
                )
            self.root = ensure_chroot(str(self.version))
        self._owns_dir = base_dir is None
        self.base_dir = (
            Path(
                tempfile.mkdtemp(
                    prefix="drtest-rmq-", dir=None if self.root is None else self.root / "tmp"
                )
            )
            if base_dir is None
            else base_dir
        )
        self.home = home or self.base_dir / "home"
        self._ports_given = amqp_port is not None and dist_port is not None
        self._claimed: list[int] = []
        self.amqp_port = amqp_port or self._new_port()
        self.dist_port = dist_port or self._new_port()
        self.tls = tls
        self.tls_port = self._new_port() if tls is not None else None
        self.plugins = tuple(plugins)
        self.config = dict(config or {})
        self.rabbit_env = dict(rabbit_env or {})
        self.start_timeout = start_timeout
        self.bin_dir = bin_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._beam_pid: int | None = None
        self._started_once = False
        self.last_start_seconds: float | None = None
        _live_nodes.add(self)

    def _new_port(self) -> int:
        port = free_port()
        self._claimed.append(port)
        return port

    # --- addresses -------------------------------------------------------

    @property
    def url(self) -> str:
        """AMQP URL of this node for the ``guest`` user and the default vhost."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    @property
    def tls_url(self) -> str:
        """AMQPS URL (host ``localhost``, CA passed as ``cafile``); needs ``tls``."""
        if self.tls is None or self.tls_port is None:
            raise BrokerHarnessError(
                f"node {self.name} has no TLS listener; pass tls=TLSFiles(...)"
            )
        return f"amqps://guest:guest@localhost:{self.tls_port}/?cafile={self.tls.cacertfile}"

    @property
    def pid(self) -> int | None:
        """Pid of the ``rabbitmq-server`` script (leader of the node's process group)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def beam_pid(self) -> int | None:
        """Pid of the Erlang VM running the node, once started."""
        return self._beam_pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_file(self) -> Path:
        return self.base_dir / "log" / f"{self.name}.log"

    @property
    def console_file(self) -> Path:
        return self.base_dir / "console.log"

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the node's console output and log file, for error messages."""
        return (
            f"--- {self.console_file} ---\n{_tail(self.console_file, lines)}\n"
            f"--- {self.log_file} ---\n{_tail(self.log_file, lines)}"
        )

    # --- environment -----------------------------------------------------

    def _inner(self, path: Path) -> str:
        """``path`` as the node sees it: relative to its chroot, if it runs in one."""
        if self.root is None:
            return str(path)
        return "/" + str(path.relative_to(self.root))

    def _command(self, tool: str, *args: str) -> list[str]:
        if self.root is None:
            return [str(self.bin_dir / tool), *args]
        ensure_mounts(self.root)
        return ["chroot", str(self.root), str(self.bin_dir / tool), *args]

    def env(self) -> dict[str, str]:
        """Environment for this node's server and CLI tools."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RABBITMQ_", "ERL_")) and key != "NODENAME"
        }
        inner = self._inner
        env.update(
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_MNESIA_BASE=inner(self.base_dir / "mnesia"),
            RABBITMQ_LOG_BASE=inner(self.base_dir / "log"),
            RABBITMQ_CONFIG_FILE=inner(self.base_dir / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=inner(self.base_dir / "advanced.config"),
            # An empty env file: /etc/rabbitmq/rabbitmq-env.conf would rename the node.
            RABBITMQ_CONF_ENV_FILE=inner(self.base_dir / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=inner(self.base_dir / "enabled_plugins"),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            # No scheduler busy-waiting: several test nodes, a client and its tests share a
            # few cores, and idle schedulers that spin take CPU from all of them.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "-kernel inet_dist_use_interface {127,0,0,1} "
                "+sbwt none +sbwtdcpu none +sbwtdio none"
                + "".join(f" -rabbit {key} {value}" for key, value in self.rabbit_env.items())
            ),
            ERL_EPMD_ADDRESS="127.0.0.1",
            HOME=inner(self.home),
        )
        return env

    def _write_files(self) -> None:
        for folder in ("mnesia", "log"):
            (self.base_dir / folder).mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        if not cookie.exists():
            write_cookie(self.home)
        lines = {
            "listeners.tcp.default": f"127.0.0.1:{self.amqp_port}",
            "loopback_users": "none",
        }
        if self.tls is not None:
            lines |= {
                "listeners.ssl.default": f"127.0.0.1:{self.tls_port}",
                "ssl_options.cacertfile": str(self.tls.cacertfile),
                "ssl_options.certfile": str(self.tls.certfile),
                "ssl_options.keyfile": str(self.tls.keyfile),
                "ssl_options.verify": "verify_peer" if self.tls.verify_peer else "verify_none",
                "ssl_options.fail_if_no_peer_cert": "true" if self.tls.verify_peer else "false",
            }
        lines |= self.config
        conf = "".join(f"{key} = {value}\n" for key, value in lines.items())
        (self.base_dir / "rabbitmq.conf").write_text(conf)
        (self.base_dir / "rabbitmq-env.conf").write_text("")
        (self.base_dir / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")

    # --- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Start the node and return once a client can log in over AMQP.

        Raises :class:`BrokerHarnessError` with the tail of the node's log when
        it exits or is not ready within ``start_timeout`` seconds.
        """
        if self.running:
            return
        server = self.bin_dir / "rabbitmq-server"
        on_host = server if self.root is None else self.root / server.relative_to("/")
        if not on_host.exists():
            raise BrokerHarnessError(
                f"{server} is missing, so no test broker can be started; install it with "
                "`apt-get install rabbitmq-server` (scripts/bootstrap does), or set RABBITMQ_URL "
                "to a running broker"
            )
        for attempt in range(3):
            self._write_files()
            try:
                self._start_once(server)
                return
            except _PortTaken:
                # Another process took a port between choosing and binding it;
                # only a node that never ran may move to other ports.
                if self._started_once or self._ports_given or attempt == 2:
                    raise
                log.warning("port taken while starting %s; retrying on other ports", self.name)
                self.amqp_port, self.dist_port = self._new_port(), self._new_port()
                if self.tls is not None:
                    self.tls_port = self._new_port()

    def _start_once(self, server: Path) -> None:
        began = time.monotonic()
        with self.console_file.open("ab") as console:
            self._proc = subprocess.Popen(
                self._command(server.name),
                env=self.env(),
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: kill() reaches all of it
            )
        _live_nodes.add(self)
        log.info(
            "starting RabbitMQ node %s (pid %d) in %s", self.name, self._proc.pid, self.base_dir
        )
        try:
            self._wait_ready(began + self.start_timeout)
        except BaseException:
            self.kill()
            raise
        self._beam_pid = next(iter(_descendants(self._proc.pid)), None)
        self._started_once = True
        self.last_start_seconds = time.monotonic() - began
        log.info(
            "RabbitMQ node %s ready at %s in %.1f s", self.name, self.url, self.last_start_seconds
        )

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = self.log_tail()
                if "eaddrinuse" in tail:
                    raise _PortTaken(tail)
                raise BrokerHarnessError(
                    f"RabbitMQ node {self.name} exited with code {code} while starting "
                    f"(AMQP port {self.amqp_port}, dist port {self.dist_port}); "
                    f"its log ends:\n{tail}"
                )
            try:
                check_connect(self.url, timeout=5.0)
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise BrokerHarnessError(
                        f"RabbitMQ node {self.name} did not accept AMQP connections on port "
                        f"{self.amqp_port} within {self.start_timeout:.0f} s "
                        f"(last error: {exc!r}); its log ends:\n{self.log_tail()}"
                    ) from exc
            time.sleep(0.1)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the node gracefully (SIGTERM to its start script), killing it after ``timeout``.

        Data stays, so :meth:`start` brings back durable queues and messages.
        """
        if self._proc is None:
            return
        if self._proc.poll() is None:
            log.info("stopping RabbitMQ node %s", self.name)
            with contextlib.suppress(ProcessLookupError):
                # The script traps TERM and forwards it to the VM, which shuts down cleanly.
                os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("node %s ignored SIGTERM for %.0f s; killing it", self.name, timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the node's whole process tree at once, as a crash would.

        Quorum queues declared just before may not survive; see :meth:`flush_metadata`.
        The VM's helpers (``erl_child_setup`` and its children) live in their
        own sessions, so they are found through /proc and killed by pid. epmd
        is shared by every node on the machine and is left running.
        """
        proc = self._proc
        if proc is None:
            return
        pids = [proc.pid, *_descendants(proc.pid)]
        if proc.poll() is None:
            log.info("killing RabbitMQ node %s (pids %s)", self.name, pids)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids[1:]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        self._proc = None
        self._beam_pid = None
        # A killed process can show as exited while its sockets still accept
        # for some milliseconds; wait for the ports too, so a restart can bind them.
        ports = [port for port in (self.amqp_port, self.dist_port, self.tls_port) if port]
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in pids[1:]) or any(listening(port) for port in ports):
            if time.monotonic() > deadline:
                raise BrokerHarnessError(
                    f"RabbitMQ node {self.name} still runs or listens on {ports} 20 s after "
                    f"SIGKILL (pids {pids}); check for stuck processes with ps"
                )
            time.sleep(0.02)

    def flush_metadata(self) -> None:
        """Write the node's lazily saved metadata (Erlang dets tables) to disk now.

        Call it before :meth:`kill` when quorum queues were declared in the
        last few seconds. RabbitMQ 3.10 saves the quorum queue registry only
        0.5 s and Raft terms 5 s after a change; a node killed sooner brings
        such a queue back empty and without a leader, and it never elects one.
        """
        self.rabbitmqctl("eval", "[dets:sync(Table) || Table <- dets:all()], ok.")

    def restart(self) -> None:
        """Stop the node if it runs, then start it with the same data folder and ports."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Kill the node and delete its folder; safe to call twice."""
        try:
            self.kill()
        except BrokerHarnessError as exc:
            log.warning("closing %s: %s", self.name, exc)
        _live_nodes.discard(self)
        for port in self._claimed:
            release_port(port)
        self._claimed = []
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<RabbitMQNode {self.name} {state} amqp={self.amqp_port} dist={self.dist_port}>"

    # --- CLI -------------------------------------------------------------

    def cli(self, tool: str, *args: str, timeout: float = 120.0) -> str:
        """Run a RabbitMQ CLI tool (``rabbitmq-queues``, ``rabbitmq-diagnostics``...) on this node.

        Returns its standard output; raises :class:`BrokerHarnessError` when it fails.
        """
        command = self._command(tool, "-n", self.name, *args)
        result = subprocess.run(
            command, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise BrokerHarnessError(
                f"`{' '.join(command)}` failed with code {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result.stdout

    def rabbitmqctl(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``rabbitmqctl -n NODE ARGS`` with this node's cookie; return its output."""
        return self.cli("rabbitmqctl", *args, timeout=timeout)


class _PortTaken(BrokerHarnessError):
    pass


def secrets_hex(nbytes: int = 4) -> str:
    """A short random hex string for node, queue and folder names."""
    return os.urandom(nbytes).hex()


def write_cookie(home: Path) -> None:
    """Write a fresh Erlang cookie into ``home``; nodes sharing ``home`` can cluster."""
    home.mkdir(parents=True, exist_ok=True)
    cookie = home / ".erlang.cookie"
    cookie.write_text(secrets_hex(16).upper())
    cookie.chmod(0o400)


_live_nodes: set[RabbitMQNode] = set()


@atexit.register
def _close_live_nodes() -> None:
    for node in list(_live_nodes):
        with contextlib.suppress(Exception):
            node.close()
