"""The watchdog as a service the hub manages, as the culler is (hub_config/jupyterhub_config.py)."""

from __future__ import annotations

import os
import sys
from typing import Any

# What the watchdog reads from the hub, and nothing more (docs/watchdog.md).
WATCHDOG_SCOPES = ["list:users", "read:users:groups", "read:servers"]
# Passed on from the hub's environment when set: JupyterHub gives a managed
# service only a few variables of its own.
PASSED_ON = ("DOCKER_HOST", "QUOTA_SPAWNER_STATE_DIR", "QUOTA_SPAWNER_HUB_ID",
             "QUOTA_SPAWNER_METRICS_TOKEN", "DCGM_HPC_JOB_MAPPING_DIR")


def watchdog_service(
    public_url: str, config_file: str = "", name: str = "gpu-watchdog",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The managed service and its RBAC role, for c.JupyterHub.services / load_roles."""
    environment = {k: os.environ[k] for k in PASSED_ON if os.environ.get(k)}
    environment["JUPYTERHUB_PUBLIC_URL"] = public_url
    if config_file:
        environment["QUOTA_SPAWNER_WATCHDOG_CONFIG"] = config_file
    service = {
        "name": name,
        "command": [sys.executable, "-m", "spawner.watchdog"],
        "environment": environment,
    }
    role = {"name": name, "scopes": list(WATCHDOG_SCOPES), "services": [name]}
    return service, role
