"""The watchdog as a service the hub manages, as the culler is (hub_config/jupyterhub_config.py)."""

from __future__ import annotations

import os
import sys
from typing import Any

from spawner.policy.config import hub_id_environment

# What the watchdog reads from the hub, and nothing more (docs/watchdog.md).
WATCHDOG_SCOPES = ["list:users", "read:users:groups", "read:servers"]
# Passed on from the hub's environment when set: JupyterHub gives a managed
# service only a few variables of its own.
PASSED_ON = ("DOCKER_HOST", "QUOTA_SPAWNER_HUB_ID", "QUOTA_SPAWNER_METRICS_TOKEN",
             "QUOTA_SPAWNER_METRICS_IP", "DCGM_HPC_JOB_MAPPING_DIR",
             "QUOTA_SPAWNER_EVENTS_FILE",  # the file the hub writes, when it names one
             "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


def watchdog_service(
    public_url: str, config_file: str = "", name: str = "gpu-watchdog",
    state_dir: str = "", secret_file: str = "", prefix: str = "quota", events_file: str = "",
    usage_db: str = "", hub_id: str = "", home_root: str = "", home_mechanism: str = "",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The managed service and its RBAC role, for c.JupyterHub.services / load_roles.

    ``state_dir`` holds its incident file, and without a ``usage_db`` the hub's event
    log file; ``events_file`` names the file the hub writes elsewhere (else with a
    ``usage_db`` it reads the ledger's events table); ``secret_file`` (the hub's
    cookie_secret_file) and ``prefix`` let it derive the hub's id, as the
    spawner does, when QUOTA_SPAWNER_HUB_ID is not set, and ``hub_id`` is the id the
    config sets (c.QuotaSpawner.hub_id). ``usage_db``: the usage ledger its samples are
    folded into. ``home_root`` and ``home_mechanism``: the hub's homes (its
    c.QuotaSpawner.home_root and home_mechanism), whose use it reads (docs/disk.md).
    """
    environment = {k: os.environ[k] for k in PASSED_ON if os.environ.get(k)}
    environment["JUPYTERHUB_PUBLIC_URL"] = public_url
    if state_dir:
        environment["QUOTA_SPAWNER_STATE_DIR"] = state_dir
    if events_file:
        environment["QUOTA_SPAWNER_EVENTS_FILE"] = events_file
    if usage_db:
        environment["QUOTA_SPAWNER_USAGE_DB"] = usage_db
    if home_root:
        environment["QUOTA_SPAWNER_HOME_ROOT"] = home_root
        if home_mechanism:
            environment["QUOTA_SPAWNER_HOME_MECHANISM"] = home_mechanism
    environment.update(hub_id_environment(hub_id or environment.get("QUOTA_SPAWNER_HUB_ID", ""),
                                           secret_file, prefix))
    if config_file:
        environment["QUOTA_SPAWNER_WATCHDOG_CONFIG"] = config_file
    service = {
        "name": name,
        "command": [sys.executable, "-m", "spawner.watchdog"],
        "environment": environment,
    }
    role = {"name": name, "scopes": list(WATCHDOG_SCOPES), "services": [name]}
    return service, role
