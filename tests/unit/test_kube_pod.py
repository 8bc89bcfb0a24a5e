"""spawner/kube/pod.py and names.py: the notebook pod and its home PVC from a role.

Every role shape (CPU-only, exclusive, shared, MIG, big shm, priority) is built
by the pure builders, checked field by field, and read into the official
client's models strictly (tests/kube_models.py), so that a misspelt field fails.
No cluster: docs/kubernetes.md lists what has not run against one.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.contract import CONTRACT_ENV, LABEL_PREFIX
from spawner.docker.container import ContainerSpec, role_environment
from spawner.docker.container import environment as docker_environment
from spawner.kube import pod as kp
from spawner.kube.names import (
    PROTECTED_LABEL,
    dns_label,
    is_label_value,
    label_value,
)
from spawner.quota.model import QuotaTable, Role

G = 2**30
M = 2**20
IMAGE = "quota-spawner/pytorch:latest"
LABEL_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

# --- the role shapes ----------------------------------------------------------------

CPU_ONLY = Role("student", cpus=0.5, memory=2 * G, images=("pytorch",))
EXCLUSIVE = Role("gpu-training", cpus=8, memory=32 * G, images=("pytorch",), shm=8 * G,
                 gpus=2, priority=300000, preempts="never", grace_period=600)
SHARED = Role("gpu-lab", cpus=2, memory=8 * G, images=("pytorch",), shm=G, gpus=1,
              gpu_mode="shared", gpu_share=4, gpu_memory=16 * G)
MIG = Role("mig-half", cpus=4, memory=16 * G, images=("pytorch",), gpus=1)
BIG_SHM = Role("dataloader", cpus=16, memory=128 * G, images=("pytorch",), shm=64 * G)
PRIORITY = Role("urgent-debug", cpus=8, memory=32 * G, images=("pytorch",), shm=8 * G,
                gpus=1, priority=1_000_000, preemptible=False, reclaim_after=72 * 3600.0,
                grace_period=900)
SHAPES = {"cpu-only": CPU_ONLY, "exclusive": EXCLUSIVE, "shared": SHARED, "mig": MIG,
          "big-shm": BIG_SHM, "priority": PRIORITY}
OPTIONS = kp.KubeOptions(mig_profiles={"mig-half": "3g.40gb"})


def spec_for(role: Role, user: str = "alice", **kwargs: Any) -> kp.NotebookPod:
    kwargs.setdefault("options", OPTIONS)
    return kp.NotebookPod(role=role, image_key="pytorch", image=IMAGE, user_name=user,
                          hub_id="quota-3f2a", **kwargs)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


# --- each shape, field by field -------------------------------------------------------

EXPECTED_RESOURCES = {
    "cpu-only": {"cpu": "500m", "memory": str(2 * G)},
    "exclusive": {"cpu": "8", "memory": str(32 * G), "nvidia.com/gpu": "2"},
    "shared": {"cpu": "2", "memory": str(8 * G), "nvidia.com/gpu.shared": "1"},
    "mig": {"cpu": "4", "memory": str(16 * G), "nvidia.com/mig-3g.40gb": "1"},
    "big-shm": {"cpu": "16", "memory": str(128 * G)},
    "priority": {"cpu": "8", "memory": str(32 * G), "nvidia.com/gpu": "1"},
}


@pytest.mark.parametrize("shape", SHAPES)
def test_resources_default_requests_equal_limits(shape):
    got = kp.resources(spec_for(SHAPES[shape]))
    assert got == {"limits": EXPECTED_RESOURCES[shape], "requests": EXPECTED_RESOURCES[shape]}


@pytest.mark.parametrize("shape", SHAPES)
def test_whole_pod_field_by_field(shape):
    role = SHAPES[shape]
    spec = spec_for(role)
    pod = kp.pod_manifest(spec, "jupyter-alice", namespace="hub")
    assert pod["apiVersion"] == "v1" and pod["kind"] == "Pod"
    assert pod["metadata"]["name"] == "jupyter-alice"
    assert pod["metadata"]["namespace"] == "hub"
    body = pod["spec"]
    assert body["priorityClassName"] == f"quota-spawner-{role.name}"
    assert "priority" not in body and "preemptionPolicy" not in body
    assert body["terminationGracePeriodSeconds"] == int(role.grace_period)
    assert body["automountServiceAccountToken"] is False
    assert body["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100,
        "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = body["containers"]
    assert container["name"] == "notebook"
    assert container["image"] == IMAGE
    assert container["resources"]["limits"] == EXPECTED_RESOURCES[shape]
    assert container["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 100, "privileged": False,
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}}
    home = {"name": "quota-home", "persistentVolumeClaim": {"claimName": "quota-home-alice"}}
    home_mount = {"name": "quota-home", "mountPath": "/home/jovyan"}
    if role.shm:
        assert body["volumes"] == [home, {"name": "quota-shm", "emptyDir": {
            "medium": "Memory", "sizeLimit": str(role.shm)}}]
        assert container["volumeMounts"] == [home_mount,
                                             {"name": "quota-shm", "mountPath": "/dev/shm"}]
    else:
        assert body["volumes"] == [home]
        assert container["volumeMounts"] == [home_mount]
    assert kp.violations(pod, spec) == []


@pytest.mark.parametrize("shape", SHAPES)
def test_environment_as_on_docker(shape):
    role = SHAPES[shape]
    env = env_of(kp.pod_manifest(spec_for(role), "p")["spec"]["containers"][0])
    threads = str(max(1, int(role.cpus)))
    assert {k: env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                "OPENBLAS_NUM_THREADS")} == dict.fromkeys(
        ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), threads)
    assert env["QUOTA_ROLE"] == role.name
    assert env["CPU_LIMIT"] == f"{role.cpus:g}"
    assert env["MEM_LIMIT"] == str(role.memory)
    # the device plugin sets a GPU pod's devices; a CPU pod gets none, over CUDA's "all"
    if role.gpus:
        assert "NVIDIA_VISIBLE_DEVICES" not in env
    else:
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert ("GPU_MEMORY_LIMIT" in env) == (shape == "shared")


def test_the_shared_contract_is_one_function():
    """Docker's and Kubernetes' environments hold the same role variables."""
    docker = docker_environment(ContainerSpec(SHARED, "pytorch", IMAGE, "alice", "h", "1000",
                                              "quota-spawner", gpu_uuids=("GPU-1",),
                                              gpu_device_memory=80 * G))
    kube = kp.environment(spec_for(SHARED, options=kp.KubeOptions(gpu_device_memory=80 * G)))
    assert role_environment(SHARED).items() <= docker.items()
    assert role_environment(SHARED).items() <= kube.items()
    assert {k: v for k, v in docker.items() if k != "NVIDIA_VISIBLE_DEVICES"} == kube


def test_shared_cap_with_device_memory_and_torch():
    spec = spec_for(SHARED, options=kp.KubeOptions(gpu_device_memory=80 * G),
                    torch_reads_fraction=True)
    env = kp.environment(spec)
    assert env["GPU_MEMORY_LIMIT"] == str(16 * G)
    assert env["FLAGS_gpu_memory_limit_mb"] == "16384"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.200"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.200"
    pod = kp.pod_manifest(spec, "p")
    assert kp.violations(pod, spec) == []


def test_exclusive_role_gets_no_cap_even_with_gpu_memory_set_elsewhere():
    assert "GPU_MEMORY_LIMIT" not in kp.environment(spec_for(EXCLUSIVE))


@pytest.mark.parametrize(("cpus", "ratio", "limit", "wanted"), [
    (2, 0.5, "2", "1"),
    (0.5, 0.5, "500m", "250m"),
    (1.5, 1.0, "1500m", "1500m"),
    (0.0001, 1.0, "1m", "1m"),  # never below Kubernetes' smallest CPU quantity
    (3, 0.1, "3", "300m"),
])
def test_cpu_request_ratio(cpus, ratio, limit, wanted):
    role = replace(CPU_ONLY, cpus=cpus)
    got = kp.resources(spec_for(role, options=kp.KubeOptions(cpu_request_ratio=ratio)))
    assert (got["limits"]["cpu"], got["requests"]["cpu"]) == (limit, wanted)


def test_memory_request_ratio_and_gpus_never_overcommitted():
    options = kp.KubeOptions(memory_request_ratio=0.25, cpu_request_ratio=0.5)
    got = kp.resources(spec_for(EXCLUSIVE, options=options))
    assert got["limits"]["memory"] == str(32 * G)
    assert got["requests"]["memory"] == str(8 * G)
    assert got["limits"]["nvidia.com/gpu"] == got["requests"]["nvidia.com/gpu"] == "2"


def test_ephemeral_storage_per_role_and_default():
    options = kp.KubeOptions(ephemeral_storage={"student": 20 * G},
                             default_ephemeral_storage=50 * G)
    assert kp.resources(spec_for(CPU_ONLY, options=options))["limits"][
        "ephemeral-storage"] == str(20 * G)
    got = kp.resources(spec_for(BIG_SHM, options=options))
    assert got["limits"]["ephemeral-storage"] == got["requests"]["ephemeral-storage"] == str(
        50 * G)
    assert "ephemeral-storage" not in kp.resources(spec_for(BIG_SHM))["limits"]


@pytest.mark.parametrize(("role", "options", "wanted"), [
    (EXCLUSIVE, kp.KubeOptions(), ("nvidia.com/gpu", 2)),
    (SHARED, kp.KubeOptions(), ("nvidia.com/gpu.shared", 1)),
    (SHARED, kp.KubeOptions(shared_suffix=""), ("nvidia.com/gpu", 1)),  # renameByDefault off
    (MIG, kp.KubeOptions(mig_profiles={"mig-half": "1g.10gb+me"}), ("nvidia.com/mig-1g.10gb.me", 1)),
    (replace(SHARED, name="mig-half"), kp.KubeOptions(mig_profiles={"mig-half": "3g.40gb"}),
     ("nvidia.com/mig-3g.40gb.shared", 1)),
    (CPU_ONLY, kp.KubeOptions(), None),
    (EXCLUSIVE, kp.KubeOptions(gpu_resource="amd.com/gpu"), ("amd.com/gpu", 2)),
])
def test_gpu_resource_names(role, options, wanted):
    assert kp.gpu_resource(role, options) == wanted


def test_labels_and_annotations():
    spec = spec_for(SHARED, user="o'brien")
    assert kp.annotations(spec) == {
        "quota-spawner.user": "o'brien", "quota-spawner.role": "gpu-lab",
        "quota-spawner.image": "pytorch", "quota-spawner.gpus": "",
        "quota-spawner.gpu-mode": "shared:4", "quota-spawner.hub": "quota-3f2a"}
    got = kp.labels(spec)
    assert got == {key: label_value(value) for key, value in kp.annotations(spec).items()}
    assert got["quota-spawner.role"] == "gpu-lab"  # valid names stay readable
    assert got["quota-spawner.user"].startswith("o-brien---")
    assert all(is_label_value(v) for v in got.values())
    assert PROTECTED_LABEL not in got
    assert kp.labels(spec_for(PRIORITY))[PROTECTED_LABEL] == "true"
    assert kp.annotations(spec_for(CPU_ONLY))["quota-spawner.gpu-mode"] == ""
    assert kp.annotations(spec_for(EXCLUSIVE))["quota-spawner.gpu-mode"] == "exclusive"


def test_contract_labels_read_back_exact_values():
    spec = spec_for(SHARED, user="Dr. O'Brien <admin>")
    pod = kp.pod_manifest(spec, "p")
    pod["metadata"]["annotations"]["other"] = "kept out"
    assert kp.contract_labels(pod["metadata"]) == kp.annotations(spec)
    assert kp.contract_labels({}) == {}


# --- names: hostile users and roles --------------------------------------------------

HOSTILE = ["o'brien", "a b", "ünal", "名前", "x" * 200, "", "-lead", "trail-", "trail.",
           "a--b", "Alice", "ALICE", "alice", "a/b", "a\nb", "user@example.com", "\udcff",
           "x---0123456789ab", "0", "-", "..", "a_b", "A.B-c_D", "'; DROP TABLE users; --",
           "$(reboot)", "{username}", "a" * 63, "a" * 64]


def test_label_values_valid_distinct_and_readable_when_possible():
    values = [label_value(n) for n in HOSTILE]
    for name, value in zip(HOSTILE, values, strict=True):
        assert LABEL_RE.fullmatch(value) and len(value) <= 63, (name, value)
    assert len(set(values)) == len(HOSTILE)
    for name in ("alice", "Alice", "a_b", "A.B-c_D", "0", "a" * 63, ""):
        assert label_value(name) == name


def test_dns_labels_valid_distinct():
    values = [dns_label(n) for n in HOSTILE]
    for name, value in zip(HOSTILE, values, strict=True):
        assert DNS_RE.fullmatch(value) and len(value) <= 63, (name, value)
    assert len(set(values)) == len(HOSTILE)
    assert dns_label("alice") == "alice"
    assert dns_label("Alice") != dns_label("ALICE") != dns_label("alice")
    assert len(dns_label("x" * 80, 30)) <= 30
    with pytest.raises(ValueError):
        dns_label("alice", 10)


@given(st.text(max_size=120), st.text(max_size=120))
def test_label_value_property(a, b):
    for value in (label_value(a), dns_label(a)):
        assert len(value) <= 63
    assert LABEL_RE.fullmatch(label_value(a))
    assert DNS_RE.fullmatch(dns_label(a))
    if a != b:
        assert label_value(a) != label_value(b)
        assert dns_label(a) != dns_label(b)


@pytest.mark.parametrize("user", HOSTILE)
def test_hostile_user_pod_and_claim(user):
    spec = spec_for(PRIORITY, user=user)
    pod = kp.pod_manifest(spec, "p")
    assert kp.violations(pod, spec) == []
    assert pod["metadata"]["annotations"]["quota-spawner.user"] == user
    assert LABEL_RE.fullmatch(pod["metadata"]["labels"]["quota-spawner.user"])
    claim = kp.home_claim(spec)
    name = claim["metadata"]["name"]
    assert DNS_RE.fullmatch(name) and len(name) <= 63 and name.startswith("quota-home-")
    assert claim["metadata"]["annotations"]["quota-spawner.user"] == user
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == name


# --- the home claim ----------------------------------------------------------------


def test_home_claim_defaults():
    assert kp.home_claim(spec_for(CPU_ONLY)) == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "quota-home-alice",
            "labels": {"quota-spawner.user": "alice", "quota-spawner.hub": "quota-3f2a"},
            "annotations": {"quota-spawner.user": "alice", "quota-spawner.hub": "quota-3f2a"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": str(10 * G)}}},
    }


def test_home_claim_options_and_no_owner():
    options = kp.KubeOptions(home_size=50 * G, home_storage_class="fast-ssd",
                             home_access_modes=("ReadWriteOncePod",), home_claim_prefix="home")
    claim = kp.home_claim(spec_for(CPU_ONLY, options=options), namespace="hub")
    assert claim["metadata"]["name"] == "home-alice"
    assert claim["metadata"]["namespace"] == "hub"
    assert "ownerReferences" not in claim["metadata"]  # kept across stops and culls
    assert claim["spec"] == {"accessModes": ["ReadWriteOncePod"],
                             "resources": {"requests": {"storage": str(50 * G)}},
                             "storageClassName": "fast-ssd"}
    named = spec_for(CPU_ONLY, home_claim="claim-alice")
    assert kp.home_claim(named)["metadata"]["name"] == "claim-alice"
    assert kp.volumes(named)[0]["persistentVolumeClaim"]["claimName"] == "claim-alice"


# --- into the official client's models, strictly ------------------------------------


def test_strict_check_catches_a_misspelt_field():
    pytest.importorskip("kubernetes")
    from kube_models import strict, unknown_fields

    pod = kp.pod_manifest(spec_for(CPU_ONLY), "p")
    bad = copy.deepcopy(pod)
    bad["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    bad["spec"]["securityContex"] = {}
    bad["spec"]["terminationGracePeriodSeconds"] = "120"
    assert unknown_fields(bad, "V1Pod") == [
        "V1Pod.spec.containers[0].securityContext.runAsNonroot: V1SecurityContext has no "
        "such field",
        "V1Pod.spec.terminationGracePeriodSeconds: '120' is not int",
        "V1Pod.spec.securityContex: V1PodSpec has no such field",
    ]
    with pytest.raises(AssertionError, match="runAsNonroot"):
        strict(bad, "V1Pod")
    # what the plain client does with it: the field is silently gone
    model = strict(pod, "V1Pod")
    assert model.spec.containers[0].security_context.run_as_non_root is True


@pytest.mark.parametrize("shape", SHAPES)
def test_pod_and_claim_deserialise_strictly(shape):
    pytest.importorskip("kubernetes")
    from kube_models import quantities, strict

    spec = spec_for(SHAPES[shape], options=kp.KubeOptions(
        mig_profiles={"mig-half": "3g.40gb"}, default_ephemeral_storage=20 * G,
        home_storage_class="standard"))
    pod = strict(kp.pod_manifest(spec, "jupyter-alice", "hub"), "V1Pod")
    container = pod.spec.containers[0]
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.spec.priority_class_name == f"quota-spawner-{SHAPES[shape].name}"
    limits = quantities(container.resources.limits)
    requests = quantities(container.resources.requests)
    assert limits == requests
    assert limits["memory"] == SHAPES[shape].memory
    assert float(limits["cpu"]) == SHAPES[shape].cpus
    if SHAPES[shape].shm:
        shm = next(v for v in pod.spec.volumes if v.name == "quota-shm")
        assert shm.empty_dir.medium == "Memory"
        assert quantities({"s": shm.empty_dir.size_limit})["s"] == SHAPES[shape].shm
    claim = strict(kp.home_claim(spec, "hub"), "V1PersistentVolumeClaim")
    assert claim.spec.storage_class_name == "standard"


# --- on top of what KubeSpawner builds ----------------------------------------------


async def kubespawner_pod(clean: bool = False, **overrides: Any) -> dict[str, Any]:
    """KubeSpawner's own make_pod(), as the API dict the subclass will hold: with hostile
    settings, or (``clean``) with only ``overrides``."""
    pytest.importorskip("kubespawner")
    # KubeSpawner's models are kubernetes_asyncio's: the sync client's ApiClient
    # would not serialise them (it leaves snake_case keys and nulls)
    from kubernetes_asyncio.client import ApiClient
    from kubespawner.objects import make_pod

    kwargs: dict[str, Any] = {} if clean else dict(
        name="jupyter-alice", cmd=["jupyterhub-singleuser"], port=8888, image="other:latest",
        image_pull_policy="IfNotPresent", uid=0, gid=0, fs_gid=0, privileged=True,
        allow_privilege_escalation=True, env={"OMP_NUM_THREADS": "64", "KEEP": "me",
                                              "NVIDIA_VISIBLE_DEVICES": "all"},
        labels={"hub.jupyter.org/username": "alice", "quota-spawner.role": "admin"},
        annotations={"hub.jupyter.org/username": "alice"},
        cpu_limit=64, mem_limit=2**40, extra_resource_limits={"nvidia.com/gpu": "8"},
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "shared-data"}}],
        volume_mounts=[{"name": "data", "mountPath": "/data"},
                       {"name": "data", "mountPath": "/home/jovyan"}],
        automount_service_account_token=True, service_account="default",
        priority_class_name="system-cluster-critical",
        extra_pod_config={"hostIPC": True, "terminationGracePeriodSeconds": 1})
    kwargs.update(overrides)
    async with ApiClient() as api:  # it needs a running loop, as in the hub
        return api.sanitize_for_serialization(make_pod(**kwargs))


async def test_apply_quota_over_a_hostile_kubespawner_pod():
    spec = spec_for(EXCLUSIVE)
    pod = await kubespawner_pod()
    assert kp.violations(pod, spec)  # as KubeSpawner made it
    kp.apply_quota(pod, spec)
    assert kp.violations(pod, spec) == []
    container = pod["spec"]["containers"][0]
    assert container["image"] == IMAGE
    assert container["resources"] == kp.resources(spec)
    env = env_of(container)
    assert env["KEEP"] == "me" and env["OMP_NUM_THREADS"] == "8"
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin's to set
    assert [e["name"] for e in container["env"]].count("OMP_NUM_THREADS") == 1
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    assert [m for m in container["volumeMounts"] if m["mountPath"] == "/home/jovyan"] == [
        {"name": "quota-home", "mountPath": "/home/jovyan"}]
    body = pod["spec"]
    assert "hostIPC" not in body
    assert body["priorityClassName"] == "quota-spawner-gpu-training"
    assert body["terminationGracePeriodSeconds"] == 600
    assert body["automountServiceAccountToken"] is False
    labels = pod["metadata"]["labels"]
    assert labels["hub.jupyter.org/username"] == "alice"  # KubeSpawner's own stay
    assert labels["quota-spawner.role"] == "gpu-training"
    pytest.importorskip("kubernetes")
    from kube_models import strict

    strict(pod, "V1Pod")


async def test_what_apply_quota_does_not_fix_is_refused():
    spec = spec_for(CPU_ONLY)
    pod = await kubespawner_pod(
        init_containers=[{"name": "chown", "image": "busybox",
                          "securityContext": {"runAsUser": 0}}],
        extra_containers=[{"name": "sidecar", "image": "miner"}],
        volumes=[{"name": "host", "hostPath": {"path": "/"}}],
        extra_container_config={"envFrom": [{"configMapRef": {"name": "evil"}}]})
    kp.apply_quota(pod, spec)
    problems = "\n".join(kp.violations(pod, spec))
    assert "spec.initContainers is set" in problems
    assert "spec.containers has ['sidecar']" in problems
    assert "envFrom is set" in problems
    assert "volume 'host' is of type ['hostPath']" in problems
    assert "spec.initContainers['chown'].securityContext.runAsUser is 0" in problems


def test_apply_quota_needs_the_notebook_container():
    with pytest.raises(ValueError, match="no container named 'notebook'"):
        kp.apply_quota({"spec": {"containers": [{"name": "x"}]}}, spec_for(CPU_ONLY))


def test_service_account_token_only_when_configured():
    spec = spec_for(CPU_ONLY, options=kp.KubeOptions(automount_service_account_token=True))
    pod = kp.pod_manifest(spec, "p")
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert kp.violations(pod, spec) == []


# --- the quota's invariants, one tampering at a time ---------------------------------


def _container(pod):
    return pod["spec"]["containers"][0]


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
    assert kp.quota_violations(pod, spec) == []
    tamper(pod)
    problems = kp.quota_violations(pod, spec)
    assert any(message in p for p in problems), problems


def test_root_user_is_a_violation():
    spec = spec_for(CPU_ONLY, uid=0)
    problems = kp.violations(kp.pod_manifest(spec, "p"), spec)
    assert "the notebook user is 0:100: never root, never the root group" in problems
    assert "spec.securityContext.runAsUser is 0" in problems


def test_torch_alloc_conf_of_the_admin_stays_without_a_cap():
    spec = spec_for(CPU_ONLY)
    pod = kp.pod_manifest(spec, "p")
    _container(pod)["env"].append({"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"})
    assert kp.violations(pod, spec) == []


def test_apply_quota_replaces_every_contract_variable():
    spec = spec_for(SHARED)
    pod = kp.pod_manifest(spec, "p")
    _container(pod)["env"] += [{"name": n, "value": "x"} for n in CONTRACT_ENV]
    kp.apply_quota(pod, spec)
    assert kp.violations(pod, spec) == []


def test_apply_quota_keeps_only_its_own_quota_spawner_keys():
    spec = spec_for(CPU_ONLY)
    pod = kp.pod_manifest(spec, "p")
    pod["metadata"]["labels"]["quota-spawner.protected"] = "true"  # a role that is preemptible
    pod["metadata"]["annotations"]["quota-spawner.gpus"] = "GPU-all"
    kp.apply_quota(pod, spec)
    assert not [k for k in pod["metadata"]["labels"] if k.startswith(LABEL_PREFIX)
                and k not in kp.labels(spec)]
    assert pod["metadata"]["annotations"]["quota-spawner.gpus"] == ""


# --- the restricted Pod Security Standard, control by control ------------------------
# From https://kubernetes.io/docs/concepts/security/pod-security-standards/: each row
# breaks one control of the baseline or restricted profile on an otherwise good pod.


def _ctx(pod):
    return _container(pod)["securityContext"]


RESTRICTED_FAILS = [
    ("HostProcess", lambda p: _ctx(p).update(windowsOptions={"hostProcess": True}),
     "windowsOptions.hostProcess is true"),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "spec.hostNetwork is true"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "spec.hostPID is true"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "spec.hostIPC is true"),
    ("privileged", lambda p: _ctx(p).update(privileged=True), ".privileged is true"),
    ("capability added", lambda p: _ctx(p)["capabilities"].update(add=["SYS_ADMIN"]),
     "capabilities.add has ['SYS_ADMIN']"),
    ("baseline capability, not restricted", lambda p: _ctx(p)["capabilities"].update(add=["CHOWN"]),
     "capabilities.add has ['CHOWN']"),
    ("drop not ALL", lambda p: _ctx(p)["capabilities"].update(drop=["NET_RAW"]),
     "capabilities.drop lacks ALL"),
    ("no capabilities", lambda p: _ctx(p).pop("capabilities"), "capabilities.drop lacks ALL"),
    ("hostPath", lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
     "volume 'h' is of type ['hostPath']"),
    ("nfs", lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
     "volume 'n' is of type ['nfs']"),
    ("volume without a type", lambda p: p["spec"]["volumes"].append({"name": "e"}),
     "volume 'e' is of type []"),
    ("hostPort", lambda p: _container(p).setdefault("ports", []).append(
        {"containerPort": 80, "hostPort": 80}), "ports has hostPort 80"),
    ("AppArmor unconfined", lambda p: _ctx(p).update(appArmorProfile={"type": "Unconfined"}),
     "appArmorProfile.type is 'Unconfined'"),
    ("AppArmor annotation", lambda p: p["metadata"]["annotations"].update(
        {"container.apparmor.security.beta.kubernetes.io/notebook": "unconfined"}),
     "annotation container.apparmor.security.beta.kubernetes.io/notebook is 'unconfined'"),
    ("SELinux type", lambda p: p["spec"]["securityContext"].update(
        seLinuxOptions={"type": "spc_t"}), "seLinuxOptions.type is 'spc_t'"),
    ("SELinux user", lambda p: _ctx(p).update(seLinuxOptions={"user": "system_u"}),
     "seLinuxOptions.user is set"),
    ("SELinux role", lambda p: _ctx(p).update(seLinuxOptions={"role": "sysadm_r"}),
     "seLinuxOptions.role is set"),
    ("procMount", lambda p: _ctx(p).update(procMount="Unmasked"), "procMount is 'Unmasked'"),
    ("seccomp unconfined (container)", lambda p: _ctx(p).update(seccompProfile={"type": "Unconfined"}),
     "seccompProfile.type is 'Unconfined'"),
    ("seccomp unconfined (pod)", lambda p: p["spec"]["securityContext"].update(
        seccompProfile={"type": "Unconfined"}), "spec.securityContext.seccompProfile.type is"),
    ("seccomp unset everywhere", lambda p: (p["spec"]["securityContext"].pop("seccompProfile"),
                                            _ctx(p).pop("seccompProfile")),
     "seccompProfile is not set, nor the pod's"),
    ("unsafe sysctl", lambda p: p["spec"]["securityContext"].update(
        sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "sysctls has 'kernel.msgmax'"),
    ("privilege escalation", lambda p: _ctx(p).update(allowPrivilegeEscalation=True),
     "allowPrivilegeEscalation is True, not false"),
    ("privilege escalation unset", lambda p: _ctx(p).pop("allowPrivilegeEscalation"),
     "allowPrivilegeEscalation is None, not false"),
    ("runAsNonRoot false on the container", lambda p: _ctx(p).update(runAsNonRoot=False),
     "runAsNonRoot is False"),
    ("runAsNonRoot unset everywhere", lambda p: (p["spec"]["securityContext"].pop("runAsNonRoot"),
                                                 _ctx(p).pop("runAsNonRoot")),
     "runAsNonRoot is None"),
    ("runAsUser 0 (pod)", lambda p: p["spec"]["securityContext"].update(runAsUser=0),
     "spec.securityContext.runAsUser is 0"),
    ("runAsUser 0 (container)", lambda p: _ctx(p).update(runAsUser=0),
     "securityContext.runAsUser is 0"),
    ("an ephemeral container", lambda p: p["spec"].update(ephemeralContainers=[
        {"name": "debug", "image": "busybox"}]), "ephemeralContainers['debug'].securityContext"),
]

RESTRICTED_PASSES = [
    ("NET_BIND_SERVICE may be added", lambda p: _ctx(p)["capabilities"].update(add=["NET_BIND_SERVICE"])),
    ("Localhost seccomp", lambda p: _ctx(p).update(
        seccompProfile={"type": "Localhost", "localhostProfile": "nb.json"})),
    ("seccomp on the pod only", lambda p: _ctx(p).pop("seccompProfile")),
    ("seccomp on the containers only", lambda p: p["spec"]["securityContext"].pop("seccompProfile")),
    ("runAsNonRoot on the containers only", lambda p: p["spec"]["securityContext"].pop("runAsNonRoot")),
    ("runAsNonRoot on the pod only", lambda p: _ctx(p).pop("runAsNonRoot")),
    ("safe sysctl", lambda p: p["spec"]["securityContext"].update(
        sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}])),
    ("AppArmor runtime default", lambda p: _ctx(p).update(appArmorProfile={"type": "RuntimeDefault"})),
    ("AppArmor annotation localhost", lambda p: p["metadata"]["annotations"].update(
        {"container.apparmor.security.beta.kubernetes.io/notebook": "localhost/nb"})),
    ("SELinux container_t", lambda p: _ctx(p).update(seLinuxOptions={"type": "container_t", "level": "s0:c1"})),
    ("every allowed volume type", lambda p: p["spec"]["volumes"].extend(
        {"name": t, t: {}} for t in kp.RESTRICTED_VOLUME_TYPES)),
    ("containerPort without hostPort", lambda p: _container(p).setdefault("ports", []).append(
        {"containerPort": 8888, "hostPort": 0})),
    ("procMount Default", lambda p: _ctx(p).update(procMount="Default")),
]


@pytest.mark.parametrize(("control", "tamper", "message"), RESTRICTED_FAILS,
                         ids=[t[0] for t in RESTRICTED_FAILS])
def test_restricted_standard_fails(control, tamper, message):
    pod = kp.pod_manifest(spec_for(PRIORITY), "p")
    assert kp.restricted_violations(pod) == []
    tamper(pod)
    problems = kp.restricted_violations(pod)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize(("control", "tamper"), RESTRICTED_PASSES,
                         ids=[t[0] for t in RESTRICTED_PASSES])
def test_restricted_standard_allows(control, tamper):
    pod = kp.pod_manifest(spec_for(PRIORITY), "p")
    tamper(pod)
    assert kp.restricted_violations(pod) == []


def test_apply_quota_repairs_what_it_owns():
    """Every restricted control that the quota writes is put back by apply_quota."""
    spec = spec_for(PRIORITY)
    for control, tamper, _ in RESTRICTED_FAILS:
        if control in ("hostPath", "nfs", "volume without a type", "AppArmor annotation",
                       "SELinux type", "SELinux user", "SELinux role", "procMount",
                       "HostProcess", "unsafe sysctl", "an ephemeral container",
                       "AppArmor unconfined", "capability added",
                       "baseline capability, not restricted"):
            continue  # the admin's additions: refused, not rewritten
        pod = kp.pod_manifest(spec, "p")
        tamper(pod)
        kp.apply_quota(pod, spec)
        assert kp.violations(pod, spec) == [], control


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
    assert kp.config_problems(pod, spec) == []
    tampered = copy.deepcopy(pod)
    hostile(tampered)
    problems = kp.config_problems(tampered, spec)
    assert len(problems) == 1 and message in problems[0], problems
    if equal is not None:
        same = copy.deepcopy(pod)
        equal(same)
        assert kp.config_problems(same, spec) == []


def test_config_problems_of_an_empty_pod_are_none():
    """Only what the configuration set is compared: an unset field is the quota's."""
    pod = {"metadata": {}, "spec": {"containers": [{"name": "notebook"}]}}
    assert kp.config_problems(pod, GPU_SPEC) == []
    with pytest.raises(ValueError, match="no container named 'notebook'"):
        kp.config_problems({"spec": {"containers": [{"name": "x"}]}}, GPU_SPEC)


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
    assert kp.config_problems(pod, CFG_SPEC) == []
    kp.apply_quota(pod, CFG_SPEC)
    problems = kp.violations(pod, CFG_SPEC)
    assert any(message in p for p in problems), problems


def kubespawner_clean_args(spec: kp.NotebookPod) -> dict[str, Any]:
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
    assert kp.config_problems(pod, spec) == []
    kp.apply_quota(pod, spec)
    assert kp.violations(pod, spec) == []


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
    assert kp.config_problems(pod, GPU_SPEC) == []
    args["cpu_limit"] = 9.0
    assert kp.config_problems(await kubespawner_pod(**args), GPU_SPEC) == [
        "container notebook: resources.limits.cpu is 9.0, not '8'"]


@pytest.mark.parametrize(("a", "b", "same"), [
    ("8", 8.0, True), ("500m", 0.5, True), ("8000m", "8", True), ("2Gi", 2 * G, True),
    ("1e3", "1k", True), ("1G", 10**9, True), (".5", "500m", True),
    ("8", "9", False), ("2G", 2 * G, False), (True, 1, False), ("", "0", False),
    ("lots", "lots", True), ("lots", "8", False), (None, None, True),
])
def test_same_quantity(a, b, same):
    assert kp.same_quantity(a, b) is same


# --- options ------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    (dict(cpu_request_ratio=0), "cpu_request_ratio is 0"),
    (dict(memory_request_ratio=1.5), "memory_request_ratio is 1.5"),
    (dict(cpu_request_ratio=True), "cpu_request_ratio is True"),
    (dict(gpu_resource="gpu"), "gpu_resource 'gpu' is not an extended resource name"),
    (dict(shared_suffix="/x"), "gpu_resource + shared_suffix"),
    (dict(mig_profiles={"r": "3g 40gb"}), "mig_profiles['r'] is '3g 40gb'"),
    (dict(default_ephemeral_storage=0), "default_ephemeral_storage is 0"),
    (dict(ephemeral_storage={"r": -1}), "ephemeral_storage['r'] is -1"),
    (dict(home_size=1.5), "home_size is 1.5"),
    (dict(home_dir="home"), "home_dir is 'home'"),
    (dict(home_dir="/dev/shm"), "home_dir is '/dev/shm'"),
    (dict(home_claim_prefix="Home"), "home_claim_prefix is 'Home'"),
    (dict(priority_class_prefix="system-"), "may not start with 'system-'"),
    (dict(priority_class_prefix="Quota_"), "must be 1 to 30 lowercase"),
    # the wrong kind: each would fail later, in the middle of a start, or be misread
    (dict(home_dir=5), "home_dir is 5: it must be text"),
    (dict(gpu_resource=None), "gpu_resource is None: it must be text"),
    (dict(mig_profiles=["3g.40gb"]), "mig_profiles is ['3g.40gb']: it must map"),
    (dict(ephemeral_storage=5), "ephemeral_storage is 5: it must map"),
    (dict(gpu_device_memory="80Gi"), "gpu_device_memory is '80Gi'"),
    (dict(gpu_device_memory=True), "gpu_device_memory is True"),
    (dict(home_access_modes="ReadWriteOnce"), "home_access_modes is 'ReadWriteOnce'"),
    (dict(home_access_modes=["RWO"]), "home_access_modes is ['RWO']"),
    (dict(home_access_modes=[]), "home_access_modes is []"),
    (dict(automount_service_account_token="false"), "automount_service_account_token is "
                                                     "'false': it must be True or False"),
    (dict(home_storage_class=3), "home_storage_class is 3"),
])
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        kp.KubeOptions(**options)


def test_option_problems_against_the_table():
    table = QuotaTable(path="t.yaml", images={}, roles={r.name: r for r in SHAPES.values()})
    options = kp.KubeOptions(mig_profiles={"mig-half": "3g.40gb", "student": "1g.10gb",
                                           "gone": "1g.10gb"},
                             ephemeral_storage={"nobody": G})
    assert kp.option_problems(options, table) == [
        "mig_profiles names the role 'gone', which the quota table does not have",
        "ephemeral_storage names the role 'nobody', which the quota table does not have",
        "mig_profiles names the role 'student', which has no GPUs",
    ]
    assert kp.option_problems(OPTIONS, table) == []


def test_refuse_any():
    kp.refuse_any([])
    with pytest.raises(kp.PodPolicyError) as raised:
        kp.refuse_any(["a", "b"])
    assert raised.value.problems == ["a", "b"]
