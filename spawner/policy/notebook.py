"""What the quota decides about one notebook server, on any backend.

``Notebook`` is the decision: the role and its image, whose server it is, on
which hub, and the GPUs it holds. What follows from it is computed here, once,
for both backends: the GPU count and mode, the soft GPU memory cap and the cap
as torch's allocator fraction, the home's size. The backends add only their own
settings: Docker's ``ContainerSpec`` (spawner/docker/container.py: the notebook user,
the network, the pids limit, the start boost) and Kubernetes' ``NotebookPod``
(spawner/kube/notebook.py: uid and gid, the options, the home claim).
"""

from __future__ import annotations

from dataclasses import dataclass

from spawner.contract import gpu_mode_value
from spawner.policy.gpu import memory_fraction
from spawner.quota.model import Role


@dataclass(frozen=True)
class Notebook:
    """Everything the quota decides about one notebook server."""

    role: Role
    image_key: str  # the quota table's key
    image: str  # the reference the engine pulls
    user_name: str  # the hub user, exactly as written
    hub_id: str
    # The GPUs the hub's pool assigned (Docker), in order.
    gpu_uuids: tuple[str, ...] = ()
    # True where the cluster's device plugin picks the GPUs when the pod is bound
    # (Kubernetes): the server holds the role's GPUs, their UUIDs unknown to the hub.
    device_plugin: bool = False
    # The smallest held GPU's memory, when known: JAX's and torch's caps are fractions of it.
    gpu_device_memory: int | None = None
    # The image's torch reads the cap as an allocator fraction (from its frameworks label).
    torch_reads_fraction: bool = False

    @property
    def gpu_count(self) -> int:
        """How many GPUs the server holds."""
        return self.role.gpus if self.device_plugin else len(self.gpu_uuids)

    @property
    def gpu_mode(self) -> str:
        """The gpu-mode label: "exclusive", "shared:<gpu_share>", or "" without GPUs."""
        if not self.gpu_count:
            return ""
        return gpu_mode_value(self.role.gpus, self.role.gpu_mode, self.role.gpu_share)

    @property
    def home_size(self) -> int | None:
        """The home's size in bytes: the role's ``disk``; None: the home has no limit."""
        return self.role.disk

    @property
    def gpu_memory_cap(self) -> int | None:
        """The soft GPU memory cap in bytes: a shared role's ``gpu_memory``; None otherwise."""
        if not self.gpu_count or self.role.gpu_mode != "shared":
            return None
        return self.role.gpu_memory

    @property
    def torch_fraction(self) -> float | None:
        """The cap as torch's per_process_memory_fraction, where the image's torch reads
        it and the card's size is known."""
        cap = self.gpu_memory_cap
        if not cap or not self.gpu_device_memory or not self.torch_reads_fraction:
            return None
        return memory_fraction(cap, self.gpu_device_memory)
