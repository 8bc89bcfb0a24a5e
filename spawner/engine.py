"""Checks on the Docker engine that the quotas depend on."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

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


def check_engine(log: logging.Logger | logging.LoggerAdapter, client: Any = None) -> bool:
    """Ask the engine for ``docker info`` and check it; blocking, for hub start.

    Returns False, after logging why, when the engine cannot be reached either.
    """
    try:
        if client is None:
            import docker

            client = docker.from_env()
        info = client.info()
    except Exception as e:  # the hub must still start; spawns will say what is wrong
        log.warning("Cannot reach the Docker engine to check its limits: %s", e)
        return False
    return check_engine_info(info, log)
