"""The notebook pod: the notebook policy (spawner/policy/) written on a pod dict.

The same three steps as on Docker (spawner/docker/container.py), for
QuotaKubeSpawner to call just before the API:

1. the pod KubeSpawner built (``make_pod()``, then ``modify_pod_hook``), as the
   API's camelCase dict (``ApiClient().sanitize_for_serialization(pod)``), is
   refused if the configuration set anything the quota owns to another value
   (``checks.config_problems``): refused, as on Docker, never silently
   overwritten;
2. ``apply_quota(pod, spec)`` writes the role's resources, the security
   contexts (``security``), the shm and home volumes, the contract environment,
   the labels and annotations and the PriorityClass on top of it, in place;
3. ``checks.violations(pod, spec)``: every way the dict breaks the quota or the
   "restricted" Pod Security Standard; the pod is created only when it is empty.

What the quota decides about the server on any backend (its environment, its
contract labels, its GPU caps) is the policy's (``NotebookPod.notebook``);
this module adds what only a pod has, each builder pure and returning plain
JSON-ready values:

- ``resources(spec)``: ``{"limits": {...}, "requests": {...}}``;
  ``gpu_resource(role, options)``: ``(resource name, count)`` or None.
- ``environment(spec)``: the contract variables as a dict;
  ``env_list(spec)``: the same as ``[{"name", "value"}]``.
- ``volumes(spec)``, ``volume_mounts(spec)``: the home claim and the shm.
- ``labels(spec)``, ``annotations(spec)``; ``contract_labels(metadata)``
  reads the exact ``quota-spawner.*`` values back from a pod's metadata, as
  the Docker labels were, for the pool, the watchdog and the ledger.
- ``pod_manifest(spec, name, namespace)``: a whole pod, for tests and tools.

Labels hold ``names.label_value`` of each value (``o'brien`` becomes
``o-brien---<hash>``); annotations of the same keys hold the exact values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spawner.contract import CONTRACT_LABELS, TORCH_ALLOC_CONF
from spawner.kube.names import PROTECTED_LABEL, label_value
from spawner.kube.notebook import NotebookPod
from spawner.kube.options import SHM_PATH, KubeOptions, mig_resource
from spawner.kube.quantities import byte_quantity, cpu_quantity
from spawner.kube.security import container_security_context, pod_security_context
from spawner.policy import environment as policy_environment
from spawner.policy import labels as policy_labels
from spawner.policy.rules import owned_label, owned_variable
from spawner.quota.model import Role

HOME_VOLUME = "quota-home"
SHM_VOLUME = "quota-shm"
# The node's namespaces: never shared with a notebook.
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")

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
    """The contract variables (spawner/policy/environment.py), and torch's allocator
    fraction where it applies. The device plugin picks a GPU pod's devices and sets
    NVIDIA_VISIBLE_DEVICES itself; a CPU pod gets ``void``."""
    env = policy_environment.environment(spec.notebook)
    torch = policy_environment.torch_allocator(spec.notebook)
    if torch is not None:
        env[TORCH_ALLOC_CONF] = torch
    return env


def env_list(spec: NotebookPod) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in environment(spec).items()]


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


def annotations(spec: NotebookPod) -> dict[str, str]:
    """The contract labels' exact values, under the same keys.

    ``quota-spawner.gpus`` is empty: the device plugin picks the GPUs when the
    pod is bound, after this is written.
    """
    return policy_labels.labels(spec.notebook)


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


# --- writing it on a pod -------------------------------------------------------------


def notebook_container(pod: Mapping[str, Any], spec: NotebookPod) -> dict[str, Any] | None:
    """The pod's container named ``spec.container``; None when it has none."""
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
    kept = {k: v for k, v in (found or {}).items() if not owned_label(k)}
    return {**kept, **ours}


def apply_quota(pod: dict[str, Any], spec: NotebookPod) -> dict[str, Any]:
    """Write the quota on top of a pod dict (camelCase, as the API takes it), in place.

    ValueError when the pod has no container named ``spec.container``.
    """
    body = pod.setdefault("spec", {})
    container = notebook_container(pod, spec)
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
    for name in (*HOST_NAMESPACES, "resources"):
        body.pop(name, None)  # pod-level resources would bypass the role's
    body["securityContext"] = {**(body.get("securityContext") or {}),
                               **pod_security_context(spec)}
    body["volumes"] = _replace_named(body.get("volumes") or [], volumes(spec))

    container["image"] = spec.image
    container["resources"] = resources(spec)
    container["securityContext"] = {**(container.get("securityContext") or {}),
                                     **container_security_context(spec)}
    ours = environment(spec)
    container["env"] = [e for e in container.get("env") or []
                        if not owned_variable(e.get("name")) and e.get("name") not in ours]
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


def __getattr__(name: str) -> Any:
    # names that moved out of this module (``home_claim_name``: names.py; moved.py)
    from spawner.common.moved import moved_name

    return moved_name(__name__, name)
