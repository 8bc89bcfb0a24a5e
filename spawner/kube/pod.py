"""The notebook pod and its home PVC, from a role: the Kubernetes side of container.py.

The same three steps as on Docker, for a KubeSpawner subclass to call:

1. build the pod as KubeSpawner does (``make_pod()``), and turn it into the
   API's camelCase dict (``ApiClient().sanitize_for_serialization(pod)``);
2. ``apply_quota(pod, spec)``: write the role's resources, the security
   contexts, the shm and home volumes, the contract environment, the labels
   and annotations and the PriorityClass on top of it, in place;
   Before that, ``config_problems(pod, spec)``: what the configuration set
   that the quota owns, to another value; refused, as on Docker, never
   silently overwritten;
3. ``violations(pod, spec)``: every way the dict breaks the quota
   (``quota_violations``) or the "restricted" Pod Security Standard
   (``restricted_violations``); create the pod only when it is empty.

The inputs:

``NotebookPod``
    One start: the role, the image (its table key and reference), the hub
    user's exact name, the hub id, the uid and gid, the ``KubeOptions``,
    the home claim's name and the container's name (KubeSpawner's
    ``notebook``).
``KubeOptions``
    What the quota table does not hold: request ratios, the NVIDIA device
    plugin's resource names, MIG profiles and ephemeral storage per role, the
    home claim's size and class, whether the service account token is
    mounted. Every default is documented on its field. ``option_problems``
    checks them against a table.

The builders, each pure and returning plain JSON-ready values:

- ``resources(spec)``: ``{"limits": {...}, "requests": {...}}``;
  ``gpu_resource(role, options)``: ``(resource name, count)`` or None.
- ``environment(spec)``: the contract variables as a dict;
  ``env_list(spec)``: the same as ``[{"name", "value"}]``.
- ``pod_security_context(spec)``, ``container_security_context(spec)``.
- ``volumes(spec)``, ``volume_mounts(spec)``.
- ``labels(spec)``, ``annotations(spec)``; ``contract_labels(metadata)``
  reads the exact ``quota-spawner.*`` values back from a pod's metadata, as
  the Docker labels were, for the pool, the watchdog and the ledger.
- ``home_claim_name(user, prefix)``, ``home_claim(spec, namespace)``: the PVC.
- ``pod_manifest(spec, name, namespace)``: a whole pod, for tests and tools.

Labels hold ``names.label_value`` of each value (``o'brien`` becomes
``o-brien---<hash>``); annotations of the same keys hold the exact values.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from spawner.contract import (
    CONTRACT_ENV,
    CPU_LIMIT,
    GPU_MODE_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    IMAGE_LABEL,
    LABEL_PREFIX,
    MEM_LIMIT,
    NO_GPU,
    NVIDIA_VISIBLE_DEVICES,
    ROLE_LABEL,
    TORCH_ALLOC_CONF,
    USER_LABEL,
)
from spawner.docker.container import role_environment
from spawner.kube.names import PROTECTED_LABEL, dns_label, is_qualified_name, label_value
from spawner.kube.priority import DEFAULT_PREFIX, check_prefix, class_name
from spawner.policy.gpu import memory_cap_environment, memory_fraction, torch_alloc_conf
from spawner.quota.model import QuotaTable, Role

NOTEBOOK_CONTAINER = "notebook"  # KubeSpawner's name for the server's container
HOME_VOLUME = "quota-home"
SHM_VOLUME = "quota-shm"
SHM_PATH = "/dev/shm"
GIB = 2**30
# The contract labels, in the order of spawner.docker.container.labels.
CONTRACT_LABELS = (USER_LABEL, ROLE_LABEL, IMAGE_LABEL, GPUS_LABEL, GPU_MODE_LABEL, HUB_LABEL)


class PodPolicyError(Exception):
    """A pod that must not be created; ``problems`` name each field and why."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class KubeOptions:
    """What the quota table does not say about a pod. The table format is unchanged."""

    # requests = limits x ratio; 1.0: the scheduler never overcommits a node.
    # Below 1, a node may hold more than it can give at once (and a memory
    # request below the limit makes the pod a candidate for node-pressure eviction).
    cpu_request_ratio: float = 1.0
    memory_request_ratio: float = 1.0
    # The NVIDIA device plugin's resources: whole GPUs; time-slicing with
    # renameByDefault (its default name for shared replicas is this plus
    # ".shared"; use "" as the suffix where renameByDefault is off); MIG
    # profiles with the "mixed" strategy (nvidia.com/mig-3g.40gb).
    gpu_resource: str = "nvidia.com/gpu"
    shared_suffix: str = ".shared"
    mig_resource_prefix: str = "nvidia.com/mig-"
    # role name -> MIG profile as nvidia-smi names it ("3g.40gb", "1g.10gb+me").
    mig_profiles: Mapping[str, str] = field(default_factory=dict)
    # role name -> bytes of ephemeral-storage (request and limit); others get the default.
    ephemeral_storage: Mapping[str, int] = field(default_factory=dict)
    default_ephemeral_storage: int | None = None  # None: no ephemeral-storage resource
    # The per-user home claim, kept across stops and culls.
    home_dir: str = "/home/jovyan"
    home_claim_prefix: str = "quota-home"
    home_size: int = 10 * GIB
    home_storage_class: str | None = None  # None: the cluster's default class
    home_access_modes: tuple[str, ...] = ("ReadWriteOnce",)
    # A notebook needs no API access; True only for a deliberately bound account.
    automount_service_account_token: bool = False
    priority_class_prefix: str = DEFAULT_PREFIX
    # The smallest GPU's memory where the shared roles run: JAX's and torch's caps
    # are fractions of it. None: they get only the byte caps (GPU_MEMORY_LIMIT, ...).
    gpu_device_memory: int | None = None

    def __post_init__(self) -> None:
        problems = option_problems(self)
        if problems:
            raise ValueError("; ".join(problems))


def _resource_problem(name: str, what: str) -> str | None:
    if "/" not in name or not is_qualified_name(name):
        return (f"{what} {name!r} is not an extended resource name "
                "(a domain, '/', and a name like gpu or mig-3g.40gb)")
    return None


def mig_resource(profile: str, options: KubeOptions) -> str:
    """A MIG profile's resource, as the device plugin names it ('+' becomes '.')."""
    return options.mig_resource_prefix + profile.replace("+", ".")


ACCESS_MODES = ("ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany")
_TEXT = ("gpu_resource", "shared_suffix", "mig_resource_prefix", "home_dir",
         "home_claim_prefix", "priority_class_prefix")


def _type_problems(options: KubeOptions) -> list[str]:
    """Each option of the wrong kind (configuration is Python: "false" is true there)."""
    problems = [f"{name} is {getattr(options, name)!r}: it must be text"
                for name in _TEXT if not isinstance(getattr(options, name), str)]
    for name in ("mig_profiles", "ephemeral_storage"):
        if not isinstance(getattr(options, name), Mapping):
            problems.append(f"{name} is {getattr(options, name)!r}: it must map role names "
                            "to values")
    if not isinstance(options.home_storage_class, (str, type(None))):
        problems.append(f"home_storage_class is {options.home_storage_class!r}: it must be "
                        "text, or None for the cluster's default class")
    modes = options.home_access_modes
    if (isinstance(modes, str) or not isinstance(modes, (list, tuple)) or not modes
            or any(m not in ACCESS_MODES for m in modes)):
        problems.append(f"home_access_modes is {modes!r}: it must be a list of "
                        f"{', '.join(ACCESS_MODES)}")
    if not isinstance(options.automount_service_account_token, bool):
        problems.append(f"automount_service_account_token is "
                        f"{options.automount_service_account_token!r}: it must be True or False")
    memory = options.gpu_device_memory
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)
                               or memory <= 0):
        problems.append(f"gpu_device_memory is {memory!r}: it must be a whole number of bytes "
                        "above 0, or None")
    return problems


def option_problems(options: KubeOptions, table: QuotaTable | None = None) -> list[str]:
    """What is wrong with the options, alone and (with ``table``) against its roles."""
    problems = _type_problems(options)
    if problems:  # the checks below read them as what they should be
        return problems
    for name in ("cpu_request_ratio", "memory_request_ratio"):
        ratio = getattr(options, name)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            problems.append(f"{name} is {ratio!r}: it must be above 0 and at most 1 "
                            "(a request above the limit is refused by Kubernetes)")
    problems += [p for p in (_resource_problem(options.gpu_resource, "gpu_resource"),
                             _resource_problem(options.gpu_resource + options.shared_suffix,
                                               "gpu_resource + shared_suffix"))
                 if p]
    for role, profile in options.mig_profiles.items():
        if not re.fullmatch(r"[0-9a-z][0-9a-z.+]*", str(profile)):
            problems.append(f"mig_profiles[{role!r}] is {profile!r}, not a MIG profile "
                            "like 3g.40gb")
            continue
        problem = _resource_problem(mig_resource(profile, options), f"mig_profiles[{role!r}]")
        if problem:
            problems.append(problem)
    sizes = {f"ephemeral_storage[{k!r}]": v for k, v in options.ephemeral_storage.items()}
    sizes["default_ephemeral_storage"] = options.default_ephemeral_storage
    sizes["home_size"] = options.home_size
    for name, size in sizes.items():
        if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                 or size <= 0):
            problems.append(f"{name} is {size!r}: it must be a whole number of bytes above 0")
    if not options.home_dir.startswith("/") or options.home_dir.rstrip("/") in ("", SHM_PATH):
        problems.append(f"home_dir is {options.home_dir!r}: it must be an absolute path, "
                        f"not / or {SHM_PATH}")
    if not re.fullmatch(r"[a-z0-9](?:[-a-z0-9]{0,14}[a-z0-9])?", options.home_claim_prefix):
        problems.append(f"home_claim_prefix is {options.home_claim_prefix!r}: 1 to 16 "
                        "lowercase letters, digits and '-'")
    try:
        check_prefix(options.priority_class_prefix)
    except ValueError as e:
        problems.append(str(e))
    if table is not None:
        for what, mapping in (("mig_profiles", options.mig_profiles),
                              ("ephemeral_storage", options.ephemeral_storage)):
            problems += [f"{what} names the role {name!r}, which the quota table does not have"
                         for name in mapping if name not in table.roles]
        problems += [f"mig_profiles names the role {name!r}, which has no GPUs"
                     for name in options.mig_profiles
                     if name in table.roles and not table.roles[name].gpus]
    return problems


@dataclass(frozen=True)
class NotebookPod:
    """Everything the quota decides about one notebook pod."""

    role: Role
    image_key: str
    image: str
    user_name: str  # the hub user, exactly as written
    hub_id: str
    uid: int = 1000  # the images' jovyan
    gid: int = 100  # jovyan's group (users); the home claim is made writable for it
    options: KubeOptions = field(default_factory=KubeOptions)
    # The image's torch reads per_process_memory_fraction (from its label).
    torch_reads_fraction: bool = False
    home_claim: str = ""  # the PVC's name; "": home_claim_name(user_name)
    container: str = NOTEBOOK_CONTAINER

    @property
    def claim_name(self) -> str:
        return self.home_claim or home_claim_name(self.user_name,
                                                  self.options.home_claim_prefix)

    @property
    def gpu_memory_cap(self) -> int | None:
        return self.role.gpu_memory if self.role.gpus and self.role.gpu_mode == "shared" else None

    @property
    def torch_fraction(self) -> float | None:
        cap, device = self.gpu_memory_cap, self.options.gpu_device_memory
        if not cap or not device or not self.torch_reads_fraction:
            return None
        return memory_fraction(cap, device)

    @property
    def priority_class(self) -> str:
        return class_name(self.role.name, self.options.priority_class_prefix)

    @property
    def grace_period(self) -> int:
        """Seconds between SIGTERM and the kill, for preemption, drains and evictions."""
        return int(self.role.grace_period)


# --- quantities -------------------------------------------------------------------


def cpu_quantity(cpus: float) -> str:
    """CPUs as a quantity: "2", "500m"; never below 1m (Kubernetes' smallest)."""
    milli = max(1, round(cpus * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def byte_quantity(size: int | float) -> str:
    """Bytes as a plain whole number, never rounded to a unit."""
    return str(max(1, int(size)))


_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_SUFFIXES = {"Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
             "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
             "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
             "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity's value ("8", 8.0, "8000m", "32Gi"); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return Decimal(number) * Decimal(10) ** int(suffix[1:])
    return Decimal(number) * _SUFFIXES[suffix]


def same_quantity(a: Any, b: Any) -> bool:
    """Equal as quantities: KubeSpawner writes cpu_limit 8 as 8.0 and mem_limit as an
    int, the quota as "8" and a string of bytes; those are the same limit."""
    qa, qb = parse_quantity(a), parse_quantity(b)
    if qa is not None and qb is not None:
        return qa == qb
    return type(a) is type(b) and a == b  # True is not 1 here


# --- what the quota sets ------------------------------------------------------------


def gpu_resource(role: Role, options: KubeOptions) -> tuple[str, int] | None:
    """The extended resource and count for the role's GPUs; None for a CPU-only role."""
    if not role.gpus:
        return None
    profile = options.mig_profiles.get(role.name)
    name = mig_resource(profile, options) if profile else options.gpu_resource
    if role.gpu_mode == "shared":
        name += options.shared_suffix
    return name, role.gpus


def resources(spec: NotebookPod) -> dict[str, dict[str, str]]:
    """The notebook container's limits and requests."""
    role, options = spec.role, spec.options
    limits = {"cpu": cpu_quantity(role.cpus), "memory": byte_quantity(role.memory)}
    requests = {"cpu": cpu_quantity(role.cpus * options.cpu_request_ratio),
                "memory": byte_quantity(role.memory * options.memory_request_ratio)}
    storage = options.ephemeral_storage.get(role.name, options.default_ephemeral_storage)
    if storage:
        limits["ephemeral-storage"] = requests["ephemeral-storage"] = byte_quantity(storage)
    gpu = gpu_resource(role, options)
    if gpu:
        # extended resources cannot be overcommitted: request and limit are equal
        limits[gpu[0]] = requests[gpu[0]] = str(gpu[1])
    return {"limits": limits, "requests": requests}


def environment(spec: NotebookPod) -> dict[str, str]:
    """The contract variables, as on Docker, except who picks the GPUs.

    A GPU pod's devices are chosen by the device plugin, which sets
    NVIDIA_VISIBLE_DEVICES itself, so the spawner leaves it out. A CPU pod gets
    ``void``, which outranks the ``all`` of CUDA images.
    """
    env = role_environment(spec.role)
    if not spec.role.gpus:
        env[NVIDIA_VISIBLE_DEVICES] = NO_GPU
    env.update(memory_cap_environment(spec.gpu_memory_cap, spec.options.gpu_device_memory))
    if spec.torch_fraction is not None:
        env[TORCH_ALLOC_CONF] = torch_alloc_conf("", spec.torch_fraction)
    return env


def env_list(spec: NotebookPod) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in environment(spec).items()]


def pod_security_context(spec: NotebookPod) -> dict[str, Any]:
    """Non-root, the runtime's seccomp profile, and the home claim writable by the gid."""
    return {
        "runAsNonRoot": True,
        "runAsUser": spec.uid,
        "runAsGroup": spec.gid,
        "fsGroup": spec.gid,
        "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown at every start
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(spec: NotebookPod) -> dict[str, Any]:
    """The restricted standard's container fields, written out even where the pod's
    would do, so that a check of the container alone sees them."""
    return {
        "runAsNonRoot": True,
        "runAsUser": spec.uid,
        "runAsGroup": spec.gid,
        "privileged": False,
        "allowPrivilegeEscalation": False,  # no_new_privs: no setuid, no sudo
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def volumes(spec: NotebookPod) -> list[dict[str, Any]]:
    """The home claim, and the role's shm as memory-backed emptyDir of its size."""
    found: list[dict[str, Any]] = [
        {"name": HOME_VOLUME, "persistentVolumeClaim": {"claimName": spec.claim_name}}]
    if spec.role.shm:
        # tmpfs pages count against the container's memory limit, as on Docker
        found.append({"name": SHM_VOLUME,
                      "emptyDir": {"medium": "Memory", "sizeLimit": byte_quantity(spec.role.shm)}})
    return found


def volume_mounts(spec: NotebookPod) -> list[dict[str, Any]]:
    mounts = [{"name": HOME_VOLUME, "mountPath": spec.options.home_dir}]
    if spec.role.shm:
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    return mounts


def _gpu_mode(role: Role) -> str:
    if not role.gpus:
        return ""
    return f"shared:{role.gpu_share}" if role.gpu_mode == "shared" else "exclusive"


def annotations(spec: NotebookPod) -> dict[str, str]:
    """The contract labels' exact values, under the same keys.

    ``quota-spawner.gpus`` is empty: the device plugin picks the GPUs when the
    pod is bound, after this is written.
    """
    return {
        USER_LABEL: spec.user_name,
        ROLE_LABEL: spec.role.name,
        IMAGE_LABEL: spec.image_key,
        GPUS_LABEL: "",
        GPU_MODE_LABEL: _gpu_mode(spec.role),
        HUB_LABEL: spec.hub_id,
    }


def labels(spec: NotebookPod) -> dict[str, str]:
    """The contract labels with values made valid (``names.label_value``), for selectors;
    plus ``quota-spawner.protected`` on a role with ``preemptible: false``."""
    found = {key: label_value(value) for key, value in annotations(spec).items()}
    if not spec.role.preemptible:
        found[PROTECTED_LABEL] = "true"
    return found


def contract_labels(metadata: Mapping[str, Any]) -> dict[str, str]:
    """A pod's ``quota-spawner.*`` values as the Docker labels held them (exact), from
    its annotations; only the keys present."""
    held = metadata.get("annotations") or {}
    return {key: str(held[key]) for key in CONTRACT_LABELS if key in held}


def home_claim_name(user_name: str, prefix: str = "quota-home") -> str:
    """``quota-home-alice``; a safe DNS label for any user name, as on Docker's volumes."""
    return f"{prefix}-{dns_label(user_name, 62 - len(prefix))}"


def home_claim(spec: NotebookPod, namespace: str | None = None) -> dict[str, Any]:
    """The home PVC. No owner: deleting the pod (a stop, a cull) never deletes it."""
    options = spec.options
    metadata: dict[str, Any] = {
        "name": spec.claim_name,
        "labels": {USER_LABEL: label_value(spec.user_name), HUB_LABEL: label_value(spec.hub_id)},
        "annotations": {USER_LABEL: spec.user_name, HUB_LABEL: spec.hub_id},
    }
    if namespace:
        metadata["namespace"] = namespace
    claim: dict[str, Any] = {
        "accessModes": list(options.home_access_modes),
        "resources": {"requests": {"storage": byte_quantity(options.home_size)}},
    }
    if options.home_storage_class is not None:
        claim["storageClassName"] = options.home_storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
            "spec": claim}


# --- writing it on a pod -------------------------------------------------------------


def _notebook(pod: Mapping[str, Any], spec: NotebookPod) -> dict[str, Any] | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(container, dict) and container.get("name") == spec.container:
            return container
    return None


def _replace_named(items: Iterable[dict[str, Any]], ours: list[dict[str, Any]],
                   key: str = "name") -> list[dict[str, Any]]:
    names = {item[key] for item in ours}
    return [i for i in items if i.get(key) not in names] + ours


def _ours_only(found: Mapping[str, Any] | None, ours: Mapping[str, str]) -> dict[str, Any]:
    """``found`` with every quota-spawner.* key replaced by ours."""
    kept = {k: v for k, v in (found or {}).items() if not str(k).startswith(LABEL_PREFIX)}
    return {**kept, **ours}


def apply_quota(pod: dict[str, Any], spec: NotebookPod) -> dict[str, Any]:
    """Write the quota on top of a pod dict (camelCase, as the API takes it), in place.

    ValueError when the pod has no container named ``spec.container``.
    """
    body = pod.setdefault("spec", {})
    container = _notebook(pod, spec)
    if container is None:
        raise ValueError(f"the pod has no container named {spec.container!r}")
    metadata = pod.setdefault("metadata", {})
    metadata["labels"] = _ours_only(metadata.get("labels"), labels(spec))
    metadata["annotations"] = _ours_only(metadata.get("annotations"), annotations(spec))

    body["priorityClassName"] = spec.priority_class
    for name in ("priority", "preemptionPolicy"):  # admission copies them from the class
        body.pop(name, None)
    body["terminationGracePeriodSeconds"] = spec.grace_period
    body["automountServiceAccountToken"] = spec.options.automount_service_account_token
    for name in ("hostNetwork", "hostPID", "hostIPC", "resources"):
        body.pop(name, None)  # host namespaces; pod-level resources would bypass the role's
    body["securityContext"] = {**(body.get("securityContext") or {}),
                               **pod_security_context(spec)}
    body["volumes"] = _replace_named(body.get("volumes") or [], volumes(spec))

    container["image"] = spec.image
    container["resources"] = resources(spec)
    container["securityContext"] = {**(container.get("securityContext") or {}),
                                     **container_security_context(spec)}
    ours = environment(spec)
    owned = set(CONTRACT_ENV) | set(ours)
    container["env"] = [e for e in container.get("env") or [] if e.get("name") not in owned]
    container["env"] += [{"name": k, "value": v} for k, v in ours.items()]
    paths = {m["mountPath"] for m in volume_mounts(spec)}
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") not in paths]
    container["volumeMounts"] = _replace_named(mounts, volume_mounts(spec))
    for port in container.get("ports") or []:
        port.pop("hostPort", None)  # the proxy reaches the pod's own IP
        port.pop("hostIP", None)
    return pod


def pod_manifest(spec: NotebookPod, name: str, namespace: str | None = None,
                 port: int = 8888) -> dict[str, Any]:
    """A whole notebook pod with nothing but the quota on it."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "restartPolicy": "OnFailure",  # as KubeSpawner
            "containers": [{"name": spec.container, "image": spec.image,
                            "ports": [{"name": "notebook-port", "containerPort": port}]}],
        },
    }
    return apply_quota(pod, spec)


# --- the checks before the API call --------------------------------------------------


_HOST_FIELDS = ("hostNetwork", "hostPID", "hostIPC")
# JupyterHub writes cpu_limit 8 as "8.0", the quota as "8": compared by value
_NUMERIC_ENV = (CPU_LIMIT, MEM_LIMIT)


def config_problems(pod: Mapping[str, Any], spec: NotebookPod) -> list[str]:
    """What the pod holds, before ``apply_quota``, that the quota owns and sets to
    another value: KubeSpawner's settings, ``extra_pod_config``,
    ``extra_container_config``, ``modify_pod_hook``. ``apply_quota`` would overwrite
    them; they are refused instead, as QuotaSpawner refuses the admin's container
    settings, so that a configuration that asks for root or 64 CPUs is seen.
    A field the configuration left unset (or set to the quota's value) is no problem;
    quantities and CPU_LIMIT/MEM_LIMIT are compared by value (8.0 is "8").

    ValueError when the pod has no container named ``spec.container``.
    """
    fixed = apply_quota(copy.deepcopy(dict(pod)), spec)
    problems: list[str] = []

    def differs(where: str, found: Mapping[str, Any], ours: Mapping[str, Any],
                keys: Iterable[str]) -> None:
        problems.extend(f"{where}{k} is {found[k]!r}, not {ours.get(k)!r}" for k in keys
                        if found.get(k) is not None and found[k] != ours.get(k))

    metadata: Mapping[str, Any] = pod.get("metadata") or {}
    for what in ("labels", "annotations"):
        found = metadata.get(what) or {}
        differs(f"metadata.{what}.", found, fixed["metadata"][what],
                [k for k in found if str(k).startswith(LABEL_PREFIX)])
    body: Mapping[str, Any] = pod.get("spec") or {}
    differs("spec.", body, fixed["spec"], ("priorityClassName", "priority", "preemptionPolicy",
                                           "terminationGracePeriodSeconds",
                                           "automountServiceAccountToken"))
    problems.extend(f"spec.{name} is {body[name]!r}: the pod shares the node's namespace"
                    for name in _HOST_FIELDS if body.get(name))
    if body.get("resources"):
        problems.append(f"spec.resources is {body['resources']!r}: the role sizes the "
                        "container")
    differs("spec.securityContext.", body.get("securityContext") or {},
            pod_security_context(spec), pod_security_context(spec))
    names = {v["name"]: v for v in volumes(spec)}
    problems.extend(f"volume {v['name']} is {v!r}, not {names[v['name']]!r}"
                    for v in body.get("volumes") or [] if v.get("name") in names
                    and v != names[v["name"]])

    container = _notebook(pod, spec) or {}
    where = f"container {spec.container}: "
    differs(where, container, {"image": spec.image}, ("image",))
    found_resources = container.get("resources") or {}
    ours_resources = resources(spec)
    for kind, ours in ours_resources.items():
        found = found_resources.get(kind) or {}
        # by value: KubeSpawner writes cpu_limit 8 as 8.0, the quota as "8"
        problems.extend(f"{where}resources.{kind}.{k} is {v!r}, not {ours.get(k)!r}"
                        for k, v in found.items()
                        if v is not None and not same_quantity(v, ours.get(k)))
    # anything else there (a DRA claim) is dropped by apply_quota: the role sizes it
    problems.extend(f"{where}resources.{kind} is {value!r}: the role sizes the container"
                    for kind, value in found_resources.items()
                    if kind not in ours_resources and value)
    own = container.get("securityContext") or {}
    differs(f"{where}securityContext.", own, container_security_context(spec),
            container_security_context(spec))
    wanted = environment(spec)
    for entry in container.get("env") or []:
        name = entry.get("name")
        if name in CONTRACT_ENV or name in wanted:
            value = entry.get("value") if "valueFrom" not in entry else entry
            same = (same_quantity(value, wanted.get(name)) if name in _NUMERIC_ENV
                    and isinstance(value, str) else value == wanted.get(name))
            if not same:
                problems.append(f"{where}environment {name} is {value!r}, not "
                                f"{wanted.get(name)!r}: the spawner sets it")
    paths = {m["mountPath"]: m for m in volume_mounts(spec)}
    ours_by_name = {m["name"]: m for m in volume_mounts(spec)}
    for m in container.get("volumeMounts") or []:
        if m.get("mountPath") in paths and m != paths[m["mountPath"]]:
            problems.append(f"{where}{m.get('mountPath')} is mounted as {m!r}, not "
                            f"{paths[m['mountPath']]!r}")
        elif m.get("name") in ours_by_name and m != ours_by_name[m["name"]]:
            # apply_quota replaces mounts by name too: this one would vanish silently
            problems.append(f"{where}volume {m['name']} is mounted as {m!r}, not "
                            f"{ours_by_name[m['name']]!r}: the quota mounts it")
    for port in container.get("ports") or []:
        for name in ("hostPort", "hostIP"):  # the proxy reaches the pod's own IP
            if port.get(name):
                problems.append(f"{where}ports has {name} {port[name]}")
    return problems


def quota_violations(pod: Mapping[str, Any], spec: NotebookPod) -> list[str]:
    """Every way this pod breaks the quota; empty when it holds exactly the role."""
    problems = []
    body: Mapping[str, Any] = pod.get("spec") or {}
    metadata: Mapping[str, Any] = pod.get("metadata") or {}

    def keyed(what: str, found: Mapping[str, Any], ours: Mapping[str, str]) -> None:
        problems.extend(f"{what} {k} is {found.get(k)!r}, not {v!r}" for k, v in ours.items()
                        if found.get(k) != v)
        problems.extend(f"{what} {k} is not one the spawner writes" for k in found
                        if str(k).startswith(LABEL_PREFIX) and k not in ours)

    keyed("label", metadata.get("labels") or {}, labels(spec))
    keyed("annotation", metadata.get("annotations") or {}, annotations(spec))

    def expect(name: str, wanted: Any, why: str) -> None:
        if body.get(name) != wanted:
            problems.append(f"spec.{name} is {body.get(name)!r}, not {wanted!r}: {why}")

    expect("priorityClassName", spec.priority_class, "the role's PriorityClass")
    expect("terminationGracePeriodSeconds", spec.grace_period, "the role's grace_period")
    if not spec.options.automount_service_account_token:
        expect("automountServiceAccountToken", False,
               "a notebook gets no API token unless configured")
    if body.get("resources"):
        problems.append("spec.resources (pod-level) is set: the role sizes the container")
    if body.get("resourceClaims"):
        # a DRA claim is allocated to the pod by the scheduler: a GPU outside the role
        problems.append("spec.resourceClaims is set: the role's GPUs are the device "
                        "plugin's resources, and a claimed device would be outside it")
    for kind in ("initContainers", "ephemeralContainers"):
        if body.get(kind):
            problems.append(f"spec.{kind} is set: the quota sizes one container, and "
                            "another would run outside it")
    containers = body.get("containers") or []
    others = [c.get("name") for c in containers if c.get("name") != spec.container]
    if others:
        problems.append(f"spec.containers has {others!r} besides {spec.container!r}: the "
                        "quota sizes one container")
    context: Mapping[str, Any] = body.get("securityContext") or {}
    for name, value in pod_security_context(spec).items():
        if context.get(name) != value:
            problems.append(f"spec.securityContext.{name} is {context.get(name)!r}, not "
                            f"{value!r}")
    if spec.uid < 1 or spec.gid < 1:
        problems.append(f"the notebook user is {spec.uid}:{spec.gid}: never root, never "
                        "the root group")
    if 0 in (context.get("supplementalGroups") or []):
        problems.append("spec.securityContext.supplementalGroups has 0: never the root group")
    problems += _volume_problems(body, spec)
    container = _notebook(pod, spec)
    if container is None:
        return problems + [f"spec.containers has no container named {spec.container!r}"]
    where = f"container {spec.container}"
    if container.get("image") != spec.image:
        problems.append(f"{where}: the image is {container.get('image')!r}, not the role's "
                        f"{spec.image!r}")
    if container.get("resources") != resources(spec):
        problems.append(f"{where}: resources are {container.get('resources')!r}, not "
                        f"{resources(spec)!r}")
    own: Mapping[str, Any] = container.get("securityContext") or {}
    problems += [f"{where}: securityContext.{k} is {own.get(k)!r}, not {v!r}"
                 for k, v in container_security_context(spec).items() if own.get(k) != v]
    problems += _env_problems(container, spec, where)
    return problems


def _volume_problems(body: Mapping[str, Any], spec: NotebookPod) -> list[str]:
    problems = []
    found = {v.get("name"): v for v in body.get("volumes") or []}
    for volume in volumes(spec):
        if found.get(volume["name"]) != volume:
            problems.append(f"volume {volume['name']} is {found.get(volume['name'])!r}, not "
                            f"{volume!r}")
    container = _notebook({"spec": body}, spec) or {}
    mounts = container.get("volumeMounts") or []
    for mount in volume_mounts(spec):
        at = [m for m in mounts if m.get("mountPath") == mount["mountPath"]]
        if at != [mount]:
            problems.append(f"{mount['mountPath']} is mounted as {at!r}, not {[mount]!r}")
    if not spec.role.shm and SHM_VOLUME in found:
        problems.append(f"volume {SHM_VOLUME} is set, but the role has no shm")
    return problems


def _env_problems(container: Mapping[str, Any], spec: NotebookPod, where: str) -> list[str]:
    problems = []
    if container.get("envFrom"):
        problems.append(f"{where}: envFrom is set: it could set a variable the spawner owns, "
                        "which no check before the start can see")
    env: dict[str, list[Any]] = {}
    for entry in container.get("env") or []:
        value = entry.get("value", "") if "valueFrom" not in entry else entry  # a reference
        env.setdefault(entry.get("name"), []).append(value)
    wanted = environment(spec)
    for name in (*CONTRACT_ENV, TORCH_ALLOC_CONF):
        if name == TORCH_ALLOC_CONF and name not in wanted:
            continue  # the admin's allocator options stay, as on Docker
        expected = [wanted[name]] if name in wanted else []
        if env.get(name, []) != expected:
            problems.append(f"{where}: environment {name} is {env.get(name, [])!r}, not "
                            f"{expected!r}")
    return problems


# --- the "restricted" Pod Security Standard -------------------------------------------

# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (v1.33).
RESTRICTED_VOLUME_TYPES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                           "persistentVolumeClaim", "projected", "secret")
RESTRICTED_ADD_CAPABILITIES = ("NET_BIND_SERVICE",)
SAFE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes")
SECCOMP_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(f"spec.{kind}[{c.get('name')!r}]", c)
            for kind in ("containers", "initContainers", "ephemeralContainers")
            for c in body.get(kind) or []]


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """Every control of the "restricted" Pod Security Standard (baseline's included) that
    this pod dict fails, by field; empty when Pod Security Admission would admit it."""
    problems = []
    body: Mapping[str, Any] = pod.get("spec") or {}
    pod_context: Mapping[str, Any] = body.get("securityContext") or {}
    containers = _containers(body)
    contexts = [(f"{where}.securityContext", c.get("securityContext") or {})
                for where, c in containers]
    every = [("spec.securityContext", pod_context), *contexts]

    # baseline: host process, host namespaces, privileged
    for where, context in every:
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.windowsOptions.hostProcess is true: host access")
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if body.get(name):
            problems.append(f"spec.{name} is true: the pod shares the node's namespace")
    for where, context in contexts:
        if context.get("privileged"):
            problems.append(f"{where}.privileged is true")
        if context.get("procMount") not in (None, "Default"):
            problems.append(f"{where}.procMount is {context['procMount']!r}, not Default")
    # capabilities: restricted drops ALL and adds NET_BIND_SERVICE at most
    for where, context in contexts:
        caps = context.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{where}.capabilities.drop lacks ALL")
        added = [c for c in caps.get("add") or [] if c not in RESTRICTED_ADD_CAPABILITIES]
        if added:
            problems.append(f"{where}.capabilities.add has {added!r}: only "
                            "NET_BIND_SERVICE may be added")
    # volumes: no hostPath, and only the restricted types
    for volume in body.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        bad = [k for k in kinds if k not in RESTRICTED_VOLUME_TYPES]
        if bad or not kinds:
            problems.append(f"volume {volume.get('name')!r} is of type {bad or kinds!r}: "
                            f"only {', '.join(RESTRICTED_VOLUME_TYPES)}")
    for where, container in containers:
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}.ports has hostPort {port['hostPort']}")
    # AppArmor, SELinux, seccomp (never Unconfined anywhere)
    for where, context in every:
        apparmor = (context.get("appArmorProfile") or {}).get("type")
        if apparmor is not None and apparmor not in APPARMOR_TYPES:
            problems.append(f"{where}.appArmorProfile.type is {apparmor!r}")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type") not in (None, *SELINUX_TYPES):
            problems.append(f"{where}.seLinuxOptions.type is {selinux['type']!r}")
        for name in ("user", "role"):
            if selinux.get(name):
                problems.append(f"{where}.seLinuxOptions.{name} is set")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in SECCOMP_TYPES:
            problems.append(f"{where}.seccompProfile.type is {seccomp!r}, not RuntimeDefault "
                            "or Localhost")
    for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
                value == "runtime/default" or str(value).startswith("localhost/")):
            problems.append(f"annotation {key} is {value!r}")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"spec.securityContext.sysctls has {sysctl.get('name')!r}, not a "
                            "safe sysctl")
    # restricted: seccomp set on the pod, or on every container
    if (pod_context.get("seccompProfile") or {}).get("type") not in SECCOMP_TYPES:
        problems += [f"{where}.seccompProfile is not set, nor the pod's" for where, context
                     in contexts if (context.get("seccompProfile") or {}).get("type") is None]
    # restricted: no privilege escalation, non-root
    for where, context in contexts:
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.allowPrivilegeEscalation is "
                            f"{context.get('allowPrivilegeEscalation')!r}, not false")
    pod_non_root = pod_context.get("runAsNonRoot") is True
    for where, context in contexts:
        if context.get("runAsNonRoot") is False or (
                not pod_non_root and context.get("runAsNonRoot") is not True):
            problems.append(f"{where}.runAsNonRoot is {context.get('runAsNonRoot')!r} and the "
                            f"pod's is {pod_context.get('runAsNonRoot')!r}: one must be true, "
                            "and neither false")
    for where, context in every:
        if context.get("runAsUser") == 0:
            problems.append(f"{where}.runAsUser is 0")
    return problems


def violations(pod: Mapping[str, Any], spec: NotebookPod) -> list[str]:
    """The quota's and the restricted standard's problems with this pod; empty: create it."""
    return quota_violations(pod, spec) + restricted_violations(pod)


def refuse_any(problems: list[str]) -> None:
    if problems:
        raise PodPolicyError(problems)
