"""The Kubernetes deployment files (deploy/kubernetes/), without a cluster.

What can be checked here: every file parses; every key of values.yaml exists in
the Zero to JupyterHub chart it is written for (the chart's key lists are copied
below, not fetched); hub.extraConfig compiles and, run as the chart runs it,
sets the spawner, the table's path, the culler's arbiter, the login and the
usage ledger from its Secret; the ConfigMap holds the shipped table byte for
byte; the device plugin's shared resource is the name the spawner asks for,
with the table's gpu_share as replicas; the committed PriorityClasses are the
command's output (the usage service's manifest: test_kube_usage_service.py).
Nothing here has been applied to a real cluster or installed with Helm
(docs/kubernetes.md#not-yet-built-not-run-against-a-real-cluster).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from shipped_config import (
    CHART_CULLER,
    DEPLOY,
    GOOD_ADMIN_PASSWORD,
    GOOD_USER_PASSWORD,
    MEMORY_LEDGER,
    VALUES,
    documents,
    run_extra_config,
    values,
    watchdog_container,
    watchdog_objects,
)

from spawner import cli
from spawner.kube.names import home_claim_name
from spawner.kube.options import KubeOptions
from spawner.kube.priority import class_name
from spawner.kube.security import restricted_violations
from spawner.quota.loader import load_quota_table

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "hub_config" / "quotas.yaml"

# The z2jh chart these values are written for, and the hub image's base tag.
CHART_VERSION = "4.4.0"

# The keys of the chart's closed objects (additionalProperties: false) that
# values.yaml uses, from jupyterhub/values.schema.yaml of
# github.com/jupyterhub/zero-to-jupyterhub-k8s at tag 4.4.0. "" is the top
# level. A key missing here is a key the chart's schema rejects (helm refuses
# the install), or one it ignores.
CHART_KEYS = {
    "": (
        "cull custom debug enabled fullnameOverride global httpRoute hub imagePullSecret "
        "imagePullSecrets ingress nameOverride prePuller proxy rbac scheduling singleuser "
    ),
    "hub": (
        "activeServerLimit allowNamedServers annotations args authenticatePrometheus baseUrl "
        "command concurrentSpawnLimit config consecutiveFailureLimit containerSecurityContext "
        "cookieSecret db deploymentStrategy existingSecret extraConfig extraContainers "
        "extraEnv extraFiles extraPodSpec extraVolumeMounts extraVolumes fsGid image "
        "initContainers labels lifecycle livenessProbe loadRoles namedServerLimitPerUser "
        "networkPolicy nodeSelector pdb podSecurityContext readinessProbe redirectToServer "
        "resources revisionHistoryLimit service serviceAccount services shutdownOnLogout "
        "templatePaths templateVars tolerations "
    ),
    "hub.image": "name pullPolicy pullSecrets tag",
    "singleuser": (
        "allowPrivilegeEscalation cloudMetadata cmd cpu defaultUrl events extraAnnotations "
        "extraContainers extraEnv extraFiles extraLabels extraNodeAffinity extraPodAffinity "
        "extraPodAntiAffinity extraPodConfig extraResource extraTolerations fsGid image "
        "initContainers lifecycleHooks memory networkPolicy networkTools nodeSelector "
        "podNameTemplate profileList serviceAccountName startTimeout storage uid "
    ),
    "singleuser.image": "name pullPolicy pullSecrets tag",
    "singleuser.memory": "guarantee limit",
    "singleuser.cpu": "guarantee limit",
    "singleuser.storage": (
        "capacity dynamic extraLabels extraVolumeMounts extraVolumes homeMountPath static type"
    ),
    "singleuser.cloudMetadata": "blockWithIptables ip",
    "singleuser.networkPolicy": (
        "allowedIngressPorts egress egressAllowRules enabled ingress interNamespaceAccessLabels"
    ),
    "scheduling": "corePods podPriority userPlaceholder userPods userScheduler",
    "scheduling.userScheduler": (
        "annotations containerSecurityContext enabled extraPodSpec image labels logLevel "
        "nodeSelector pdb pluginConfig plugins replicas resources revisionHistoryLimit "
        "serviceAccount tolerations "
    ),
    "scheduling.podPriority": (
        "defaultPriority enabled globalDefault imagePullerPriority userPlaceholderPriority"
    ),
    "scheduling.userPlaceholder": (
        "annotations containerSecurityContext enabled extraPodSpec image labels replicas "
        "resources revisionHistoryLimit "
    ),
    "prePuller": (
        "annotations containerSecurityContext continuous extraImages extraTolerations hook "
        "labels pause pullProfileListImages resources revisionHistoryLimit "
    ),
    "prePuller.hook": (
        "containerSecurityContext daemonsetAnnotations enabled image nodeSelector "
        "podSchedulingWaitDuration pullOnlyOnChanges resources serviceAccount "
        "serviceAccountImagePuller tolerations "
    ),
    "prePuller.continuous": "daemonsetAnnotations enabled serviceAccount",
    "cull": "adminUsers concurrency enabled every maxAge removeNamedServers timeout users",
}
# Objects whose keys are free (names of env variables, config snippets, images,
# traitlets classes, services, roles): not descended into. hub.services and
# hub.loadRoles are additionalProperties: true in the schema, as are the
# service objects in them.
OPEN_OBJECTS = {"hub.config", "hub.extraEnv", "hub.extraConfig", "singleuser.extraEnv",
                "prePuller.extraImages", "hub.services", "hub.loadRoles"}
# The chart's enum for singleuser.storage.type (same schema).
STORAGE_TYPES = {"dynamic", "static", "none"}


# --- every file parses --------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.yaml")), ids=lambda p: p.name)
def test_every_yaml_file_parses(path: Path) -> None:
    assert documents(path)


def test_every_manifest_is_a_kubernetes_object() -> None:
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path == VALUES:
            continue
        for doc in documents(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path.name
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", doc["metadata"]["name"])


# --- values.yaml against the chart -----------------------------------------------------

def test_values_keys_exist_in_the_chart() -> None:
    unknown: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if path in OPEN_OBJECTS:
            return
        known = CHART_KEYS.get(path)
        assert known is not None, f"{path}: add the chart's keys for it to CHART_KEYS"
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            if key not in known.split():
                unknown.append(where)
            elif isinstance(value, dict) and value:
                walk(value, where)

    walk(values(), "")
    assert unknown == []


def test_values_hub_config_sections_are_class_names() -> None:
    # the chart's schema: hub.config keys match ^[A-Z] (else the hub exits)
    assert all(re.match(r"[A-Z]", k) for k in values()["hub"]["config"])


def test_values_storage_type_is_the_charts() -> None:
    assert values()["singleuser"]["storage"]["type"] in STORAGE_TYPES


def test_values_switch_off_what_the_last_step_refuses() -> None:
    singleuser = values()["singleuser"]
    # the chart's 1G memory guarantee would differ from each role's request
    assert singleuser["memory"] == {"guarantee": None}
    assert singleuser["cpu"] == {"limit": None, "guarantee": None}
    # the chart's home volume would be a second mount at /home/jovyan
    assert singleuser["storage"]["type"] == "none"
    # the chart's privileged, root init container
    assert singleuser["cloudMetadata"]["blockWithIptables"] is False
    assert singleuser["profileList"] == []
    assert singleuser["allowPrivilegeEscalation"] is False
    for key in ("extraResource", "extraPodConfig", "initContainers", "extraContainers",
                "lifecycleHooks"):
        assert key not in singleuser


def test_values_cull_thirty_minutes_every_minute() -> None:
    cull = values()["cull"]
    assert cull["enabled"] is True
    assert (cull["timeout"], cull["every"], cull["maxAge"]) == (1800, 60, 0)
    assert values()["singleuser"]["extraEnv"]["JUPYTERHUB_ACTIVITY_INTERVAL"] == "60"


def test_values_hub_image_is_the_dockerfiles() -> None:
    dockerfile = (DEPLOY / "Dockerfile.hub").read_text()
    assert re.search(rf"^FROM quay\.io/jupyterhub/k8s-hub:{re.escape(CHART_VERSION)}$",
                     dockerfile, re.M)
    extras = re.search(r'"/src\[([a-z,]+)\]"', dockerfile)
    assert extras and extras.group(1).split(",") == ["kubernetes", "postgresql"]
    import tomllib

    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("psycopg") for d in optional["postgresql"])  # psycopg 3
    assert '"jupyterhub-idle-culler>=2,<3"' in dockerfile
    assert f"--version {CHART_VERSION}" in VALUES.read_text()
    templates = re.search(r"^COPY hub_config/templates/ (\S+)/$", dockerfile, re.M)
    assert templates and values()["hub"]["templatePaths"] == [templates.group(1)]
    # the spawner's own code, not the Docker hub's config
    for path in re.findall(r"^COPY (\S+) ", dockerfile, re.M):
        assert (ROOT / path).exists(), path


# --- hub.extraConfig ------------------------------------------------------------------

def test_extra_config_compiles() -> None:
    for key, source in values()["hub"]["extraConfig"].items():
        compile(source, f"hub.extraConfig.{key}", "exec")


def test_extra_config_sets_the_spawner(monkeypatch: pytest.MonkeyPatch) -> None:
    c = run_extra_config(monkeypatch)
    assert c.JupyterHub.spawner_class == "quota-kube"
    spawner = c.QuotaKubeSpawner
    assert spawner.usage_db == MEMORY_LEDGER  # the Secret's, as given
    KubeOptions(**spawner.kube_options)  # the spawner refuses every start when invalid
    singleuser = values()["singleuser"]
    assert (spawner.notebook_uid, spawner.notebook_gid) == (singleuser["uid"],
                                                            singleuser["fsGid"])


def test_the_quota_file_is_in_the_configmap_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    hub = values()["hub"]
    (mount,) = [m for m in hub["extraVolumeMounts"] if m["name"] == "quota-table"]
    (volume,) = [v for v in hub["extraVolumes"] if v["name"] == "quota-table"]
    assert "subPath" not in mount  # a subPath mount never sees the kubelet's updates
    assert mount["readOnly"] is True
    (configmap,) = documents(DEPLOY / "quotas-configmap.yaml")
    assert volume["configMap"] == {"name": configmap["metadata"]["name"]}
    assert "items" not in volume["configMap"]
    c = run_extra_config(monkeypatch)
    assert c.QuotaKubeSpawner.quota_file == f"{mount['mountPath']}/quotas.yaml"
    assert list(configmap["data"]) == ["quotas.yaml"]


def test_extra_config_gives_the_charts_culler_the_arbiter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = run_extra_config(monkeypatch)
    (culler,) = [s for s in c.JupyterHub.services if s["name"] == CHART_CULLER["name"]]
    assert culler["command"][:len(CHART_CULLER["command"])] == CHART_CULLER["command"]
    config = [a for a in culler["command"] if a.startswith("--config=")]
    assert len(config) == 1
    arbiter = Path(config[0].removeprefix("--config="))
    assert arbiter == ROOT / "spawner" / "hubconfig" / "culler_config.py"
    assert "cull_arbiter_hook" in arbiter.read_text()
    assert culler["environment"] == {
        "QUOTA_SPAWNER_QUOTA_FILE": c.QuotaKubeSpawner.quota_file,
        "QUOTA_SPAWNER_MAX_AGE": "0",
        "QUOTA_SPAWNER_USAGE_DB": c.QuotaKubeSpawner.usage_db}  # cull reasons, in the ledger


def test_extra_config_login_and_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    c = run_extra_config(monkeypatch)
    assert c.JupyterHub.authenticator_class == "shared-password"
    assert c.SharedPasswordAuthenticator.user_password == GOOD_USER_PASSWORD
    assert c.SharedPasswordAuthenticator.admin_password == GOOD_ADMIN_PASSWORD
    assert any("cs101" in str(role) for role in c.JupyterHub.load_roles)
    groups = values()["hub"]["config"]["JupyterHub"]["load_groups"]
    table = load_quota_table(TABLE)
    # every group the shipped table assigns exists in the hub
    assert set(table.groups) <= set(groups)


def test_extra_config_creates_the_ledger_of_the_secrets_url(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """At each hub start, as on Docker: the usage service and the watchdog only wait
    for it."""
    from spawner.usage.ledger import Ledger

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    c = run_extra_config(monkeypatch, usage_db=url)
    assert c.QuotaKubeSpawner.usage_db == url
    Ledger(url, create=False).dispose()  # there, and at this code's revision


@pytest.mark.parametrize(("url", "says"), [
    ("", "Secret quota-spawner-usage-db"),
    ("postgresql+psycopg://quota:s3cret@db:5432:x/y", "not a SQLAlchemy URL")])
def test_extra_config_refuses_no_or_a_broken_ledger_url(
        monkeypatch: pytest.MonkeyPatch, url: str, says: str) -> None:
    with pytest.raises(SystemExit, match=says) as refused:
        run_extra_config(monkeypatch, usage_db=url)
    assert "s3cret" not in str(refused.value)


def test_one_ledger_secret_for_the_hub_the_watchdog_and_the_usage_service() -> None:
    secret = {"name": "quota-spawner-usage-db", "key": "url"}
    assert values()["hub"]["extraEnv"]["QUOTA_SPAWNER_USAGE_DB"] == {
        "valueFrom": {"secretKeyRef": secret}}  # not optional: no hub without its ledger
    env = {e["name"]: e for e in watchdog_container()["env"]}
    assert env["QUOTA_SPAWNER_USAGE_DB"]["valueFrom"] == {"secretKeyRef": secret}
    (usage,) = [d for d in documents(DEPLOY / "usage-service.yaml") if d["kind"] == "Deployment"]
    (container,) = usage["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["QUOTA_SPAWNER_USAGE_DB"]["valueFrom"] == {"secretKeyRef": secret}
    text = VALUES.read_text()
    assert "create secret generic quota-spawner-usage-db" in text
    assert "--from-literal=url='postgresql+psycopg://" in text


@pytest.mark.parametrize(("user", "admin"), [
    ("", GOOD_ADMIN_PASSWORD), (GOOD_USER_PASSWORD, ""), (GOOD_USER_PASSWORD, "short"),
    (GOOD_ADMIN_PASSWORD, GOOD_ADMIN_PASSWORD)])
def test_extra_config_refuses_weak_passwords(monkeypatch: pytest.MonkeyPatch, user: str,
                                             admin: str) -> None:
    with pytest.raises(SystemExit, match="quota-spawner-passwords"):
        run_extra_config(monkeypatch, user, admin)


# --- the quota table's ConfigMap ------------------------------------------------------

def test_the_configmap_holds_the_shipped_table_byte_for_byte() -> None:
    (configmap,) = documents(DEPLOY / "quotas-configmap.yaml")
    assert configmap["kind"] == "ConfigMap"
    assert configmap["data"]["quotas.yaml"].encode() == TABLE.read_bytes()


# --- the device plugin's time-slicing -----------------------------------------------

def plugin_configs() -> dict[str, Any]:
    (configmap,) = documents(DEPLOY / "time-slicing-config.yaml")
    assert configmap["kind"] == "ConfigMap"
    return {name: yaml.safe_load(text) for name, text in configmap["data"].items()}


def test_time_slicing_shares_under_the_spawners_resource_name() -> None:
    configs = plugin_configs()
    assert all(config["version"] == "v1" for config in configs.values())
    assert "sharing" not in configs["exclusive"]
    slicing = configs["shared"]["sharing"]["timeSlicing"]
    assert slicing["renameByDefault"] is True  # <name>.shared
    assert slicing["failRequestsGreaterThanOne"] is True
    (resource,) = slicing["resources"]
    options = KubeOptions()
    assert resource["name"] == options.gpu_resource
    assert resource["name"] + ".shared" == options.gpu_resource + options.shared_suffix
    assert options.shared_suffix == ".shared"


def test_time_slicing_replicas_are_the_tables_gpu_share() -> None:
    (resource,) = plugin_configs()["shared"]["sharing"]["timeSlicing"]["resources"]
    shared = [r for r in load_quota_table(TABLE).roles.values()
              if r.gpus and r.gpu_mode == "shared"]
    assert shared, "the shipped table has a shared role"
    assert {r.gpu_share for r in shared} == {resource["replicas"]}


def test_values_kube_options_match_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    options = KubeOptions(**run_extra_config(monkeypatch).QuotaKubeSpawner.kube_options)
    (resource,) = plugin_configs()["shared"]["sharing"]["timeSlicing"]["resources"]
    assert options.gpu_resource == resource["name"]
    assert options.shared_suffix == ".shared"


# --- the PriorityClasses ----------------------------------------------------------------

def test_priority_classes_are_the_commands_output(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["k8s", "priority-classes", "hub_config/quotas.yaml"]) == 0
    # regenerate: quota-spawner k8s priority-classes hub_config/quotas.yaml \
    #   > deploy/kubernetes/priority-classes.yaml
    assert (DEPLOY / "priority-classes.yaml").read_text() == capsys.readouterr().out


def test_every_role_has_its_priority_class() -> None:
    names = {d["metadata"]["name"] for d in documents(DEPLOY / "priority-classes.yaml")
             if d["kind"] == "PriorityClass"}
    assert names == {class_name(role) for role in load_quota_table(TABLE).roles}


# --- the home copy helper -------------------------------------------------------------

def test_home_copy_pod_is_restricted_and_mounts_the_users_claim() -> None:
    (pod,) = documents(DEPLOY / "home-copy-pod.yaml")
    assert restricted_violations(pod) == []
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == home_claim_name("alice")
    (container,) = pod["spec"]["containers"]
    assert container["volumeMounts"][0]["mountPath"] == KubeOptions().home_dir
    context = pod["spec"]["securityContext"]
    assert (context["runAsUser"], context["fsGroup"]) == (1000, 100)


# --- the hub's patch of the home claims -------------------------------------------------

def test_the_hub_may_patch_claims_and_nothing_more() -> None:
    """A bigger role grows its claim by a patch, which the chart's hub Role does not
    grant (get, watch, list, create, delete)."""
    pytest.importorskip("kubernetes")
    from kube_models import strict

    objects = {doc["kind"]: doc for doc in documents(DEPLOY / "hub-claims-role.yaml")}
    assert sorted(objects) == ["Role", "RoleBinding"]
    for kind, doc in objects.items():
        strict(doc, f"V1{kind}")
        assert doc["metadata"]["namespace"] == "jhub"
    (rule,) = objects["Role"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["persistentvolumeclaims"],
                    "verbs": ["patch"]}
    binding = objects["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": objects["Role"]["metadata"]["name"]}
    # the chart's hub ServiceAccount, whose pod runs the spawner
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub",
                                    "namespace": "jhub"}]
    assert "serviceAccount" not in values()["hub"]  # so the chart names it "hub"


def test_extra_config_builds_the_hub_as_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """So that the hub's log says what a home is (and the budget duties start) at the
    hub's start, not at the first spawn."""
    from spawner.policy import hub

    calls: list[Any] = []
    monkeypatch.setattr(hub, "build_at_hub_start", calls.append)
    run_extra_config(monkeypatch)
    assert len(calls) == 1 and calls[0].name == "JupyterHub"


# --- the watchdog's DaemonSet -----------------------------------------------------------


def test_watchdog_manifests_read_strictly_into_the_clients_models() -> None:
    pytest.importorskip("kubernetes")
    from kube_models import strict

    objects = watchdog_objects()
    assert sorted(objects) == ["ConfigMap", "DaemonSet", "Role", "RoleBinding",
                               "ServiceAccount"]
    for kind, doc in objects.items():
        strict(doc, f"V1{kind}")
        assert doc["metadata"]["namespace"] == "jhub"


def test_watchdog_may_only_read_pods() -> None:
    objects = watchdog_objects()
    (rule,) = objects["Role"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    binding, account = objects["RoleBinding"], objects["ServiceAccount"]
    assert binding["roleRef"]["name"] == objects["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "jhub"}]
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_watchdog_sees_the_node() -> None:
    daemonset = watchdog_objects()["DaemonSet"]
    template = daemonset["spec"]["template"]
    assert template["metadata"]["labels"]["hub.jupyter.org/network-access-hub"] == "true"
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    pod = template["spec"]
    assert pod["hostPID"] is True  # NVML's PIDs are the node's
    container = watchdog_container()
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["QUOTA_SPAWNER_WATCHDOG_SOURCE"]["value"] == "kubernetes"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["host-cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup"
    cgroup_arg = f"--QuotaWatchdog.cgroup_root={mounts['host-cgroup']['mountPath']}"
    assert cgroup_arg in container["args"] and mounts["host-cgroup"]["readOnly"] is True
    assert volumes["config"]["configMap"]["name"] == watchdog_objects()["ConfigMap"][
        "metadata"]["name"]


def test_watchdog_and_hub_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same hub id, the same token, the hub's API where the chart serves it."""
    c = run_extra_config(monkeypatch)
    env = {e["name"]: e for e in watchdog_container()["env"]}
    assert env["QUOTA_SPAWNER_HUB_ID"]["value"] == c.QuotaKubeSpawner.hub_id
    token = values()["hub"]["extraEnv"]["QUOTA_SPAWNER_WATCHDOG_TOKEN"]["valueFrom"]
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": token["secretKeyRef"]["name"], "key": token["secretKeyRef"]["key"]}
    assert env["JUPYTERHUB_API_URL"]["value"] == "http://hub:8081/hub/api"


def test_extra_config_lets_the_watchdog_log_in_with_its_scopes_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from spawner.watchdog.service import WATCHDOG_SCOPES

    assert not [s for s in run_extra_config(monkeypatch).JupyterHub.services
                if s["name"] == "gpu-watchdog"]  # no Secret: no watchdog
    monkeypatch.setenv("QUOTA_SPAWNER_WATCHDOG_TOKEN", "f" * 64)
    c = run_extra_config(monkeypatch)
    (service,) = [s for s in c.JupyterHub.services if s["name"] == "gpu-watchdog"]
    assert service == {"name": "gpu-watchdog", "api_token": "f" * 64}
    (role,) = [r for r in c.JupyterHub.load_roles if r["name"] == "gpu-watchdog"]
    assert role == {"name": "gpu-watchdog", "scopes": list(WATCHDOG_SCOPES),
                    "services": ["gpu-watchdog"]}
    monkeypatch.setenv("QUOTA_SPAWNER_WATCHDOG_TOKEN", "short")
    with pytest.raises(SystemExit, match="at least 32 characters"):
        run_extra_config(monkeypatch)


WATCHDOG_PROBE = """\
import json, sys
from spawner.watchdog.app import QuotaWatchdog
app = QuotaWatchdog()
app.initialize(sys.argv[1:])
pods = app.containers
print(json.dumps({"source": type(pods).__name__, "oom_source": app.oom_events is pods,
                  "node": pods.node, "namespace": pods.namespace, "hub": pods.hub_id,
                  "cgroup_root": str(app.cgroups.root), "usage_db": app.usage_db,
                  "events_file": app.events_file, "hub_url": app.hub_url,
                  "api_url": app.hub_api_url}))
"""


def test_watchdog_starts_as_the_daemonset_runs_it(tmp_path: Path) -> None:
    """``python -m spawner.watchdog``'s app initialised in a process of its own with the
    DaemonSet's environment, arguments and ConfigMap. No cluster: the API client is
    made from a kubeconfig that points nowhere, and initialising calls nothing."""
    pytest.importorskip("kubernetes")
    import json
    import subprocess
    import sys

    from shipped_config import KUBECONFIG  # a kubeconfig that points nowhere

    config = tmp_path / "watchdog_config.py"
    config.write_text(watchdog_objects()["ConfigMap"]["data"]["watchdog_config.py"])
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    container = watchdog_container()
    fields = {"spec.nodeName": "gpu-node-3", "metadata.namespace": "jhub"}
    ledger = "postgresql+psycopg://quota:pw@db.example.org:5432/quota_usage"
    secrets = {("quota-spawner-watchdog", "token"): "t" * 64,
               ("quota-spawner-usage-db", "url"): ledger}
    env = {"PATH": os.environ["PATH"], "KUBECONFIG": str(kubeconfig)}
    for entry in container["env"]:
        source = entry.get("valueFrom") or {}
        ref = source.get("secretKeyRef")
        env[entry["name"]] = (fields[source["fieldRef"]["fieldPath"]] if "fieldRef" in source
                              else secrets[ref["name"], ref["key"]] if ref else entry["value"])
    env["QUOTA_SPAWNER_STATE_DIR"] = str(tmp_path)  # the hostPath volume's place
    args = [f"--config-file={config}" if a.startswith("--config-file=") else a
            for a in container["args"]]
    assert container["command"] == ["python3", "-m", "spawner.watchdog"]
    done = subprocess.run([sys.executable, "-c", WATCHDOG_PROBE, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"source": "Pods", "oom_source": True, "node": "gpu-node-3",
                    "namespace": "jhub", "hub": "quota-jhub",
                    "cgroup_root": "/host/sys/fs/cgroup", "usage_db": ledger,
                    "events_file": "", "hub_url": "https://hub.example.org",
                    "api_url": "http://hub:8081/hub/api"}
