"""The user's home claim: the PersistentVolumeClaim their notebook pods mount.

One per user (``names.home_claim_name``: ``quota-home-<user>``), shared by all
their servers, kept across stops and culls: it has no owner, so deleting a pod
never deletes it. KubeSpawner creates it (``storage_pvc_ensure``); the
spawner adds the user's and the hub's labels.

Its storage request is the role's ``disk`` (``NotebookPod.home_size``; the
options' ``home_size`` for a role without one). A claim outlives the role it
was made for, so each start compares the claim as the API holds it with the
size the start wants (``ClaimSize``): a smaller claim is grown by a patch of
its request (PVC expansion, which the storage class must allow:
``allowVolumeExpansion: true``); a larger one is left as it is, since
Kubernetes never shrinks a claim. The request is the claim's size; whether a
full claim refuses writes is the storage driver's (``homes_sentence``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from spawner.contract import HUB_LABEL, USER_LABEL
from spawner.kube.names import label_value
from spawner.kube.notebook import NotebookPod
from spawner.kube.options import KubeOptions
from spawner.kube.quantities import byte_quantity, parse_quantity
from spawner.quota.units import format_human

# the hub's Role that lets it patch claims (the chart's own Role cannot)
CLAIMS_ROLE = "deploy/kubernetes/hub-claims-role.yaml"


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
        "resources": {"requests": {"storage": byte_quantity(spec.home_size)}},
    }
    if options.home_storage_class is not None:
        claim["storageClassName"] = options.home_storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
            "spec": claim}


def homes_sentence(options: KubeOptions) -> str:
    """One sentence for the hub's start log: what a home is here, and what the cluster,
    not the hub, decides about it."""
    where = (f"of storage class {options.home_storage_class!r}"
             if options.home_storage_class is not None else "of the cluster's default "
             "storage class")
    return (f"Homes are PersistentVolumeClaims {where}, each sized by its role's disk "
            f"({format_human(options.home_size)} for a role without one); whether a full "
            "claim refuses writes depends on the storage class's driver, and a claim grows "
            "for a bigger role only where the class allows volume expansion "
            "(allowVolumeExpansion: true).")


def requested_bytes(claim: dict[str, Any]) -> int | None:
    """A claim's storage request in bytes, from the API's dict; None when it has none."""
    spec = claim.get("spec") or {}
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    value = parse_quantity(storage)
    return None if value is None else int(value)


@dataclass(frozen=True)
class ClaimSize:
    """A home claim's request (``requested``, bytes; None: it has none) against the size
    a start of ``role`` wants (``size``): grown when smaller, never shrunk."""

    name: str
    user: str
    role: str
    requested: int | None
    size: int

    @classmethod
    def of(cls, claim: dict[str, Any], spec: NotebookPod) -> ClaimSize:
        """``claim`` as the API returned it (a dict), for the start of ``spec``."""
        name = (claim.get("metadata") or {}).get("name") or spec.claim_name
        return cls(name, spec.user_name, spec.role.name, requested_bytes(claim),
                   spec.home_size)

    @property
    def grows(self) -> bool:
        return self.requested is not None and self.requested < self.size

    @property
    def larger(self) -> bool:
        return self.requested is not None and self.requested > self.size

    def patch(self) -> dict[str, Any]:
        """The claim's new request (a strategic merge patch: only the request changes)."""
        return {"spec": {"resources": {"requests": {"storage": byte_quantity(self.size)}}}}

    @property
    def _sizes(self) -> tuple[str, str]:
        return format_human(self.requested or 0), format_human(self.size)

    def growing(self) -> tuple[str, str]:
        """What the log and the user are told when the patch was accepted."""
        old, new = self._sizes
        return (f"Growing the home claim {self.name} of {self.user} from {old} to {new}, "
                f"role {self.role}'s disk",
                f"Your home grows from {old} to {new}, the disk of role {self.role}")

    def kept_larger(self) -> tuple[str, str]:
        """What the log and the user are told when the claim is larger than the role's."""
        old, new = self._sizes
        return (f"The home claim {self.name} of {self.user} is {old}, larger than role "
                f"{self.role}'s {new}: a claim never shrinks, nothing is deleted",
                f"Your home is {old}, larger than the {new} of role {self.role}; that is "
                "fine: nothing is shrunk or deleted")

    def refused(self, message: str) -> tuple[str, str]:
        """The cluster's refusal of the patch, in one sentence for the log (with what to
        change) and one for the user."""
        old, new = self._sizes
        return (f"The cluster refused to grow the home claim {self.name} of {self.user} "
                f"from {old} to {new} (role {self.role}), so it stays at {old}: "
                f"{message.rstrip('.')}{refusal_hint(message)}",
                f"Your home stays at {old}: the cluster could not grow it to the {new} of "
                f"role {self.role} (the hub's log says why)")


def refusal_hint(message: str) -> str:
    """What an admin changes for the API's refusal ``message`` of a claim's patch."""
    text = message.lower()
    if "cannot patch" in text:  # RBAC: the chart's hub Role has no patch on claims
        return f" (give the hub's ServiceAccount patch on claims: {CLAIMS_ROLE})"
    if "storageclass" in text or "resize" in text or "expan" in text:
        return " (its storage class must say allowVolumeExpansion: true)"
    return ""


def api_message(body: Any) -> str:
    """The ``message`` of the API's Status answer (an ApiException's body), else the
    body as text."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        found = json.loads(body)
    except (TypeError, ValueError):
        return str(body)
    message = found.get("message") if isinstance(found, dict) else None
    return message if isinstance(message, str) and message else str(body)
