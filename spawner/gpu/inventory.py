"""The hub's GPU inventory: discovered with NVML, or declared in the config.

NVML calls block and can fail in many ways (no library, no driver, a field
not supported); every failure becomes a plain reason string, never an
exception that reaches the hub. Call these functions in a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..quota.units import parse_size


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

    def describe(self) -> str:
        if not self.devices:
            return f"no GPUs ({self.reason})" if self.reason else "no GPUs"
        names = ", ".join(f"{d.index}: {d.name} {d.uuid}" for d in self.devices)
        text = f"{len(self.devices)} GPUs from {self.source}: {names}"
        return f"{text} ({self.reason})" if self.reason else text


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


def _load_nvml(nvml: ModuleType | None) -> ModuleType:
    if nvml is not None:
        return nvml
    import pynvml  # nvidia-ml-py

    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_reason(error: BaseException) -> str:
    """A plain sentence for an NVML failure."""
    text = str(error) or type(error).__name__
    return f"NVML: {text}"


_nvml_lock = threading.Lock()  # nvmlInit/Shutdown are counted; keep pairs whole


def discover_nvml(nvml: ModuleType | None = None) -> Inventory:
    """Every GPU NVML sees, with MIG instances in place of their GPU when MIG is on."""
    try:
        nvml = _load_nvml(nvml)
    except ImportError:
        return Inventory((), "none", "the NVML binding (nvidia-ml-py) is not installed")
    with _nvml_lock:
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, …
            return Inventory((), "none", nvml_reason(e))
        try:
            devices: list[GpuDevice] = []
            skipped: list[str] = []
            for i in range(nvml.nvmlDeviceGetCount()):
                try:  # one lost GPU must not take the others out of the inventory
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                    migs = _mig_devices(nvml, handle, i)
                    devices.extend(migs if migs is not None else [_device(nvml, handle, str(i))])
                except Exception as e:
                    skipped.append(f"GPU {i} skipped: {nvml_reason(e)}")
            reason = "; ".join(skipped) or ("" if devices else "NVML found no GPUs")
            return Inventory(tuple(devices), "nvml" if devices else "none", reason)
        except Exception as e:
            return Inventory((), "none", nvml_reason(e))
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass


def _device(nvml: ModuleType, handle: Any, index: str, parent: str | None = None) -> GpuDevice:
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    try:
        name = _text(nvml.nvmlDeviceGetName(handle))
    except Exception:
        name = "GPU"
    try:
        memory: int | None = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception:
        memory = None
    return GpuDevice(index, uuid, name, memory, parent)


def _mig_devices(nvml: ModuleType, handle: Any, i: int) -> list[GpuDevice] | None:
    """The GPU's MIG instances, or None when MIG is off or not supported."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:
        return None  # NotSupported on GPUs without MIG
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    parent = _text(nvml.nvmlDeviceGetUUID(handle))
    devices = []
    for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except Exception:
            continue  # NotFound: this slot holds no instance
        devices.append(_device(nvml, mig, f"{i}:{j}", parent))
    return devices


def free_memory(uuids: Iterable[str], nvml: ModuleType | None = None) -> dict[str, int]:
    """Free memory per UUID now, for the ones NVML can read; {} when it can't."""
    try:
        nvml = _load_nvml(nvml)
    except ImportError:
        return {}
    result: dict[str, int] = {}
    with _nvml_lock:
        try:
            nvml.nvmlInit()
        except Exception:
            return {}
        try:
            for uuid in uuids:
                try:
                    handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                    result[uuid] = int(nvml.nvmlDeviceGetMemoryInfo(handle).free)
                except Exception:
                    continue
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass
    return result
