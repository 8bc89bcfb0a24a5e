"""The names the docs told admins and users to import or configure that have moved since,
and where they are now: each keeps working for one minor version after its move, with a
``DeprecationWarning`` (``QuotaSpawnerDeprecationWarning``) that names the new place,
and is removed in the next minor (CHANGELOG.md lists them under Deprecated).

- ``MODULES``: an old module path, imported as the module it became (``import
  spawner.culling`` is ``spawner.hubconfig.culling``), through spawner/__init__.py's
  finder, which asks here only for a ``spawner.`` name that no module file has;
- ``PACKAGES``: an old package that has no new home of its own, only moved modules;
- ``NAMES``: an old name in a module that exists (``spawner.webapp.app.usage_service``),
  through that module's ``__getattr__`` (``moved_name``);
- ``CONFIG_CLASSES``: a renamed traitlets class, whose old section (``c.UsageService.x``,
  ``--UsageService.x=…``) still sets the new class's setting (``config_sections``).

Python shows no DeprecationWarning by default outside ``__main__``, and a hub config is
not ``__main__``: so, unless the process was given its own warning filters (``-W``,
PYTHONWARNINGS), these are shown once per place, in the log of the process (stderr).
Standard library only, imported only when an old name is used.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import Any

SINCE = "0.2.0"
REMOVED_IN = "0.3.0"

# old module -> the module it is now (the docs named these in hub configs and images)
MODULES = {
    "spawner.culling": "spawner.hubconfig.culling",
    "spawner.rbac": "spawner.hubconfig.rbac",
    "spawner.passwords": "spawner.hubconfig.passwords",
    "spawner.engine": "spawner.docker.engine",
    "spawner.network": "spawner.docker.network",
    "spawner.store": "spawner.quota.store",
    "spawner.units": "spawner.quota.units",
    "spawner.torch_memory_cap": "spawner.notebook.torch_cap",
    "spawner.gpu.torch_cap": "spawner.notebook.torch_cap",
    "spawner.usage.service": "spawner.webapp.app",
    "spawner.usage.requests_api": "spawner.webapp.requests",
    "spawner.admin.classes": "spawner.hubconfig.rbac",
    "spawner.webapp.class_logic": "spawner.hubconfig.rbac",
}
# old packages that are only a parent of moved modules now
PACKAGES = {"spawner.admin"}
# (module, old name) -> (module, new name)
NAMES = {
    ("spawner.quota", "QuotaTableError"): ("spawner.quota.model", "QuotaTableError"),
    ("spawner.kube.pod", "home_claim_name"): ("spawner.kube.names", "home_claim_name"),
    ("spawner.webapp.app", "usage_service"): ("spawner.webapp.app", "webapp_service"),
    ("spawner.webapp.app", "UsageService"): ("spawner.webapp.app", "QuotaWebApp"),
    ("spawner.docker.runtime", "build_at_hub_start"): ("spawner.policy.hub",
                                                       "build_at_hub_start"),
}
# old traitlets class -> the class whose settings its config section still sets
CONFIG_CLASSES = {"UsageService": "QuotaWebApp"}


class QuotaSpawnerDeprecationWarning(DeprecationWarning):
    """A name used by its place before a move; the message says the new place."""


if not sys.warnoptions:  # the process's own filters (-W, PYTHONWARNINGS) win
    warnings.filterwarnings("default", category=QuotaSpawnerDeprecationWarning)


def message(old: str, new: str) -> str:
    return (f"{old} is deprecated since Quota Spawner {SINCE} and will be removed in "
            f"{REMOVED_IN}: use {new}")


def find_spec(name: str, alias: Callable[[str], Any]) -> ModuleSpec | None:
    """The spec of an old module's name (``alias(new)``, spawner/__init__.py's loader of
    the module it became; warns), or of an old package's (an empty package); None for
    any other name."""
    if name in PACKAGES:
        spec = ModuleSpec(name, _EmptyPackage(), is_package=True)
        spec.submodule_search_locations = []  # its modules are all in MODULES
        return spec
    new = MODULES.get(name)
    if new is None:
        return None
    # 3: past this function and the finder that asked, to the line that imports the name
    warnings.warn(message(name, new), QuotaSpawnerDeprecationWarning, stacklevel=3)
    return ModuleSpec(name, alias(new))


def moved_name(module: str, name: str) -> Any:
    """For a module's ``__getattr__``: the object an old ``name`` of ``module`` is now,
    with the warning; AttributeError for any other name, as without ``__getattr__``."""
    found = NAMES.get((module, name))
    if found is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    where, new = found
    warnings.warn(message(f"{module}.{name}", f"{where}.{new}"), QuotaSpawnerDeprecationWarning,
                  stacklevel=3)
    return getattr(importlib.import_module(where), new)


def config_sections(cls_name: str, config: Any) -> list[str]:
    """The old sections of ``cls_name`` that ``config`` sets, each warned about, to be read
    before the class's own section (which wins where both set a setting)."""
    found = []
    for old, new in CONFIG_CLASSES.items():
        if new == cls_name and old in config:
            warnings.warn(message(f"The config section {old} (c.{old}.…, --{old}.…)",
                                  f"{new} (c.{new}.…, --{new}.…)"),
                          QuotaSpawnerDeprecationWarning, stacklevel=2)
            found.append(old)
    return found


class _EmptyPackage:
    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: Any) -> None:
        module.__doc__ = "A package that moved; its modules are in spawner/common/moved.py."
