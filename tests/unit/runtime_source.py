"""A spawner as the hub's runtime reads it (spawner/docker/runtime.py): ``source`` gives
QuotaSpawnerConfig's settings, an engine client (``FakeDocker`` unless given) and a log,
for the runtime's tests (test_runtime.py) and the event log's (test_event_destinations.py).
"""

from __future__ import annotations

import logging
from typing import Any

from spawner.contract import GPUS_LABEL, HUB_LABEL, USER_LABEL

HUB = "hub-rt"
LOG = logging.getLogger("test.runtime")


class FakeDocker:
    """The engine as the runtime's build and first sync ask it."""

    def __init__(self, names: tuple[str, ...] = (), info: dict[str, Any] | None = None):
        self.names = names
        self._info = info if info is not None else {"SwapLimit": True, "NCPU": 8}
        self.removed: list[str] = []

    def info(self) -> dict[str, Any]:
        return self._info

    def containers(self, all=False, filters=None):  # noqa: A002 (docker-py's own name)
        return [{"Names": [f"/{n}"], "State": "running",
                 "Labels": {GPUS_LABEL: "", HUB_LABEL: HUB, USER_LABEL: n}}
                for n in self.names]

    def remove_container(self, name: str, force: bool = False) -> None:
        self.removed.append(name)


class Source:
    """A spawner as the runtime reads it: QuotaSpawnerConfig's traits, a client, a log."""

    def __init__(self, **values: Any) -> None:
        vars(self).update(values)


def source(tmp_path, client: Any = None, **settings: Any) -> Any:
    values = dict(hub_id=HUB, gpu_inventory=[], gpu_discovery=False,
                  quota_file=str(tmp_path / "quotas.yaml"), state_dir=str(tmp_path),
                  usage_db="none", events_file="", gpu_sync_interval=3600.0,
                  zombie_grace_period=300.0,
                  usage_retention_days=0.0, usage_check_interval=3600.0,
                  host_admission=False, queue_strategy="BestEffortFIFO", host_cpus=0.0,
                  host_memory="", host_reserve_cpus=1.0,
                  host_reserve_memory="", cpu_overcommit=4.0, memory_overcommit=1.0,
                  notebooks_cgroup=False, quota_source="file", quota_table_name="default",
                  home_root="", home_mechanism="auto", home_image_dir="", disk_ratio=1.0,
                  disk_reserve="")
    values.update(settings)
    return Source(client=client if client is not None else FakeDocker(), log=LOG,
                  _log_name="alice", **values)
