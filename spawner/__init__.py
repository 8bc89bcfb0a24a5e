"""Quota Spawner: JupyterHub spawner for shared GPU servers.

``spawner.QuotaSpawner`` is imported lazily, so that the notebook side of the package
(inside the images) does not import DockerSpawner and the hub. Two documented names are
modules that live elsewhere (``ALIASES``): ``spawner.checkpoint``, which notebooks
import ``on_preempt`` from (docs/preemption.md), and ``spawner.monitor``, the
jupyter_server extension the images enable (docs/gpu-monitor.md). The names that moved
in a release keep working for one minor version, with a DeprecationWarning that names
the new place (spawner/common/moved.py); both go through ``_Aliases``, the last finder
Python asks, so an import that finds its module costs nothing more.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.2.0"
__all__ = ["QuotaSpawner", "__version__"]

# documented names -> the modules they are; not deprecated
ALIASES = {
    "spawner.checkpoint": "spawner.notebook.checkpoint",
    "spawner.monitor": "spawner.notebook.monitor",
}


def __getattr__(name: str) -> Any:
    if name == "QuotaSpawner":
        from spawner.docker.spawner import QuotaSpawner

        return QuotaSpawner
    raise AttributeError(name)


class Alias:
    """A loader that gives an existing module under a second name: ``target`` itself, so
    its classes, its state and ``isinstance`` are the same under both names."""

    def __init__(self, target: str):
        self.target = target
        self.spec: Any = None

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        # ``target`` ran when it was imported; Python gave it the second name's spec,
        # and its own (a package's search path: its data files, its modules) comes back
        module.__spec__ = self.spec


class _Aliases:
    """The finder of the documented aliases and of the names that moved (a meta path
    finder, asked last: only for a ``spawner.`` name that no module file has)."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
        if not name.startswith("spawner."):
            return None
        from importlib.machinery import ModuleSpec

        if name in ALIASES:
            return ModuleSpec(name, Alias(ALIASES[name]))
        from spawner.common import moved  # only now: the images never need it

        return moved.find_spec(name, Alias)


if not any(isinstance(f, type) and f.__name__ == "_Aliases" for f in sys.meta_path):
    sys.meta_path.append(_Aliases)  # type: ignore[arg-type]
