"""What the JVM prints while Spark starts: quiet unless the user asked for ``-v``.

A new JVM announces its log4j profile, warns about the host name, native
Hadoop libraries and incubator modules, all on stderr, before
``setLogLevel`` can act. Two things keep that off the terminal: a log4j2
configuration given to the driver JVM (errors only, warnings too when
verbose), and a filter on the JVM's stderr that drops the few lines the JVM
writes outside log4j (:func:`is_startup_noise`) and passes every other line on.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["filtered_jvm_stderr", "is_startup_noise", "log4j2_java_option"]

_LOG4J2 = """\
# Written by delayed-retry: Spark's log output on stderr, {level} and above.
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""

_NOISE = re.compile(
    r"^(WARNING: Using incubator modules"
    r"|Using Spark's default log4j profile"
    r"|Setting default log level to"
    r"|To adjust logging level use sc\.setLogLevel"
    r"|\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO|DEBUG|TRACE) )"
)


def is_startup_noise(line: str) -> bool:
    """True for a JVM stderr line that only says how Spark started (not an error)."""
    return bool(_NOISE.match(line))


def log4j2_java_option(*, verbose: bool) -> str:
    """``-Dlog4j2.configurationFile=…`` for the driver JVM: errors only, or warnings too."""
    level = "warn" if verbose else "error"
    folder = os.path.join(tempfile.gettempdir(), f"delayed-retry-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"log4j2-{level}.properties")
    text = _LOG4J2.format(level=level)
    # Written under a temporary name and renamed: another process may be reading it.
    handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(temporary, path)
    return f"-Dlog4j2.configurationFile=file:{path}"


@contextmanager
def filtered_jvm_stderr(*, verbose: bool) -> Iterator[None]:
    """Run the block (which starts the JVM) with stderr through a filter the JVM keeps.

    The JVM inherits file descriptor 2 when it starts; here that is a pipe.
    A daemon thread passes each line it reads to the real stderr, except
    start-up noise when not ``verbose``. Python's own stderr is restored when
    the block ends; the JVM keeps writing into the pipe for its whole life,
    so its later errors still reach the terminal.
    """
    if verbose:
        yield
        return
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(
        target=_forward, args=(read_end, saved), name="jvm-stderr", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        # The JVM holds its own copy of the pipe; the thread ends when the JVM does.
        os.dup2(saved, 2)


def _forward(read_end: int, target: int) -> None:
    with os.fdopen(read_end, "rb") as source:
        for raw in source:
            if not is_startup_noise(raw.decode(errors="replace")):
                os.write(target, raw)
