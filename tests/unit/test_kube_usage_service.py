"""The usage service on Kubernetes (deploy/kubernetes/usage-service.yaml and its
hub.services / hub.loadRoles entries in values.yaml), without a cluster.

What is checked: the manifest reads strictly into the client's models and meets the
restricted standard; every environment variable it sets is one QuotaWebApp or the
hub's OAuth client reads, and ``python -m spawner.webapp``'s app, initialised in a
process of its own with that environment, has the settings the hub expects (the
ledger, the table, no state folder, the prefix, the hub's API, the OAuth client);
hub.services' URL is the Service's name and port, and the service's token the
chart's Secret key; the service and its roles are what the Docker hub config
registers (spawner.webapp.app.webapp_service and the class dashboard's scopes),
without the command; every scope is one JupyterHub knows, and JupyterHub initialises
with them. Nothing here has been applied to a cluster
(docs/kubernetes.md#not-yet-built-not-run-against-a-real-cluster).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from shipped_config import (
    CHART_SECRET,
    DEPLOY,
    ROOT,
    documents,
    run_extra_config,
    values,
    watchdog_container,
)

from spawner.hubconfig.rbac import CLASS_OAUTH_SCOPES, class_service_scopes
from spawner.kube.security import restricted_violations
from spawner.webapp import app as webapp
from spawner.webapp.requests import USER_SCOPES

MANIFEST = DEPLOY / "usage-service.yaml"
LEDGER_SECRET = ("quota-spawner-usage-db", "url")
# what the probe gets for each secretKeyRef
SECRETS = {LEDGER_SECRET: "postgresql+psycopg://quota:pw@db.example.org:5432/quota_usage",
           (CHART_SECRET, "hub.services.usage.apiToken"): "u" * 64}


def objects() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in documents(MANIFEST)}


def pod() -> dict[str, Any]:
    return objects()["Deployment"]["spec"]["template"]


def container() -> dict[str, Any]:
    (found,) = pod()["spec"]["containers"]
    return found


def env() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container()["env"]}


def service_key() -> str:
    (key,) = values()["hub"]["services"]
    return key


# --- the manifest ------------------------------------------------------------------------


def test_manifests_read_strictly_into_the_clients_models() -> None:
    pytest.importorskip("kubernetes")
    from kube_models import strict

    found = objects()
    assert sorted(found) == ["Deployment", "NetworkPolicy", "Service"]
    for kind, doc in found.items():
        strict(doc, f"V1{kind}")
        assert doc["metadata"]["namespace"] == "jhub"


def test_the_pod_is_restricted_and_reaches_the_hub() -> None:
    template = pod()
    assert restricted_violations({"spec": template["spec"]}) == []
    assert template["spec"]["automountServiceAccountToken"] is False
    assert container()["securityContext"]["readOnlyRootFilesystem"] is True
    # the chart's NetworkPolicy lets pods with this label reach the hub's API
    assert template["metadata"]["labels"]["hub.jupyter.org/network-access-hub"] == "true"
    deployment = objects()["Deployment"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    # one process: its cookies' key is its own, its pre-warms must run once
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert container()["command"] == ["python3", "-m", "spawner.webapp"]


def test_the_image_is_the_hubs() -> None:
    image = values()["hub"]["image"]
    assert container()["image"] == f"{image['name']}:{image['tag']}"
    assert watchdog_container()["image"] == container()["image"]


def test_the_service_and_the_policy_select_the_pod() -> None:
    labels = pod()["metadata"]["labels"]
    found = objects()
    assert found["Service"]["spec"]["selector"].items() <= labels.items()
    policy = found["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    (rule,) = policy["ingress"]
    assert [p["port"] for p in rule["ports"]] == ["http"]
    # the chart's proxy and hub pods (their matchLabels: app, component, release)
    assert [f["podSelector"]["matchLabels"] for f in rule["from"]] == [
        {"app": "jupyterhub", "component": "proxy"}, {"app": "jupyterhub", "component": "hub"}]


# --- its settings ------------------------------------------------------------------------

# The variables QuotaWebApp's defaults read (its _env calls), and those of the hub's
# OAuth client (HubOAuth, jupyterhub/services/auth.py) that a service the hub does not
# start must be given.
USAGE_SERVICE_ENV = set(re.findall(r'_env\("([A-Z_]+)"', Path(webapp.__file__).read_text()))
HUB_OAUTH_ENV = {"JUPYTERHUB_SERVICE_NAME", "JUPYTERHUB_CLIENT_ID",
                 "JUPYTERHUB_OAUTH_CALLBACK_URL", "JUPYTERHUB_OAUTH_ACCESS_SCOPES",
                 "JUPYTERHUB_PUBLIC_URL"}


def test_every_variable_is_one_the_service_reads() -> None:
    import jupyterhub.services.auth

    auth = Path(jupyterhub.services.auth.__file__).read_text()
    assert {"QUOTA_SPAWNER_USAGE_DB", "QUOTA_SPAWNER_QUOTA_FILE", "QUOTA_SPAWNER_HUB_ID",
            "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN"} <= USAGE_SERVICE_ENV
    for name in HUB_OAUTH_ENV:
        assert re.search(rf"""os\.(getenv|environ\.get)\(\s*['"]{name}['"]""", auth), name
    names = [e["name"] for e in container()["env"]]
    assert len(names) == len(set(names))
    assert set(names) - USAGE_SERVICE_ENV - HUB_OAUTH_ENV == set()
    # no state folder of the hub's: none is shared with the hub pod
    assert not {"QUOTA_SPAWNER_STATE_DIR", "QUOTA_SPAWNER_HUB_SECRET_FILE"} & set(names)
    assert not [m for m in container()["volumeMounts"] if m["name"] not in ("quota-table", "tmp")]


def test_the_table_is_the_hubs_configmap_mounted_as_the_hub_mounts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hub = values()["hub"]
    (hub_mount,) = [m for m in hub["extraVolumeMounts"] if m["name"] == "quota-table"]
    (hub_volume,) = [v for v in hub["extraVolumes"] if v["name"] == "quota-table"]
    mounts = {m["name"]: m for m in container()["volumeMounts"]}
    volumes = {v["name"]: v for v in pod()["spec"]["volumes"]}
    assert mounts["quota-table"] == hub_mount  # a directory, read-only, no subPath
    assert volumes["quota-table"] == hub_volume
    c = run_extra_config(monkeypatch)
    assert env()["QUOTA_SPAWNER_QUOTA_FILE"]["value"] == c.QuotaKubeSpawner.quota_file
    # the role requests' events carry the hub's id, which the watchdog reads by
    assert env()["QUOTA_SPAWNER_HUB_ID"]["value"] == c.QuotaKubeSpawner.hub_id
    watchdog = {e["name"]: e for e in watchdog_container()["env"]}
    for name in ("JUPYTERHUB_API_URL", "JUPYTERHUB_PUBLIC_URL"):
        assert env()[name] == watchdog[name]


PROBE = """\
import json, sys
from jupyterhub.services.auth import HubOAuth
from spawner.webapp.app import QuotaWebApp
app = QuotaWebApp()
app.initialize(sys.argv[1:])
web = app.web_app()
setup = web.settings["usage"]
auth = HubOAuth()
print(json.dumps({
    "usage_db": app.usage_db, "quota_file": app.quota_file, "state_dir": app.state_dir,
    "prefix": app.service_prefix, "bind_url": app.bind_url, "hub_base": app.hub_base_url,
    "api_url": app.hub_api_url, "token": app.hub_api_token, "hub_id": app.event_hub_id(),
    "time_zone": app.time_zone, "events": setup.events.path,
    "stored": setup.events.store is not None,
    "oauth": {"client_id": auth.oauth_client_id, "redirect": auth.oauth_redirect_uri,
              "scopes": sorted(auth.access_scopes), "base_url": auth.base_url,
              "api_url": auth.api_url, "token": auth.api_token,
              "authorize": auth.oauth_authorization_url},
    "routes": [rule.matcher.regex.pattern for rule in web.default_router.rules
               for rule in rule.target.rules]}))
"""


def probe() -> dict[str, Any]:
    """``python -m spawner.webapp``'s app, initialised in a process of its own with the
    Deployment's environment (the Secrets' values stand in), and the OAuth client its
    pages log in with. Initialising connects to nothing."""
    environment = {"PATH": os.environ["PATH"]}
    for entry in container()["env"]:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        environment[entry["name"]] = SECRETS[ref["name"], ref["key"]] if ref else entry["value"]
    assert container()["command"][:3] == ["python3", "-m", "spawner.webapp"]
    done = subprocess.run([sys.executable, "-c", PROBE, *container().get("args", [])],
                          env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_service_starts_with_the_deployments_settings() -> None:
    seen = probe()
    key = service_key()
    prefix = f"/services/{key}/"  # JupyterHub's Service.prefix, hub.baseUrl "/"
    port = next(p["containerPort"] for p in container()["ports"] if p["name"] == "http")
    assert seen.pop("routes")  # the pages' routes, under the prefix
    assert seen == {
        "usage_db": SECRETS[LEDGER_SECRET],
        "quota_file": "/usr/local/etc/quota-spawner/quotas.yaml",
        "state_dir": "",  # no folder shared with the hub pod
        "prefix": prefix,
        "bind_url": f"http://0.0.0.0:{port}",  # every address of the pod
        "hub_base": "/",
        "api_url": "http://hub:8081/hub/api",
        "token": SECRETS[CHART_SECRET, f"hub.services.{key}.apiToken"],
        "hub_id": "quota-jhub",
        "time_zone": "UTC",
        "events": "",  # no events file: the ledger's events table only
        "stored": True,
        "oauth": {
            "client_id": f"service-{key}",  # JupyterHub's oauth_client_id for it
            "redirect": prefix + "oauth_callback",  # the hub's oauth_redirect_uri for it
            "scopes": [f"access:services!service={key}"],
            "base_url": prefix,
            "api_url": "http://hub:8081/hub/api",
            "token": SECRETS[CHART_SECRET, f"hub.services.{key}.apiToken"],
            "authorize": "/hub/api/oauth2/authorize",
        },
    }


def test_the_oauth_client_is_the_one_the_hub_makes_for_the_service() -> None:
    from jupyterhub.services.service import Service

    key = service_key()
    hub_side = Service(name=key, base_url="/")  # the hub's base_url: hub.baseUrl, "/"
    assert env()["JUPYTERHUB_SERVICE_NAME"]["value"] == key
    assert env()["JUPYTERHUB_CLIENT_ID"]["value"] == hub_side.oauth_client_id
    assert env()["JUPYTERHUB_SERVICE_PREFIX"]["value"] == hub_side.prefix
    assert env()["JUPYTERHUB_OAUTH_CALLBACK_URL"]["value"] == hub_side.prefix + "oauth_callback"


# --- hub.services and hub.loadRoles -----------------------------------------------------


def test_the_hubs_url_is_the_services_name_and_port() -> None:
    url = urlparse(values()["hub"]["services"][service_key()]["url"])
    service = objects()["Service"]
    (port,) = service["spec"]["ports"]
    assert url.scheme == "http" and url.path in ("", "/")
    # the short name: the proxy and the hub run in the Service's namespace
    assert url.hostname == service["metadata"]["name"]
    assert url.port == port["port"]
    assert port["targetPort"] == "http"
    assert urlparse(env()["JUPYTERHUB_SERVICE_URL"]["value"]).port == next(
        p["containerPort"] for p in container()["ports"] if p["name"] == "http")


def test_the_token_is_the_one_the_chart_generates_for_the_service() -> None:
    key = service_key()
    entry = values()["hub"]["services"][key]
    assert "api_token" not in entry and "apiToken" not in entry  # the chart generates it
    assert env()["JUPYTERHUB_API_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": CHART_SECRET, "key": f"hub.services.{key}.apiToken"}}


def test_the_entry_is_a_jupyterhub_service_the_hub_does_not_start() -> None:
    from jupyterhub.services.service import Service

    entry = values()["hub"]["services"][service_key()]
    inputs = {n for n, t in Service.class_traits().items() if t.metadata.get("input")}
    assert set(entry) <= inputs
    assert "command" not in entry  # an external service: the Deployment runs it


def test_the_service_and_its_roles_are_the_docker_hubs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What spawner.webapp.app.webapp_service() registers, and the class dashboard's
    scopes hub_config/jupyterhub_config.py adds to it, without the command and its
    environment (the Deployment's)."""
    key = service_key()
    c = run_extra_config(monkeypatch)
    docker, viewer, own = webapp.webapp_service("https://hub.example.org", "sqlite://",
                                               "quotas.yaml", name=key)
    (service,) = [s for s in c.JupyterHub.services if s["name"] == key]
    assert sorted(service["oauth_client_allowed_scopes"]) == sorted(
        [*docker["oauth_client_allowed_scopes"], *CLASS_OAUTH_SCOPES])
    assert service["oauth_no_confirm"] is docker["oauth_no_confirm"] is True
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles[viewer["name"]] == viewer
    # the classes are those of the instructors' roles hub.extraConfig makes
    classes = {s.removeprefix("servers!group=") for r in roles.values()
               if r["name"].startswith("instructor-") for s in r["scopes"]
               if s.startswith("servers!group=")}
    assert classes == {"cs101"}
    assert roles[own["name"]]["services"] == own["services"] == [key]
    assert roles[own["name"]]["scopes"] == [*own["scopes"], *class_service_scopes(classes)]
    assert roles["user"]["scopes"] == ["self", *USER_SCOPES]  # JupyterHub 5: the chart's
    # the usage page's scope, defined for the roles that name it
    assert c.JupyterHub.custom_scopes == webapp.CUSTOM_SCOPES


def test_every_scope_is_one_jupyterhub_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyterhub import scopes

    c = run_extra_config(monkeypatch)
    # define_custom_scopes adds to the module's table: on a copy
    monkeypatch.setattr(scopes, "scope_definitions", dict(scopes.scope_definitions))
    scopes.define_custom_scopes(c.JupyterHub.custom_scopes)
    named = [s for r in c.JupyterHub.load_roles for s in r["scopes"]]
    named += [s for v in c.JupyterHub.services for s in v.get("oauth_client_allowed_scopes", [])]
    assert "custom:quota-spawner:usage" in named
    scopes._check_scopes_exist(named)  # ScopeNotFound otherwise
    services = {s["name"] for s in c.JupyterHub.services}
    for role in c.JupyterHub.load_roles:
        assert set(role.get("services", [])) <= services, role["name"]
        for scope in role["scopes"]:
            if "!service=" in scope:
                assert scope.partition("!service=")[2] in services, scope


HUB_PROBE = """\
import asyncio, json, sys
import pytest
from shipped_config import run_extra_config
from jupyterhub import orm
from jupyterhub.app import JupyterHub

folder = sys.argv[1]
c = run_extra_config(pytest.MonkeyPatch())
c.JupyterHub.db_url = f"sqlite:///{folder}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{folder}/cookie_secret"
c.JupyterHub.spawner_class = "simple"  # the roles and services are what is checked
c.ConfigurableHTTPProxy.should_start = False
c.ConfigurableHTTPProxy.auth_token = "p" * 32
app = JupyterHub(config=c)

async def main():
    await app.initialize([])
    roles = {r.name: {"scopes": sorted(r.scopes), "services": [s.name for s in r.services]}
             for r in app.db.query(orm.Role)}
    services = {s.name: {"url": s.url, "managed": s.managed, "client": s.oauth_client_id,
                         "redirect": s.oauth_redirect_uri, "prefix": s.prefix,
                         "allowed": sorted(s.oauth_client_allowed_scopes)}
                for s in app._service_map.values()}
    print(json.dumps({"roles": roles, "services": services}))

asyncio.run(main())
"""


def test_jupyterhub_loads_the_services_and_roles(tmp_path: Path) -> None:
    """The hub's own initialisation (its database, roles, services, OAuth clients) with
    what the chart and hub.extraConfig put in the config; the installed JupyterHub, not
    the chart's 5.5. In a process of its own: it defines the custom scopes globally."""
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(
        str(ROOT / p) for p in ("tests", "tests/unit", "tests/service", "."))}
    done = subprocess.run([sys.executable, "-c", HUB_PROBE, str(tmp_path)], env=environment,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    key = service_key()
    assert seen["services"][key] == {
        "url": values()["hub"]["services"][key]["url"], "managed": False,
        "client": env()["JUPYTERHUB_CLIENT_ID"]["value"],
        "redirect": env()["JUPYTERHUB_OAUTH_CALLBACK_URL"]["value"],
        "prefix": env()["JUPYTERHUB_SERVICE_PREFIX"]["value"],
        "allowed": sorted(values()["hub"]["services"][key]["oauth_client_allowed_scopes"])}
    assert seen["roles"]["usage-service"]["services"] == [key]
    assert f"access:services!service={key}" in seen["roles"]["user"]["scopes"]
