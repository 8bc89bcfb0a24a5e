"""What is refused before a notebook pod reaches the API.

Two checks, on the pod as the API will take it (a camelCase dict):

- ``config_problems(pod, spec)``, before ``pod.apply_quota``: what
  KubeSpawner's settings, ``extra_pod_config``, ``extra_container_config`` or
  ``modify_pod_hook`` set, that the quota owns, to another value;
- ``violations(pod, spec)``, after it: every way the pod breaks the quota
  (``quota_violations``) or the "restricted" Pod Security Standard
  (``security.restricted_violations``).

Each problem is one sentence naming the field (the rules' wording,
spawner/policy/rules.py, as on Docker); ``refuse_any`` refuses a start with any.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from spawner.contract import CONTRACT_ENV, CPU_LIMIT, MEM_LIMIT, TORCH_ALLOC_CONF
from spawner.kube.notebook import NotebookPod
from spawner.kube.pod import (
    HOST_NAMESPACES,
    SHM_VOLUME,
    annotations,
    apply_quota,
    environment,
    labels,
    notebook_container,
    resources,
    volume_mounts,
    volumes,
)
from spawner.kube.quantities import same_quantity
from spawner.kube.security import (
    container_security_context,
    pod_security_context,
    restricted_violations,
)
from spawner.policy.rules import (
    differs,
    environment_problems,
    is_root,
    label_problems,
    mismatches,
    owned_label,
    owned_variable,
)

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

    def set_otherwise(where: str, found: Mapping[str, Any], ours: Mapping[str, Any],
                      keys: Iterable[str]) -> None:
        problems.extend(differs(f"{where}{k}", found[k], ours.get(k)) for k in keys
                        if found.get(k) is not None and found[k] != ours.get(k))

    metadata: Mapping[str, Any] = pod.get("metadata") or {}
    for what in ("labels", "annotations"):
        found = metadata.get(what) or {}
        set_otherwise(f"metadata.{what}.", found, fixed["metadata"][what],
                      [k for k in found if owned_label(k)])
    body: Mapping[str, Any] = pod.get("spec") or {}
    set_otherwise("spec.", body, fixed["spec"], ("priorityClassName", "priority",
                                                 "preemptionPolicy",
                                                 "terminationGracePeriodSeconds",
                                                 "automountServiceAccountToken"))
    problems.extend(f"spec.{name} is {body[name]!r}: the pod shares the node's namespace"
                    for name in HOST_NAMESPACES if body.get(name))
    if body.get("resources"):
        problems.append(f"spec.resources is {body['resources']!r}: the role sizes the "
                        "container")
    set_otherwise("spec.securityContext.", body.get("securityContext") or {},
                  pod_security_context(spec), pod_security_context(spec))
    names = {v["name"]: v for v in volumes(spec)}
    problems.extend(differs(f"volume {v['name']}", v, names[v["name"]])
                    for v in body.get("volumes") or [] if v.get("name") in names
                    and v != names[v["name"]])

    container = notebook_container(pod, spec) or {}
    where = f"container {spec.container}: "
    set_otherwise(where, container, {"image": spec.image}, ("image",))
    found_resources = container.get("resources") or {}
    ours_resources = resources(spec)
    for kind, ours in ours_resources.items():
        found = found_resources.get(kind) or {}
        # by value: KubeSpawner writes cpu_limit 8 as 8.0, the quota as "8"
        problems.extend(differs(f"{where}resources.{kind}.{k}", v, ours.get(k))
                        for k, v in found.items()
                        if v is not None and not same_quantity(v, ours.get(k)))
    # anything else there (a DRA claim) is dropped by apply_quota: the role sizes it
    problems.extend(f"{where}resources.{kind} is {value!r}: the role sizes the container"
                    for kind, value in found_resources.items()
                    if kind not in ours_resources and value)
    own = container.get("securityContext") or {}
    set_otherwise(f"{where}securityContext.", own, container_security_context(spec),
                  container_security_context(spec))
    wanted = environment(spec)
    for entry in container.get("env") or []:
        name = entry.get("name")
        if owned_variable(name) or name in wanted:
            value = entry.get("value") if "valueFrom" not in entry else entry
            same = (same_quantity(value, wanted.get(name)) if name in _NUMERIC_ENV
                    and isinstance(value, str) else value == wanted.get(name))
            if not same:
                problems.append(differs(f"{where}environment {name}", value, wanted.get(name),
                                        "the spawner sets it"))
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
    body: Mapping[str, Any] = pod.get("spec") or {}
    metadata: Mapping[str, Any] = pod.get("metadata") or {}
    problems = [*label_problems("label", metadata.get("labels") or {}, labels(spec)),
                *label_problems("annotation", metadata.get("annotations") or {},
                                annotations(spec))]

    def expect(name: str, wanted: Any, why: str) -> None:
        if body.get(name) != wanted:
            problems.append(differs(f"spec.{name}", body.get(name), wanted, why))

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
    problems += mismatches("spec.securityContext.", context, pod_security_context(spec))
    if is_root(spec.uid, spec.gid):
        problems.append(f"the notebook user is {spec.uid}:{spec.gid}: never root, never "
                        "the root group")
    if 0 in (context.get("supplementalGroups") or []):
        problems.append("spec.securityContext.supplementalGroups has 0: never the root group")
    problems += _volume_problems(body, spec)
    container = notebook_container(pod, spec)
    if container is None:
        return problems + [f"spec.containers has no container named {spec.container!r}"]
    where = f"container {spec.container}"
    if container.get("image") != spec.image:
        problems.append(f"{where}: the image is {container.get('image')!r}, not the role's "
                        f"{spec.image!r}")
    if container.get("resources") != resources(spec):
        problems.append(f"{where}: resources are {container.get('resources')!r}, not "
                        f"{resources(spec)!r}")
    problems += mismatches(f"{where}: securityContext.", container.get("securityContext") or {},
                           container_security_context(spec))
    problems += _env_problems(container, spec, where)
    return problems


def _volume_problems(body: Mapping[str, Any], spec: NotebookPod) -> list[str]:
    found = {v.get("name"): v for v in body.get("volumes") or []}
    problems = mismatches("volume ", found, {v["name"]: v for v in volumes(spec)})
    container = notebook_container({"spec": body}, spec) or {}
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
    entries = [(entry.get("name"),  # a reference (valueFrom) is never the quota's value
                entry.get("value", "") if "valueFrom" not in entry else entry)
               for entry in container.get("env") or []]
    wanted = environment(spec)
    # the admin's allocator options stay where no cap applies, as on Docker
    torch = (TORCH_ALLOC_CONF,) if TORCH_ALLOC_CONF in wanted else ()
    return problems + environment_problems(entries, wanted, (*CONTRACT_ENV, *torch),
                                           where=f"{where}: ")


def violations(pod: Mapping[str, Any], spec: NotebookPod) -> list[str]:
    """The quota's and the restricted standard's problems with this pod; empty: create it."""
    return quota_violations(pod, spec) + restricted_violations(pod)
