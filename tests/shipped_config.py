"""The configs the project ships, run as JupyterHub and the Zero to JupyterHub chart run
them, with no hub and no cluster: hub_config/jupyterhub_config.py (``load_hub_config``)
and the chart's values and hub.extraConfig in deploy/kubernetes/ (``run_extra_config``,
the manifests), and the kubeconfig a Kubernetes client loads here, which points nowhere."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[1]

# --- Docker: the hub's config -----------------------------------------------------------

HUB_CONFIG = ROOT / "hub_config"
GOOD_USER = "correct horse battery"
GOOD_ADMIN = "a-long-admin-password-of-32-chars-or-more"


def load_hub_config(tmp_path: Path, monkeypatch, **env: str) -> Config:
    """Run hub_config/jupyterhub_config.py as JupyterHub would, with these variables.

    Host network and an engine that does not answer, so nothing here needs
    Docker; the e2e tests run the bridge network on a real engine.
    """
    for name in ("QUOTA_SPAWNER_DEMO", "QUOTA_SPAWNER_DEMO_PASSWORD",
                 "QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("QUOTA_SPAWNER_NETWORK", "host")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    c = Config()
    namespace = {"get_config": lambda: c, "__file__": str(HUB_CONFIG / "jupyterhub_config.py")}
    exec(compile((HUB_CONFIG / "jupyterhub_config.py").read_text(), "jupyterhub_config.py",
                 "exec"), namespace)
    return c


# --- Kubernetes: the chart's values and the manifests -----------------------------------

DEPLOY = ROOT / "deploy" / "kubernetes"
VALUES = DEPLOY / "values.yaml"
WATCHDOG = DEPLOY / "watchdog.yaml"

# What the chart's jupyterhub_config.py (4.4.0) has put in c.JupyterHub.services
# before it runs hub.extraConfig, with cull.enabled and the values' cull section.
CHART_CULLER = {"name": "jupyterhub-idle-culler", "command": [
    "python3", "-m", "jupyterhub_idle_culler", "--url=http://localhost:8081/hub/api",
    "--timeout=1800", "--cull-every=60", "--concurrency=10"]}
CHART_CULLER_ROLE = {"name": "jupyterhub-idle-culler", "services": ["jupyterhub-idle-culler"],
                     "scopes": ["list:users", "read:users:activity", "read:servers",
                                "delete:servers"]}
# The token the chart generates for each of hub.services and keeps in its Secret
# "hub" (the chart's hub.fullname with fullnameOverride "", its default) under
# hub.services.<key>.apiToken; its jupyterhub_config.py sets it as api_token.
CHART_SECRET = "hub"
CHART_SERVICE_TOKEN = "s" * 64
# An in-memory ledger for the runs of hub.extraConfig that do not look at it (it is
# created at each run, as at each hub start).
MEMORY_LEDGER = "sqlite://"

GOOD_USER_PASSWORD = "correct-horse-battery"
GOOD_ADMIN_PASSWORD = "a" * 20 + "0123456789abcdef"


def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def documents(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def run_extra_config(monkeypatch: pytest.MonkeyPatch, user_password: str = GOOD_USER_PASSWORD,
                     admin_password: str = GOOD_ADMIN_PASSWORD,
                     usage_db: str = MEMORY_LEDGER) -> Config:
    """hub.extraConfig run as the chart runs it: exec'd, in order of its keys, after
    the chart's own settings (its culler, hub.services, hub.loadRoles) and
    hub.config, with hub.extraEnv's Secrets as given."""
    for name, value in (("QUOTA_SPAWNER_DEMO_PASSWORD", user_password),
                        ("QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD", admin_password),
                        ("QUOTA_SPAWNER_USAGE_DB", usage_db)):
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    hub = values()["hub"]
    c = Config()
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    c.JupyterHub.services = [{**CHART_CULLER, "command": list(CHART_CULLER["command"])}]
    c.JupyterHub.load_roles = [{**CHART_CULLER_ROLE, "scopes": list(CHART_CULLER_ROLE["scopes"])}]
    # as the chart's jupyterhub_config.py (4.4.0) reads hub.services and hub.loadRoles
    for key, service in hub.get("services", {}).items():
        service = {"name": key, **service}
        service.pop("apiToken", None)
        service["api_token"] = CHART_SERVICE_TOKEN
        c.JupyterHub.services.append(service)
    for key, role in hub.get("loadRoles", {}).items():
        c.JupyterHub.load_roles.append({"name": key, **role})
    for section, settings in hub["config"].items():
        c[section].update(settings)
    for key, source in sorted(hub["extraConfig"].items()):
        exec(compile(source, f"hub.extraConfig.{key}", "exec"),
             {"c": c, "get_config": lambda *a, **k: None, "os": os})
    return c


def watchdog_objects() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in documents(WATCHDOG)}


def watchdog_container() -> dict[str, Any]:
    (container,) = watchdog_objects()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    return container


# A kubeconfig that points nowhere: a Kubernetes client loads it, and nothing is ever called.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: not-a-token}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""
