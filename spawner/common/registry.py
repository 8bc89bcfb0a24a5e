"""Objects shared by every spawner of one hub process, one per key.

JupyterHub makes a spawner per user server, but some state belongs to the
hub process: the quota table's store (one per file) and the GPU pool (one
per inventory and hub id). Both are kept in a ``Registry``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Registry(Generic[K, V]):
    """Creates the object for a key once, from threads or from the event loop."""

    def __init__(self) -> None:
        self._items: dict[K, V] = {}
        self._lock = threading.Lock()
        self._async_lock: asyncio.Lock | None = None

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The object for ``key``, made by ``make()`` the first time (cheap calls only)."""
        with self._lock:
            if key not in self._items:
                self._items[key] = make()
            return self._items[key]

    async def aget(self, key: K, make: Callable[[], Awaitable[V]]) -> V:
        """As ``get``, for a ``make`` that awaits (a thread, the engine): made once,
        however many spawns ask at the same time."""
        found = self._items.get(key)
        if found is not None:
            return found
        if self._async_lock is None:
            self._async_lock = asyncio.Lock()
        async with self._async_lock:
            if key not in self._items:
                made = await make()
                with self._lock:
                    self._items[key] = made
            return self._items[key]

    def values(self) -> list[V]:
        with self._lock:
            return list(self._items.values())
