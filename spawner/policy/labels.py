"""The contract labels of a notebook server: who runs what with which GPUs.

The exact values, on any backend: Docker writes them as the container's
labels, Kubernetes as the pod's annotations (its labels hold valid forms of
the same values, spawner/kube/pod.py). The GPU pool, the watchdog, the culler
and the ledger read them back.
"""

from __future__ import annotations

from spawner.contract import (
    GPU_MODE_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    IMAGE_LABEL,
    ROLE_LABEL,
    USER_LABEL,
)
from spawner.policy.notebook import Notebook


def labels(notebook: Notebook) -> dict[str, str]:
    """Every contract label, in the contract's order (CONTRACT_LABELS).
    ``quota-spawner.gpus`` is empty where the device plugin picks the GPUs, after
    this is written."""
    return {
        USER_LABEL: notebook.user_name,
        ROLE_LABEL: notebook.role.name,
        IMAGE_LABEL: notebook.image_key,
        GPUS_LABEL: ",".join(notebook.gpu_uuids),
        GPU_MODE_LABEL: notebook.gpu_mode,
        HUB_LABEL: notebook.hub_id,
    }
