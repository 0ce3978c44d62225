"""A bounded least-recently-used map: the near-cache (digests) and the fingerprint memo (by URL)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


class LRU(Generic[_K, _V]):
    """At most ``size`` entries, the least recently used dropped first. ``size`` 0 keeps none."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[_K, _V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[_K]:
        return iter(self._items)

    def get(self, key: _K) -> _V | None:
        """Return the value of ``key`` (marking it used), or None."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: _K, value: _V) -> None:
        """Remember ``key``; drop the oldest entry when full."""
        if not self.size:
            return
        items = self._items
        items[key] = value
        items.move_to_end(key)
        if len(items) > self.size:
            items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything."""
        self._items.clear()
