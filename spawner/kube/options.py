"""What the quota table does not say about a pod: ``KubeOptions``.

Request ratios, the NVIDIA device plugin's resource names, MIG profiles and
ephemeral storage per role, the home claim's size and class, whether the
service account token is mounted, the PriorityClass prefix and the GPUs'
memory. Set as ``QuotaKubeSpawner.kube_options``; every default is documented
on its field. ``option_problems`` checks them, alone and against a table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from spawner.kube.names import is_qualified_name
from spawner.kube.priority import DEFAULT_PREFIX, check_prefix
from spawner.quota.model import QuotaTable

GIB = 2**30
SHM_PATH = "/dev/shm"  # where a role's shm is mounted: never the home


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
