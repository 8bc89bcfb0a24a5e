"""What the watchdog asks the hub: each user's groups (for routing) and servers (for zombies).

Read through the hub's REST API (spawner/common/hub_client.py) with the service token
JupyterHub gives a managed service (JUPYTERHUB_API_TOKEN); the scopes it needs are
``list:users``, ``read:users:groups`` and ``read:servers`` (docs/watchdog.md).
Asynchronous, on the watchdog's event loop.
"""

from __future__ import annotations

import logging
import time

from spawner.common.hub_client import HubClient


class HubDirectory:
    """The users of the hub, read at most once a ``ttl``; empty until the hub answers."""

    def __init__(self, api_url: str, token: str, log: logging.Logger | logging.LoggerAdapter,
                 ttl: float = 30.0):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.log = log
        self.ttl = ttl
        self.known = False  # whether the hub has answered at least once
        # When the last answer was asked for, epoch seconds (None before the first):
        # it shows every server the hub had recorded by then.
        self.read_at: float | None = None
        self._groups: dict[str, list[str]] = {}
        self._servers: dict[str, set[str]] = {}
        self._read_at = float("-inf")

    def groups_of(self, user: str) -> list[str]:
        return self._groups.get(user, [])

    def has_server(self, user: str) -> bool:
        """Whether the hub knows a server of this user (running, starting or stopping)."""
        return bool(self._servers.get(user))

    async def groups_for(self, user: str) -> list[str]:
        """``user``'s groups, read again first when the last read did not know the user
        (a user created since): routing must not miss an instructor's channel."""
        if user not in self._groups:
            await self.refresh(force=True)
        return self.groups_of(user)

    async def refresh(self, force: bool = False) -> None:
        """Read the users again after ``ttl``, or now when ``force`` (at most every 2 s)."""
        age = time.monotonic() - self._read_at
        if not self.api_url or age < (2.0 if force else self.ttl):
            return
        asked = time.time()
        try:
            users = await HubClient(self.api_url, self.token, timeout=10).users()
        except Exception as e:  # the hub restarting: keep what was known
            self.log.warning("Could not read the hub's users (%s); routing by group and the "
                             "zombie check use what was read before", e)
            return
        groups = {u["name"]: list(u.get("groups") or []) for u in users}
        servers = {u["name"]: set((u.get("servers") or {}).keys()) for u in users}
        self._groups, self._servers = groups, servers
        self.known, self._read_at, self.read_at = True, time.monotonic(), asked
