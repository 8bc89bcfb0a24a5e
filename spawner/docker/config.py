"""QuotaSpawner's own settings: its traits, and the DockerSpawner defaults it changes.

A mixin on ``QuotaConfig`` (spawner/policy/config.py, the settings every quota
spawner has), so that spawner.py holds the lifecycle only; the traits are still
set as ``c.QuotaSpawner.<name>`` (docs/deployment.md lists them). Nothing here
is a guarantee: a trait can be replaced by config, so every limit is enforced
again when the container is created (spawner/docker/container.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from traitlets import (
    Bool,
    CaselessStrEnum,
    Dict,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)

from spawner.gpu.queue import BEST_EFFORT_FIFO, STRATEGIES
from spawner.homes.detect import CHOICES as HOME_MECHANISMS
from spawner.host.admission import CPU_RATIO, MEMORY_RATIO
from spawner.host.disk import DISK_RATIO
from spawner.policy.config import QuotaConfig


def filled_templates(value: Any, namespace: Mapping[str, str]) -> Any:
    """``value`` with every string in it (dict keys and values, list and tuple items)
    formatted with ``namespace`` (``{username}``, ``{servername}``, ...), as DockerSpawner
    fills its settings; a string that is no such template (``{`` in a path) stays as it is."""
    if isinstance(value, str):
        try:
            return value.format(**namespace)
        except (ValueError, KeyError):
            return value
    if isinstance(value, dict):
        return {filled_templates(k, namespace): filled_templates(v, namespace)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)([filled_templates(item, namespace) for item in value])
    return value


class QuotaSpawnerConfig(QuotaConfig):
    """The settings of QuotaSpawner (``c.QuotaSpawner.*``) beyond QuotaConfig's."""

    engine_threads = Integer(
        8,
        config=True,
        help="""Engine calls (create, inspect, start, stop, remove, the socket probes) the hub
        process makes at once, for all its servers together (docs/deployment.md#engine-calls-
        in-parallel). DockerSpawner makes one at a time, so a class's 24 stops queue behind
        each other; 1 gives that back. From 1 to 64.""",
    )

    @validate("engine_threads")
    def _valid_engine_threads(self, proposal: dict[str, Any]) -> int:
        value = int(proposal["value"])
        if not 1 <= value <= 64:
            raise TraitError(f"QuotaSpawner.engine_threads is {value}: it must be from 1 to 64")
        return value

    pids_limit = Integer(
        2048,
        config=True,
        help="Most processes and threads in one container, for roles that set no 'pids'.",
    )
    notebook_user = Unicode(
        "1000",
        config=True,
        help="The user (uid or uid:gid) the notebook runs as; never root.",
    )
    home_dir = Unicode("/home/jovyan", config=True,
                       help="Where the home (its volume, or its folder of a size) is mounted.")
    extra_labels = Dict(
        config=True, help="More container labels. The quota-spawner.* labels are refused."
    )
    gpu_inventory = List(
        Dict(),
        config=True,
        help="""The GPUs this hub hands out, declared: for a hub that cannot see them
        (a hub in a container, say). A list of {"uuid": "GPU-…", "name": "…",
        "memory": "80G"}; name and memory are optional. When empty, the GPUs are
        discovered with NVML on the hub host.""",
    )
    gpu_discovery = Bool(
        True, config=True, help="Discover GPUs with NVML when no gpu_inventory is declared."
    )
    gpu_sync_interval = Float(
        30.0, config=True,
        help="Seconds between checks of the running containers against the GPU holdings.",
    )
    zombie_grace_period = Float(
        300.0, config=True,
        help="Seconds an unclaimed container of this hub may run before it is stopped.",
    )
    usage_retention_days = Float(
        400.0, config=True,
        help="Days a finished session stays in the usage ledger; 0: kept forever.",
    )
    host_admission = Bool(
        True, config=True,
        help="""Admit a start only while the servers of this hub, with it, reserve no more
        CPUs and memory than the notebooks' share of the host; else it waits in the
        queue, up to its role's queue_timeout (docs/deployment.md#host-capacity).""",
    )
    queue_strategy = CaselessStrEnum(
        list(STRATEGIES), default_value=BEST_EFFORT_FIFO, config=True,
        help="""How the wait queue serves starts, with Kueue's names: "BestEffortFIFO" (a
        start that fits now is not held up by an older one that does not, which keeps its
        place and its right to preempt) or "StrictFIFO" (nobody behind takes room on the
        host, or a GPU, that a start ahead waits for). Either way the order is by
        priority, then a user's first server before anyone's second, then arrival
        (docs/preemption.md#the-queues-strategies).""",
    )
    host_cpus = Float(
        0.0, config=True,
        help="CPUs to count for the host; 0: the engine's (docker info). Never more than those.",
    )
    host_memory = Unicode(
        "", config=True,
        help="Memory to count for the host, like 200G; empty: the engine's. Never more.",
    )
    host_reserve_cpus = Float(
        None, allow_none=True, config=True,
        help="CPUs kept back for the hub, the proxy, the engine and the system; None: a "
             "tenth of the host's, at most 1.",
    )
    host_reserve_memory = Unicode(
        "", config=True,
        help="Memory kept back for the hub, the proxy and the system, like 8G; empty: a "
             "tenth of the host's, at least 1G.",
    )
    notebooks_cgroup = Bool(
        True, config=True,
        help="""Put this hub's notebook containers under one parent cgroup whose memory limit
        is the notebooks' share of the host (its memory less host_reserve_memory), so the
        kernel's OOM killer acts inside it and never on the hub or the proxy. The hub sets
        it up at start where it can, and says so in its log where it cannot
        (docs/deployment.md#the-notebooks-cgroup).""",
    )
    cpu_overcommit = Float(
        CPU_RATIO, config=True,
        help="How many times the notebooks' CPUs may be reserved (CPU time is shared).",
    )
    memory_overcommit = Float(
        MEMORY_RATIO, config=True,
        help="How many times the notebooks' memory may be reserved; 1: never overcommitted.",
    )
    home_root = Unicode(
        "", config=True,
        help="""The folder under which each user's home is kept, with the size of its
        role's 'disk' (docs/disk.md), bind-mounted as the home. Empty: homes stay Docker
        volumes, and disk is not enforced. The hub says at start which mechanism keeps
        the homes, or why disk is not enforced.""",
    )
    home_mechanism = CaselessStrEnum(
        list(HOME_MECHANISMS), default_value="auto", config=True,
        help="""What keeps the homes under home_root at their size: "auto" (btrfs with
        quotas, or XFS or ext4 mounted with prjquota, whichever holds home_root; else not
        enforced), "btrfs", "xfs", "ext4", "image" (an ext4 image per home on a loop
        device, on any filesystem), or "none". A mechanism named here that cannot work
        on this host refuses every start of a role with disk, with the reason in the log
        (docs/disk.md#which-one-a-host-uses).""",
    )
    home_image_dir = Unicode(
        "", config=True,
        help="With home_mechanism \"image\": the folder of the images; empty: "
             "<home_root>/.images.",
    )
    disk_ratio = Float(
        DISK_RATIO, config=True,
        help="""How many times the homes' filesystem (less disk_reserve) may be promised
        to homes: each home reserves its size from when it is made, running or not. 1:
        never overcommitted (docs/disk.md#admission).""",
    )
    disk_reserve = Unicode(
        "", config=True,
        help="Room kept free on the homes' filesystem for the system (and the hub's state "
             "where it shares it), like 50G; empty: a tenth of it, at most 100G.",
    )
    cpu_boost = Bool(
        True,
        config=True,
        help="""Start each server with more CPUs than its role (cpu_boost_cpus), and set
        the role's CPU quota with the engine's update call as soon as the server answers,
        before the user is handed the server. Python's imports are single-threaded, so a
        role below one CPU otherwise starts about twice as slowly. If the update fails,
        the server is stopped, never left unlimited.""",
    )
    cpu_boost_cpus = Float(
        0.0,
        config=True,
        help="CPUs a server gets while it starts (cpu_boost); 0 means all of the engine's CPUs.",
    )

    # --- DockerSpawner's defaults, changed ----------------------------------------

    @default("remove")
    def _remove_default(self) -> bool:
        return True  # a fresh container per spawn; the home volume keeps the work

    @validate("remove")
    def _always_remove(self, proposal: Any) -> bool:
        # A kept container would come back with the last role's limits and GPUs.
        if not proposal.value:
            self.log.warning("QuotaSpawner.remove=False is ignored: every start gets a fresh "
                             "container, sized from the quota table")
        return True

    @default("prefix")
    def _prefix_default(self) -> str:
        return "quota"

    @default("volumes")
    def _volumes_default(self) -> dict[str, str]:
        return {f"{self.prefix}-home-{{username}}": self.home_dir}

    @default("cmd")
    def _cmd_default(self) -> list[str]:
        return ["jupyterhub-singleuser"]

    @property
    def hub_id_prefix(self) -> str:
        return self.prefix

    async def admin_value(self, value: Any) -> dict[str, Any]:
        """An admin's dict setting as DockerSpawner reads it: called with the spawner if
        callable, awaited, with {username}-style templates filled in."""
        if callable(value):
            value = value(self)
        if inspect.isawaitable(value):
            value = await value
        return filled_templates(dict(value or {}), self.template_namespace())

    def start_cpus(self, engine_cpus: float) -> float | None:
        """CPUs for the start boost; None when it is off. ``engine_cpus``: 0 if unknown."""
        if not self.cpu_boost:
            return None
        cpus = self.cpu_boost_cpus or engine_cpus
        return min(cpus, engine_cpus) if engine_cpus else cpus or None
