"""A hub config written from the docs of 0.1.0 still starts a real hub: the names those
docs told admins to import (spawner.culling, spawner.rbac, spawner.usage.service and the
others) and the web app's old settings section (--UsageService.…) work, and the log says
for each where it lives now (spawner/common/moved.py; tests/unit/test_moved_names.py has
every name of the table)."""

from __future__ import annotations

import os

import requests

from harness import Hub, free_port, teardown, wait_for

# As docs/culling.md, docs/usage.md, docs/security.md and the shipped
# hub_config/jupyterhub_config.py of 0.1.0 wrote them.
OLD_CONFIG = """
from spawner.admin.classes import CLASS_OAUTH_SCOPES, class_service_scopes
from spawner.culling import culler_service
from spawner.engine import check_engine, warn_oversized_roles
from spawner.network import ensure_network, warn_host_network
from spawner.passwords import DEMO_ADMIN_PASSWORD, DEMO_PASSWORD, password_problems
from spawner.quota import QuotaTableError
from spawner.rbac import instructor_roles
from spawner.store import QuotaStore
from spawner.units import parse_duration
from spawner.usage.requests_api import USER_SCOPES
from spawner.usage.service import CUSTOM_SCOPES, DEFAULT_URL, usage_service

CLASSES = {{"cs101": ["prof-ada"]}}
c.JupyterHub.load_roles += instructor_roles(CLASSES)
culler, culler_role = culler_service(c.QuotaSpawner.quota_file, timeout=parse_duration("1h"),
                                     cull_every=60, usage_db=c.QuotaSpawner.usage_db)
c.JupyterHub.services.append(culler)
c.JupyterHub.load_roles.append(culler_role)
c.JupyterHub.custom_scopes = CUSTOM_SCOPES
usage, usage_role, usage_own_role = usage_service(
    c.JupyterHub.bind_url, c.QuotaSpawner.usage_db, c.QuotaSpawner.quota_file,
    url="http://127.0.0.1:{port}")
usage["command"].append("--UsageService.time_zone=UTC")
usage["oauth_client_allowed_scopes"] += CLASS_OAUTH_SCOPES
usage_own_role["scopes"] += class_service_scopes(CLASSES)
c.JupyterHub.services.append(usage)
c.JupyterHub.load_roles += [usage_role, usage_own_role]
"""

MOVED = {
    "spawner.admin.classes": "spawner.hubconfig.rbac",
    "spawner.culling": "spawner.hubconfig.culling",
    "spawner.engine": "spawner.docker.engine",
    "spawner.network": "spawner.docker.network",
    "spawner.passwords": "spawner.hubconfig.passwords",
    "spawner.quota.QuotaTableError": "spawner.quota.model.QuotaTableError",
    "spawner.rbac": "spawner.hubconfig.rbac",
    "spawner.store": "spawner.quota.store",
    "spawner.units": "spawner.quota.units",
    "spawner.usage.requests_api": "spawner.webapp.requests",
    "spawner.usage.service": "spawner.webapp.app",
    "spawner.webapp.app.usage_service": "spawner.webapp.app.webapp_service",
}


def test_a_config_from_the_old_docs_starts_the_hub_and_its_services_with_warnings(
        docker_client, tmp_path):
    port = free_port()
    # the shipped config's own culler, watchdog and web app off: the old lines add theirs
    hub = Hub(tmp_path, prefix=f"qsold{os.getpid()}", extra_config=OLD_CONFIG.format(port=port),
              env={"QUOTA_SPAWNER_IDLE_TIMEOUT": "0", "QUOTA_SPAWNER_WATCHDOG": "0",
                   "QUOTA_SPAWNER_USAGE_URL": "0"})
    try:
        hub.start()
        log = hub.log()
        for old, new in MOVED.items():
            assert (f"DeprecationWarning: {old} is deprecated since Quota Spawner 0.2.0 and "
                    f"will be removed in 0.3.0: use {new}") in log, (old, log[-3000:])
        # the culler the old helper defined reads the hub's users
        wait_for(lambda: "/hub/api/users" in hub.log() and "(idle-culler@" in hub.log(), 60,
                 "the idle culler asking the hub for its users")
        # the web app the old helper defined answers at its URL (its login: the hub's OAuth)
        page = wait_for(lambda: _answer(f"http://127.0.0.1:{port}/services/usage/"), 60,
                        "the usage service answering")
        assert page.status_code in (200, 302), page.status_code
        wait_for(lambda: "The config section UsageService (c.UsageService.…, --UsageService.…) "
                 "is deprecated" in hub.log(), 30, "the web app's warning of its section")
        assert "Traceback" not in hub.log(), hub.log()[-3000:]
    finally:
        teardown(hub, docker_client, "old-config")


def _answer(url: str) -> requests.Response | None:
    try:
        return requests.get(url, allow_redirects=False, timeout=5)
    except requests.RequestException:
        return None
