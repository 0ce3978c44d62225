"""A test fixture's ``start()`` and ``stop()`` as a ``with`` block."""

from __future__ import annotations

from typing import Self


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
