"""A test fixture's ``start()`` and ``stop()`` as a ``with`` block."""

from __future__ import annotations

import subprocess
from typing import Any, Self


def terminate(process: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """Stop a server's process if it runs: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Running:
    """``with fixture:`` starts it, and stops it however the block ends."""

    def start(self) -> Self:
        """Start the fixture; return it (subclasses define it)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the fixture and free what it holds (subclasses define it)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
