"""One reading of the GPUs this container can see, through NVML.

Blocking: the collector calls it in a thread. Every NVML call is wrapped, so
a field a GPU does not support is ``None`` with a note in ``errors``, and a
GPU that fails entirely gets an ``error`` of its own; neither raises.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def reason(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _read(errors: dict[str, str], field: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as e:  # NVMLError_NotSupported, _NoPermission, …
        errors[field] = reason(e)
        return None


def _handle(call: Callable[[Any], Any], ident: Any) -> Any:
    try:
        return call(ident)
    except Exception as e:  # lost (GPU_IS_LOST), or gone from NVML: that GPU's error
        return e


def handles(nvml: ModuleType, visible: list[str] | None) -> list[tuple[str, Any]]:
    """(the name it was asked by, NVML handle) for each visible device.

    A device whose lookup fails gets the exception in place of its handle, so
    one lost GPU does not hide the others; read_gpu turns it into its error.
    """
    if visible is None:
        return [(str(i), _handle(nvml.nvmlDeviceGetHandleByIndex, i))
                for i in range(nvml.nvmlDeviceGetCount())]
    found = []
    for ident in visible:
        if ident.isdigit():
            found.append((ident, _handle(nvml.nvmlDeviceGetHandleByIndex, int(ident))))
        else:  # GPU-… or MIG-…
            found.append((ident, _handle(nvml.nvmlDeviceGetHandleByUUID, ident)))
    return found


def read_gpu(nvml: ModuleType, position: int, asked_as: str, handle: Any) -> dict[str, Any]:
    """Everything NVML will tell about one device; unsupported fields are None."""
    errors: dict[str, str] = {}
    gpu: dict[str, Any] = {"index": position, "uuid": asked_as, "errors": errors}
    if isinstance(handle, Exception):  # the lookup itself failed (see handles)
        gpu["error"] = reason(handle)
        return gpu
    try:
        gpu["uuid"] = _text(nvml.nvmlDeviceGetUUID(handle))
    except Exception as e:  # a GPU that fell off the bus fails here first
        gpu["error"] = reason(e)
        return gpu
    gpu["name"] = _read(errors, "name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
    memory = _read(errors, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    gpu["memory_used"] = int(memory.used) if memory is not None else None
    gpu["memory_total"] = int(memory.total) if memory is not None else None
    rates = _read(errors, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    gpu["utilization"] = rates.gpu / 100 if rates is not None else None
    gpu["temperature"] = _read(errors, "temperature", lambda: nvml.nvmlDeviceGetTemperature(
        handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)))
    power = _read(errors, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    gpu["power_draw"] = power / 1000 if power is not None else None  # mW -> W
    limit = _read(errors, "power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    gpu["power_limit"] = limit / 1000 if limit is not None else None
    procs = _read(errors, "processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    # NVML gives host PIDs, which mean nothing inside the container, and on a
    # shared GPU other users' processes: report only how many and how much.
    if procs is None:
        gpu["processes"] = None
    else:
        used = [getattr(p, "usedGpuMemory", None) for p in procs]
        known = all(isinstance(u, int) for u in used)  # not known under MIG
        gpu["processes"] = {"count": len(used), "used_memory": sum(used) if known else None}
    return gpu
