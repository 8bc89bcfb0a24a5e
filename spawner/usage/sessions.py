"""One server start's session in the usage ledger, for every spawner.

A session opens when a start is asked for (before any GPU wait, so the wait
counts), gets the GPUs it holds, is started when the container or pod is
created (with its home's size) and ready when the server answers, and is closed with why it ended.
``ServerSession`` is that lifecycle, once: QuotaSpawner (Docker) and
QuotaKubeSpawner (Kubernetes) call it at those moments; each backend reads
its own way why a server ended (spawner/usage/duties.py ``record_end`` from
the Docker engine, spawner/kube/pod_end.py from the pod), as an ``End``.

Every call goes through the hub's ``LedgerWriter`` (one thread, in order): a
ledger that fails is logged, never a failed start or stop. Without a ledger
nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spawner.contract import gpu_mode_value
from spawner.quota.model import Choice, Role
from spawner.usage.ledger import FAILED, NO_LEDGER, LedgerWriter, failure

End = tuple[str, str | None, float | None]  # (reason, detail, when; None for now)


class ServerSession:
    """The session of one server (``container``: its container's or pod's name) of
    ``hub``; ``usage`` None: no ledger."""

    def __init__(self, usage: LedgerWriter | None, hub: str, container: str):
        self.usage = usage or NO_LEDGER
        self.hub = hub
        self.container = container
        # Opened by this start: a start refused before it leaves an older session alone.
        self.opened = False

    async def open(self, choice: Choice, user: str, server: str, groups: Iterable[str],
                   requested: float | None = None) -> None:
        """A new session for the start of ``choice``, asked for at ``requested`` (now);
        an older one of this server still open is closed as lost."""
        role = choice.role
        self.opened = True
        await self.usage.open(hub=self.hub, user=user, server=server,
                              container=self.container, role=role.name,
                              image=choice.image.key, cpu_limit=role.cpus,
                              mem_limit=role.memory, requested=requested, groups=list(groups))

    async def gpus(self, role: Role, uuids: Sequence[str] = (),
                   device_memory: int | None = None) -> None:
        """The role's GPUs: ``uuids`` where the hub assigned them, else (the device plugin
        picks them) only their count. The GPU memory is a shared role's cap, else
        ``device_memory``, the smallest card's where known."""
        if not role.gpus:
            return
        shared = role.gpu_mode == "shared"
        await self.usage.set_gpus(
            self.hub, self.container, uuids, gpu_mode_value(role.gpus, role.gpu_mode,
                                                            role.gpu_share),
            role.gpu_memory if shared else device_memory,
            count=None if uuids else role.gpus)

    async def started(self, container_id: str, home_size: int | None = None) -> None:
        """The container (its id) or pod (its uid) is created, with a home of
        ``home_size`` bytes (``Notebook.home_size``; None: no size limit)."""
        await self.usage.started(self.hub, self.container, container_id,
                                 home_size=home_size)

    async def ready(self) -> None:
        """The server answers."""
        await self.usage.ready(self.hub, self.container)

    async def failed(self, error: BaseException) -> None:
        """The start failed: the session it opened, if any, closes as failed, with what
        its user was told."""
        if self.opened:
            await self.close((FAILED, failure(error), None))

    async def close(self, end: End) -> None:
        """The server ended: its open session closes (a reason told earlier, e.g. by the
        culler, wins over a plain stop; ``Ledger.close``)."""
        await self.usage.close(self.hub, self.container, *end)
