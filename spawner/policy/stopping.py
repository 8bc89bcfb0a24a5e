"""Stopping a user's server the way the hub stops any: for preemption and for spent
GPU-hour budgets, on Docker and on Kubernetes.

Its proxy route first, then JupyterHub's ``User.stop`` (which calls the spawner's stop
and records the server as stopped), so the hub's record and the user's page agree.
"""

from __future__ import annotations

from typing import Any, Protocol


class HubServer(Protocol):
    """A server as the hub runs it: what a stop through the hub needs of its spawner
    (JupyterHub's ``Spawner``)."""

    user: Any  # JupyterHub's User: its settings (the proxy) and its stop
    name: str  # the server's name; "" for the default server
    pending: str | None  # "spawn", "stop", ... while the hub acts on it
    server: Any  # None while it does not run


async def stop_through_hub(spawner: HubServer) -> None:
    """Stop ``spawner``'s server through its JupyterHub user; raises what the stop raises."""
    user = spawner.user
    proxy = user.settings.get("proxy")
    if proxy is not None:
        await proxy.delete_user(user, spawner.name)
    await user.stop(spawner.name)
