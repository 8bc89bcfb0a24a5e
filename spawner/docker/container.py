"""The notebook container: the notebook policy (spawner/policy/) as an engine create body.

DockerSpawner builds the create request from traits, and traits can be
replaced by config, by JupyterHub's group overrides and by a pre_spawn_hook.
So nothing here trusts them:

1. what the admin adds (``extra_host_config``, ``extra_create_kwargs``,
   ``environment``, ``extra_labels``) is checked against what an admin may
   add (``check_admin_*``); a setting that would weaken the quota, the
   hardening, the GPU assignment or the isolation is refused by name;
2. the role's limits, the GPUs, the labels, the user and the hardening are
   written on top of the engine's own create body (``apply_quota``);
3. the invariants are checked on that body just before the engine is called
   (``violations``).

What the quota decides about the server, on any backend (its environment, its
labels, its GPU caps, the rules of the last check), is the policy's
(``ContainerSpec.notebook``); this module writes it in Docker's fields and adds
what only Docker has: the CFS quota and its start boost, the pids limit, the
device requests, the hardening, the network and the engine's socket.

Every function here is pure: the spawner gathers the inputs and calls the
engine.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from docker.errors import DockerException
from docker.utils import parse_bytes

from spawner.contract import LABEL_PREFIX, TORCH_ALLOC_CONF
from spawner.docker.home_body import (
    HomeBind,
    apply_home,
    disk_environment,
    disk_label,
    home_problems,
)
from spawner.docker.mounts import BindSource, bind_sources, socket_problems
from spawner.policy import environment as policy_environment
from spawner.policy import labels as policy_labels
from spawner.policy.notebook import Notebook
from spawner.policy.rules import (
    PolicyError,
    differs,
    environment_problems,
    is_root,
    label_problems,
    owned_label,
    owned_variable,
)
from spawner.policy.rules import refuse_any as refuse_any  # spawner.py's name for it
from spawner.quota.model import MAX_PIDS, Role

CPU_PERIOD = 100_000  # microseconds; Docker's default CFS period
# Runtimes that keep the container at least as isolated as runc.
SAFE_RUNTIMES = ("runc", "crun", "nvidia", "runsc", "kata", "kata-runtime", "io.containerd.runc.v2")
SAFE_IPC_MODES = ("", "private", "shareable", "none")
UNSAFE_SECURITY_OPT = re.compile(
    r"^(no-new-privileges[=:]false|(seccomp|apparmor|systempaths)[=:]unconfined|"
    r"label[=:]disable)$",
    re.IGNORECASE,
)
NO_NEW_PRIVILEGES = re.compile(r"^no-new-privileges([=:]true)?$", re.IGNORECASE)

# The policy's one error, under the name spawner/docker/spawner.py catches.
ContainerPolicyError = PolicyError


@dataclass(frozen=True)
class ContainerSpec:
    """Everything the quota decides about one notebook container: the notebook policy
    (``notebook``) and what only Docker needs."""

    role: Role
    image_key: str
    image: str
    user_name: str  # the hub user, as written
    hub_id: str
    notebook_user: str  # uid or uid:gid
    network_mode: str
    pids_default: int = 2048
    gpu_uuids: tuple[str, ...] = ()
    # The pool's name for the holding ("exclusive", "shared:N", ""). The label comes
    # from the policy (Notebook.gpu_mode); another value here is refused.
    gpu_mode: str = ""
    gpu_device_memory: int | None = None  # the smallest assigned GPU's memory
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    # CPUs while the server starts (QuotaSpawner.cpu_boost); the spawner sets
    # the role's quota with the engine's update call once the server answers.
    start_cpus: float | None = None
    # The image's torch reads per_process_memory_fraction (from its label).
    torch_reads_fraction: bool = False
    # The notebooks' parent cgroup (docker/parent_cgroup.py); "" where the hub could not set it up.
    cgroup_parent: str = ""
    # The home of the role's size where disk is enforced (docker/home_body.py), bound at
    # home_dir (the hub config's, not an override's); None: the Docker volume, as ever.
    home: HomeBind | None = None
    home_dir: str = "/home/jovyan"

    def __post_init__(self) -> None:
        if self.gpu_mode not in ("", self.notebook.gpu_mode):
            raise ValueError(f"gpu_mode {self.gpu_mode!r} is not the role's "
                             f"{self.notebook.gpu_mode!r}")

    @cached_property
    def notebook(self) -> Notebook:
        """What the quota decides about this server, as on any backend."""
        return Notebook(self.role, self.image_key, self.image, self.user_name, self.hub_id,
                        gpu_uuids=self.gpu_uuids, gpu_device_memory=self.gpu_device_memory,
                        torch_reads_fraction=self.torch_reads_fraction)

    @property
    def pids_limit(self) -> int:
        return self.role.pids or self.pids_default

    @property
    def start_cpu_quota(self) -> int:
        """The CFS quota the container is created with: the boost, or the role's."""
        return int(max(self.start_cpus or 0, self.role.cpus) * CPU_PERIOD)

    @property
    def cpu_quota(self) -> int:
        """The role's CFS quota: what the container runs with once it is handed over."""
        return int(self.role.cpus * CPU_PERIOD)


# --- what the quota sets ---------------------------------------------------------


def labels(spec: ContainerSpec) -> dict[str, str]:
    """The quota-spawner.* labels: the record of who runs what with which GPUs, and the
    home's size."""
    return {**policy_labels.labels(spec.notebook), **disk_label(spec.home)}


def environment(spec: ContainerSpec) -> dict[str, str]:
    """The contract variables: limits for jupyter-resource-usage, threads, GPUs, disk."""
    return {**policy_environment.environment(spec.notebook), **disk_environment(spec.home)}


def device_requests(spec: ContainerSpec) -> list[dict[str, Any]]:
    """Exact UUIDs, never a Count: with a Count, Docker takes GPUs 0..N-1 for everyone."""
    if not spec.gpu_uuids:
        return []
    return [{"Driver": "nvidia", "Count": 0, "DeviceIDs": list(spec.gpu_uuids),
             "Capabilities": [["gpu"]], "Options": {}}]


def _quota_host_config(spec: ContainerSpec) -> dict[str, Any]:
    role = spec.role
    return {
        "Memory": role.memory,
        "MemorySwap": role.memory,  # equal to Memory: no swap at all
        "CpuPeriod": CPU_PERIOD,
        "CpuQuota": spec.start_cpu_quota,
        "PidsLimit": spec.pids_limit,
        "Privileged": False,
        "CapDrop": ["ALL"],
        "DeviceRequests": device_requests(spec),
        "Devices": [],
        "DeviceCgroupRules": [],
        "AutoRemove": True,  # a fresh container per start: never an old role's limits or GPUs
        "OomKillDisable": False,
        "PublishAllPorts": False,
    }


# Fields that only the quota decides; set to these, or removed when None.
_CLEARED_HOST_FIELDS = ("NanoCpus", "CpuCount", "CpuPercent", "CapAdd", "VolumesFrom",
                        "CpuRealtimePeriod", "CpuRealtimeRuntime",
                        "MaskedPaths", "ReadonlyPaths", "VolumeDriver", "Isolation")


def apply_quota(body: dict[str, Any], spec: ContainerSpec) -> dict[str, Any]:
    """Write the quota on top of an engine create body (``ContainerConfig``), in place."""
    host = body.get("HostConfig")
    if not isinstance(host, dict):
        host = body["HostConfig"] = {}
    host.update(_quota_host_config(spec))
    if spec.role.shm:
        host["ShmSize"] = spec.role.shm
    else:
        host.pop("ShmSize", None)  # Docker's default
    for name in _CLEARED_HOST_FIELDS:
        host.pop(name, None)
    host.pop("CgroupParent", None)  # the engine's default parent, unless the parent cgroup
    if spec.cgroup_parent:
        host["CgroupParent"] = spec.cgroup_parent
    security = [o for o in host.get("SecurityOpt") or [] if not NO_NEW_PRIVILEGES.match(o)]
    host["SecurityOpt"] = [*security, "no-new-privileges"]

    env = [e for e in body.get("Env") or [] if not owned_variable(e.partition("=")[0])]
    admin = [e.partition("=")[2] for e in env if e.partition("=")[0] == TORCH_ALLOC_CONF]
    torch = policy_environment.torch_allocator(spec.notebook, ",".join(admin))
    if torch is not None:  # the admin's other allocator options stay, before the cap
        env = [e for e in env if e.partition("=")[0] != TORCH_ALLOC_CONF]
        env.append(f"{TORCH_ALLOC_CONF}={torch}")
    body["Env"] = env + [f"{k}={v}" for k, v in environment(spec).items()]
    body["Labels"] = {**(body.get("Labels") or {}), **spec.extra_labels, **labels(spec)}
    body["User"] = spec.notebook_user
    body["Image"] = spec.image
    body.pop("Runtime", None)  # only HostConfig.Runtime counts, and it is checked
    apply_home(body, spec.home, spec.home_dir, spec.role.memory)
    return body


# --- what an admin may add ---------------------------------------------------------

# extra_host_config keys an admin may set, as docker-py's create_host_config
# names them. Everything else is refused; the reasons below say why.
SAFE_HOST_SETTINGS = frozenset({
    "binds", "mounts", "tmpfs", "links", "dns", "dns_opt", "dns_search", "extra_hosts",
    "log_config", "ulimits", "sysctls", "read_only", "init", "storage_opt", "group_add",
    "security_opt", "cap_drop", "cpuset_cpus", "cpuset_mems", "cpu_shares", "blkio_weight",
    "blkio_weight_device", "device_read_bps", "device_write_bps", "device_read_iops",
    "device_write_iops", "mem_reservation", "mem_swappiness", "oom_score_adj", "runtime",
    "ipc_mode", "cgroupns", "network_mode",
})
_QUOTA_REASON = "the role in the quota table sets it"
REFUSED_HOST_SETTINGS = {
    "mem_limit": _QUOTA_REASON, "memswap_limit": _QUOTA_REASON, "cpu_quota": _QUOTA_REASON,
    "cpu_period": _QUOTA_REASON, "nano_cpus": _QUOTA_REASON, "cpu_count": _QUOTA_REASON,
    "cpu_percent": _QUOTA_REASON, "pids_limit": _QUOTA_REASON, "shm_size": _QUOTA_REASON,
    "kernel_memory": _QUOTA_REASON,
    "privileged": "it would give the container every device and capability of the host",
    "cap_add": "notebook containers drop every capability and never get one back",
    "devices": "devices reach a container only through the quota's GPU assignment",
    "device_cgroup_rules": "devices reach a container only through the quota's GPU assignment",
    "device_requests": "GPUs reach a container only through the quota's GPU assignment",
    "pid_mode": "the container must not share another process namespace",
    "userns_mode": "the container must not leave the engine's user namespace setting",
    "uts_mode": "the container must not share the host's hostname namespace",
    "volumes_from": "it would copy another container's mounts, such as the hub's Docker socket",
    "volume_driver": "volumes come from the admin's volumes, checked one by one",
    "cgroup_parent": "the spawner puts every notebook in the notebooks' parent cgroup, whose "
                     "memory limit keeps them off the hub's memory",
    "oom_kill_disable": "a container at its memory limit must be OOM-killed, not hang the host",
    "cpu_rt_period": "real-time scheduling could starve the host",
    "cpu_rt_runtime": "real-time scheduling could starve the host",
    "port_bindings": "the spawner publishes the notebook port itself, on loopback only",
    "publish_all_ports": "the spawner publishes the notebook port itself, on loopback only",
    "restart_policy": "a stopped or culled server must stay stopped",
    "auto_remove": "each start gets a fresh container, removed when it stops",
    "isolation": "only the default isolation is supported",
    "lxc_conf": "raw runtime settings could undo the hardening",
    "init_path": "the engine's own init is used",
}
SAFE_CREATE_SETTINGS = frozenset({
    "command", "entrypoint", "working_dir", "hostname", "domainname", "environment",
    "labels", "volumes", "ports", "stop_signal", "stop_timeout", "healthcheck", "tty",
    "stdin_open", "detach", "network_disabled", "mac_address",
})
REFUSED_CREATE_SETTINGS = {
    "image": "the image comes from the role's image key in the quota table",
    "user": "the notebook runs as QuotaSpawner.notebook_user, never root",
    "host_config": "host settings go in extra_host_config, where each one is checked",
    "name": "the spawner names the container",
    "networking_config": "the container joins only the spawner's network",
    "runtime": "set the runtime in extra_host_config, where it is checked",
    "platform": "the image's own platform is used",
}


def admin_problems(
    spec: ContainerSpec,
    *,
    host: Mapping[str, Any],
    create: Mapping[str, Any],
    environment: Mapping[str, Any],
    extra_labels: Mapping[str, Any],
    network: str,
) -> list[str]:
    """Everything the admin's settings (after overrides and hooks) add that the quota
    does not allow: extra_host_config, extra_create_kwargs, environment, extra_labels,
    and network_name, which must still be the network the hub's config set."""
    problems = [
        *check_admin_host_config(host, spec),
        *check_admin_create_kwargs(create),
        *check_admin_environment(environment, "environment"),
        *check_admin_labels(extra_labels, "extra_labels"),
    ]
    if network != spec.network_mode:
        problems.append(f"network_name = {network!r} is refused: the hub's config sets "
                        f"{spec.network_mode!r} for every server, and an override or hook "
                        "may not move one server to another network")
    return problems


def create_body(
    client: Any,
    spec: ContainerSpec,
    create: Mapping[str, Any],
    host: Mapping[str, Any],
    admin_create: Mapping[str, Any],
    admin_host: Mapping[str, Any],
) -> dict[str, Any]:
    """The engine's create body: DockerSpawner's request (``create``, ``host``, in
    docker-py's names) with the admin's additions merged in, then the quota on top.

    ``client`` is a docker-py APIClient; only its offline builders are used.
    """
    kwargs = deep_merge(copy.deepcopy(dict(create)), copy.deepcopy(dict(admin_create)))
    host_kwargs = deep_merge(copy.deepcopy(dict(host)), copy.deepcopy(dict(admin_host)))
    try:
        body = client.create_container_config(
            host_config=client.create_host_config(**host_kwargs), **kwargs)
    except (DockerException, TypeError, ValueError) as e:
        raise PolicyError([f"the container settings cannot be read: {e}"]) from None
    return apply_quota(dict(body), spec)


def deep_merge(dest: dict[str, Any], src: Mapping[str, Any]) -> dict[str, Any]:
    """``src`` merged into ``dest``, which is changed and returned: a dict in both is
    merged key by key, anything else in ``src`` replaces what ``dest`` had. DockerSpawner
    merges ``extra_create_kwargs`` and ``extra_host_config`` into its request so."""
    for key, value in src.items():
        mine = dest.get(key)
        if isinstance(mine, dict) and isinstance(value, dict):
            deep_merge(mine, value)
        else:
            dest[key] = value
    return dest


def _refuse_unknown(setting: str, key: str, safe: frozenset[str]) -> str:
    return (f"{setting}[{key!r}] is not a setting an admin may add "
            f"(allowed: {', '.join(sorted(safe))})")


def check_admin_host_config(extra: Mapping[str, Any], spec: ContainerSpec) -> list[str]:
    """Problems with the admin's extra_host_config; one sentence each, naming the setting."""
    problems = []
    for key, value in extra.items():
        where = f"extra_host_config[{key!r}]"
        if key in REFUSED_HOST_SETTINGS:
            problems.append(f"{where} = {value!r} is refused: {REFUSED_HOST_SETTINGS[key]}")
        elif key not in SAFE_HOST_SETTINGS:
            problems.append(_refuse_unknown("extra_host_config", key, SAFE_HOST_SETTINGS))
        elif key == "security_opt":
            bad = [o for o in value or [] if UNSAFE_SECURITY_OPT.match(str(o))]
            if bad:
                problems.append(f"{where} = {value!r} is refused: {bad[0]!r} would undo the "
                                "hardening")
        elif key == "group_add" and any(str(g) in ("0", "root") for g in value or []):
            problems.append(f"{where} = {value!r} is refused: the root group is never added")
        elif key == "runtime" and value not in (None, "", *SAFE_RUNTIMES):
            problems.append(f"{where} = {value!r} is refused: only these runtimes keep the "
                            f"isolation: {', '.join(SAFE_RUNTIMES)}")
        elif key == "ipc_mode" and (value or "") not in SAFE_IPC_MODES:
            problems.append(f"{where} = {value!r} is refused: the container must not share "
                            "another IPC namespace")
        elif key == "cgroupns" and (value or "private") != "private":
            problems.append(f"{where} = {value!r} is refused: the container keeps its own "
                            "cgroup namespace")
        elif key == "network_mode" and value != spec.network_mode:
            problems.append(f"{where} = {value!r} is refused: the network is set by "
                            f"network_name ({spec.network_mode!r})")
        elif key == "oom_score_adj" and not (isinstance(value, int) and value >= 0):
            problems.append(f"{where} = {value!r} is refused: a notebook must never be "
                            "protected from the OOM killer ahead of the host")
        elif key == "mem_reservation" and not _at_most(value, spec.role.memory):
            problems.append(f"{where} = {value!r} is refused: it is more than the role's "
                            "memory")
    return problems


def _at_most(value: Any, limit: int) -> bool:
    try:  # read as docker-py reads "512m" for the engine
        return 0 <= parse_bytes(value) <= limit
    except Exception:
        return False


def check_admin_create_kwargs(extra: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, value in extra.items():
        if key in REFUSED_CREATE_SETTINGS:
            problems.append(f"extra_create_kwargs[{key!r}] = {value!r} is refused: "
                            f"{REFUSED_CREATE_SETTINGS[key]}")
        elif key not in SAFE_CREATE_SETTINGS:
            problems.append(_refuse_unknown("extra_create_kwargs", key, SAFE_CREATE_SETTINGS))
    env = extra.get("environment")
    if env is not None:
        problems += check_admin_environment(env, "extra_create_kwargs['environment']")
    problems += check_admin_labels(extra.get("labels") or {}, "extra_create_kwargs['labels']")
    return problems


def _env_names(env: Mapping[str, Any] | Iterable[str]) -> list[str]:
    if isinstance(env, Mapping):
        return [str(k) for k in env]
    return [str(e).partition("=")[0] for e in env]


def check_admin_environment(env: Mapping[str, Any] | Iterable[str], setting: str) -> list[str]:
    return [
        f"{setting}[{name!r}] is refused: the spawner sets {name} from the quota and the GPU "
        "assignment"
        for name in _env_names(env) if owned_variable(name)
    ]


def check_admin_labels(extra: Mapping[str, Any] | Iterable[str], setting: str) -> list[str]:
    return [
        f"{setting}[{name!r}] is refused: the {LABEL_PREFIX}* labels record the quota and "
        "the GPUs, and only the spawner writes them"
        for name in (extra if isinstance(extra, Mapping) else list(extra))
        if owned_label(name)
    ]


# --- the invariants, on the body the engine receives --------------------------------


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _uid_gid(user: str) -> tuple[int, int | None] | None:
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user or "")
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)) if match.group(2) else None


def violations(
    body: Mapping[str, Any], spec: ContainerSpec, binds: Iterable[BindSource] | None = None
) -> list[str]:
    """Every way this create body breaks a guarantee; empty when it may be created.

    ``binds`` defaults to the body's own bind sources; the spawner passes them
    with the engine's view of named volumes.
    """
    host: Mapping[str, Any] = body.get("HostConfig") or {}
    problems = []

    def expect(name: str, wanted: Any, why: str) -> None:
        if host.get(name) != wanted:
            problems.append(differs(f"HostConfig.{name}", host.get(name), wanted, why))

    role = spec.role
    expect("Memory", role.memory, "the role's memory")
    expect("MemorySwap", role.memory, "equal to Memory, so there is no swap")
    expect("CpuPeriod", CPU_PERIOD, "the CPU quota's period")
    expect("CpuQuota", spec.start_cpu_quota, "the role's CPUs (or the start boost)")
    expect("PidsLimit", spec.pids_limit, "the pids limit")
    if not spec.pids_limit or not 1 <= spec.pids_limit <= MAX_PIDS:
        problems.append(f"the pids limit is {spec.pids_limit!r}: it must be from 1 to "
                        f"{MAX_PIDS} (QuotaSpawner.pids_limit or the role's pids)")
    expect("Privileged", False, "never privileged")
    expect("CapDrop", ["ALL"], "every capability dropped")
    expect("DeviceRequests", device_requests(spec), "exactly the assigned GPUs")
    expect("AutoRemove", True, "a fresh container for every start")
    if role.shm:
        expect("ShmSize", role.shm, "the role's shared memory")
    if (host.get("CgroupParent") or "") != spec.cgroup_parent:
        problems.append(differs("HostConfig.CgroupParent", host.get("CgroupParent"),
                                spec.cgroup_parent or None, "the notebooks' parent cgroup, "
                                "whose memory limit keeps them off the hub's memory"))
    for name in _CLEARED_HOST_FIELDS + ("Devices", "DeviceCgroupRules", "OomKillDisable",
                                        "PublishAllPorts"):
        if host.get(name):
            problems.append(f"HostConfig.{name} is {host[name]!r}: the quota never allows it")
    security = [str(o) for o in host.get("SecurityOpt") or []]
    if not any(NO_NEW_PRIVILEGES.match(o) for o in security):
        problems.append("HostConfig.SecurityOpt lacks no-new-privileges")
    problems += [f"HostConfig.SecurityOpt has {o!r}, which undoes the hardening"
                 for o in security if UNSAFE_SECURITY_OPT.match(o)]
    for name in ("PidMode", "UsernsMode", "UTSMode"):
        if host.get(name):
            problems.append(f"HostConfig.{name} is {host[name]!r}: the container keeps "
                            "its own namespaces")
    if (host.get("IpcMode") or "") not in SAFE_IPC_MODES:
        problems.append(f"HostConfig.IpcMode is {host['IpcMode']!r}: the container keeps "
                        "its own IPC namespace")
    if (host.get("CgroupnsMode") or "private") != "private":
        problems.append("HostConfig.CgroupnsMode must be private")
    if host.get("Runtime") not in (None, "", *SAFE_RUNTIMES):
        problems.append(f"HostConfig.Runtime is {host['Runtime']!r}, not one that keeps "
                        "the isolation")
    network = str(host.get("NetworkMode") or "")
    if network != spec.network_mode:
        problems.append(f"HostConfig.NetworkMode is {network!r}, not the spawner's network "
                        f"{spec.network_mode!r}")
    if (host.get("OomScoreAdj") or 0) < 0:
        problems.append("HostConfig.OomScoreAdj is negative: a notebook is never protected "
                        "from the OOM killer ahead of the host")
    for port, bindings in (host.get("PortBindings") or {}).items():
        for binding in bindings or []:
            address = str((binding or {}).get("HostIp") or "")
            if not _is_loopback(address):
                problems.append(f"HostConfig.PortBindings publishes {port} on "
                                f"{address or 'every address'}: the notebook port is published "
                                "on loopback only (DockerSpawner.host_ip)")
    problems += socket_problems(bind_sources(host) if binds is None else binds)
    problems += home_problems(body, spec.home, spec.home_dir, role.memory)

    ids = _uid_gid(str(body.get("User") or ""))
    if ids is None or is_root(*ids):
        problems.append(f"the container user is {body.get('User')!r}: notebooks run as a "
                        "numeric, non-root uid (and never the root group)")
    if body.get("Image") != spec.image:
        problems.append(f"the image is {body.get('Image')!r}, not the role's {spec.image!r}")
    if body.get("Runtime"):
        problems.append("a top-level Runtime is not allowed; see HostConfig.Runtime")
    problems += label_problems("label", body.get("Labels") or {}, labels(spec))
    env = [(name, value) for name, _, value in
           (str(entry).partition("=") for entry in body.get("Env") or [])]
    problems += environment_problems(env, environment(spec))
    fraction = policy_environment.torch_allocator(spec.notebook)  # the option alone
    if fraction is not None:  # the last option: the admin's others stay before it
        values = [value for name, value in env if name == TORCH_ALLOC_CONF]
        if len(values) != 1 or values[0].split(",")[-1] != fraction:
            problems.append(f"environment {TORCH_ALLOC_CONF} is {values!r}: it must be set "
                            f"once and end with {fraction}")
    return problems
