"""Whole container bodies and pod manifests, compared with the ones recorded in
notebook_bodies.json, key order included: what the engine or the API receives
for the same inputs stays the same, byte for byte, when the code that builds it
moves. The refusals are compared too, sentence by sentence and in order.

After a deliberate change of what is sent, record again and read the diff:
``.venv/bin/python tests/unit/test_notebook_bodies.py --record``.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import pytest

from spawner.docker import container as dc
from spawner.kube.checks import config_problems, violations
from spawner.kube.claims import home_claim
from spawner.kube.notebook import NotebookPod
from spawner.kube.options import KubeOptions
from spawner.kube.pod import apply_quota, pod_manifest
from spawner.quota.model import Role

RECORDED = Path(__file__).with_name("notebook_bodies.json")
G = 2**30
API = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")
IMAGE = "quota-spawner/pytorch:latest"

CPU = Role("student", cpus=0.5, memory=2 * G, images=("pytorch",), shm=G)
DISK = Role("thesis", cpus=1, memory=4 * G, images=("pytorch",), disk=20 * G)
HOME = dc.HomeBind(path="/srv/homes/o-27brien", size=20 * G,
                   use_folder="/srv/hub/home-use/o-27brien")
PLAIN = Role("plain", cpus=3, memory=6 * G, images=("pytorch",), pids=512)
SHARED = Role("gpu-lab", cpus=2, memory=8 * G, images=("pytorch",), shm=G, gpus=1,
              gpu_mode="shared", gpu_share=4, gpu_memory=16 * G)
EXCLUSIVE = Role("gpu-training", cpus=8, memory=32 * G, images=("pytorch",), shm=8 * G,
                 gpus=2, priority=300000, preempts="never", grace_period=600)
PROTECTED = Role("urgent-debug", cpus=8, memory=32 * G, images=("pytorch",), gpus=1,
                 priority=1_000_000, preemptible=False, grace_period=900)

# --- Docker: DockerSpawner's request, the admin's additions, the quota on top ------

CREATE = {"image": IMAGE, "command": ["jupyterhub-singleuser"],
          "environment": {"JUPYTERHUB_API_TOKEN": "t", "MEM_LIMIT": "99", "TZ": "UTC"},
          "volumes": ["/home/jovyan"], "ports": {"8888/tcp": None}}
HOST = {"binds": {"quota-home-x": {"bind": "/home/jovyan", "mode": "rw"}},
        "network_mode": "quota-spawner", "port_bindings": {8888: ("127.0.0.1",)}}


def container_spec(role: Role, **kwargs: Any) -> dc.ContainerSpec:
    values: dict[str, Any] = dict(role=role, image_key="pytorch", image=IMAGE,
                                  user_name="o'brien", hub_id="quota-abc",
                                  notebook_user="1000", network_mode="quota-spawner")
    values.update(kwargs)
    return dc.ContainerSpec(**values)


CONTAINERS: dict[str, tuple[dc.ContainerSpec, dict[str, Any], dict[str, Any]]] = {
    "cpu": (container_spec(CPU), {}, {}),
    "plain, boosted, admin additions": (
        container_spec(PLAIN, start_cpus=8, extra_labels={"team": "vision"},
                       notebook_user="1000:100"),
        {"working_dir": "/data", "labels": {"cost": "42"}},
        {"binds": {"/srv/data": {"bind": "/data", "mode": "ro"}}, "dns": ["10.0.0.53"],
         "security_opt": ["apparmor=docker-default"]}),
    "shared, torch reads the fraction": (
        container_spec(SHARED, gpu_uuids=("GPU-b",), gpu_mode="shared:4",
                       gpu_device_memory=80 * G, torch_reads_fraction=True),
        {"environment": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,"
                                                    "per_process_memory_fraction:0.9"}},
        {}),
    "shared, no device memory": (
        container_spec(SHARED, gpu_uuids=("GPU-c",), gpu_mode="shared:4",
                       torch_reads_fraction=True), {}, {}),
    "a home of 20 GiB, an admin's volume at the home and /tmp": (
        container_spec(DISK, home=HOME),
        {"volumes": ["/data"]},
        {"binds": {"/srv/data": {"bind": "/data", "mode": "ro"},
                   "/srv/other": {"bind": "/home/jovyan/", "mode": "rw"}},
         "tmpfs": {"/tmp": "size=100g", "/cache": "size=1g"}, "read_only": False}),
    "a home over its size": (
        container_spec(DISK, home=dc.HomeBind(
            path="/srv/homes/o-27brien", size=5 * G, use_folder="/srv/hub/home-use/o-27brien",
            over_size="The home of o'brien holds 15 GiB, at or over its size of 5 GiB: "
            "nothing was deleted, and writes are refused until files are deleted.")),
        {}, {}),
    "exclusive, two GPUs, host network": (
        container_spec(EXCLUSIVE, gpu_uuids=("GPU-a", "GPU-d"), gpu_mode="exclusive",
                       gpu_device_memory=40 * G, network_mode="host", pids_default=4096),
        {}, {"network_mode": "host", "runtime": "nvidia"}),
}


def container_outputs() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, (spec, admin_create, admin_host) in CONTAINERS.items():
        host = dict(HOST, network_mode=spec.network_mode)
        if spec.network_mode == "host":  # as DockerSpawner: no ports to publish
            host.pop("port_bindings")
        body = dc.create_body(API, spec, CREATE, host, admin_create, admin_host)
        found[f"docker {name}"] = body
        found[f"docker {name}: violations"] = dc.violations(body, spec)
    spec = CONTAINERS["shared, torch reads the fraction"][0]
    weak = dc.create_body(API, spec, CREATE, HOST, {}, {})
    weak["HostConfig"].update(Privileged=True, CapAdd=["SYS_ADMIN"], Memory=1, PidMode="host",
                              SecurityOpt=["seccomp=unconfined"], IpcMode="host")
    weak.update(User="0", Image="evil", Runtime="runc")
    weak["Labels"].update({"quota-spawner.role": "admin", "quota-spawner.x": "1"})
    weak["Env"] += ["MEM_LIMIT=1", "PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:1.0"]
    found["docker weakened: violations"] = dc.violations(weak, spec)
    spec = CONTAINERS["a home over its size"][0]
    weak = dc.create_body(API, spec, CREATE, HOST, {}, {})
    weak["HostConfig"].update(ReadonlyRootfs=False, Tmpfs={"/tmp": "size=1t"},
                              Binds=["quota-home-x:/home/jovyan:rw"])
    weak["HostConfig"]["Mounts"] = weak["HostConfig"]["Mounts"][1:]  # the home's bind gone
    weak["Labels"]["quota-spawner.disk"] = ""
    weak["Env"] = [e for e in weak["Env"] if not e.startswith(("DISK_LIMIT=", "IPYTHONDIR="))]
    weak["Env"] += ["JUPYTER_RUNTIME_DIR=/home/jovyan/.run"]
    found["docker home weakened: violations"] = dc.violations(weak, spec)
    found["docker hostile admin: problems"] = dc.admin_problems(
        spec, host={"privileged": True, "mem_limit": "8g", "network_mode": "host",
                    "something_new": 1},
        create={"user": "0", "environment": {"NVIDIA_VISIBLE_DEVICES": "all"},
                "labels": {"quota-spawner.gpus": ""}},
        environment={"GPU_MEMORY_LIMIT": "1", "TZ": "UTC"},
        extra_labels={"quota-spawner.role": "x"}, network="host")
    return found


# --- Kubernetes: the pod and the claim, and the checks on hostile pods ---------------

OPTIONS = KubeOptions(mig_profiles={"mig-half": "3g.40gb"})


def notebook_pod(role: Role, **kwargs: Any) -> NotebookPod:
    kwargs.setdefault("options", OPTIONS)
    return NotebookPod(role=role, image_key="pytorch", image=IMAGE, user_name="o'brien",
                          hub_id="quota-3f2a", **kwargs)


PODS: dict[str, NotebookPod] = {
    "cpu": notebook_pod(CPU),
    "plain, options": notebook_pod(PLAIN, uid=1001, gid=1001, home_claim="claim-x",
                                   options=KubeOptions(
                                       cpu_request_ratio=0.5, memory_request_ratio=0.25,
                                       default_ephemeral_storage=20 * G,
                                       home_storage_class="fast", home_dir="/home/user",
                                       automount_service_account_token=True)),
    "shared, torch reads the fraction": notebook_pod(
        SHARED, torch_reads_fraction=True, options=KubeOptions(gpu_device_memory=80 * G)),
    "shared, no device memory": notebook_pod(SHARED, torch_reads_fraction=True),
    "exclusive": notebook_pod(EXCLUSIVE),
    "mig": notebook_pod(replace(EXCLUSIVE, name="mig-half", gpus=1)),
    "protected": notebook_pod(PROTECTED, container="lab"),
}


def hostile_pod(spec: NotebookPod) -> dict[str, Any]:
    """A pod as a careless or hostile configuration could leave it before the quota."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "jupyter-o-brien", "labels": {
            "hub.jupyter.org/username": "o-brien", "quota-spawner.role": "admin",
            "quota-spawner.protected": "true"},
            "annotations": {"hub.jupyter.org/username": "o'brien", "quota-spawner.gpus": "x"}},
        "spec": {
            "hostIPC": True, "priority": 5, "priorityClassName": "system-node-critical",
            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": True,
            "resources": {"limits": {"cpu": "64"}},
            "securityContext": {"runAsUser": 0, "fsGroup": 0, "supplementalGroups": [0]},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
                        {"name": "quota-home", "hostPath": {"path": "/"}}],
            "containers": [{
                "name": spec.container, "image": "other:latest",
                "env": [{"name": "OMP_NUM_THREADS", "value": "64"}, {"name": "KEEP", "value": "me"},
                        {"name": "CPU_LIMIT", "value": "64.0"},
                        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {
                            "secretKeyRef": {"name": "s", "key": "k"}}},
                        {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}],
                "resources": {"limits": {"cpu": 64.0, "memory": 2**40, "nvidia.com/gpu": "8"},
                              "requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]},
                "securityContext": {"privileged": True, "runAsUser": 0},
                "ports": [{"containerPort": 8888, "hostPort": 8888, "hostIP": "0.0.0.0"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                 {"name": "data", "mountPath": "/home/jovyan"}]}],
            "initContainers": [{"name": "chown", "image": "busybox",
                                "securityContext": {"runAsUser": 0}}]}}


def pod_outputs() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, spec in PODS.items():
        pod = pod_manifest(spec, "jupyter-o-brien", namespace="hub", port=8890)
        found[f"pod {name}"] = pod
        found[f"pod {name}: violations"] = violations(pod, spec)
        found[f"pod {name}: claim"] = home_claim(spec, "hub")
        hostile = hostile_pod(spec)
        found[f"pod {name}: hostile, config problems"] = config_problems(hostile, spec)
        found[f"pod {name}: hostile, violations before"] = violations(hostile, spec)
        apply_quota(hostile, spec)
        found[f"pod {name}: hostile, with the quota"] = hostile
        found[f"pod {name}: hostile, violations after"] = violations(hostile, spec)
    spec = PODS["shared, torch reads the fraction"]
    tampered = pod_manifest(spec, "p")
    body = tampered["spec"]
    body["containers"][0]["env"] += [{"name": "MEM_LIMIT", "value": "1"},
                                     {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "x"}]
    body["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True,
                                                    capabilities={"add": ["SYS_ADMIN"]})
    body["containers"][0]["envFrom"] = [{"configMapRef": {"name": "evil"}}]
    body["volumes"].pop()
    body.update(hostNetwork=True, ephemeralContainers=[{"name": "debug", "image": "busybox"}])
    tampered["metadata"]["annotations"][
        "container.apparmor.security.beta.kubernetes.io/notebook"] = "unconfined"
    found["pod tampered: violations"] = violations(tampered, spec)
    return found


@functools.cache
def outputs() -> dict[str, Any]:
    return {**container_outputs(), **pod_outputs()}


@functools.cache
def recorded() -> dict[str, Any]:
    return json.loads(RECORDED.read_text())


@pytest.mark.parametrize("name", list(outputs()))
def test_the_same_as_recorded(name: str) -> None:
    # as the engine and the API get it: the text, so key order counts too
    assert json.dumps(outputs()[name], indent=1) == json.dumps(recorded()[name], indent=1)


def test_every_case_is_recorded() -> None:
    assert list(outputs()) == list(recorded())


def test_building_never_changes_its_inputs() -> None:
    spec = PODS["exclusive"]
    hostile = hostile_pod(spec)
    kept = copy.deepcopy(hostile)
    config_problems(hostile, spec)
    violations(hostile, spec)
    assert hostile == kept


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORDED.write_text(json.dumps(outputs(), indent=1) + "\n")
    print(f"recorded {len(outputs())} outputs in {RECORDED}")
