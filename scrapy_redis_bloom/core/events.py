"""What happens to the filter while it runs, counted in memory for the layer above to read.

The Scrapy layer copies the counts into the crawl's stats from the reactor thread, so a
stats store that fails or is not thread-safe is never called from retries, a lease's thread
or ``request_seen``. No log call of the package raises, whichever handler fails.
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
        #: Kinds after which what Redis answered before may no longer hold (set by the filter),
        #: and how many such events happened: a near-cache filled before one is stale.
        self.forgetting: frozenset[str] = frozenset()
        self.epoch = 0

    def count(self, name: str, n: int = 1) -> None:
        """Count ``n`` events of kind ``name``."""
        if n:
            with self._lock:
                self.counts[name] += n
                if name in self.forgetting:
                    self.epoch += 1

    def set(self, name: str, value: Any) -> None:
        """Set the value ``name`` (the latest wins)."""
        with self._lock:
            self.values[name] = value

    def forked(self) -> None:
        """Take a lock of its own in a forked child (another thread may have held the parent's)."""
        self._lock = threading.Lock()

    def read(self) -> tuple[dict[str, int], dict[str, Any]]:
        """Return a copy of the counts since the start, and of the values, taken together."""
        with self._lock:
            return dict(self.counts), dict(self.values)


class RateLimitedLog:
    """Log a message at most once per ``interval`` seconds per topic, then say how many more."""

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
        if skipped := self._suppressed.pop(topic, 0):
            message += " (%d more like this since the last such message)"
            args = (*args, skipped)
        emit(self.logger, level, message, *args, stacklevel=2)


# -- log calls that never raise: a handler may fail (Scrapy's ``LogCounterHandler`` counts into
# stats in a Redis that may be down); the other handlers still get the record.

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
    """Make the stock loggers made so far (``prefix`` and below) :class:`GuardedLogger`."""
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
    """Log ``message % args`` to every handler, never raising; return whether all took it."""
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
    return not logger.filter(record) or _dispatch(logger, record)


def _dispatch(logger: logging.Logger, record: logging.LogRecord) -> bool:
    """Hand ``record`` to the handlers, counting and saying failures; return whether all took it."""
    global _failures
    if not (failed := _deliver(logger, record, skip=())):
        return True
    now = time.monotonic()
    kinds = []
    with _failures_lock:
        _failures += 1
        for handler, exc in failed:
            kind = type(handler).__qualname__
            last = _handler_failures_said.get(kind)
            if last is None or now - last >= HANDLER_FAILURE_INTERVAL:
                _handler_failures_said[kind] = now
                kinds.append(f"{kind} ({type(exc).__name__}: {exc})")
    if kinds:
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
    return False


def _deliver(
    logger: logging.Logger, record: logging.LogRecord, skip: tuple[logging.Handler, ...]
) -> list[tuple[logging.Handler, Exception]]:
    """Hand ``record`` to each handler (but ``skip``); return those that raised, and why."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:  # in the order logging calls them
        handlers += current.handlers
        current = current.parent if current.propagate else None
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
