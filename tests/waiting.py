"""Waiting, bounded, for what a filter's own state tells: not for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scrapy_redis_bloom.transport.executor import PROBE_INTERVAL


def until_tried(executor: Any, timeout: float = 3 * PROBE_INTERVAL + 5.0) -> None:
    """Wait until the executor's next write goes to Redis: its outage ended or an attempt is due.

    After a server answers again, the watch (a probe a second) ends the outage; a fixed sleep
    of a probe interval races it on a loaded machine.
    """
    deadline = time.monotonic() + timeout
    while executor.refusal("wait", write=True) is not None:
        assert time.monotonic() < deadline, f"no write went to Redis for {timeout} s"
        time.sleep(0.02)


def wait_until(condition: Callable[[], Any], timeout: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
