"""What a web view serves and who may use it: a small frozen settings object.

Build one with :class:`WebSettings` and hand it to
:func:`delayed_retry.web.create_app`; the command line builds it from its
options.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.errors import ConfigurationError

__all__ = ["Credentials", "WebSettings", "default_audit_log", "parse_credentials"]

TOKEN_ENV = "DELAYED_RETRY_WEB_TOKEN"
"""Environment variable holding a bearer token the web view accepts."""


def default_audit_log(
    environ: Mapping[str, str] | None = None, *, home: Path | None = None
) -> Path:
    """Where ``delayed-retry web`` appends its audit log unless told: a per-user state file.

    ``$XDG_STATE_HOME/delayed-retry/audit.jsonl`` (the XDG base directory
    for state that should survive restarts), by default
    ``~/.local/state/delayed-retry/audit.jsonl``; never the current directory.
    """
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME", "")
    # The specification ignores a relative path here.
    base = Path(state) if state and Path(state).is_absolute() else None
    if base is None:
        base = (home or Path.home()) / ".local" / "state"
    return base / "delayed-retry" / "audit.jsonl"


@dataclass(frozen=True, kw_only=True, repr=False)
class Credentials:
    """Who may use the view: a user and password (HTTP Basic), a bearer token, or both.

    Compared in constant time. ``repr`` never shows the secrets.
    """

    user: str | None = None
    password: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if (self.user is None) != (self.password is None):
            raise ConfigurationError("web credentials need both a user and a password")
        if self.user is None and not self.token:
            raise ConfigurationError("web credentials need a user and password, or a token")
        if self.user is not None and (not self.user or ":" in self.user or not self.password):
            raise ConfigurationError(
                "web credentials: the user must be non-empty without ':' and the password "
                "non-empty; pass --auth USER:PASSWORD"
            )

    def __repr__(self) -> str:
        return (
            f"Credentials(user={self.user!r}, password=***, token={'***' if self.token else None})"
        )

    def check_basic(self, user: str, password: str) -> bool:
        """Whether ``user``/``password`` match, in constant time."""
        if self.user is None or self.password is None:
            return False
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return ok_user and ok_password

    def check_token(self, token: str) -> bool:
        """Whether ``token`` is the bearer token, in constant time."""
        if not self.token:
            return False
        return hmac.compare_digest(token.encode(), self.token.encode())


def parse_credentials(auth: str | None, *, token: str | None = None) -> Credentials | None:
    """``USER:PASSWORD`` (from ``--auth``) and/or a token into :class:`Credentials`."""
    if not auth and not token:
        return None
    user = password = None
    if auth:
        user, sep, password = auth.partition(":")
        if not sep:
            raise ConfigurationError(f"--auth {user[:20]!r}… has no ':'; pass --auth USER:PASSWORD")
    return Credentials(user=user, password=password, token=token or None)


@dataclass(frozen=True, kw_only=True)
class WebSettings:
    """How the web view runs.

    ``queues`` are the work queues whose parking lots it shows (their parking
    queues are ``<queue>.parking``); empty means: find them through the
    management API at ``management_url`` (default: the broker's host, by the
    rule of :func:`~delayed_retry.admin.management.management_url_for`).
    ``read_only`` hides and refuses every action.
    ``audit_log`` is a JSON-lines file every action is appended to (the
    ``delayed_retry.web.audit`` logger gets each entry too).
    """

    url: str = "amqp://guest:guest@127.0.0.1:5672/"
    queues: tuple[str, ...] = ()
    topology: DelayTopology = DEFAULT_TOPOLOGY
    credentials: Credentials | None = None
    read_only: bool = False
    audit_log: Path | None = None
    page_size: int = 25
    live_interval: float = 2.0
    scan_limit: int = 10_000
    management_url: str | None = None
    trusted_hosts: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= 500:
            raise ConfigurationError(f"page_size={self.page_size} must be within 1..500")
        if self.live_interval <= 0:
            raise ConfigurationError(f"live_interval={self.live_interval} must be positive")
        if self.scan_limit < 1:
            raise ConfigurationError(f"scan_limit={self.scan_limit} must be at least 1")
