"""The hub's GPU inventory: discovered with NVML, or declared in the config.

NVML calls block and can fail in many ways (no library, no driver, a field
not supported); every failure becomes a plain reason string, never an
exception that reaches the hub. Call these functions in a thread. The NVML
calls themselves are in spawner.gpu.nvml, shared with the GPU monitor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from spawner.gpu.nvml import NOT_INSTALLED, Nvml, NvmlError, NvmlNotInstalled
from spawner.quota.units import parse_size

# the reasons an inventory is empty that the hub itself gives (the rest are NVML's)
INVALID = "QuotaSpawner.gpu_inventory is invalid"
DISCOVERY_OFF = "no gpu_inventory is declared and discovery is off"
NONE_FOUND = "NVML found no GPUs"


@dataclass(frozen=True)
class GpuDevice:
    """One assignable device: a whole GPU, or a MIG instance when MIG is on."""

    index: str  # "0", or "0:1" for MIG instance 1 on GPU 0
    uuid: str  # "GPU-…" or "MIG-…": what DeviceRequests and NVIDIA_VISIBLE_DEVICES take
    name: str = "GPU"
    memory: int | None = None  # bytes; None when unknown
    parent: str | None = None  # the GPU's UUID, for a MIG instance


@dataclass(frozen=True)
class Inventory:
    devices: tuple[GpuDevice, ...]
    source: str  # "nvml", "declared" or "none"
    reason: str = ""  # why there are no devices, or which ones were skipped

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    def smallest_memory(self, uuids: Iterable[str] | None = None) -> int | None:
        """The least memory among these devices (all by default); None if any is unknown."""
        wanted = None if uuids is None else set(uuids)
        memories = [d.memory for d in self.devices if wanted is None or d.uuid in wanted]
        if not memories or None in memories:
            return None
        return min(m for m in memories if m is not None)

    @property
    def plain_reason(self) -> str:
        """Why there are no GPUs, in words for the hub's users ('' when there are
        some); ``reason`` keeps the technical one, for the log."""
        if self.devices:
            return ""
        return plain_reason(self.reason)

    def describe(self) -> str:
        if not self.devices:
            return f"no GPUs ({self.reason})" if self.reason else "no GPUs"
        names = ", ".join(f"{d.index}: {d.name} {d.uuid}" for d in self.devices)
        text = f"{len(self.devices)} GPUs from {self.source}: {names}"
        return f"{text} ({self.reason})" if self.reason else text


# An empty inventory's reason (NVML's own words, or the config's) -> what users read.
_PLAIN = (
    ("NVML Shared Library Not Found", "it cannot read them: the NVIDIA driver's library is "
                                      "not installed where the hub runs"),
    ("Driver Not Loaded", "it cannot read them: the NVIDIA driver is not loaded on the "
                          "hub's host"),
    ("Insufficient Permissions", "it is not allowed to read them"),
    (NOT_INSTALLED, "it cannot read them: the hub lacks the NVIDIA library that reads them"),
    (INVALID, "an admin must fix the hub's list of GPUs"),
    (DISCOVERY_OFF, "none are configured"),
    (NONE_FOUND, "none were found"),
)


def plain_reason(reason: str) -> str:
    """``reason`` for an empty inventory, in words a researcher understands."""
    if not reason:
        return "none were found"
    for technical, plain in _PLAIN:
        if technical in reason:
            return plain
    return "it cannot read them; the hub's log says why"


def declared_inventory(entries: Iterable[Mapping[str, Any]]) -> Inventory:
    """An inventory from config: [{"uuid": "GPU-…", "name": "…", "memory": "80G"}, …]."""
    devices = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        uuid = str(entry.get("uuid") or "").strip()
        if not uuid or "," in uuid or any(c.isspace() for c in uuid):
            raise ValueError(f"GPU {i} in the declared inventory needs a 'uuid' "
                             f"without commas or spaces, not {uuid!r}")
        if uuid in seen:
            raise ValueError(f"GPU {uuid} is declared twice")
        seen.add(uuid)
        memory = entry.get("memory")
        devices.append(GpuDevice(
            index=str(entry.get("index", i)),
            uuid=uuid,
            name=str(entry.get("name") or "GPU"),
            memory=parse_size(memory) if memory not in (None, "") else None,
            parent=entry.get("parent"),
        ))
    return Inventory(tuple(devices), "declared")


def _reason(error: NvmlError) -> str:
    """'NVML: Driver Not Loaded'; the binding's absence as it is."""
    return str(error) if isinstance(error, NvmlNotInstalled) else f"NVML: {error}"


def discover_nvml(nvml: ModuleType | None = None) -> Inventory:
    """Every GPU NVML sees, with MIG instances in place of their GPU when MIG is on.

    One NVML session (spawner.gpu.nvml: started for this call, shut down after it).
    """
    try:
        with Nvml(nvml).session() as session:
            found, skipped = session.devices()
    except NvmlError as e:  # no binding, no library, no driver; or the GPUs not countable
        return Inventory((), "none", _reason(e))
    devices = tuple(GpuDevice(d.index, d.uuid, d.name or "GPU", d.memory, d.parent)
                    for d in found)
    reason = "; ".join(f"GPU {i} skipped: NVML: {why}" for i, why in skipped)
    return Inventory(devices, "nvml" if devices else "none",
                     reason or ("" if devices else NONE_FOUND))


def free_memory(uuids: Iterable[str], nvml: ModuleType | None = None) -> dict[str, int]:
    """Free memory per UUID now, for the ones NVML can read; {} when it can't.

    One NVML session, like discover_nvml.
    """
    try:
        with Nvml(nvml).session() as session:
            return session.free_memory(uuids)
    except NvmlError:
        return {}
