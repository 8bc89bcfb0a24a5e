"""What a quota spawner is, to the code both backends share: ``QuotaSpawnerProtocol``.

QuotaSpawner (spawner/docker/spawner.py) and QuotaKubeSpawner (spawner/kube/spawner.py)
extend two libraries' spawners (DockerSpawner, KubeSpawner) and share their lifecycle
through mixins: the settings (``QuotaConfig``, policy/config.py), the table, the user's
choices, the spawn form and the options check (``RoleChoicesMixin``, policy/choices.py),
and the hub object of their hub process (``QuotaHub``, policy/hub.py, reached through
``quota_hub``). The mixins' methods are typed against this Protocol, which names what
they need of the spawner they are mixed into: JupyterHub's ``Spawner``, the settings,
the shared methods they call on each other, and what each backend gives. Both
spawners satisfy it (tests/unit/test_hub_object.py).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from spawner.policy.hub import Log, QuotaHub
from spawner.policy.stopping import HubServer
from spawner.quota.model import Choice, GpuCapacity, QuotaTable, Role
from spawner.quota.store import QuotaStore
from spawner.usage.ledger import LedgerWriter


class QuotaSpawnerProtocol(HubServer, Protocol):
    """A quota spawner, on Docker or Kubernetes, as its shared lifecycle uses it."""

    # JupyterHub's Spawner (and HubServer's user, name, pending, server)
    log: Log
    orm_spawner: Any  # the server's row; None for a spawner made to read the settings
    db: Any  # the hub's database session
    user_options: dict[str, Any]

    # QuotaConfig's settings (policy/config.py)
    quota_file: str
    quota_source: str
    quota_table_name: str
    form_template: str
    hub_id: str
    state_dir: str
    usage_db: str
    events_file: str
    usage_check_interval: float

    # what each backend gives
    hub_class: ClassVar[type[QuotaHub]]  # its hub object (policy/hub.py)
    _started_options: dict[str, str]  # the options that last started

    @property
    def log_name(self) -> str: ...

    def startable(self, choice: Choice) -> bool: ...

    # the shared lifecycle (RoleChoicesMixin), whose methods call each other

    async def quota_hub(self) -> QuotaHub: ...

    def table_store(self) -> QuotaStore: ...

    async def quota_table(self, capacity: GpuCapacity | None = None) -> QuotaTable: ...

    async def table_now(self, capacity: GpuCapacity | None = None) -> QuotaTable: ...

    async def choices_in(self, table: QuotaTable,
                         usage: LedgerWriter | None) -> list[Choice]: ...

    async def grants_in(self, usage: LedgerWriter | None) -> set[str]: ...

    async def budget_refusal_in(self, table: QuotaTable, usage: LedgerWriter | None,
                                role: Role) -> str | None: ...

    async def form_for(self, choices: list[Choice],
                       gpus: tuple[dict[str, int], int] | None = None,
                       contents: dict[str, str] | None = None,
                       host: dict[str, str] | None = None) -> str: ...

    async def resolve(self, choices: list[Choice],
                      options: dict[str, Any] | None = None) -> Choice: ...
