"""What happens to the filter while it runs, counted in memory for the layer above to read.

The engine counts events and sets values on a :class:`FilterEvents` (each the stat
``bloomfilter/<name>``); nothing is pushed: the Scrapy layer copies them into the crawl's
stats on its own timer, from the reactor thread, so that a stats store that fails or is
not thread-safe is never called from the executor's retries, a lease's thread or
``request_seen``. :class:`RateLimitedLog` says repeating warnings; no log call of the
package raises, whichever handler fails (:class:`GuardedLogger`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from typing import Any


class FilterEvents:
    """Counts and values of what happened to one filter: thread-safe, never calling out."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        """Count ``n`` events of kind ``name``."""
        if n:
            with self._lock:
                self.counts[name] += n

    def set(self, name: str, value: Any) -> None:
        """Set the value ``name`` (the latest wins)."""
        with self._lock:
            self.values[name] = value

    def read(self) -> tuple[dict[str, int], dict[str, Any]]:
        """Return a copy of the counts since the start, and of the values, taken together."""
        with self._lock:
            return dict(self.counts), dict(self.values)


class RateLimitedLog:
    """Log a message at most once per ``interval`` seconds per topic, counting the rest.

    A fault that hits every request is said while it lasts without a line per request: the
    first occurrence, then one line per interval saying how many more there were.
    """

    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def log(self, level: int, topic: str, message: str, *args: object) -> None:
        """Log ``message % args`` unless ``topic`` was logged less than ``interval`` ago."""
        now = time.monotonic()
        last = self._last.get(topic)
        if last is not None and now - last < self.interval:
            self._suppressed[topic] += 1
            return
        self._last[topic] = now
        skipped = self._suppressed.pop(topic, 0)
        if skipped:
            message += " (%d more like this since the last such message)"
            args = (*args, skipped)
        emit(self.logger, level, message, *args, stacklevel=2)


# -- log calls that never raise --------------------------------------------------------------
#
# A log handler may fail (Scrapy's ``LogCounterHandler``, on the root logger, counts every
# record into the crawl's stats, which may live in a Redis that is down), and through
# :mod:`logging` the first that fails raises into the code that logs and cuts the record off
# from the handlers after it. So the package's records go to each handler in turn; a failing
# one stops neither the others nor the caller: the record is counted (:func:`handler_failures`,
# ``bloomfilter/log_failed``) and the failure said, at most once a minute per kind of handler.

#: The package's loggers: this one and those below it (:func:`guard_loggers`).
PACKAGE_LOGGER = __name__.partition(".")[0]
#: Seconds between two lines saying that a kind of log handler fails.
HANDLER_FAILURE_INTERVAL = 60.0
_failures_lock = threading.Lock()
_failures = 0
_handler_failures_said: dict[str, float] = {}


class GuardedLogger(logging.Logger):
    """A logger whose records reach every handler, whichever fails; never raising for one."""

    def callHandlers(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        """Hand ``record`` to each handler in turn; count and say those that fail."""
        _dispatch(self, record)


def guard_loggers(prefix: str = PACKAGE_LOGGER) -> None:
    """Make the package's loggers made so far (``prefix`` and below) :class:`GuardedLogger`.

    Called at import and again when a filter or a command starts, for modules imported
    since. A logger of another class (a program's ``setLoggerClass``) is left as it is.
    """
    logging.getLogger(prefix)
    for name, found in list(logging.Logger.manager.loggerDict.items()):
        if (name == prefix or name.startswith(prefix + ".")) and type(found) is logging.Logger:
            found.__class__ = GuardedLogger


def handler_failures() -> int:
    """Return how many of this process's records (the package's) a log handler failed."""
    return _failures


def emit(
    logger: logging.Logger,
    level: int,
    message: str,
    *args: object,
    exc_info: Any = None,
    stacklevel: int = 1,
) -> bool:
    """Log ``message % args`` to every handler, never raising; return whether all took it.

    As a :class:`GuardedLogger` logs, for any logger; ``stacklevel`` 1 is the caller's.
    """
    if not logger.isEnabledFor(level):
        return True
    try:
        path, line, function, _ = logger.findCaller(False, stacklevel + 1)
    except ValueError:  # no frame to name
        path, line, function = "(unknown file)", 0, "(unknown function)"
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    elif exc_info and not isinstance(exc_info, tuple):
        exc_info = sys.exc_info()
    record = logger.makeRecord(
        logger.name, level, path, line, message, args, exc_info or None, function
    )
    if not logger.filter(record):
        return True
    return _dispatch(logger, record)


def _dispatch(logger: logging.Logger, record: logging.LogRecord) -> bool:
    """Hand ``record`` to the handlers; count and say a failure. Whether all took it."""
    global _failures
    failed = _deliver(logger, record, skip=())
    if not failed:
        return True
    with _failures_lock:
        _failures += 1
    _say_failures(logger, record, failed)
    return False


def _handlers(logger: logging.Logger) -> list[logging.Handler]:
    """Return the handlers a record of ``logger`` reaches, in the order logging calls them."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += current.handlers
        current = current.parent if current.propagate else None
    return found


def _deliver(
    logger: logging.Logger, record: logging.LogRecord, skip: tuple[logging.Handler, ...]
) -> list[tuple[logging.Handler, Exception]]:
    """Hand ``record`` to each handler (but ``skip``); return those that raised, and why."""
    handlers = _handlers(logger)
    if not handlers:  # as logging does: the last resort, to stderr
        handlers = [logging.lastResort] if logging.lastResort is not None else []
    failed = []
    for handler in handlers:
        if handler in skip or record.levelno < handler.level:
            continue
        try:
            handler.handle(record)
        except Exception as exc:
            failed.append((handler, exc))
    return failed


def _say_failures(
    logger: logging.Logger,
    record: logging.LogRecord,
    failed: list[tuple[logging.Handler, Exception]],
) -> None:
    """Say, to the handlers that took ``record``, which handlers failed it and why.

    Once a minute per kind of handler (a stats store that is down fails every record); a
    handler failing this line too is not said again.
    """
    now = time.monotonic()
    kinds = []
    with _failures_lock:
        for handler, exc in failed:
            kind = type(handler).__qualname__
            last = _handler_failures_said.get(kind)
            if last is None or now - last >= HANDLER_FAILURE_INTERVAL:
                _handler_failures_said[kind] = now
                kinds.append(f"{kind} ({type(exc).__name__}: {exc})")
    if not kinds:
        return
    said = logger.makeRecord(
        logger.name,
        logging.WARNING,
        record.pathname,
        record.lineno,
        "A log handler failed to take a record (%s); the other handlers got it. Said at"
        " most once a minute per kind of handler; every record missed is counted.",
        ("; ".join(kinds),),
        None,
        record.funcName,
    )
    _deliver(logger, said, skip=tuple(handler for handler, _ in failed))
