"""spawner/kube/checks.py: what is refused before a pod reaches the API.

``quota_violations`` one tampering at a time, ``config_problems`` one field the
quota owns at a time (a hostile value refused by name, an equal one written as
KubeSpawner writes it not), and what the quota does not own refused after
``apply_quota``; on KubeSpawner's own ``make_pod`` too.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from kube_shapes import CPU_ONLY, EXCLUSIVE, IMAGE, G, kubespawner_pod, spec_for
from kube_shapes import first_container as _container

from spawner.kube import pod as kp
from spawner.kube.checks import config_problems, quota_violations, violations
from spawner.kube.notebook import NotebookPod


async def test_what_apply_quota_does_not_fix_is_refused():
    spec = spec_for(CPU_ONLY)
    pod = await kubespawner_pod(
        init_containers=[{"name": "chown", "image": "busybox",
                          "securityContext": {"runAsUser": 0}}],
        extra_containers=[{"name": "sidecar", "image": "miner"}],
        volumes=[{"name": "host", "hostPath": {"path": "/"}}],
        extra_container_config={"envFrom": [{"configMapRef": {"name": "evil"}}]})
    kp.apply_quota(pod, spec)
    problems = "\n".join(violations(pod, spec))
    assert "spec.initContainers is set" in problems
    assert "spec.containers has ['sidecar']" in problems
    assert "envFrom is set" in problems
    assert "volume 'host' is of type ['hostPath']" in problems
    assert "spec.initContainers['chown'].securityContext.runAsUser is 0" in problems


# --- the quota's invariants, one tampering at a time ---------------------------------

TAMPERING = [
    ("more cpu", lambda p: _container(p)["resources"]["limits"].update(cpu="64"), "resources are"),
    ("a gpu on a cpu role", lambda p: _container(p)["resources"]["limits"].update(
        {"nvidia.com/gpu": "1"}), "resources are"),
    ("other image", lambda p: _container(p).update(image="evil"), "the image is 'evil'"),
    ("class", lambda p: p["spec"].update(priorityClassName="system-node-critical"),
     "spec.priorityClassName is 'system-node-critical'"),
    ("grace", lambda p: p["spec"].update(terminationGracePeriodSeconds=0),
     "spec.terminationGracePeriodSeconds is 0"),
    ("token", lambda p: p["spec"].pop("automountServiceAccountToken"),
     "spec.automountServiceAccountToken is None"),
    ("pod resources", lambda p: p["spec"].update(resources={"limits": {"cpu": "64"}}),
     "spec.resources (pod-level)"),
    ("label", lambda p: p["metadata"]["labels"].update({"quota-spawner.role": "admin"}),
     "label quota-spawner.role is 'admin'"),
    ("extra label", lambda p: p["metadata"]["labels"].update({"quota-spawner.x": "1"}),
     "label quota-spawner.x is not one the spawner writes"),
    ("annotation", lambda p: p["metadata"]["annotations"].update({"quota-spawner.user": "bob"}),
     "annotation quota-spawner.user is 'bob'"),
    ("env twice", lambda p: _container(p)["env"].append({"name": "MEM_LIMIT", "value": "1"}),
     "environment MEM_LIMIT is"),
    ("env from a secret", lambda p: _container(p)["env"].append(
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
     "environment NVIDIA_VISIBLE_DEVICES is"),
    ("no shm", lambda p: p["spec"]["volumes"].pop(), "volume quota-shm is None"),
    ("small shm", lambda p: p["spec"]["volumes"][1]["emptyDir"].update(sizeLimit="64Mi"),
     "volume quota-shm is"),
    ("shm on disk", lambda p: p["spec"]["volumes"][1]["emptyDir"].pop("medium"),
     "volume quota-shm is"),
    ("other home", lambda p: p["spec"]["volumes"][0]["persistentVolumeClaim"].update(
        claimName="quota-home-bob"), "volume quota-home is"),
    ("home mounted twice", lambda p: _container(p)["volumeMounts"].append(
        {"name": "quota-shm", "mountPath": "/home/jovyan"}), "/home/jovyan is mounted as"),
    ("root group", lambda p: p["spec"]["securityContext"].update(runAsGroup=0),
     "spec.securityContext.runAsGroup is 0"),
    ("fsGroup", lambda p: p["spec"]["securityContext"].update(fsGroup=0),
     "spec.securityContext.fsGroup is 0"),
    ("root as a supplemental group", lambda p: p["spec"]["securityContext"].update(
        supplementalGroups=[100, 0]), "supplementalGroups has 0"),
    ("no container", lambda p: _container(p).update(name="other"),
     "no container named 'notebook'"),
]


@pytest.mark.parametrize(("why", "tamper", "message"), TAMPERING, ids=[t[0] for t in TAMPERING])
def test_quota_violations(why, tamper, message):
    spec = spec_for(replace(CPU_ONLY, shm=G))
    pod = kp.pod_manifest(spec, "p")
    assert quota_violations(pod, spec) == []
    tamper(pod)
    problems = quota_violations(pod, spec)
    assert any(message in p for p in problems), problems


def test_root_user_is_a_violation():
    spec = spec_for(CPU_ONLY, uid=0)
    problems = violations(kp.pod_manifest(spec, "p"), spec)
    assert "the notebook user is 0:100: never root, never the root group" in problems
    assert "spec.securityContext.runAsUser is 0" in problems


def test_torch_alloc_conf_of_the_admin_stays_without_a_cap():
    spec = spec_for(CPU_ONLY)
    pod = kp.pod_manifest(spec, "p")
    _container(pod)["env"].append({"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"})
    assert violations(pod, spec) == []


# --- config_problems: what the configuration set that the quota owns ----------------
# Each row sets one field the quota owns on a pod that already holds the quota (the
# configuration's pod, before apply_quota): a hostile value is refused by name, an
# equal one (written as KubeSpawner writes it) is not.

CFG_SPEC = spec_for(replace(CPU_ONLY, shm=G))
GPU_SPEC = spec_for(EXCLUSIVE)


def _set(path: str, value: Any) -> Any:
    """A tamper that sets spec.<path> (dots; "c." for the notebook container)."""
    def tamper(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = pod
        for key in parents:
            node = _container(pod) if key == "c" else node.setdefault(key, {})
        node[last] = value
    return tamper


def _meta(what: str, key: str, value: str) -> Any:
    return lambda p: p["metadata"][what].update({key: value})


def _env(name: str, value: Any) -> Any:
    """A tamper that sets one variable (a str, or an entry's other keys as a dict)."""
    entry = {"name": name, **(value if isinstance(value, dict) else {"value": value})}

    def tamper(pod: dict[str, Any]) -> None:
        container = _container(pod)
        container["env"] = [e for e in container["env"] if e["name"] != name] + [entry]
    return tamper


def _resource(kind: str, name: str, value: Any) -> Any:
    return lambda p: _container(p)["resources"][kind].update({name: value})


def _volume(name: str, value: dict[str, Any]) -> Any:
    def tamper(pod: dict[str, Any]) -> None:
        pod["spec"]["volumes"] = [v for v in pod["spec"]["volumes"] if v["name"] != name]
        pod["spec"]["volumes"].append({"name": name, **value})
    return tamper


def _mount(mount: dict[str, str]) -> Any:
    return lambda p: _container(p)["volumeMounts"].append(mount)


def _port(**fields: Any) -> Any:
    return lambda p: _container(p)["ports"][0].update(fields)


SECRET = {"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
HOME = {"persistentVolumeClaim": {"claimName": CFG_SPEC.claim_name}}
SHM = {"emptyDir": {"medium": "Memory", "sizeLimit": str(G)}}

# (field, spec, hostile tamper, the problem that names it, an equal tamper or None)
CONFIG_ROWS = [
    # resources: by value, as KubeSpawner writes them (8.0, an int of bytes)
    ("cpu limit", CFG_SPEC, _resource("limits", "cpu", "64"),
     "container notebook: resources.limits.cpu is '64', not '500m'",
     _resource("limits", "cpu", 0.5)),
    ("memory limit", CFG_SPEC, _resource("limits", "memory", 2**40),
     f"container notebook: resources.limits.memory is {2**40}, not '{2 * G}'",
     _resource("limits", "memory", 2 * G)),
    ("memory limit in Gi", CFG_SPEC, _resource("limits", "memory", "3Gi"),
     "resources.limits.memory is '3Gi'", _resource("limits", "memory", "2Gi")),
    ("cpu request", CFG_SPEC, _resource("requests", "cpu", "4"),
     "container notebook: resources.requests.cpu is '4', not '500m'",
     _resource("requests", "cpu", "500m")),
    ("a GPU on a CPU role", CFG_SPEC, _resource("limits", "nvidia.com/gpu", "8"),
     "container notebook: resources.limits.nvidia.com/gpu is '8', not None", None),
    ("more GPUs", GPU_SPEC, _resource("limits", "nvidia.com/gpu", "8"),
     "container notebook: resources.limits.nvidia.com/gpu is '8', not '2'",
     _resource("limits", "nvidia.com/gpu", 2)),
    ("cpu limit 8.0", GPU_SPEC, _resource("limits", "cpu", "9"),
     "resources.limits.cpu is '9', not '8'", _resource("limits", "cpu", 8.0)),
    ("ephemeral storage", CFG_SPEC, _resource("limits", "ephemeral-storage", "100Gi"),
     "container notebook: resources.limits.ephemeral-storage is '100Gi', not None", None),
    ("a DRA claim", CFG_SPEC, _set("c.resources.claims", [{"name": "gpu"}]),
     "container notebook: resources.claims is [{'name': 'gpu'}]: the role sizes",
     _set("c.resources.claims", [])),
    ("pod-level resources", CFG_SPEC, _set("spec.resources", {"limits": {"cpu": "64"}}),
     "spec.resources is {'limits': {'cpu': '64'}}: the role sizes the container",
     _set("spec.resources", {})),
    ("image", CFG_SPEC, _set("c.image", "evil"),
     f"container notebook: image is 'evil', not {IMAGE!r}", _set("c.image", IMAGE)),
    # the pod's securityContext
    ("pod runAsUser", CFG_SPEC, _set("spec.securityContext.runAsUser", 0),
     "spec.securityContext.runAsUser is 0, not 1000",
     _set("spec.securityContext.runAsUser", 1000)),
    ("pod runAsNonRoot", CFG_SPEC, _set("spec.securityContext.runAsNonRoot", False),
     "spec.securityContext.runAsNonRoot is False, not True",
     _set("spec.securityContext.runAsNonRoot", True)),
    ("pod runAsGroup", CFG_SPEC, _set("spec.securityContext.runAsGroup", 0),
     "spec.securityContext.runAsGroup is 0, not 100",
     _set("spec.securityContext.runAsGroup", 100)),
    ("fsGroup", CFG_SPEC, _set("spec.securityContext.fsGroup", 0),
     "spec.securityContext.fsGroup is 0, not 100", _set("spec.securityContext.fsGroup", 100)),
    ("fsGroupChangePolicy", CFG_SPEC, _set("spec.securityContext.fsGroupChangePolicy", "Always"),
     "spec.securityContext.fsGroupChangePolicy is 'Always'", None),
    ("pod seccomp", CFG_SPEC, _set("spec.securityContext.seccompProfile", {"type": "Unconfined"}),
     "spec.securityContext.seccompProfile is {'type': 'Unconfined'}",
     _set("spec.securityContext.seccompProfile", {"type": "RuntimeDefault"})),
    # the container's securityContext
    ("privileged", CFG_SPEC, _set("c.securityContext.privileged", True),
     "container notebook: securityContext.privileged is True, not False",
     _set("c.securityContext.privileged", False)),
    ("allowPrivilegeEscalation", CFG_SPEC, _set("c.securityContext.allowPrivilegeEscalation", True),
     "container notebook: securityContext.allowPrivilegeEscalation is True, not False",
     _set("c.securityContext.allowPrivilegeEscalation", False)),
    ("container runAsUser", CFG_SPEC, _set("c.securityContext.runAsUser", 0),
     "container notebook: securityContext.runAsUser is 0, not 1000",
     _set("c.securityContext.runAsUser", 1000)),
    ("container runAsNonRoot", CFG_SPEC, _set("c.securityContext.runAsNonRoot", False),
     "container notebook: securityContext.runAsNonRoot is False, not True", None),
    ("capabilities", CFG_SPEC,
     _set("c.securityContext.capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
     "container notebook: securityContext.capabilities is {'drop': ['ALL'], 'add': ",
     _set("c.securityContext.capabilities", {"drop": ["ALL"]})),
    ("container seccomp", CFG_SPEC,
     _set("c.securityContext.seccompProfile", {"type": "Unconfined"}),
     "container notebook: securityContext.seccompProfile is {'type': 'Unconfined'}", None),
    # volumes and mounts the quota owns
    ("home as hostPath", CFG_SPEC, _volume("quota-home", {"hostPath": {"path": "/"}}),
     "volume quota-home is {'name': 'quota-home', 'hostPath': {'path': '/'}}",
     _volume("quota-home", HOME)),
    ("another user's home", CFG_SPEC,
     _volume("quota-home", {"persistentVolumeClaim": {"claimName": "quota-home-bob"}}),
     "volume quota-home is", None),
    ("bigger shm", CFG_SPEC, _volume("quota-shm", {"emptyDir": {"medium": "Memory"}}),
     "volume quota-shm is {'name': 'quota-shm', 'emptyDir': {'medium': 'Memory'}}",
     _volume("quota-shm", SHM)),
    ("home mounted from elsewhere", CFG_SPEC,
     _mount({"name": "data", "mountPath": "/home/jovyan"}),
     "container notebook: /home/jovyan is mounted as {'name': 'data'",
     _mount({"name": "quota-home", "mountPath": "/home/jovyan"})),
    ("shm mounted from elsewhere", CFG_SPEC, _mount({"name": "data", "mountPath": "/dev/shm"}),
     "container notebook: /dev/shm is mounted as", None),
    ("home mounted at another path", CFG_SPEC,
     _mount({"name": "quota-home", "mountPath": "/data", "subPath": "x"}),
     "container notebook: volume quota-home is mounted as {'name': 'quota-home', "
     "'mountPath': '/data', 'subPath': 'x'}", None),
    # host namespaces and ports
    ("hostNetwork", CFG_SPEC, _set("spec.hostNetwork", True),
     "spec.hostNetwork is True: the pod shares the node's namespace",
     _set("spec.hostNetwork", False)),
    ("hostPID", CFG_SPEC, _set("spec.hostPID", True), "spec.hostPID is True",
     _set("spec.hostPID", False)),
    ("hostIPC", CFG_SPEC, _set("spec.hostIPC", True), "spec.hostIPC is True",
     _set("spec.hostIPC", False)),
    ("hostPort", CFG_SPEC, _port(hostPort=8888), "container notebook: ports has hostPort 8888",
     _port(hostPort=0)),
    ("hostIP", CFG_SPEC, _port(hostIP="0.0.0.0"), "container notebook: ports has hostIP 0.0.0.0",
     None),
    # the quota-spawner.* labels and annotations
    ("role label", CFG_SPEC, _meta("labels", "quota-spawner.role", "admin"),
     "metadata.labels.quota-spawner.role is 'admin', not 'student'",
     _meta("labels", "quota-spawner.role", "student")),
    ("a label of our own", CFG_SPEC, _meta("labels", "quota-spawner.x", "1"),
     "metadata.labels.quota-spawner.x is '1', not None", None),
    ("protected label", CFG_SPEC, _meta("labels", "quota-spawner.protected", "true"),
     "metadata.labels.quota-spawner.protected is 'true', not None", None),
    ("user annotation", CFG_SPEC, _meta("annotations", "quota-spawner.user", "bob"),
     "metadata.annotations.quota-spawner.user is 'bob', not 'alice'",
     _meta("annotations", "quota-spawner.user", "alice")),
    ("gpus annotation", CFG_SPEC, _meta("annotations", "quota-spawner.gpus", "GPU-1"),
     "metadata.annotations.quota-spawner.gpus is 'GPU-1', not ''", None),
    # the environment of the contract
    ("NVIDIA_VISIBLE_DEVICES on a CPU role", CFG_SPEC, _env("NVIDIA_VISIBLE_DEVICES", "all"),
     "container notebook: environment NVIDIA_VISIBLE_DEVICES is 'all', not 'void'",
     _env("NVIDIA_VISIBLE_DEVICES", "void")),
    ("NVIDIA_VISIBLE_DEVICES on a GPU role", GPU_SPEC, _env("NVIDIA_VISIBLE_DEVICES", "0,1"),
     "environment NVIDIA_VISIBLE_DEVICES is '0,1', not None: the spawner sets it", None),
    ("NVIDIA_VISIBLE_DEVICES from a secret", CFG_SPEC, _env("NVIDIA_VISIBLE_DEVICES", SECRET),
     "container notebook: environment NVIDIA_VISIBLE_DEVICES is {'name':", None),
    ("thread count", CFG_SPEC, _env("OMP_NUM_THREADS", "64"),
     "container notebook: environment OMP_NUM_THREADS is '64', not '1'",
     _env("OMP_NUM_THREADS", "1")),
    ("MEM_LIMIT", CFG_SPEC, _env("MEM_LIMIT", "1"),
     f"container notebook: environment MEM_LIMIT is '1', not '{2 * G}'",
     _env("MEM_LIMIT", str(2 * G))),
    ("CPU_LIMIT as JupyterHub writes it", GPU_SPEC, _env("CPU_LIMIT", "64.0"),
     "container notebook: environment CPU_LIMIT is '64.0', not '8'", _env("CPU_LIMIT", "8.0")),
    ("QUOTA_ROLE", CFG_SPEC, _env("QUOTA_ROLE", "admin"),
     "container notebook: environment QUOTA_ROLE is 'admin', not 'student'",
     _env("QUOTA_ROLE", "student")),
    # the PriorityClass, the grace period, the API token
    ("priority class", CFG_SPEC, _set("spec.priorityClassName", "system-node-critical"),
     "spec.priorityClassName is 'system-node-critical', not 'quota-spawner-student'",
     _set("spec.priorityClassName", "quota-spawner-student")),
    ("priority", CFG_SPEC, _set("spec.priority", 2_000_001_000),
     "spec.priority is 2000001000, not None", None),
    ("preemptionPolicy", CFG_SPEC, _set("spec.preemptionPolicy", "Never"),
     "spec.preemptionPolicy is 'Never', not None", None),
    ("grace period", GPU_SPEC, _set("spec.terminationGracePeriodSeconds", 0),
     "spec.terminationGracePeriodSeconds is 0, not 600",
     _set("spec.terminationGracePeriodSeconds", 600)),
    ("API token", CFG_SPEC, _set("spec.automountServiceAccountToken", True),
     "spec.automountServiceAccountToken is True, not False",
     _set("spec.automountServiceAccountToken", False)),
]


@pytest.mark.parametrize(("field", "spec", "hostile", "message", "equal"), CONFIG_ROWS,
                         ids=[r[0] for r in CONFIG_ROWS])
def test_config_problems_refuse_what_the_quota_owns(field, spec, hostile, message, equal):
    pod = kp.pod_manifest(spec, "p")  # the quota's own values: nothing to refuse
    assert config_problems(pod, spec) == []
    tampered = copy.deepcopy(pod)
    hostile(tampered)
    problems = config_problems(tampered, spec)
    assert len(problems) == 1 and message in problems[0], problems
    if equal is not None:
        same = copy.deepcopy(pod)
        equal(same)
        assert config_problems(same, spec) == []


def test_config_problems_of_an_empty_pod_are_none():
    """Only what the configuration set is compared: an unset field is the quota's."""
    pod = {"metadata": {}, "spec": {"containers": [{"name": "notebook"}]}}
    assert config_problems(pod, GPU_SPEC) == []
    with pytest.raises(ValueError, match="no container named 'notebook'"):
        config_problems({"spec": {"containers": [{"name": "x"}]}}, GPU_SPEC)


# What the quota does not own is not rewritten by apply_quota, so it is not a
# config_problem: it stays on the pod, and the checks after apply_quota refuse it.
NOT_OWNED = [
    ("hostPath under another name", _volume("host", {"hostPath": {"path": "/"}}),
     "volume 'host' is of type ['hostPath']"),
    ("a sidecar", lambda p: p["spec"]["containers"].append({"name": "miner", "image": "evil"}),
     "spec.containers has ['miner'] besides 'notebook'"),
    ("an init container", _set("spec.initContainers", [{"name": "chown", "image": "busybox"}]),
     "spec.initContainers is set"),
    ("envFrom", _set("c.envFrom", [{"configMapRef": {"name": "evil"}}]), "envFrom is set"),
    ("a pod-level DRA claim", _set("spec.resourceClaims", [{"name": "gpu"}]),
     "spec.resourceClaims is set"),
    ("root as a supplemental group", _set("spec.securityContext.supplementalGroups", [0]),
     "supplementalGroups has 0"),
    ("procMount", _set("c.securityContext.procMount", "Unmasked"), "procMount is 'Unmasked'"),
    ("an unsafe sysctl", _set("spec.securityContext.sysctls", [{"name": "kernel.msgmax",
                                                                "value": "1"}]),
     "'kernel.msgmax', not a safe sysctl"),
]


@pytest.mark.parametrize(("what", "tamper", "message"), NOT_OWNED, ids=[r[0] for r in NOT_OWNED])
def test_what_the_quota_does_not_own_is_refused_after_apply_quota(what, tamper, message):
    pod = kp.pod_manifest(CFG_SPEC, "p")
    tamper(pod)
    assert config_problems(pod, CFG_SPEC) == []
    kp.apply_quota(pod, CFG_SPEC)
    problems = violations(pod, CFG_SPEC)
    assert any(message in p for p in problems), problems


def kubespawner_clean_args(spec: NotebookPod) -> dict[str, Any]:
    """make_pod's arguments as QuotaKubeSpawner's defaults give them."""
    return dict(name="jupyter-alice", cmd=["jupyterhub-singleuser"], port=8888,
                image=spec.image, image_pull_policy="IfNotPresent", uid=1000, gid=100,
                fs_gid=100, allow_privilege_escalation=False,
                env={"JUPYTERHUB_USER": "alice", "KEEP": "me"},
                labels={"hub.jupyter.org/username": "alice"},
                annotations={"hub.jupyter.org/username": "alice"},
                priority_class_name=spec.priority_class,
                volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}],
                volume_mounts=[{"name": "data", "mountPath": "/data"}])


@pytest.mark.parametrize("spec", [CFG_SPEC, GPU_SPEC], ids=["cpu", "gpu"])
async def test_a_clean_kubespawner_pod_has_no_config_problems(spec):
    pod = await kubespawner_pod(clean=True, **kubespawner_clean_args(spec))
    assert config_problems(pod, spec) == []
    kp.apply_quota(pod, spec)
    assert violations(pod, spec) == []


async def test_equal_limits_as_kubespawner_writes_them_are_no_problem():
    """cpu_limit 8 (8.0 on the pod, "8.0" in CPU_LIMIT) and mem_limit in bytes (an int)
    are the role's own values: an admin who writes them is not refused."""
    role = GPU_SPEC.role
    args = {"clean": True, **kubespawner_clean_args(GPU_SPEC),
            "cpu_limit": float(role.cpus), "cpu_guarantee": float(role.cpus),
            "mem_limit": role.memory, "mem_guarantee": role.memory,
            "extra_resource_limits": {"nvidia.com/gpu": "2"},
            "extra_resource_guarantees": {"nvidia.com/gpu": 2},
            "env": {"CPU_LIMIT": f"{float(role.cpus)}", "MEM_LIMIT": str(role.memory)},
            "labels": {"quota-spawner.role": "gpu-training"}}
    pod = await kubespawner_pod(**args)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == 8.0
    assert config_problems(pod, GPU_SPEC) == []
    args["cpu_limit"] = 9.0
    assert config_problems(await kubespawner_pod(**args), GPU_SPEC) == [
        "container notebook: resources.limits.cpu is 9.0, not '8'"]
