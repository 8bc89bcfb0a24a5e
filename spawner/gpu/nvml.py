"""The one NVML layer: every NVML call of the hub and of the GPU monitor goes through here.

Modelled on nvitop's ``api/libnvml.py``: one wrapper around the ``pynvml``
module (the nvidia-ml-py binding, or a fake in the tests) that starts NVML
once, decodes the bytes that old bindings return for text, and turns every
failure into an ``NvmlError`` whose text is the reason, in NVML's own words
("Driver Not Loaded", "GPU is lost"). A field a device does not give is
``None``, with its reason noted; it never raises.

What "start once" means for each user:

- The GPU monitor (spawner.notebook.monitor.collector) keeps one ``Nvml`` started for
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
- The watchdog (spawner.watchdog) keeps one ``Nvml`` started like the monitor,
  and reads the whole host each cycle: ``host_gpus()`` (every device with its
  processes' host PIDs) and an ``XidWatcher`` (the XID errors since its last
  poll, through NVML events).

Cheap to import: the standard library only. ``pynvml`` is imported on the
first ``start()``, so a notebook server without a GPU never loads it.
Blocking: call it in a thread.
"""

from __future__ import annotations

import logging
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


# --- what the watchdog reads: the whole host ------------------------------------------


class HostProcess(NamedTuple):
    """A process with a context on a device, as NVML lists it."""

    pid: int  # on the host: /proc/PID/cgroup names its container
    used_memory: int | None  # bytes; None where NVML does not know it (MIG, WDDM)


class HostGpu(TypedDict):
    """One device of the host: a whole GPU, or a MIG instance when MIG is on.

    ``lost`` is NVML's reason when the device could not be read at all ("GPU is
    lost", "Not Found"); its values are then None. A field that one device does
    not give (utilisation of a MIG instance) is None with its reason in errors.
    """

    uuid: str  # a lost GPU never read before: "unknown:<index>"
    index: int  # the GPU's index on the host (its parent's for a MIG instance); -1 unknown
    mig: int | None  # the MIG slot on that GPU; None for a whole GPU
    parent: str | None  # the GPU's UUID, for a MIG instance
    gpu_instance: int | None  # a MIG instance's GPU instance id, as XID events name it
    name: str | None
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes
    utilization: float | None  # 0 to 1
    # Compute and graphics processes, each PID once; None: NVML would not list them.
    processes: list[HostProcess] | None
    errors: dict[str, str]  # field -> reason
    lost: str | None


class HostScan(NamedTuple):
    """One read of the host; ``error`` says why there is none (NVML down), gpus then []."""

    gpus: list[HostGpu]
    error: str | None = None


class XidEvent(NamedTuple):
    """An XID error NVML reported for a GPU."""

    uuid: str  # the whole GPU's, also when MIG is on
    xid: int  # e.g. 79: the GPU has fallen off the bus
    gpu_instance: int | None = None  # the MIG GPU instance id (HostGpu's), when NVML names one


class Nvml:
    """A ``pynvml`` module (imported when first needed), started once, failing as reasons."""

    _sessions = threading.Lock()  # NVML counts inits and shutdowns: one session at a time

    def __init__(self, module: ModuleType | Any = None, retry_seconds: float = 0.0):
        self._module = module  # pynvml, or a fake with its names; None: import pynvml
        self.retry_seconds = retry_seconds
        self.initialized = False
        # Counts the starts: handles and event sets of an earlier start are stale.
        self.generation = 0
        self._last: dict[int, list[HostGpu]] = {}  # host_gpus: the last good records per GPU
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
            self.generation += 1

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

    def is_error(self, error: NvmlError, name: str, default: int) -> bool:
        """Whether ``error`` came from NVML's error code ``name`` (e.g. NVML_ERROR_TIMEOUT)."""
        return getattr(error.__cause__, "value", None) == self.constant(name, default)

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


    # --- the watchdog: every device of the host, with host PIDs ----------------------

    def host_gpus(self, expected: Iterable[str] = ()) -> HostScan:
        """Every device NVML sees (MIG instances in place of their GPU when MIG is on),
        with the host PIDs of the processes on it. Starts NVML and keeps it started
        (after a failure, tried again only once retry_seconds passed). Never raises:
        NVML down is ``HostScan([], reason)``; a GPU that cannot be read is in the list
        with ``lost``, under the UUIDs it had at its last good read, so its servers
        can be told. ``expected``: UUIDs the caller knows of (from its containers'
        labels) that must not vanish silently: one NVML no longer lists is reported
        lost too. Blocking: call it in a thread."""
        try:
            self.start()
            count = self.count()
        except NvmlError as e:
            return HostScan([], str(e))
        gpus: list[HostGpu] = []
        for i in range(count):
            try:  # one lost GPU must not take the others out
                records = self._host_gpu_records(i)
            except NvmlError as e:
                records = [_lost(gpu, str(e)) for gpu in self._last.get(i, [])] or [
                    _lost(_blank(f"unknown:{i}", i), str(e))]
            else:
                self._last[i] = records
            gpus.extend(records)
        listed = {gpu["uuid"] for gpu in gpus}
        for uuid in dict.fromkeys(expected):
            if uuid not in listed:
                gpus.append(self._unlisted(uuid))
        return HostScan(gpus)

    def _host_gpu_records(self, i: int) -> list[HostGpu]:
        """GPU ``i`` (or its MIG instances); raises NvmlError when the GPU cannot be read."""
        handle = self.call("nvmlDeviceGetHandleByIndex", i)
        uuid = self.call("nvmlDeviceGetUUID", handle)  # a GPU off the bus fails here first
        mode = self.query("nvmlDeviceGetMigMode", handle)  # NotSupported without MIG
        if mode is None or mode[0] != self.constant("NVML_DEVICE_MIG_ENABLE", 1):
            return [self._host_gpu(handle, uuid, i)]
        records = []
        for j in range(self.call("nvmlDeviceGetMaxMigDeviceCount", handle)):
            mig = self.query("nvmlDeviceGetMigDeviceHandleByIndex", handle, j)
            if mig is not None:  # None: NotFound, this slot holds no instance
                mig_uuid = self.call("nvmlDeviceGetUUID", mig)
                records.append(self._host_gpu(mig, mig_uuid, i, j, uuid))
        return records

    def _host_gpu(self, handle: Any, uuid: str, index: int, mig: int | None = None,
                  parent: str | None = None) -> HostGpu:
        gpu = _blank(uuid, index, mig, parent)
        errors = gpu["errors"]

        def get(field: str, function: str) -> Any:
            try:
                return self.call(function, handle)
            except NvmlError as e:
                errors[field] = str(e)
                if self.is_error(e, "NVML_ERROR_GPU_IS_LOST", 15) and gpu["lost"] is None:
                    gpu["lost"] = str(e)  # it fell off the bus between two calls
                return None

        gpu["name"] = get("name", "nvmlDeviceGetName")
        if mig is not None:
            gpu["gpu_instance"] = get("gpu_instance", "nvmlDeviceGetGpuInstanceId")
        memory = get("memory", "nvmlDeviceGetMemoryInfo")
        if memory is not None:
            gpu["memory_used"], gpu["memory_total"] = int(memory.used), int(memory.total)
        rates = get("utilization", "nvmlDeviceGetUtilizationRates")  # not for MIG instances
        if rates is not None:
            gpu["utilization"] = rates.gpu / 100
        compute = get("processes", "nvmlDeviceGetComputeRunningProcesses")
        if compute is not None:
            # Graphics contexts are rare in notebooks but hold memory all the same;
            # datacenter GPUs answer NotSupported. A PID in both lists counts once.
            graphics = get("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses")
            gpu["processes"] = _host_processes([*compute, *(graphics or [])])
        return gpu

    def _unlisted(self, uuid: str) -> HostGpu:
        """An expected device that the host's list lacks: lost, unless NVML finds it."""
        try:
            handle = self.call("nvmlDeviceGetHandleByUUID", uuid)
        except NvmlError as e:
            known = [g for gpus in self._last.values() for g in gpus if g["uuid"] == uuid]
            return _lost(known[0] if known else _blank(uuid, -1), str(e))
        index = self.query("nvmlDeviceGetIndex", handle)
        return self._host_gpu(handle, uuid, index if isinstance(index, int) else -1)

def _processes(procs: list[Any]) -> ProcessSummary:
    # NVML gives host PIDs, which mean nothing inside the container, and on a
    # shared GPU other users' processes: only how many and how much.
    used = [getattr(p, "usedGpuMemory", None) for p in procs]
    known = all(isinstance(u, int) for u in used)  # not known under MIG
    return ProcessSummary(count=len(used), used_memory=sum(used) if known else None)


def _blank(uuid: str, index: int, mig: int | None = None, parent: str | None = None) -> HostGpu:
    return HostGpu(uuid=uuid, index=index, mig=mig, parent=parent, gpu_instance=None, name=None,
                   memory_used=None, memory_total=None, utilization=None, processes=None,
                   errors={}, lost=None)


def _lost(gpu: HostGpu, why: str) -> HostGpu:
    """A device as it was last read, now lost: its names kept, its values unknown."""
    lost = _blank(gpu["uuid"], gpu["index"], gpu["mig"], gpu["parent"])
    lost.update(gpu_instance=gpu["gpu_instance"], name=gpu["name"],
                memory_total=gpu["memory_total"], lost=why)
    return lost


def _host_processes(procs: list[Any]) -> list[HostProcess]:
    seen: dict[int, HostProcess] = {}
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)  # pynvml: None when not available
        used = used if isinstance(used, int) else None
        seen.setdefault(int(p.pid), HostProcess(int(p.pid), used))
    return list(seen.values())


# --- XID errors, through NVML events ---------------------------------------------------


class XidWatcher:
    """The XID errors NVML reported since the last ``poll()``, for the GPUs that give them.

    One NVML event set, registered for XID critical errors on every whole GPU that
    supports them (a GPU that does not is skipped, its reason logged once), made
    again after NVML restarted (its handles are stale then) or after a wait failed.
    NVML queues events while nobody waits, so a poll each cycle with ``timeout_ms``
    0 misses none. Never raises; ``error`` says why the last poll fell short.
    Blocking: call it in a thread, the one that uses ``nvml`` for the host reads.
    """

    def __init__(self, nvml: Nvml, timeout_ms: int = 0, limit: int = 1000,
                 log: logging.Logger | None = None):
        self.nvml = nvml
        self.timeout_ms = timeout_ms
        self.limit = limit  # events read per poll at most: a storm must not hold a cycle up
        self.log = log or logging.getLogger(__name__)
        self.watched: dict[str, int] = {}  # UUID -> GPU index, XIDs registered for
        self.skipped: dict[str, str] = {}  # UUID (or "GPU <index>") -> why not watched
        self.error: str | None = None
        self._set: Any = None
        self._generation = 0  # the nvml start the set belongs to
        self._uuids: dict[Any, str] = {}  # handle address -> UUID
        self._told: set[tuple[str, str]] = set()

    def poll(self) -> list[XidEvent]:
        """The XID events since the last poll, oldest first; [] when NVML is down."""
        self.error = None
        try:
            self.nvml.start()
        except NvmlError as e:
            self.error = str(e)
            return []
        if self._set is None or self._generation != self.nvml.generation:
            self._watch()
            if self._set is None:
                return []
        xid_type = self.nvml.constant("nvmlEventTypeXidCriticalError", 8)
        events: list[XidEvent] = []
        while len(events) < self.limit:
            try:
                data = self.nvml.call("nvmlEventSetWait", self._set, self.timeout_ms)
            except NvmlError as e:
                if not self.nvml.is_error(e, "NVML_ERROR_TIMEOUT", 10):  # timeout: no more
                    self.error = str(e)
                    self._tell("waiting for XID events failed", str(e))
                    self._free()  # a lost GPU can fail every wait: register anew next time
                break
            if int(data.eventType) & xid_type:
                instance = getattr(data, "gpuInstanceId", None)
                events.append(XidEvent(
                    self._uuid_of(data.device), int(data.eventData),
                    instance if isinstance(instance, int) and instance < 0xFFFFFFFF else None))
        return events

    def close(self) -> None:
        """Free the event set (NVML stays started: it is the caller's)."""
        self._free()

    def _watch(self) -> None:
        self._free()
        self.watched.clear()
        self.skipped.clear()
        self._uuids.clear()
        try:
            event_set = self.nvml.call("nvmlEventSetCreate")
            count = self.nvml.count()
        except NvmlError as e:
            self.error = str(e)
            self._tell("XID errors are not watched", str(e))
            return
        self._set, self._generation = event_set, self.nvml.generation
        xid_type = self.nvml.constant("nvmlEventTypeXidCriticalError", 8)
        for i in range(count):
            name = f"GPU {i}"
            try:
                handle = self.nvml.call("nvmlDeviceGetHandleByIndex", i)
                name = self.nvml.call("nvmlDeviceGetUUID", handle)
                if not self.nvml.call("nvmlDeviceGetSupportedEventTypes", handle) & xid_type:
                    raise NvmlError("it does not report XID errors as events")
                self.nvml.call("nvmlDeviceRegisterEvents", handle, xid_type, event_set)
            except NvmlError as e:
                self.skipped[name] = str(e)
                self._tell(f"XID errors of {name} are not watched", str(e))
                continue
            self.watched[name] = i
            self._uuids[_handle_key(handle)] = name

    def _free(self) -> None:
        event_set, self._set = self._set, None
        # A set of an earlier NVML start went with its shutdown.
        if event_set is not None and self._generation == self.nvml.generation \
                and self.nvml.initialized:
            try:
                self.nvml.call("nvmlEventSetFree", event_set)
            except NvmlError:
                pass

    def _uuid_of(self, device: Any) -> str:
        uuid = self._uuids.get(_handle_key(device))
        if uuid is None:
            try:
                uuid = self.nvml.call("nvmlDeviceGetUUID", device)
            except NvmlError:
                uuid = "unknown"
        return uuid

    def _tell(self, what: str, why: str) -> None:
        if (what, why) not in self._told:  # once: the watchdog polls every few seconds
            self._told.add((what, why))
            self.log.warning("%s: %s", what, why)


def _handle_key(handle: Any) -> Any:
    """What identifies a device handle: pynvml gives a new pointer object each time,
    to the same address; a fake's handles are objects."""
    import ctypes

    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
