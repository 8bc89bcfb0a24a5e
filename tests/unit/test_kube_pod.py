"""spawner/kube/pod.py: the notebook pod from a role, and the quota written on KubeSpawner's.

Every role shape (CPU-only, exclusive, shared, MIG, big shm, priority) is built
by the pure builders, checked field by field, and read into the official
client's models strictly (tests/kube_models.py), so that a misspelt field fails.
The names are test_kube_names.py's, the claim test_kube_claims.py's, the
checks before the API call test_kube_checks.py's and test_kube_security.py's.
No cluster: docs/kubernetes.md lists what has not run against one.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from kube_shapes import (
    BIG_SHM,
    CPU_ONLY,
    EXCLUSIVE,
    IMAGE,
    MIG,
    PRIORITY,
    SHAPES,
    SHARED,
    G,
    kubespawner_pod,
    spec_for,
)
from kube_shapes import first_container as _container

from spawner.contract import CONTRACT_ENV, LABEL_PREFIX
from spawner.kube import pod as kp
from spawner.kube.checks import violations
from spawner.kube.claims import home_claim
from spawner.kube.names import PROTECTED_LABEL, is_label_value, label_value
from spawner.kube.options import KubeOptions


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
    assert violations(pod, spec) == []


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


def test_shared_cap_with_device_memory_and_torch():
    spec = spec_for(SHARED, options=KubeOptions(gpu_device_memory=80 * G),
                    torch_reads_fraction=True)
    env = kp.environment(spec)
    assert env["GPU_MEMORY_LIMIT"] == str(16 * G)
    assert env["FLAGS_gpu_memory_limit_mb"] == "16384"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.200"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.200"
    pod = kp.pod_manifest(spec, "p")
    assert violations(pod, spec) == []


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
    got = kp.resources(spec_for(role, options=KubeOptions(cpu_request_ratio=ratio)))
    assert (got["limits"]["cpu"], got["requests"]["cpu"]) == (limit, wanted)


def test_memory_request_ratio_and_gpus_never_overcommitted():
    options = KubeOptions(memory_request_ratio=0.25, cpu_request_ratio=0.5)
    got = kp.resources(spec_for(EXCLUSIVE, options=options))
    assert got["limits"]["memory"] == str(32 * G)
    assert got["requests"]["memory"] == str(8 * G)
    assert got["limits"]["nvidia.com/gpu"] == got["requests"]["nvidia.com/gpu"] == "2"


def test_ephemeral_storage_per_role_and_default():
    options = KubeOptions(ephemeral_storage={"student": 20 * G},
                             default_ephemeral_storage=50 * G)
    assert kp.resources(spec_for(CPU_ONLY, options=options))["limits"][
        "ephemeral-storage"] == str(20 * G)
    got = kp.resources(spec_for(BIG_SHM, options=options))
    assert got["limits"]["ephemeral-storage"] == got["requests"]["ephemeral-storage"] == str(
        50 * G)
    assert "ephemeral-storage" not in kp.resources(spec_for(BIG_SHM))["limits"]


@pytest.mark.parametrize(("role", "options", "wanted"), [
    (EXCLUSIVE, KubeOptions(), ("nvidia.com/gpu", 2)),
    (SHARED, KubeOptions(), ("nvidia.com/gpu.shared", 1)),
    (SHARED, KubeOptions(shared_suffix=""), ("nvidia.com/gpu", 1)),  # renameByDefault off
    (MIG, KubeOptions(mig_profiles={"mig-half": "1g.10gb+me"}), ("nvidia.com/mig-1g.10gb.me", 1)),
    (replace(SHARED, name="mig-half"), KubeOptions(mig_profiles={"mig-half": "3g.40gb"}),
     ("nvidia.com/mig-3g.40gb.shared", 1)),
    (CPU_ONLY, KubeOptions(), None),
    (EXCLUSIVE, KubeOptions(gpu_resource="amd.com/gpu"), ("amd.com/gpu", 2)),
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

    spec = spec_for(SHAPES[shape], options=KubeOptions(
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
    claim = strict(home_claim(spec, "hub"), "V1PersistentVolumeClaim")
    assert claim.spec.storage_class_name == "standard"


# --- on top of what KubeSpawner builds ----------------------------------------------


async def test_apply_quota_over_a_hostile_kubespawner_pod():
    spec = spec_for(EXCLUSIVE)
    pod = await kubespawner_pod()
    assert violations(pod, spec)  # as KubeSpawner made it
    kp.apply_quota(pod, spec)
    assert violations(pod, spec) == []
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


def test_apply_quota_needs_the_notebook_container():
    with pytest.raises(ValueError, match="no container named 'notebook'"):
        kp.apply_quota({"spec": {"containers": [{"name": "x"}]}}, spec_for(CPU_ONLY))


def test_service_account_token_only_when_configured():
    spec = spec_for(CPU_ONLY, options=KubeOptions(automount_service_account_token=True))
    pod = kp.pod_manifest(spec, "p")
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert violations(pod, spec) == []


def test_apply_quota_replaces_every_contract_variable():
    spec = spec_for(SHARED)
    pod = kp.pod_manifest(spec, "p")
    _container(pod)["env"] += [{"name": n, "value": "x"} for n in CONTRACT_ENV]
    kp.apply_quota(pod, spec)
    assert violations(pod, spec) == []


def test_apply_quota_keeps_only_its_own_quota_spawner_keys():
    spec = spec_for(CPU_ONLY)
    pod = kp.pod_manifest(spec, "p")
    pod["metadata"]["labels"]["quota-spawner.protected"] = "true"  # a role that is preemptible
    pod["metadata"]["annotations"]["quota-spawner.gpus"] = "GPU-all"
    kp.apply_quota(pod, spec)
    assert not [k for k in pod["metadata"]["labels"] if k.startswith(LABEL_PREFIX)
                and k not in kp.labels(spec)]
    assert pod["metadata"]["annotations"]["quota-spawner.gpus"] == ""
