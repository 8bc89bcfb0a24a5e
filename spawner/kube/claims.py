"""The user's home claim: the PersistentVolumeClaim their notebook pods mount.

One per user (``names.home_claim_name``: ``quota-home-<user>``), shared by all
their servers, kept across stops and culls: it has no owner, so deleting a pod
never deletes it. KubeSpawner creates it (``storage_pvc_ensure``); the
spawner adds the user's and the hub's labels.
"""

from __future__ import annotations

from typing import Any

from spawner.contract import HUB_LABEL, USER_LABEL
from spawner.kube.names import label_value
from spawner.kube.notebook import NotebookPod
from spawner.kube.quantities import byte_quantity


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
