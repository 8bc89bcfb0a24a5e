"""PriorityClasses from the quota table's roles, and what ``preemptible: false`` becomes.

One PriorityClass per role (``priority_classes``), named ``<prefix><role>``
with the role name made a safe DNS label (``class_name``):

- ``value`` is the role's ``priority``;
- ``preemptionPolicy`` is ``PreemptLowerPriority`` when the role may preempt
  (``preempts: lower``, or no ``preempts`` and a priority above 0, as on
  Docker) and ``Never`` otherwise. A CPU-only role is always ``Never``: on
  Docker it never preempts, and the same table must not start doing so here.

Kubernetes has no per-pod protection from preemption. For roles with
``preemptible: false`` the pod builder adds the label ``quota-spawner.protected``
and ``protection_budget`` is one PodDisruptionBudget (``maxUnavailable: 0``)
over those pods: it blocks every eviction (``kubectl drain``, the eviction
API), but the scheduler honours it during preemption only when it has another
choice. ``preemption_notes`` says, per table, which roles can still push which
protected or CPU-only servers out, so that the admin can raise their
priorities instead. docs/kubernetes.md#priorities has the whole story.

Pure: ``manifests_yaml`` is what ``quota-spawner k8s priority-classes`` prints.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from spawner.contract import ROLE_LABEL
from spawner.kube.names import MAX_NAME, PROTECTED_LABEL, dns_label, label_value
from spawner.quota.model import QuotaTable, Role

DEFAULT_PREFIX = "quota-spawner-"
PROTECTION_BUDGET = "quota-spawner-protected"
MANAGED_BY = {"app.kubernetes.io/managed-by": "quota-spawner"}
PREEMPT_LOWER = "PreemptLowerPriority"
NEVER = "Never"
_PREFIX = re.compile(r"[a-z0-9][-a-z0-9]{0,29}")


def check_prefix(prefix: str) -> str:
    """The prefix, when it can start a PriorityClass name; ValueError otherwise."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"the PriorityClass prefix {prefix!r} must be 1 to 30 lowercase "
                         "letters, digits and '-', starting with a letter or digit")
    if prefix.startswith("system-"):  # reserved by Kubernetes for its own classes
        raise ValueError(f"the PriorityClass prefix {prefix!r} may not start with 'system-'")
    return prefix


def class_name(role_name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The PriorityClass of a role: ``quota-spawner-gpu-lab``; distinct for distinct roles."""
    return check_prefix(prefix) + dns_label(role_name, MAX_NAME - len(prefix))


def preemption_policy(role: Role) -> str:
    # Preemption acts on GPU roles only in the table (docs/preemption.md)
    return PREEMPT_LOWER if role.gpus and role.may_preempt else NEVER


def priority_class(role: Role, prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    """The role's PriorityClass manifest (scheduling.k8s.io/v1)."""
    policy = preemption_policy(role)
    what = ("preempts lower priorities" if policy == PREEMPT_LOWER else "never preempts")
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": class_name(role.name, prefix),
            "labels": {**MANAGED_BY, ROLE_LABEL: label_value(role.name)},
            "annotations": {ROLE_LABEL: role.name},  # the exact name
        },
        "value": role.priority,
        "preemptionPolicy": policy,
        "globalDefault": False,  # only pods that name it: never other workloads
        "description": f"Quota Spawner role {role.name}: priority {role.priority}, {what}"
                       + ("; not preemptible (best effort, see quota-spawner.protected)"
                          if not role.preemptible else ""),
    }


def priority_classes(table: QuotaTable, prefix: str = DEFAULT_PREFIX) -> list[dict[str, Any]]:
    """One PriorityClass per role, in the table's order."""
    return [priority_class(role, prefix) for role in table.roles.values()]


def protection_budget(namespace: str | None = None,
                      name: str = PROTECTION_BUDGET) -> dict[str, Any]:
    """The PodDisruptionBudget that refuses every eviction of a protected server."""
    metadata: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY)}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata,
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {PROTECTED_LABEL: "true"}},
            # evict even unhealthy protected pods: a crashed server protects nothing
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _preemptors(table: QuotaTable, victim: Role) -> list[Role]:
    """Roles whose pods the scheduler may let preempt ``victim``'s pods."""
    return [r for r in table.roles.values()
            if preemption_policy(r) == PREEMPT_LOWER and r.priority > victim.priority]


def preemption_notes(table: QuotaTable) -> list[str]:
    """Where Kubernetes does less than the hub does on Docker, for this table."""
    notes = []
    for role in table.roles.values():
        names = ", ".join(f"{r.name!r} ({r.priority})" for r in _preemptors(table, role))
        if not role.preemptible:
            if names:
                notes.append(
                    f"role {role.name!r} has preemptible: false, but the scheduler may still "
                    f"preempt its pods for a start of {names} when it finds no other room: "
                    f"the PodDisruptionBudget {PROTECTION_BUDGET} is best effort against "
                    "preemption. Give those roles a priority at most "
                    f"{role.priority} to make the protection hard.")
            if role.reclaim_after is not None:
                notes.append(f"role {role.name!r}: reclaim_after is not enforced on "
                             "Kubernetes yet; its pods stay protected until they stop.")
        elif not role.gpus and names:
            notes.append(
                f"role {role.name!r} is CPU-only, so it is never preempted on Docker; on "
                f"Kubernetes a start of {names} may preempt its pods for CPU or memory. "
                f"Give it a priority of at least the highest of those (its class never "
                f"preempts), or preemptible: false.")
    young = [r.name for r in table.roles.values()
             if r.gpus and r.preemptible and r.min_runtime and _preemptors(table, r)]
    if young:
        notes.append(f"min_runtime has no Kubernetes equivalent: the scheduler may preempt "
                     f"servers of {', '.join(map(repr, young))} at any age.")
    return notes


def manifests(table: QuotaTable, prefix: str = DEFAULT_PREFIX,
              namespace: str | None = None) -> list[dict[str, Any]]:
    """The PriorityClasses, and the PodDisruptionBudget when a role is not preemptible."""
    documents = priority_classes(table, prefix)
    if any(not role.preemptible for role in table.roles.values()):
        documents.append(protection_budget(namespace))
    return documents


def manifests_yaml(table: QuotaTable, prefix: str = DEFAULT_PREFIX,
                   namespace: str | None = None) -> str:
    """A YAML multi-document for ``kubectl apply -f -``, the notes as comments on top."""
    path = " ".join(str(table.path).splitlines())  # a comment is one line
    head = [f"# PriorityClasses for the quota table {path} (quota-spawner k8s "
            "priority-classes)"]
    head += [f"# note: {note}" for note in preemption_notes(table)]
    body = yaml.safe_dump_all(manifests(table, prefix, namespace), sort_keys=False,
                              explicit_start=True, allow_unicode=True, width=1000)
    return "\n".join(head) + "\n" + body
