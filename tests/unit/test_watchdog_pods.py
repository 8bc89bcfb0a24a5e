"""The watchdog on a Kubernetes node, without a cluster.

The pods are the ones QuotaKubeSpawner builds (``kube.pod.pod_manifest``, the
annotations, limits and environment it writes), given the status a kubelet
would write. FAKE: the Kubernetes API (``FakeCoreApi``, one list call; the
serialiser is the real client's), NVML (``StubNvml``, a host scan), and the
node's /proc and cgroup trees, built in tmp_path in the layouts containerd
and CRI-O write (a kubelet and a container runtime cannot run here).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from cgroup_trees import v2_files, write_files, write_proc  # noqa: E402
from kubernetes.client import ApiClient  # noqa: E402

from spawner.gpu.nvml import HostProcess, HostScan, NvmlDevice  # noqa: E402
from spawner.kube.notebook import NotebookPod  # noqa: E402
from spawner.kube.options import KubeOptions  # noqa: E402
from spawner.kube.pod import pod_manifest  # noqa: E402
from spawner.quota.loader import load_quota_table  # noqa: E402
from spawner.watchdog.app import QuotaWatchdog, usage_samples  # noqa: E402
from spawner.watchdog.host import (  # noqa: E402
    CgroupReader,
    CpuMeter,
    MainPids,
    container_id_of,
    visible_gpus,
)
from spawner.watchdog.pods import Pods, oom_killed, server_from_pod  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TABLE = load_quota_table(str(ROOT / "hub_config" / "quotas.yaml"))
A = "a" * 63 + "1"
B = "b" * 63 + "2"
OLD = "c" * 63 + "3"
GPU = "GPU-11111111-2222-3333-4444-555555555555"
G = 2**30
MiB = 2**20
NODE = "gpu-node-3"
HUB = "quota-jhub"
POD_UID = "0f3c5a8e-1b2c-4d5e-8f90-123456789abc"
STARTED = "2026-12-01T09:00:00+00:00"


def kube_pod(user: str, role: str, cid: str, *, node: str = NODE, hub: str = HUB,
             state: dict[str, Any] | None = None,
             last: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod QuotaKubeSpawner creates for ``user`` and ``role``, as the API lists it
    once the kubelet runs it."""
    spec = NotebookPod(role=TABLE.roles[role], image_key="pytorch",
                       image="registry.example.org/pytorch:latest", user_name=user,
                       hub_id=hub, options=KubeOptions(gpu_device_memory=24 * G))
    pod = pod_manifest(spec, name=f"jupyter-{cid[:6]}", namespace="jhub", port=8888)
    pod["spec"]["nodeName"] = node
    status = {"name": "notebook", "ready": True, "restartCount": 0,
              "containerID": f"containerd://{cid}",
              "state": state or {"running": {"startedAt": STARTED}}}
    if last:
        status["lastState"] = last
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.7", "containerStatuses": [status]}
    return pod


class FakeCoreApi:
    """FAKE of CoreV1Api's pod lists, which need an API server: the pods of the node
    asked for, as a list answer; the serialiser is the real client's."""

    def __init__(self, pods: list[dict[str, Any]]):
        self.pods = pods
        self.api_client = ApiClient()
        self.calls: list[tuple[str, dict[str, str]]] = []

    def _answer(self, namespace: str, kwargs: dict[str, str]) -> dict[str, Any]:
        self.calls.append((namespace, kwargs))
        node = kwargs["field_selector"].removeprefix("spec.nodeName=")
        return {"kind": "PodList", "items": [
            p for p in self.pods if p["spec"].get("nodeName") == node
            and (not namespace or p["metadata"]["namespace"] == namespace)]}

    def list_namespaced_pod(self, namespace: str, **kwargs: str) -> dict[str, Any]:
        return self._answer(namespace, kwargs)

    def list_pod_for_all_namespaces(self, **kwargs: str) -> dict[str, Any]:
        return self._answer("", kwargs)


def node_proc(proc: Path, pid: int, cgroup: str, environ: dict[str, str] | None = None) -> None:
    write_proc(proc, pid, cgroup)
    if environ is not None:
        (proc / str(pid) / "environ").write_bytes(b"".join(
            f"{k}={v}".encode() + b"\0" for k, v in environ.items()))


def v2(path: str) -> str:
    return f"0::{path}\n"


def containerd(cid: str) -> str:
    """containerd's cgroup v2 path with the systemd driver, burstable QoS."""
    return (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{cid}.scope")


# --- which container a PID is in, on a Kubernetes node -----------------------------------


@pytest.mark.parametrize("text", [
    v2(containerd(A)),
    v2(f"/kubepods.slice/kubepods-pod{POD_UID}.slice/crio-{A}.scope"),  # CRI-O, Guaranteed
    v2(f"/kubepods/burstable/pod{POD_UID}/{A}"),  # containerd, cgroupfs driver
    v2(f"/kubepods/besteffort/pod{POD_UID}/crio-{A}"),  # CRI-O, cgroupfs driver
    f"11:memory:/kubepods/burstable/pod{POD_UID}/{A}\n0::/\n",  # v1
    v2(f"/../../kubepods-burstable-pod{POD_UID}.slice/cri-containerd-{A}.scope"),  # own ns
], ids=["containerd-systemd", "crio-systemd", "containerd-cgroupfs", "crio-cgroupfs",
        "v1-cgroupfs", "other-namespace"])
def test_a_pid_in_a_pod_maps_to_its_container(tmp_path, text):
    node_proc(tmp_path, 100, text)
    assert container_id_of(100, proc=tmp_path) == A


def test_cri_o_s_monitor_and_the_pause_slice_are_no_container(tmp_path):
    node_proc(tmp_path, 100, v2(f"/kubepods.slice/crio-conmon-{A}.scope"))
    node_proc(tmp_path, 101, v2(f"/kubepods.slice/kubepods-pod{POD_UID}.slice"))
    assert container_id_of(100, proc=tmp_path) is None
    assert container_id_of(101, proc=tmp_path) is None


def test_in_a_cgroup_namespace_of_its_own_the_folder_is_found_by_name(tmp_path):
    # the DaemonSet's pod sees paths relative to its own cgroup; the host's tree is
    # mounted at cgroup_root, where the container's folder is found by its name
    proc, root = tmp_path / "proc", tmp_path / "host-cgroup"
    write_files(root / containerd(A).lstrip("/"), v2_files(300 * MiB, 100 * MiB, 2500000, 1))
    pod_slice = f"kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice"
    node_proc(proc, 100, v2(f"/../../../{pod_slice}/cri-containerd-{A}.scope"))
    server = server_from_pod(kube_pod("ann", "student", A), pid=100)
    usage = CgroupReader(root=root, proc=proc).read(server)
    assert (usage.working_set, usage.cpu_seconds, usage.oom_kills) == (200 * MiB, 2.5, 1)


# --- main PIDs and GPUs from the node ----------------------------------------------------


def test_main_pids_are_the_lowest_in_each_container_and_kept(tmp_path):
    node_proc(tmp_path, 7, v2("/system.slice/containerd.service"))
    node_proc(tmp_path, 1200, v2(containerd(A)))
    node_proc(tmp_path, 1201, v2(containerd(A) + "/child"))
    node_proc(tmp_path, 1300, v2(containerd(B)))
    pids = MainPids(tmp_path)
    assert pids.find([A, B, OLD]) == {A: 1200, B: 1300}
    node_proc(tmp_path, 900, v2(containerd(A)))  # a lower PID later: the one found is kept
    assert pids.find([A]) == {A: 1200}
    (tmp_path / "1200" / "cgroup").unlink()
    (tmp_path / "1200").rmdir()  # the main process is gone: looked for again
    assert pids.find([A]) == {A: 900}


@pytest.mark.parametrize("value, mounted, expected", [
    (f"{GPU},GPU-2", (), (GPU, "GPU-2")),
    (f"{GPU}::0,{GPU}::3", (), (GPU,)),  # time-slicing's replicas: one GPU
    ("MIG-aaaa", (), ("MIG-aaaa",)),
    ("/var/run/nvidia-container-devices", (GPU,), (GPU,)),  # volume-mounts strategy
    ("void", (), ()),
    ("0,1", (), ()),  # deviceIDStrategy index: not UUIDs, not guessed
    (None, (), ()),
], ids=["envvar", "replicas", "mig", "volume-mounts", "none", "indices", "unset"])
def test_visible_gpus_as_the_device_plugin_gave_them(tmp_path, value, mounted, expected):
    environ = {"PATH": "/usr/bin", "HOME": "/home/jovyan"}
    if value is not None:
        environ["NVIDIA_VISIBLE_DEVICES"] = value
    node_proc(tmp_path, 100, v2(containerd(A)), environ)
    devices = tmp_path / "100" / "root" / "var" / "run" / "nvidia-container-devices"
    for uuid in mounted:
        devices.mkdir(parents=True, exist_ok=True)
        (devices / uuid).write_text("")
    assert visible_gpus(100, tmp_path) == expected


def test_an_unreadable_environment_gives_no_gpus(tmp_path):
    assert visible_gpus(4242, tmp_path) == ()


# --- a pod as a server --------------------------------------------------------------------


def test_a_pod_is_the_server_the_rules_know():
    pod = kube_pod("o'brien", "gpu-lab", A)
    server = server_from_pod(pod, pid=1200, gpus=(GPU,))
    role = TABLE.roles["gpu-lab"]
    assert (server.container_id, server.name, server.pid) == (A, pod["metadata"]["name"], 1200)
    assert (server.user, server.role, server.image, server.hub_id) == (
        "o'brien", "gpu-lab", "pytorch", HUB)  # the exact names, from the annotations
    assert server.gpus == (GPU,) and server.gpu_mode == "shared:4" and server.shared_gpu
    assert server.memory_limit == role.memory and server.cpus == role.cpus
    assert server.cpus_reserved == role.cpus  # the host room it counts for
    assert server.gpu_memory_limit == role.gpu_memory
    assert server.started == pytest.approx(1796115600.0)


@pytest.mark.parametrize("change", [
    lambda p: p["metadata"]["annotations"].pop("quota-spawner.user"),
    lambda p: p["status"]["containerStatuses"][0].update(state={"waiting": {}}),
    lambda p: p["status"]["containerStatuses"][0].pop("containerID"),
], ids=["not-ours", "not-running", "no-container-yet"])
def test_pods_that_are_no_server(change):
    pod = kube_pod("ann", "student", A)
    change(pod)
    assert server_from_pod(pod, pid=1200) is None


def test_an_oom_kill_shows_before_and_after_the_restart():
    killed = {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                             "containerID": f"containerd://{OLD}"}}
    assert oom_killed(kube_pod("ann", "student", OLD, state=killed)) == OLD
    assert oom_killed(kube_pod("ann", "student", A, last=killed)) == OLD
    crashed = {"terminated": {"reason": "Error", "exitCode": 1,
                              "containerID": f"containerd://{OLD}"}}
    assert oom_killed(kube_pod("ann", "student", A, last=crashed)) == ""


# --- the node's servers ------------------------------------------------------------------


@pytest.fixture
def node(tmp_path):
    proc = tmp_path / "proc"
    node_proc(proc, 1200, v2(containerd(A)), {"NVIDIA_VISIBLE_DEVICES": GPU})
    node_proc(proc, 1300, v2(containerd(B)), {"NVIDIA_VISIBLE_DEVICES": "void"})
    return proc


def test_pods_lists_this_node_s_servers_of_this_hub(node):
    api = FakeCoreApi([
        kube_pod("ann", "gpu-lab", A),
        kube_pod("bo", "student", B),
        kube_pod("cy", "student", OLD),  # no process on this node yet: skipped this cycle
        kube_pod("dee", "student", "d" * 64, node="gpu-node-4"),  # another node
        kube_pod("eve", "student", "e" * 64, hub="other-hub"),  # another hub
    ])
    pods = Pods(api, NODE, "jhub", HUB, node)
    servers = {s.user: s for s in pods.servers()}
    assert sorted(servers) == ["ann", "bo"]
    assert servers["ann"].gpus == (GPU,) and servers["ann"].pid == 1200
    assert servers["bo"].gpus == () and servers["bo"].pid == 1300
    assert api.calls == [("jhub", {"label_selector": "quota-spawner.user",
                                   "field_selector": f"spec.nodeName={NODE}",
                                   "_request_timeout": 10.0})]
    node_proc(node, 1500, v2(containerd("e" * 64)))
    every = Pods(api, NODE, "", "", node)  # every namespace, every hub
    assert sorted(s.user for s in every.servers()) == ["ann", "bo", "eve"]
    assert api.calls[-1][0] == ""


def test_an_oom_kill_is_told_once(node):
    api = FakeCoreApi([kube_pod("ann", "gpu-lab", A)])
    pods = Pods(api, NODE, "jhub", HUB, node)
    (before,) = pods.servers()
    assert pods.take() == []
    # the kubelet restarted the killed notebook: a new container id, the kill in lastState
    killed = {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                             "containerID": f"containerd://{A}"}}
    api.pods = [kube_pod("ann", "gpu-lab", B, last=killed)]
    node_proc(node, 1400, v2(containerd(B)), {"NVIDIA_VISIBLE_DEVICES": GPU})
    (after,) = pods.servers()
    assert pods.take() == [before] and after.container_id == B
    pods.servers()
    assert pods.take() == []  # the same kill, still in lastState: not told again


# --- one watchdog cycle ------------------------------------------------------------------


class StubNvml:
    """FAKE of NVML's host scan: one GPU, with the PIDs on it."""

    def __init__(self, processes: list[HostProcess]):
        self.processes = processes

    def host_gpus(self, expected: Any = ()) -> HostScan:
        return HostScan([NvmlDevice(GPU, 0, name="NVIDIA L4", memory_used=3 * G,
                                    memory_total=24 * G, utilization=0.0,
                                    processes=self.processes)])


class NoXids:
    def poll(self) -> list[Any]:
        return []


def test_a_cycle_reads_pods_as_it_reads_containers(tmp_path, node):
    root = tmp_path / "cgroup"
    write_files(root / containerd(A).lstrip("/"), v2_files(900 * MiB, 100 * MiB, 1000000, 0))
    node_proc(node, 1250, v2(containerd(A)))  # the notebook's kernel, on the GPU
    app = QuotaWatchdog(source="kubernetes", node_name=NODE, hub_id=HUB, proc_root=str(node))
    app.log = logging.getLogger("test")
    app.containers = app.oom_events = Pods(FakeCoreApi([kube_pod("ann", "gpu-lab", A)]),
                                           NODE, "jhub", HUB, node)
    app.nvml, app.xids, app._last_gpus = StubNvml([HostProcess(1250, 2 * G)]), NoXids(), {}
    app.cgroups, app.cpu = CgroupReader(root=root, proc=node), CpuMeter()
    snapshot = app.collect()
    (sample,) = snapshot.servers.values()
    assert sample.server.user == "ann" and sample.server.gpus == (GPU,)
    assert sample.gpu_memory == {GPU: 2 * G}  # its kernel's, mapped by PID
    assert sample.memory_working_set == 800 * MiB
    assert snapshot.engine_cpus is None  # the node's size is not read
    (ledger,) = usage_samples(snapshot)
    # the sample goes to the session QuotaKubeSpawner opened, keyed by the pod's name
    assert (ledger.hub, ledger.container) == (HUB, sample.server.name)
    assert ledger.gpu_util == 0.0 and ledger.gpu_memory == 2 * G


def test_kubernetes_without_a_node_name_exits():
    app = QuotaWatchdog(source="kubernetes", node_name="")
    with pytest.raises(SystemExit) as info:
        app.pods()
    assert info.value.code == 2
