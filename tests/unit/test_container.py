"""The container module: what an admin may add, the quota on top, and the invariants.

Pure functions, checked case by case without an engine; the end-to-end tests
(test_e2e_guarantees.py) check the same rules on a real hub and dockerd.
"""

from __future__ import annotations

import copy

import docker
import pytest

from spawner.contract import CONTRACT_ENV
from spawner.docker.container import (
    ContainerPolicyError,
    ContainerSpec,
    admin_problems,
    apply_quota,
    check_admin_create_kwargs,
    check_admin_environment,
    check_admin_host_config,
    check_admin_labels,
    create_body,
    deep_merge,
    device_requests,
    environment,
    labels,
    refuse_any,
    violations,
)
from spawner.docker.mounts import BindSource, bind_sources, normalise, refused
from spawner.quota.model import Role

GiB = 2**30
ROLE = Role(name="small", cpus=2, memory=4 * GiB, images=("pytorch",), shm=GiB)
GPU_ROLE = Role(name="gpu", cpus=1.5, memory=8 * GiB, images=("pytorch",), gpus=1,
                gpu_mode="shared", gpu_share=4, gpu_memory=16 * GiB)
API = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")


def spec(role: Role = ROLE, **kwargs) -> ContainerSpec:
    values = dict(role=role, image_key="pytorch", image="quota-spawner/pytorch:latest",
                  user_name="o'brien{0}<b>", hub_id="quota-abc", notebook_user="1000",
                  network_mode="quota-spawner")
    values.update(kwargs)
    return ContainerSpec(**values)


def body(host: dict | None = None, **create) -> dict:
    """An engine create body built as DockerSpawner builds it, through docker-py."""
    host_kwargs = {"binds": {"quota-home-x": {"bind": "/home/jovyan", "mode": "rw"}},
                   "network_mode": "quota-spawner", **(host or {})}
    kwargs = {"image": "quota-spawner/pytorch:latest", "command": ["jupyterhub-singleuser"],
              "environment": {"JUPYTERHUB_API_TOKEN": "t", "MEM_LIMIT": "1"}, **create}
    return dict(API.create_container_config(host_config=API.create_host_config(**host_kwargs),
                                            **kwargs))


def quota_body(s: ContainerSpec | None = None, **kwargs) -> dict:
    s = s or spec()
    return apply_quota(body(**kwargs), s)


# --- the quota on top ---------------------------------------------------------------


def test_apply_quota_sets_every_limit_and_the_hardening():
    b = quota_body()
    host = b["HostConfig"]
    assert (host["Memory"], host["MemorySwap"]) == (4 * GiB, 4 * GiB)
    assert (host["CpuQuota"], host["CpuPeriod"]) == (200_000, 100_000)
    assert host["PidsLimit"] == 2048 and host["ShmSize"] == GiB
    assert host["Privileged"] is False and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["DeviceRequests"] == [] and host["Devices"] == []
    assert host["AutoRemove"] is True
    assert b["User"] == "1000" and b["Image"] == "quota-spawner/pytorch:latest"
    assert violations(b, spec()) == []


def test_labels_are_exact_for_any_user_name():
    b = quota_body()
    assert b["Labels"]["quota-spawner.user"] == "o'brien{0}<b>"
    assert b["Labels"] == {**labels(spec())}
    assert labels(spec())["quota-spawner.gpus"] == ""


def test_environment_contract_replaces_what_was_there():
    env = dict(e.split("=", 1) for e in quota_body()["Env"])
    assert env["MEM_LIMIT"] == str(4 * GiB) and env["CPU_LIMIT"] == "2"
    assert env["QUOTA_ROLE"] == "small" and env["OMP_NUM_THREADS"] == "2"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["JUPYTERHUB_API_TOKEN"] == "t"
    names = [e.split("=", 1)[0] for e in quota_body()["Env"]]
    assert len(names) == len(set(names))


def test_gpus_are_exact_device_ids_never_a_count():
    s = spec(GPU_ROLE, gpu_uuids=("GPU-b",), gpu_mode="shared:4", gpu_device_memory=64 * GiB)
    b = quota_body(s)
    (request,) = b["HostConfig"]["DeviceRequests"]
    assert request == {"Driver": "nvidia", "Count": 0, "DeviceIDs": ["GPU-b"],
                       "Capabilities": [["gpu"]], "Options": {}}
    env = dict(e.split("=", 1) for e in b["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert env["GPU_MEMORY_LIMIT"] == str(16 * GiB)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250"
    assert env["OMP_NUM_THREADS"] == "1"
    assert b["Labels"]["quota-spawner.gpus"] == "GPU-b"
    assert b["Labels"]["quota-spawner.gpu-mode"] == "shared:4"
    assert violations(b, s) == []
    assert device_requests(spec()) == []


def test_role_without_shm_gets_the_engine_default():
    role = Role(name="plain", cpus=1, memory=GiB, images=("pytorch",))
    b = apply_quota(body(host={"shm_size": "2g"}), spec(role))
    assert "ShmSize" not in b["HostConfig"]
    assert violations(b, spec(role)) == []


def test_apply_quota_overwrites_a_weakened_body():
    """Whatever came before (a hook, an override, a DockerSpawner change), the quota wins."""
    weak = body(host={"privileged": True, "cap_add": ["SYS_ADMIN"], "mem_limit": "64g",
                      "memswap_limit": -1, "nano_cpus": 16 * 10**9, "pids_limit": -1,
                      "security_opt": ["no-new-privileges:false"], "auto_remove": False,
                      "devices": ["/dev/fuse:/dev/fuse:rwm"]},
                user="0", labels={"quota-spawner.gpus": ""},
                environment={"NVIDIA_VISIBLE_DEVICES": "all"})
    b = apply_quota(weak, spec())
    host = b["HostConfig"]
    assert host["Privileged"] is False and "CapAdd" not in host and "NanoCpus" not in host
    assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (4 * GiB, 4 * GiB, 2048)
    assert host["Devices"] == [] and host["AutoRemove"] is True
    assert b["User"] == "1000"
    assert "NVIDIA_VISIBLE_DEVICES=void" in b["Env"]
    assert "NVIDIA_VISIBLE_DEVICES=all" not in b["Env"]
    # the weakening security_opt is still there, and the invariants say so
    assert violations(b, spec()) == [
        "HostConfig.SecurityOpt has 'no-new-privileges:false', which undoes the hardening"]


# --- the invariants ------------------------------------------------------------------


@pytest.mark.parametrize("field, value, words", [
    ("Privileged", True, "HostConfig.Privileged"),
    ("CapAdd", ["SYS_ADMIN"], "HostConfig.CapAdd"),
    ("CapDrop", [], "every capability dropped"),
    ("SecurityOpt", [], "lacks no-new-privileges"),
    ("SecurityOpt", ["no-new-privileges", "seccomp=unconfined"], "undoes the hardening"),
    ("SecurityOpt", ["no-new-privileges", "apparmor:unconfined"], "undoes the hardening"),
    ("SecurityOpt", ["no-new-privileges", "label=disable"], "undoes the hardening"),
    ("SecurityOpt", ["no-new-privileges", "systempaths=unconfined"], "undoes the hardening"),
    ("Memory", 8 * GiB, "the role's memory"),
    ("MemorySwap", -1, "no swap"),
    ("MemorySwap", 8 * GiB, "no swap"),
    ("CpuQuota", 1_600_000, "the role's CPUs"),
    ("CpuPeriod", 10_000, "period"),
    ("NanoCpus", 16 * 10**9, "HostConfig.NanoCpus"),
    ("CpuCount", 16, "HostConfig.CpuCount"),
    ("PidsLimit", -1, "the pids limit"),
    ("PidsLimit", 0, "the pids limit"),
    ("ShmSize", 64 * GiB, "shared memory"),
    ("DeviceRequests", [{"Driver": "nvidia", "Count": -1}], "exactly the assigned GPUs"),
    ("Devices", [{"PathOnHost": "/dev/mem"}], "HostConfig.Devices"),
    ("DeviceCgroupRules", ["c 1:1 rwm"], "HostConfig.DeviceCgroupRules"),
    ("PidMode", "host", "PidMode"),
    ("PidMode", "container:hub", "PidMode"),
    ("IpcMode", "host", "IpcMode"),
    ("IpcMode", "container:hub", "IpcMode"),
    ("UsernsMode", "host", "UsernsMode"),
    ("UTSMode", "host", "UTSMode"),
    ("CgroupParent", "/", "CgroupParent"),
    ("CgroupnsMode", "host", "CgroupnsMode"),
    ("VolumesFrom", ["hub"], "VolumesFrom"),
    ("Runtime", "runc-privileged", "Runtime"),
    ("OomKillDisable", True, "OomKillDisable"),
    ("OomScoreAdj", -1000, "OomScoreAdj"),
    ("PublishAllPorts", True, "PublishAllPorts"),
    ("AutoRemove", False, "a fresh container"),
    ("NetworkMode", "container:hub", "NetworkMode"),
    ("NetworkMode", "host", "NetworkMode"),
    ("MaskedPaths", ["/proc/kcore"], "MaskedPaths"),
    ("Binds", ["/var/run/docker.sock:/var/run/docker.sock"], "engine's socket"),
    ("PortBindings", {"8888/tcp": [{"HostIp": "0.0.0.0", "HostPort": ""}]}, "loopback only"),
    ("PortBindings", {"8888/tcp": [{"HostIp": "", "HostPort": "8888"}]}, "every address"),
])
def test_each_invariant_is_checked(field, value, words):
    b = quota_body()
    b["HostConfig"][field] = value
    found = violations(b, spec())
    assert len(found) == 1 and words in found[0], found


@pytest.mark.parametrize("change, words", [
    ({"User": "0"}, "non-root"),
    ({"User": "root"}, "non-root"),
    ({"User": "1000:0"}, "root group"),
    ({"User": ""}, "non-root"),
    ({"Image": "ubuntu"}, "the role's"),
    ({"Runtime": "nvidia"}, "top-level Runtime"),
    ({"Labels": {}}, "label quota-spawner.user"),
    ({"Labels": None}, "label quota-spawner.user"),
    ({"Env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "environment"),
])
def test_create_body_invariants(change, words):
    b = quota_body()
    b.update(change)
    found = violations(b, spec())
    assert found and all(words in f or "environment" in f or "label" in f for f in found), found
    assert any(words in f for f in found)


def test_contract_variables_must_appear_once_with_our_value():
    b = quota_body()
    b["Env"] = b["Env"] + ["QUOTA_ROLE=admin"]
    assert violations(b, spec()) == ["environment QUOTA_ROLE is ['small', 'admin'], not ['small']"]
    b = quota_body()
    b["Env"] = b["Env"] + ["NVIDIA_MIG_CONFIG_DEVICES=all"]
    assert violations(b, spec()) == ["environment NVIDIA_MIG_CONFIG_DEVICES is ['all'], not []"]


def test_a_stray_quota_label_is_refused():
    b = quota_body()
    b["Labels"]["quota-spawner.extra"] = "x"
    assert violations(b, spec()) == ["label quota-spawner.extra is not one the spawner writes"]


def test_a_configured_root_or_no_pids_limit_is_refused():
    assert any("non-root" in v for v in violations(quota_body(spec(notebook_user="0")),
                                                   spec(notebook_user="0")))
    s = spec(pids_default=0)
    assert any("from 1 to" in v for v in violations(quota_body(s), s))


def test_loopback_port_bindings_are_allowed():
    for address in ("127.0.0.1", "::1", "127.0.0.2"):
        b = quota_body(host={"port_bindings": {8888: (address,)}})
        assert violations(b, spec()) == [], address


def test_a_pids_default_above_the_kernel_limit_is_refused():
    s = spec(pids_default=10**9)
    assert any("from 1 to 4194304" in v for v in violations(quota_body(s), s))


def test_host_mode_is_allowed_when_it_is_the_spawner_network():
    s = spec(network_mode="host")
    b = apply_quota(body(host={"network_mode": "host"}), s)
    assert violations(b, s) == []


# --- what an admin may add --------------------------------------------------------------

SAFE_HOST = {
    "binds": {"/srv/datasets": {"bind": "/data", "mode": "ro"}},
    "dns": ["10.0.0.2"], "extra_hosts": {"db": "10.0.0.3"}, "tmpfs": {"/scratch": "size=1g"},
    "ulimits": [{"Name": "nofile", "Soft": 4096, "Hard": 8192}], "read_only": False,
    "init": True, "cpuset_cpus": "0-1", "cpu_shares": 512, "blkio_weight": 300,
    "security_opt": ["apparmor=docker-default"], "log_config": {"Type": "json-file"},
    "mem_reservation": "1g", "oom_score_adj": 500, "runtime": "nvidia", "ipc_mode": "private",
    "group_add": ["100"], "cap_drop": ["NET_RAW"], "network_mode": "quota-spawner",
}


def test_safe_host_settings_pass_and_keep_their_effect():
    assert check_admin_host_config(SAFE_HOST, spec()) == []
    b = apply_quota(body(host=SAFE_HOST), spec())
    assert violations(b, spec()) == []
    host = b["HostConfig"]
    assert host["Dns"] == ["10.0.0.2"] and host["CpusetCpus"] == "0-1"
    assert "/srv/datasets:/data:ro" in host["Binds"]
    assert host["Runtime"] == "nvidia" and host["Init"] is True
    assert host["SecurityOpt"] == ["apparmor=docker-default", "no-new-privileges"]


@pytest.mark.parametrize("key, value, words", [
    ("privileged", True, "every device and capability"),
    ("cap_add", ["SYS_ADMIN"], "capability"),
    ("mem_limit", "8g", "the role"),
    ("memswap_limit", -1, "the role"),
    ("cpu_quota", 1_600_000, "the role"),
    ("cpu_period", 1000, "the role"),
    ("nano_cpus", 16 * 10**9, "the role"),
    ("pids_limit", -1, "the role"),
    ("shm_size", "64g", "the role"),
    ("devices", ["/dev/fuse"], "GPU assignment"),
    ("device_cgroup_rules", ["a *:* rwm"], "GPU assignment"),
    ("device_requests", [{"Driver": "nvidia", "Count": -1}], "GPU assignment"),
    ("runtime", "sysbox-runc", "runtimes"),
    ("pid_mode", "host", "process namespace"),
    ("ipc_mode", "host", "IPC"),
    ("ipc_mode", "container:hub", "IPC"),
    ("userns_mode", "host", "user namespace"),
    ("uts_mode", "host", "hostname"),
    ("cgroupns", "host", "cgroup namespace"),
    ("cgroup_parent", "/", "cgroup"),
    ("volumes_from", ["hub"], "another container's mounts"),
    ("volume_driver", "local-persist", "volumes"),
    ("oom_kill_disable", True, "OOM-killed"),
    ("oom_score_adj", -1000, "OOM killer"),
    ("mem_reservation", "64g", "more than the role"),
    ("security_opt", ["no-new-privileges:false"], "undo the hardening"),
    ("security_opt", ["seccomp=unconfined"], "undo the hardening"),
    ("security_opt", ["apparmor=unconfined"], "undo the hardening"),
    ("group_add", ["0"], "root group"),
    ("port_bindings", {8888: ("0.0.0.0", 8888)}, "loopback"),
    ("publish_all_ports", True, "loopback"),
    ("restart_policy", {"Name": "always"}, "stay stopped"),
    ("auto_remove", False, "fresh container"),
    ("network_mode", "container:hub", "network_name"),
    ("network_mode", "host", "network_name"),
    ("cpu_rt_runtime", 950000, "real-time"),
    ("something_new", 1, "not a setting an admin may add"),
])
def test_each_weakening_host_setting_is_refused_by_name(key, value, words):
    problems = check_admin_host_config({key: value}, spec())
    assert len(problems) == 1, problems
    assert f"extra_host_config[{key!r}]" in problems[0] and words in problems[0], problems[0]


@pytest.mark.parametrize("extra, words", [
    ({"host_config": {"Privileged": True}}, "extra_create_kwargs['host_config']"),
    ({"image": "ubuntu"}, "extra_create_kwargs['image']"),
    ({"user": "0"}, "extra_create_kwargs['user']"),
    ({"name": "hub"}, "extra_create_kwargs['name']"),
    ({"runtime": "runc"}, "extra_create_kwargs['runtime']"),
    ({"networking_config": {}}, "extra_create_kwargs['networking_config']"),
    ({"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}},
     "extra_create_kwargs['environment']['NVIDIA_VISIBLE_DEVICES']"),
    ({"environment": ["MEM_LIMIT=99"]}, "extra_create_kwargs['environment']['MEM_LIMIT']"),
    ({"labels": {"quota-spawner.gpus": ""}}, "extra_create_kwargs['labels']['quota-spawner.gpus']"),
    ({"privileged": True}, "not a setting an admin may add"),
])
def test_weakening_create_kwargs_are_refused_by_name(extra, words):
    problems = check_admin_create_kwargs(extra)
    assert len(problems) == 1 and words in problems[0], problems


def test_safe_create_kwargs_pass():
    extra = {"working_dir": "/home/jovyan", "environment": {"TZ": "UTC"},
             "labels": {"lab.example/cost-centre": "42"}, "hostname": "notebook",
             "stop_timeout": 30}
    assert check_admin_create_kwargs(extra) == []


def test_admin_environment_and_labels():
    for name in CONTRACT_ENV:
        assert check_admin_environment({name: "x"}, "environment"), name
    assert check_admin_environment({"TZ": "UTC", "PYTHONPATH": "/opt"}, "environment") == []
    assert check_admin_labels({"quota-spawner.role": "x"}, "extra_labels")
    assert check_admin_labels({"team": "x"}, "extra_labels") == []


def test_environment_is_the_contract():
    env = environment(spec())
    assert set(env) <= set(CONTRACT_ENV)


# --- the socket rule ----------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "/var/run/docker.sock", "/run/docker.sock", "/var/run/docker.sock/.", "/var/run/docker.sock/",
    "//var//run//docker.sock", "/srv/../var/run/docker.sock", "/var/run/./docker.sock",
    "/var/run", "/var/run/", "/run", "/var", "/", "//", "/.", "/srv/..",
    "/run/containerd/containerd.sock", "/run/containerd", "/var/run/containerd",
    "/run/docker/containerd/containerd.sock", "/run/docker",
    "/run/podman/podman.sock", "/run/podman", "/run/user/1000/podman/podman.sock",
    "/run/user/1000/docker.sock", "/run/user/1000", "/run/user",
    "/srv/engine/docker.sock", "/home/ci/.docker/run/docker.sock",
])
def test_engine_sockets_their_folders_and_root_are_refused(source):
    assert refused(source), source


@pytest.mark.parametrize("source", [
    "/srv/datasets", "/home", "/var/lib/quota/data", "/run/lock", "/tmp", "/mnt/nfs/run",
    "/srv/docker.socket-notes", "/opt/fake-nvml",
])
def test_ordinary_folders_are_allowed(source):
    assert refused(source) is None


def test_normalise_is_lexical_and_knows_var_run():
    assert normalise("/var/run/docker.sock/.") == "/run/docker.sock"
    assert normalise("//srv//x/../y/") == "/srv/y"
    assert normalise("/variable") == "/variable"


def test_bind_sources_cover_binds_mounts_and_bind_volumes():
    host = {
        "Binds": ["/srv/a:/a:ro", "quota-home-x:/home/jovyan:rw", "evil:/evil:rw"],
        "Mounts": [
            {"Type": "bind", "Source": "/srv/b", "Target": "/b"},
            {"Type": "volume", "Source": "inline", "Target": "/c",
             "VolumeOptions": {"DriverConfig": {"Name": "local", "Options": {
                 "type": "none", "o": "bind", "device": "/var/run"}}}},
            {"Type": "tmpfs", "Target": "/tmp"},
        ],
    }
    volumes = {"evil": {"Driver": "local", "Options": {"type": "none", "o": "bind",
                                                       "device": "/run/containerd"}},
               "quota-home-x": {"Driver": "local", "Options": None}}
    found = list(bind_sources(host, volumes))
    assert found == [
        BindSource("Binds", "/srv/a", "/a"),
        BindSource("volume evil", "/run/containerd", "/evil"),
        BindSource("Mounts", "/srv/b", "/b"),
        BindSource("volume inline", "/var/run", "/c"),
    ]
    b = quota_body()
    b["HostConfig"].update(copy.deepcopy(host))
    problems = violations(b, spec(), found)
    assert len(problems) == 2
    assert "volume evil mounts '/run/containerd'" in problems[0]
    assert "volume inline mounts '/var/run'" in problems[1]


def test_read_only_volumes_are_binds_too():
    b = body(host={"binds": {"/var/run": {"bind": "/host-run", "mode": "ro"}}})
    assert any("'/var/run'" in p for p in violations(apply_quota(b, spec()), spec()))


# --- the start boost and torch's allocator setting ------------------------------------


def test_boost_creates_with_more_cpus_and_violations_expect_it():
    s = spec(start_cpus=8)
    b = quota_body(s)
    assert b["HostConfig"]["CpuQuota"] == 800_000
    assert s.cpu_quota == 200_000  # what the update sets once the server answers
    assert violations(b, s) == []
    # a body with the role's quota where the boost was decided is not what was checked
    b["HostConfig"]["CpuQuota"] = 1_600_000
    assert any("CpuQuota" in p for p in violations(b, s))


@pytest.mark.parametrize("start_cpus", [None, 0, 1, 2])
def test_no_boost_below_or_at_the_role(start_cpus):
    s = spec(start_cpus=start_cpus)
    assert s.start_cpu_quota == s.cpu_quota == 200_000
    assert quota_body(s)["HostConfig"]["CpuQuota"] == 200_000


def test_torch_gets_the_cap_as_an_allocator_fraction_and_admin_options_stay():
    s = spec(GPU_ROLE, gpu_uuids=("GPU-a",), gpu_mode="shared:4", gpu_device_memory=80 * GiB,
             torch_reads_fraction=True)
    b = quota_body(s, environment={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,"
                                   "per_process_memory_fraction:0.9"})
    values = [e for e in b["Env"] if e.startswith("PYTORCH_CUDA_ALLOC_CONF=")]
    assert values == ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,"
                      "per_process_memory_fraction:0.200"]
    assert violations(b, s) == []
    b["Env"].append("PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:1.0")
    assert any("PYTORCH_CUDA_ALLOC_CONF" in p for p in violations(b, s))


@pytest.mark.parametrize("label,reads", [
    ("PyTorch 2.14.1 · CUDA 13.0", True), ("PyTorch 2.10.0 · CPU build", True),
    ("PyTorch 2.7.1 · CUDA 12.6", False), ("PaddlePaddle 3.0.0 · CPU build", False),
    ("", False), ("PyTorch 3.0.0 + PaddlePaddle 3.0.0 · CPU build", True)])
def test_the_fraction_only_for_an_image_whose_torch_reads_it(label, reads):
    from spawner.policy.gpu import torch_reads_fraction

    assert torch_reads_fraction(label) is reads
    s = spec(GPU_ROLE, gpu_uuids=("GPU-a",), gpu_mode="shared:4", gpu_device_memory=80 * GiB,
             torch_reads_fraction=torch_reads_fraction(label))
    env = quota_body(s)["Env"]
    assert any(e.startswith("PYTORCH_CUDA_ALLOC_CONF=") for e in env) is reads
    assert "GPU_MEMORY_LIMIT=17179869184" in env  # the hook's cap for an older torch
    assert violations(quota_body(s), s) == []


def test_no_allocator_fraction_without_a_cap():
    b = quota_body(spec(), environment={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in b["Env"]
    assert violations(b, spec()) == []


# --- the whole decision, as create_object runs it ------------------------------------

DOCKERSPAWNER_CREATE = {"image": "quota-spawner/pytorch:latest",
                        "command": ["jupyterhub-singleuser"],
                        "environment": {"JUPYTERHUB_API_TOKEN": "t", "MEM_LIMIT": "99"},
                        "volumes": ["/home/jovyan"], "ports": {"8888/tcp": None}}
DOCKERSPAWNER_HOST = {"binds": {"quota-home-x": {"bind": "/home/jovyan", "mode": "rw"}},
                      "network_mode": "quota-spawner",
                      "port_bindings": {8888: ("127.0.0.1",)}}


def decide(admin_host: dict | None = None, admin_create: dict | None = None,
           environment: dict | None = None, extra_labels: dict | None = None,
           network: str = "quota-spawner", s: ContainerSpec | None = None) -> dict:
    """admin_problems, then create_body, then violations: create_object without the engine."""
    s = s or spec()
    admin_host, admin_create = admin_host or {}, admin_create or {}
    refuse_any(admin_problems(s, host=admin_host, create=admin_create,
                              environment=environment or {},
                              extra_labels=extra_labels or {}, network=network))
    b = create_body(API, s, DOCKERSPAWNER_CREATE, DOCKERSPAWNER_HOST, admin_create, admin_host)
    refuse_any(violations(b, s))
    return b


def test_safe_admin_additions_are_kept_and_the_quota_wins():
    b = decide(admin_host={"binds": {"/srv/data": {"bind": "/data", "mode": "ro"}},
                           "dns": ["10.0.0.53"], "read_only": False},
               admin_create={"labels": {"team": "vision"}, "working_dir": "/data"},
               environment={"HTTP_PROXY": "http://proxy:3128"})
    host = b["HostConfig"]
    assert "/srv/data:/data:ro" in host["Binds"] and host["Dns"] == ["10.0.0.53"]
    assert b["Labels"]["team"] == "vision" and b["WorkingDir"] == "/data"
    assert "MEM_LIMIT=4294967296" in b["Env"] and "MEM_LIMIT=99" not in b["Env"]
    assert host["PortBindings"] == {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}


@pytest.mark.parametrize("kwargs, words", [
    ({"admin_host": {"privileged": True, "cap_add": ["SYS_ADMIN"]}},
     ["extra_host_config['privileged']", "extra_host_config['cap_add']"]),
    ({"admin_host": {"mem_limit": "8g", "cpu_quota": 1_600_000, "pid_mode": "host"}},
     ["'mem_limit'", "'cpu_quota'", "'pid_mode'"]),
    ({"admin_create": {"user": "0", "host_config": {"Privileged": True}}},
     ["extra_create_kwargs['user']", "extra_create_kwargs['host_config']"]),
    ({"admin_create": {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}},
     ["extra_create_kwargs['environment']['NVIDIA_VISIBLE_DEVICES']"]),
    ({"environment": {"GPU_MEMORY_LIMIT": "1"}}, ["environment['GPU_MEMORY_LIMIT']"]),
    ({"extra_labels": {"quota-spawner.gpus": ""}}, ["extra_labels['quota-spawner.gpus']"]),
    ({"network": "host"}, ["network_name = 'host' is refused"]),
    ({"admin_host": {"network_mode": "host"}}, ["extra_host_config['network_mode']"]),
])
def test_hostile_admin_settings_are_refused_by_name(kwargs, words):
    with pytest.raises(ContainerPolicyError) as info:
        decide(**kwargs)
    text = "\n".join(info.value.problems)
    for word in words:
        assert word in text, text


def test_settings_docker_py_cannot_read_are_refused():
    with pytest.raises(ContainerPolicyError, match="cannot be read"):
        decide(admin_host={"ulimits": "not a list"})


def test_deep_merge_merges_dicts_key_by_key_and_replaces_the_rest():
    """As DockerSpawner merges extra_create_kwargs and extra_host_config into its request."""
    request = {"labels": {"a": "1", "b": "2"}, "ports": {"8888/tcp": None},
               "command": ["jupyterhub-singleuser"], "log_config": {"type": "json-file"},
               "deep": {"one": {"two": 2, "keep": True}}}
    merged = deep_merge(request, {
        "labels": {"b": "3", "c": "4"}, "command": ["start.sh"], "log_config": None,
        "deep": {"one": {"two": {"three": 3}}}, "dns": ["10.0.0.2"]})
    assert merged is request
    assert request == {
        "labels": {"a": "1", "b": "3", "c": "4"}, "ports": {"8888/tcp": None},
        "command": ["start.sh"], "log_config": None,
        "deep": {"one": {"two": {"three": 3}, "keep": True}}, "dns": ["10.0.0.2"]}
    assert deep_merge({"x": 1}, {"x": {"y": 2}}) == {"x": {"y": 2}}
    assert deep_merge({"x": {"y": 2}}, {}) == {"x": {"y": 2}}


def test_create_body_never_changes_its_inputs():
    create, host = copy.deepcopy(DOCKERSPAWNER_CREATE), copy.deepcopy(DOCKERSPAWNER_HOST)
    admin = {"binds": {"/srv": {"bind": "/srv", "mode": "ro"}}}
    create_body(API, spec(), create, host, {}, admin)
    assert (create, host) == (DOCKERSPAWNER_CREATE, DOCKERSPAWNER_HOST)
    assert admin == {"binds": {"/srv": {"bind": "/srv", "mode": "ro"}}}


def test_a_socket_bind_is_refused_on_the_decided_body():
    with pytest.raises(ContainerPolicyError, match="docker.sock"):
        decide(admin_host={"binds": {"/var/run/docker.sock": {"bind": "/d", "mode": "rw"}}})


# --- the notebooks' parent cgroup (docker/parent_cgroup.py) -----------------------------------------


FENCED = "/quota_spawner_quota_abc_1a2b3c4d"


def test_the_fence_is_the_containers_parent_whatever_the_admin_asked():
    s = spec(cgroup_parent=FENCED)
    b = body({"cgroup_parent": "/"})  # what a hook could slip in past the admin checks
    apply_quota(b, s)
    assert b["HostConfig"]["CgroupParent"] == FENCED
    assert violations(b, s) == []


@pytest.mark.parametrize("found", [None, "", "/", "/docker", FENCED + "/x"])
def test_a_body_out_of_the_fence_is_refused(found):
    s = spec(cgroup_parent=FENCED)
    b = quota_body(s)
    if found is None:
        del b["HostConfig"]["CgroupParent"]
    else:
        b["HostConfig"]["CgroupParent"] = found
    problems = violations(b, s)
    assert len(problems) == 1 and "HostConfig.CgroupParent" in problems[0], problems
    assert "the notebooks' parent cgroup" in problems[0]


def test_without_a_fence_the_engine_default_parent_is_kept():
    b = body({"cgroup_parent": "/elsewhere"})
    apply_quota(b, spec())
    assert "CgroupParent" not in b["HostConfig"]
    assert violations(b, spec()) == []


def test_an_admin_cannot_choose_the_parent_cgroup():
    problems = check_admin_host_config({"cgroup_parent": "/"}, spec(cgroup_parent=FENCED))
    assert problems == ["extra_host_config['cgroup_parent'] = '/' is refused: the spawner puts "
                        "every notebook in the notebooks' parent cgroup, whose memory limit "
                        "keeps them off the hub's memory"]
