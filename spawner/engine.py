"""Checks on the Docker engine that the quotas depend on."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .quota.model import QuotaTable
from .quota.units import format_human

SWAP_WARNING = (
    "The Docker engine cannot limit swap (docker info: SwapLimit false). "
    "Memory quotas are NOT fully enforced: containers can use swap beyond their "
    "memory limit. Enable swap accounting on the host (swapaccount=1 on the kernel "
    "command line for cgroup v1, or use cgroup v2)."
)


def check_engine_info(info: Mapping[str, Any], log: logging.Logger | logging.LoggerAdapter) -> bool:
    """Warn loudly about engine settings that weaken quotas; True when all is well."""
    ok = True
    if not info.get("SwapLimit", False):
        log.warning("!" * 20 + " %s " + "!" * 20, SWAP_WARNING)
        ok = False
    if not info.get("MemoryLimit", True):
        log.warning("The Docker engine cannot enforce memory limits (docker info: MemoryLimit "
                    "false): memory quotas will not be applied.")
        ok = False
    return ok


def check_engine(
    log: logging.Logger | logging.LoggerAdapter, client: Any = None
) -> dict[str, Any] | None:
    """Ask the engine for ``docker info`` and check it; blocking, for hub start.

    Returns the info, or None, after logging why, when the engine cannot be reached.
    """
    try:
        if client is None:
            import docker

            client = docker.from_env()
        info = client.info()
    except Exception as e:  # the hub must still start; spawns will say what is wrong
        log.warning("Cannot reach the Docker engine to check its limits: %s", e)
        return None
    check_engine_info(info, log)
    return info


def oversized_roles(table: QuotaTable, info: Mapping[str, Any] | None) -> list[str]:
    """A warning per role that asks for more CPUs or memory than the engine has.

    Warnings, not errors: overcommitting can be deliberate, but an admin
    should know that such a role can never get what it promises.
    """
    if not info:
        return []
    cpus, memory = info.get("NCPU"), info.get("MemTotal")
    warnings = []
    for role in table.roles.values():
        if cpus and role.cpus > cpus:
            warnings.append(f"Role '{role.name}' in {table.path} asks for {role.cpus:g} CPUs, "
                            f"but the Docker engine has {cpus}.")
        if memory and role.memory > memory:
            warnings.append(f"Role '{role.name}' in {table.path} asks for "
                            f"{format_human(role.memory)} of memory, but the Docker engine "
                            f"has {format_human(memory)}.")
    return warnings


_warned: set[str] = set()


def warn_oversized_roles(
    table: QuotaTable, info: Mapping[str, Any] | None, log: logging.Logger | logging.LoggerAdapter
) -> None:
    """Log each oversized role once per hub process (at hub start and after each edit)."""
    for warning in oversized_roles(table, info):
        if warning not in _warned:
            _warned.add(warning)
            log.warning("%s", warning)
