"""The role shapes the Kubernetes builders are tested on (CPU-only, exclusive, shared, MIG,
big shm, priority), the notebook pod spec of each, and KubeSpawner's own pod to write the
quota on: what tests/unit/test_kube_*.py share."""

from __future__ import annotations

from typing import Any

import pytest

from spawner.kube.notebook import NotebookPod
from spawner.kube.options import KubeOptions
from spawner.quota.model import Role

G = 2**30
IMAGE = "quota-spawner/pytorch:latest"

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
OPTIONS = KubeOptions(mig_profiles={"mig-half": "3g.40gb"})


def spec_for(role: Role, user: str = "alice", **kwargs: Any) -> NotebookPod:
    kwargs.setdefault("options", OPTIONS)
    return NotebookPod(role=role, image_key="pytorch", image=IMAGE, user_name=user,
                          hub_id="quota-3f2a", **kwargs)


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


def first_container(pod):
    return pod["spec"]["containers"][0]
