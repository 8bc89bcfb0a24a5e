"""Stopping a user's server the way the hub stops any: for preemption and for spent
GPU-hour budgets, on Docker and on Kubernetes.

Its proxy route first, then JupyterHub's ``User.stop`` (which calls the spawner's stop
and records the server as stopped), so the hub's record and the user's page agree.
"""

from __future__ import annotations

from typing import Any


async def stop_through_hub(spawner: Any) -> None:
    """Stop ``spawner``'s server through its JupyterHub user; raises what the stop raises."""
    user = spawner.user
    proxy = user.settings.get("proxy")
    if proxy is not None:
        await proxy.delete_user(user, spawner.name)
    await user.stop(spawner.name)
