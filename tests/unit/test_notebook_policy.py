"""spawner/policy/: one notebook policy for both backends.

What the quota decides about a server (``Notebook``: its GPUs, mode and caps,
its environment, its labels) is computed once, and Docker's ``ContainerSpec``
and Kubernetes' ``NotebookPod`` read it from there; the last check's rules and
error are one. The policy and the Kubernetes builders import nothing of Docker
(nor the policy anything of Kubernetes): each is imported here in a process
that refuses those packages, and builds what it builds there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spawner.contract import CONTRACT_ENV, CONTRACT_LABELS, gpu_mode_value
from spawner.docker.container import ContainerPolicyError, ContainerSpec
from spawner.docker.container import environment as docker_environment
from spawner.kube import pod as kp
from spawner.kube.notebook import NotebookPod
from spawner.kube.options import KubeOptions
from spawner.policy import rules
from spawner.policy.environment import environment, role_environment, torch_allocator
from spawner.policy.labels import labels
from spawner.policy.notebook import Notebook
from spawner.quota.model import Role

ROOT = Path(__file__).resolve().parents[2]
G = 2**30
IMAGE = "quota-spawner/pytorch:latest"
CPU = Role("student", cpus=0.5, memory=2 * G, images=("pytorch",))
SHARED = Role("gpu-lab", cpus=2, memory=8 * G, images=("pytorch",), shm=G, gpus=1,
              gpu_mode="shared", gpu_share=4, gpu_memory=16 * G)
EXCLUSIVE = Role("gpu-training", cpus=8, memory=32 * G, images=("pytorch",), gpus=2)


def notebook(role: Role, **kwargs) -> Notebook:
    return Notebook(role, "pytorch", IMAGE, "alice", "h", **kwargs)


def spec_for(role: Role, **kwargs) -> NotebookPod:
    return NotebookPod(role=role, image_key="pytorch", image=IMAGE, user_name="alice",
                       hub_id="quota-3f2a", **kwargs)


# --- the decision, once -----------------------------------------------------------


@pytest.mark.parametrize(("role", "kwargs", "count", "mode", "cap"), [
    (CPU, {}, 0, "", None),
    (CPU, {"device_plugin": True}, 0, "", None),
    (SHARED, {"gpu_uuids": ("GPU-a",)}, 1, "shared:4", 16 * G),
    (SHARED, {"device_plugin": True}, 1, "shared:4", 16 * G),
    (SHARED, {}, 0, "", None),  # a GPU role before the pool assigned its GPU
    (EXCLUSIVE, {"gpu_uuids": ("GPU-a", "GPU-b")}, 2, "exclusive", None),
    (EXCLUSIVE, {"device_plugin": True}, 2, "exclusive", None),
])
def test_gpus_mode_and_cap(role, kwargs, count, mode, cap):
    found = notebook(role, **kwargs)
    assert (found.gpu_count, found.gpu_mode, found.gpu_memory_cap) == (count, mode, cap)
    assert found.gpu_mode == (gpu_mode_value(role.gpus, role.gpu_mode, role.gpu_share)
                              if count else "")


@pytest.mark.parametrize(("kwargs", "fraction"), [
    ({"gpu_device_memory": 80 * G, "torch_reads_fraction": True}, 0.2),
    ({"gpu_device_memory": 80 * G}, None),  # the image's torch does not read it
    ({"torch_reads_fraction": True}, None),  # the card's size is not known
])
def test_torch_fraction_only_where_it_applies(kwargs, fraction):
    for where in ({"gpu_uuids": ("GPU-a",)}, {"device_plugin": True}):
        found = notebook(SHARED, **where, **kwargs)
        assert found.torch_fraction == fraction
        assert torch_allocator(found) == (None if fraction is None
                                          else f"per_process_memory_fraction:{fraction:.3f}")
    assert notebook(EXCLUSIVE, gpu_uuids=("GPU-a",), gpu_device_memory=80 * G,
                    torch_reads_fraction=True).torch_fraction is None


def test_the_admins_allocator_options_stay_before_the_fraction():
    found = notebook(SHARED, gpu_uuids=("GPU-a",), gpu_device_memory=80 * G,
                     torch_reads_fraction=True)
    assert torch_allocator(found, "expandable_segments:True,per_process_memory_fraction:0.9") \
        == "expandable_segments:True,per_process_memory_fraction:0.200"


def test_both_backends_read_the_same_decision():
    docker = ContainerSpec(SHARED, "pytorch", IMAGE, "alice", "h", "1000", "quota-spawner",
                           gpu_uuids=("GPU-1",), gpu_mode="shared:4",
                           gpu_device_memory=80 * G, torch_reads_fraction=True)
    kube = NotebookPod(SHARED, "pytorch", IMAGE, "alice", "h", torch_reads_fraction=True,
                       options=KubeOptions(gpu_device_memory=80 * G))
    for name in ("gpu_count", "gpu_mode", "gpu_memory_cap", "torch_fraction"):
        assert getattr(docker.notebook, name) == getattr(kube.notebook, name), name
    assert docker.notebook.gpu_uuids == ("GPU-1",) and kube.notebook.gpu_uuids == ()


def test_the_homes_size_is_the_roles_disk_on_both_backends():
    sized = Role("student", cpus=0.5, memory=2 * G, images=("pytorch",), disk=20 * G)
    for role, size in ((sized, 20 * G), (CPU, None)):  # no disk: the home has no limit
        docker = ContainerSpec(role, "pytorch", IMAGE, "alice", "h", "1000", "quota-spawner")
        assert docker.notebook.home_size == spec_for(role).notebook.home_size == size


def test_a_container_spec_with_another_gpu_mode_is_refused():
    with pytest.raises(ValueError, match="gpu_mode 'exclusive' is not the role's 'shared:4'"):
        ContainerSpec(SHARED, "pytorch", IMAGE, "alice", "h", "1000", "quota-spawner",
                      gpu_uuids=("GPU-1",), gpu_mode="exclusive")


# --- the environment and the labels ---------------------------------------------------


def test_the_shared_contract_is_one_function():
    """Docker's and Kubernetes' environments hold the same role variables."""
    docker = docker_environment(ContainerSpec(SHARED, "pytorch", IMAGE, "alice", "h", "1000",
                                              "quota-spawner", gpu_uuids=("GPU-1",),
                                              gpu_device_memory=80 * G))
    kube = kp.environment(spec_for(SHARED, options=KubeOptions(gpu_device_memory=80 * G)))
    assert role_environment(SHARED).items() <= docker.items()
    assert role_environment(SHARED).items() <= kube.items()
    assert {k: v for k, v in docker.items() if k != "NVIDIA_VISIBLE_DEVICES"} == kube


@pytest.mark.parametrize(("role", "kwargs", "devices"), [
    (CPU, {}, "void"),
    (CPU, {"device_plugin": True}, "void"),  # outranks the "all" of CUDA images
    (SHARED, {"gpu_uuids": ("GPU-a",)}, "GPU-a"),
    (SHARED, {"device_plugin": True}, None),  # the device plugin sets it
    (EXCLUSIVE, {"gpu_uuids": ("GPU-a", "GPU-b")}, "GPU-a,GPU-b"),
])
def test_the_device_variable(role, kwargs, devices):
    env = environment(notebook(role, **kwargs))
    assert env.get("NVIDIA_VISIBLE_DEVICES") == devices
    assert set(env) <= set(CONTRACT_ENV)
    assert ("GPU_MEMORY_LIMIT" in env) == (role is SHARED)


def test_labels_in_the_contracts_order():
    found = labels(notebook(SHARED, gpu_uuids=("GPU-a", "GPU-b")))
    assert tuple(found) == CONTRACT_LABELS
    assert found == {"quota-spawner.user": "alice", "quota-spawner.role": "gpu-lab",
                     "quota-spawner.image": "pytorch", "quota-spawner.gpus": "GPU-a,GPU-b",
                     "quota-spawner.gpu-mode": "shared:4", "quota-spawner.hub": "h"}
    assert labels(notebook(SHARED, device_plugin=True))["quota-spawner.gpus"] == ""


# --- the rules of the last check -------------------------------------------------------


def test_refuse_any():
    rules.refuse_any([])
    with pytest.raises(rules.PolicyError) as raised:
        rules.refuse_any(["a", "b"])
    assert raised.value.problems == ["a", "b"]
    assert str(raised.value) == "a; b"
    assert ContainerPolicyError is rules.PolicyError  # the name QuotaSpawner catches


def test_what_only_the_spawner_sets():
    assert all(rules.owned_variable(name) for name in CONTRACT_ENV)
    assert not rules.owned_variable("TZ") and not rules.owned_variable(None)
    assert rules.owned_label("quota-spawner.anything") and not rules.owned_label("team")
    ids = [(0, None), (1000, 0), (1000, None), (1000, 100), (None, None), (-1, 100)]
    assert [rules.is_root(*i) for i in ids] == [True, True, False, False, True, True]


def test_the_sentences():
    assert rules.differs("spec.x", 1, 2) == "spec.x is 1, not 2"
    assert rules.differs("HostConfig.Memory", 1, 2, "the role's memory") == (
        "HostConfig.Memory is 1, not 2: the role's memory")
    assert rules.mismatches("ctx.", {"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == [
        "ctx.b is 2, not 3", "ctx.c is None, not 4"]
    found = {"quota-spawner.role": "x", "quota-spawner.y": "1", "team": "t"}
    assert rules.label_problems("label", found, {"quota-spawner.role": "r"}) == [
        "label quota-spawner.role is 'x', not 'r'",
        "label quota-spawner.y is not one the spawner writes"]
    entries = [("MEM_LIMIT", "1"), ("MEM_LIMIT", "2"), ("QUOTA_ROLE", "r"), ("TZ", "UTC")]
    wanted = {"MEM_LIMIT": "1", "CPU_LIMIT": "2"}
    assert rules.environment_problems(entries, wanted, where="container notebook: ") == [
        "container notebook: environment CPU_LIMIT is [], not ['2']",
        "container notebook: environment MEM_LIMIT is ['1', '2'], not ['1']",
        "container notebook: environment QUOTA_ROLE is ['r'], not []"]


# --- no Docker on Kubernetes, no Kubernetes in the policy ------------------------------

POLICY = ["spawner.policy.gpu", "spawner.policy.notebook", "spawner.policy.environment",
          "spawner.policy.labels", "spawner.policy.rules"]
# KubeSpawner's builders: everything in spawner/kube/ but the spawner itself
KUBE_BUILDERS = ["spawner.kube.names", "spawner.kube.priority", "spawner.kube.options",
                 "spawner.kube.notebook", "spawner.kube.quantities", "spawner.kube.security",
                 "spawner.kube.claims", "spawner.kube.pod", "spawner.kube.checks",
                 "spawner.kube.pod_end", "spawner.usage.sessions"]
REFUSED = ["docker", "dockerspawner", "kubernetes", "kubernetes_asyncio", "kubespawner"]
BUILD = """
from spawner.kube.checks import config_problems, violations
from spawner.kube.claims import home_claim
from spawner.kube.pod_end import pod_end
from spawner.kube.notebook import NotebookPod
from spawner.kube.options import KubeOptions
from spawner.kube.pod import pod_manifest
from spawner.quota.model import Role

role = Role("gpu-lab", cpus=2, memory=2**33, images=("pytorch",), shm=2**30, gpus=1,
            gpu_mode="shared", gpu_share=4, gpu_memory=2**34)
spec = NotebookPod(role, "pytorch", "img", "o'brien", "hub",
                   options=KubeOptions(gpu_device_memory=2**36), torch_reads_fraction=True)
pod = pod_manifest(spec, "jupyter-o-brien", "hub")
assert config_problems(pod, spec) == [] and violations(pod, spec) == [], violations(pod, spec)
assert home_claim(spec)["metadata"]["name"] == "quota-home-o-brien---65b87174be3b"
assert pod_end(None)[0] == "lost"
"""


def imported_without(modules: list[str], refused: list[str], then: str = "") -> list[str]:
    """Import ``modules`` (and run ``then``) in a Python whose imports of ``refused`` fail;
    the modules it loaded."""
    code = (
        "import json, sys\n"
        f"REFUSED = {refused!r}\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in REFUSED:\n"
        "            raise ImportError(f'{name} is refused here')\n"
        "sys.meta_path.insert(0, Refuse())\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        f"{then}\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_policy_imports_neither_docker_nor_kubernetes():
    loaded = imported_without(POLICY, REFUSED)
    assert not [m for m in loaded if m.startswith(("spawner.docker", "spawner.kube"))]


def test_the_kubernetes_builders_build_a_pod_without_docker_or_the_client():
    loaded = imported_without(KUBE_BUILDERS, REFUSED, BUILD)
    assert not [m for m in loaded if m.startswith("spawner.docker")]


def test_the_kubernetes_spawner_imports_no_docker():
    pytest.importorskip("kubespawner")
    loaded = imported_without(["spawner.kube.spawner"], ["docker", "dockerspawner"])
    assert "kubespawner" in loaded
    assert not [m for m in loaded if m.startswith("spawner.docker")]


def test_importing_the_pod_builder_imports_no_docker():
    """As ``python -X importtime -c 'import spawner.kube.pod'`` lists it."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import spawner.kube.pod"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    modules = [line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:")]
    assert "spawner.kube.pod" in modules
    assert not [m for m in modules
                if m.partition(".")[0] in ("docker", "dockerspawner", "kubernetes",
                                           "kubespawner")
                or m.startswith("spawner.docker")]
