"""One start's inputs on Kubernetes: ``NotebookPod``.

The notebook policy (``notebook``: the role, the image, the user, the hub,
the GPUs the device plugin gives and their caps, spawner/policy/notebook.py)
and what only a pod needs: the uid and gid, the ``KubeOptions``, the home
claim's name and size and the container's name (KubeSpawner's ``notebook``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from spawner.kube.names import home_claim_name
from spawner.kube.options import KubeOptions
from spawner.kube.priority import class_name
from spawner.policy.notebook import Notebook
from spawner.quota.model import Role

NOTEBOOK_CONTAINER = "notebook"  # KubeSpawner's name for the server's container


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

    @cached_property
    def notebook(self) -> Notebook:
        """What the quota decides about this server, as on any backend: the device plugin
        picks the role's GPUs, whose memory is the options' ``gpu_device_memory``."""
        return Notebook(self.role, self.image_key, self.image, self.user_name, self.hub_id,
                        device_plugin=True, gpu_device_memory=self.options.gpu_device_memory,
                        torch_reads_fraction=self.torch_reads_fraction)

    @property
    def claim_name(self) -> str:
        return self.home_claim or home_claim_name(self.user_name,
                                                  self.options.home_claim_prefix)

    @property
    def home_size(self) -> int:
        """The home claim's storage request: the role's ``disk``, else the options'
        ``home_size`` (the size every claim had before roles had a disk)."""
        return self.role.disk if self.role.disk is not None else self.options.home_size

    @property
    def priority_class(self) -> str:
        return class_name(self.role.name, self.options.priority_class_prefix)

    @property
    def grace_period(self) -> int:
        """Seconds between SIGTERM and the kill, for preemption, drains and evictions."""
        return int(self.role.grace_period)
