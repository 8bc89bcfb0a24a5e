"""Quota Spawner: JupyterHub spawner for shared GPU servers."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["QuotaSpawner", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so that the notebook side of the package (inside the images)
    # does not import DockerSpawner and the hub.
    if name == "QuotaSpawner":
        from spawner.docker.spawner import QuotaSpawner

        return QuotaSpawner
    raise AttributeError(name)
