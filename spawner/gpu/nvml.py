"""The one NVML layer: every NVML call of the hub and of the GPU monitor goes through here.

Modelled on nvitop's ``api/libnvml.py``: one wrapper around the ``pynvml``
module (the nvidia-ml-py binding, or a fake in the tests) that starts NVML
once, decodes the bytes that old bindings return for text, and turns every
failure into an ``NvmlError`` whose text is the reason, in NVML's own words
("Driver Not Loaded", "GPU is lost"). A field a device does not give is
``None``, with its reason noted; it never raises.

What "start once" means for each user:

- The GPU monitor (spawner.monitor.collector) keeps one ``Nvml`` started for
  its whole life and reads every visible device once per tick. When NVML
  cannot be started, or stops answering (the driver unloaded or reloaded:
  the device count fails), ``start()`` fails with the same error, without
  calling NVML, until ``retry_seconds`` have passed; then it tries again.
- The hub (spawner.gpu.inventory) asks rarely: the inventory once when it
  starts, free memory at each pool sync. Each call is one ``session()``:
  NVML started for it and shut down after it, one session at a time in the
  process, since NVML counts its inits and shutdowns. A long-lived hub thus
  never holds the driver open (a driver update can unload it) and never
  reads through handles a driver reload made stale.

Cheap to import: the standard library only. ``pynvml`` is imported on the
first ``start()``, so a notebook server without a GPU never loads it.
Blocking: call it in a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, NamedTuple, TypedDict

NOT_INSTALLED = "the NVML binding (nvidia-ml-py) is not installed"


def reason(error: BaseException) -> str:
    """The reason an error gives: NVML's own text, or its type's name when it has none."""
    return str(error) or type(error).__name__


class NvmlError(Exception):
    """An NVML call failed; ``str()`` is the reason, e.g. 'GPU is lost'."""


class NvmlUnavailable(NvmlError):
    """NVML could not be started: no library, no driver."""


class NvmlNotInstalled(NvmlUnavailable):
    """The binding itself is missing: ``import pynvml`` failed."""

    def __init__(self) -> None:
        super().__init__(NOT_INSTALLED)


# --- what the reads return (docs/gpu-metrics.schema.json: $defs gpu, failedGpu) -----


class ProcessSummary(TypedDict):
    """The compute processes on a device, all users' together: no host PIDs."""

    count: int
    used_memory: int | None  # bytes; None where NVML does not know it (MIG, WDDM)


class GpuReading(TypedDict):
    """A device NVML answered for; a field it would not give is None, its reason in errors."""

    index: int  # the position in the list read, from 0
    uuid: str
    errors: dict[str, str]  # field -> reason: name, memory, utilization, temperature, ...
    name: str | None
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes
    utilization: float | None  # 0 to 1
    temperature: int | None  # °C
    power_draw: float | None  # W
    power_limit: float | None  # W
    processes: ProcessSummary | None


class FailedGpu(TypedDict):
    """A device that could not be read at all: lost, or not found."""

    index: int
    uuid: str  # the name it was asked for by
    errors: dict[str, str]
    error: str


class Device(NamedTuple):
    """A device found by ``Nvml.devices``: a whole GPU, or a MIG instance."""

    index: str  # "0", or "0:1" for MIG instance 1 on GPU 0
    uuid: str
    name: str | None  # None: NVML would not say
    memory: int | None  # total bytes; None: NVML would not say
    parent: str | None = None  # the GPU's UUID, for a MIG instance


class Nvml:
    """A ``pynvml`` module (imported when first needed), started once, failing as reasons."""

    _sessions = threading.Lock()  # NVML counts inits and shutdowns: one session at a time

    def __init__(self, module: ModuleType | Any = None, retry_seconds: float = 0.0):
        self._module = module  # pynvml, or a fake with its names; None: import pynvml
        self.retry_seconds = retry_seconds
        self.initialized = False
        self._lock = threading.RLock()
        self._failure: NvmlError | None = None  # why NVML is down, until _next_try
        self._next_try = 0.0

    # --- starting and stopping ---------------------------------------------------

    @property
    def module(self) -> Any:
        if self._module is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError:
                raise NvmlNotInstalled() from None
            self._module = pynvml
        return self._module

    def start(self) -> None:
        """Start NVML unless it is started; raises NvmlUnavailable (or the error that
        took it down) when it cannot be, again without trying until retry_seconds passed."""
        with self._lock:
            if self.initialized:
                return
            if self._failure is not None and time.monotonic() < self._next_try:
                raise self._failure.with_traceback(None)
            try:
                self.module.nvmlInit()
            except NvmlNotInstalled as e:
                self._down(e)
                raise
            except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, …
                failure = NvmlUnavailable(reason(e))
                self._down(failure)
                raise failure from e
            self.initialized, self._failure = True, None

    def stop(self) -> None:
        """Shut NVML down if this wrapper started it; a failing shutdown is ignored."""
        with self._lock:
            if not self.initialized:
                return
            self.initialized = False
            try:
                self.module.nvmlShutdown()
            except Exception:
                pass

    def _down(self, error: NvmlError) -> None:
        """NVML is unusable: stopped, and start() fails with ``error`` for retry_seconds."""
        with self._lock:
            self.stop()
            self._failure = error
            self._next_try = time.monotonic() + self.retry_seconds

    @contextmanager
    def session(self) -> Iterator[Nvml]:
        """NVML started for the block and shut down after it (the hub's way)."""
        with self._sessions:
            self.start()
            try:
                yield self
            finally:
                self.stop()

    # --- calls -----------------------------------------------------------------------

    def call(self, function: str, *args: Any) -> Any:
        """``pynvml.<function>(*args)``, text decoded; any failure raises NvmlError."""
        try:
            value = getattr(self.module, function)(*args)
        except Exception as e:  # NVMLError_NotSupported, _GpuIsLost, a missing function, …
            raise NvmlError(reason(e)) from e
        return value.decode() if isinstance(value, bytes) else value

    def query(self, function: str, *args: Any, errors: dict[str, str] | None = None,
              field: str = "") -> Any:
        """``call()``, but a failure is None, its reason noted in ``errors[field]``."""
        try:
            return self.call(function, *args)
        except NvmlError as e:
            if errors is not None:
                errors[field] = str(e)
            return None

    def constant(self, name: str, default: int) -> int:
        return getattr(self.module, name, default)

    def count(self) -> int:
        """How many GPUs NVML sees. Failing here means NVML itself is gone (the driver
        unloaded or reloaded): it is stopped, and start() fails for retry_seconds."""
        try:
            return self.call("nvmlDeviceGetCount")
        except NvmlError as e:
            self._down(e)
            raise

    # --- the hub: the inventory and free memory --------------------------------------

    def devices(self) -> tuple[list[Device], list[tuple[int, str]]]:
        """Every device NVML sees, with MIG instances in place of their GPU when MIG is
        on; and (GPU index, reason) for each GPU left out because it failed."""
        found: list[Device] = []
        skipped: list[tuple[int, str]] = []
        for i in range(self.count()):
            try:  # one lost GPU must not take the others out
                handle = self.call("nvmlDeviceGetHandleByIndex", i)
                migs = self._mig_devices(handle, i)
                found.extend(migs if migs is not None else [self._device(handle, str(i))])
            except NvmlError as e:
                skipped.append((i, str(e)))
        return found, skipped

    def _device(self, handle: Any, index: str, parent: str | None = None) -> Device:
        uuid = self.call("nvmlDeviceGetUUID", handle)
        name = self.query("nvmlDeviceGetName", handle)
        memory = self.query("nvmlDeviceGetMemoryInfo", handle)
        return Device(index, uuid, name, int(memory.total) if memory is not None else None,
                      parent)

    def _mig_devices(self, handle: Any, i: int) -> list[Device] | None:
        """The GPU's MIG instances, or None when MIG is off or not supported."""
        mode = self.query("nvmlDeviceGetMigMode", handle)  # NotSupported without MIG
        if mode is None or mode[0] != self.constant("NVML_DEVICE_MIG_ENABLE", 1):
            return None
        parent = self.call("nvmlDeviceGetUUID", handle)
        devices = []
        for j in range(self.call("nvmlDeviceGetMaxMigDeviceCount", handle)):
            mig = self.query("nvmlDeviceGetMigDeviceHandleByIndex", handle, j)
            if mig is not None:  # None: NotFound, this slot holds no instance
                devices.append(self._device(mig, f"{i}:{j}", parent))
        return devices

    def free_memory(self, uuids: Iterable[str]) -> dict[str, int]:
        """Free bytes per UUID, for the devices NVML can read."""
        result: dict[str, int] = {}
        for uuid in uuids:
            handle = self.query("nvmlDeviceGetHandleByUUID", uuid)
            memory = self.query("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
            if memory is not None:
                result[uuid] = int(memory.free)
        return result

    # --- the monitor: one reading of each visible device ----------------------------

    def readings(self, visible: list[str] | None) -> list[GpuReading | FailedGpu]:
        """A reading of each device in ``visible`` (UUIDs or numbers, as in
        NVIDIA_VISIBLE_DEVICES; None: all). A device that cannot be found or read
        gets its own error, so one lost GPU does not hide the others; raises
        NvmlError only when NVML cannot count the GPUs."""
        if visible is None:
            found = [(str(i), self._lookup("nvmlDeviceGetHandleByIndex", i))
                     for i in range(self.count())]
        else:
            found = [(ident, self._lookup("nvmlDeviceGetHandleByIndex", int(ident))
                      if ident.isdigit() else self._lookup("nvmlDeviceGetHandleByUUID", ident))
                     for ident in visible]
        return [self.read(i, asked_as, handle) for i, (asked_as, handle) in enumerate(found)]

    def _lookup(self, function: str, ident: Any) -> Any:
        """A device's handle, or the NvmlError of its lookup (lost, not found)."""
        try:
            return self.call(function, ident)
        except NvmlError as e:
            return e

    def read(self, position: int, asked_as: str, handle: Any) -> GpuReading | FailedGpu:
        """Everything NVML will tell about one device (``handle``, or its lookup's error)."""
        errors: dict[str, str] = {}
        try:
            if isinstance(handle, NvmlError):
                raise handle
            uuid = self.call("nvmlDeviceGetUUID", handle)  # a GPU off the bus fails here first
        except NvmlError as e:
            return FailedGpu(index=position, uuid=asked_as, errors=errors, error=str(e))

        def get(field: str, function: str, *args: Any) -> Any:
            return self.query(function, handle, *args, errors=errors, field=field)

        name = get("name", "nvmlDeviceGetName")
        memory = get("memory", "nvmlDeviceGetMemoryInfo")
        rates = get("utilization", "nvmlDeviceGetUtilizationRates")
        temperature = get("temperature", "nvmlDeviceGetTemperature",
                          self.constant("NVML_TEMPERATURE_GPU", 0))
        power = get("power", "nvmlDeviceGetPowerUsage")
        limit = get("power_limit", "nvmlDeviceGetEnforcedPowerLimit")
        procs = get("processes", "nvmlDeviceGetComputeRunningProcesses")
        return GpuReading(
            index=position, uuid=uuid, errors=errors, name=name,
            memory_used=int(memory.used) if memory is not None else None,
            memory_total=int(memory.total) if memory is not None else None,
            utilization=rates.gpu / 100 if rates is not None else None,
            temperature=temperature,
            power_draw=power / 1000 if power is not None else None,  # mW -> W
            power_limit=limit / 1000 if limit is not None else None,
            processes=_processes(procs) if procs is not None else None,
        )


def _processes(procs: list[Any]) -> ProcessSummary:
    # NVML gives host PIDs, which mean nothing inside the container, and on a
    # shared GPU other users' processes: only how many and how much.
    used = [getattr(p, "usedGpuMemory", None) for p in procs]
    known = all(isinstance(u, int) for u in used)  # not known under MIG
    return ProcessSummary(count=len(used), used_memory=sum(used) if known else None)
