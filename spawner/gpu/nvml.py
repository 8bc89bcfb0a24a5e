"""The one NVML layer: every NVML call of the hub and of the GPU monitor goes through here.

Modelled on nvitop's ``api/libnvml.py`` and ``api/device.py``: one wrapper
around the ``pynvml`` module (the nvidia-ml-py binding, or a fake in the
tests) that starts NVML once, decodes the bytes that old bindings return for
text, and turns every failure into an ``NvmlError`` whose text is the reason,
in NVML's own words ("Driver Not Loaded", "GPU is lost"); and one reader,
whose record is ``NvmlDevice``: one per device, a whole GPU or a MIG instance,
with each field asked for read once. A field a device does not give is
``None``, its reason in ``errors``; it never raises. A device that cannot be
read at all is a record too, with its ``state``: ``lost`` (NVML's
GPU_IS_LOST, at its lookup or between two reads) or ``unreadable`` (not
found, not identified), and its ``error``. ``Nvml.walk`` reads every device
of the host (the one MIG walk: instances in place of their GPU), ``Nvml.find``
one device by UUID or number.

Each user asks for the fields it needs and takes its view of the records:

- The GPU monitor (spawner.notebook.monitor.collector): ``readings()``, the
  devices NVIDIA_VISIBLE_DEVICES names, as the metrics API's ``gpu`` and
  ``failedGpu``. It keeps one ``Nvml`` started for its whole life and reads
  every visible device once per tick. When NVML cannot be started, or stops
  answering (the driver unloaded or reloaded: the device count fails),
  ``start()`` fails with the same error, without calling NVML, until
  ``retry_seconds`` have passed; then it tries again.
- The hub (spawner.gpu.inventory): ``devices()`` once when it starts,
  ``free_memory()`` at each pool sync. Each call is one ``session()``: NVML
  started for it and shut down after it, one session at a time in the
  process, since NVML counts its inits and shutdowns. A long-lived hub thus
  never holds the driver open (a driver update can unload it) and never
  reads through handles a driver reload made stale.
- The watchdog (spawner.watchdog) keeps one ``Nvml`` started like the monitor,
  and reads the whole host each cycle: ``host_gpus()`` (every device's record with its
  processes' host PIDs, a lost GPU under the UUIDs of its last good read), which it
  turns into its readings (``GpuSample``, spawner/usage/gpu_readings.py), and
  an ``XidWatcher`` (the XID errors since its last poll, through NVML events).

Cheap to import: the standard library only. ``pynvml`` is imported on the
first ``start()``, so a notebook server without a GPU never loads it.
Blocking: call it in a thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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


# --- the record: one device as NVML answered for it ------------------------------------

OK = "ok"
LOST = "lost"  # NVML_ERROR_GPU_IS_LOST: off the bus, at its lookup or between two reads
UNREADABLE = "unreadable"  # it could not be found or identified (Not Found, Unknown Error, …)

# The fields a user can ask for, each one NVML call per device (named as in ``errors``):
# name, gpu_instance (MIG instances only), memory (total, used and free), utilization,
# temperature, power, power_limit, processes (compute), graphics_processes (added to
# processes, read only when those were), and index (a device found by UUID).
INVENTORY_FIELDS = frozenset({"name", "memory"})
MONITOR_FIELDS = frozenset({"name", "memory", "utilization", "temperature", "power",
                            "power_limit", "processes"})
HOST_FIELDS = frozenset({"name", "gpu_instance", "memory", "utilization", "processes",
                         "graphics_processes"})


class HostProcess(NamedTuple):
    """A process with a context on a device, as NVML lists it."""

    pid: int  # on the host: /proc/PID/cgroup names its container
    used_memory: int | None  # bytes; None where NVML does not know it (MIG, WDDM)


@dataclass(slots=True)
class NvmlDevice:
    """One device: a whole GPU, or a MIG instance when MIG is on (nvitop's ``Device``).

    A field not asked for, or that NVML would not give, is None; the reason of each
    that failed is in ``errors`` (field -> reason, in the order read). ``state`` says
    whether the device could be read; ``error`` why not, in NVML's words.
    """

    uuid: str  # "GPU-…" or "MIG-…"; never identified: as asked for, or "unknown:<index>"
    index: int  # the GPU's index on the host (its parent's for a MIG instance); -1 unknown
    mig: int | None = None  # the MIG slot on that GPU; None for a whole GPU
    parent: str | None = None  # the GPU's UUID, for a MIG instance
    state: str = OK  # OK, LOST or UNREADABLE
    error: str | None = None  # why it is not OK
    errors: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    gpu_instance: int | None = None  # a MIG instance's GPU instance id, as XID events name it
    memory_total: int | None = None  # bytes
    memory_used: int | None = None  # bytes
    memory_free: int | None = None  # bytes
    utilization: float | None = None  # 0 to 1
    temperature: int | None = None  # °C
    power_draw: float | None = None  # W
    power_limit: float | None = None  # W
    # The compute processes, then the graphics ones when asked for (a PID can be in
    # both); None: NVML would not list them.
    processes: list[HostProcess] | None = None

    @property
    def answered(self) -> bool:
        """Whether NVML answered for it at all: not when it could not be found or
        identified; a GPU lost between two reads did, up to then."""
        return self.state == OK or bool(self.errors)


# --- the users' views of the records -----------------------------------------------------


class ProcessSummary(TypedDict):
    """The compute processes on a device, all users' together: no host PIDs."""

    count: int
    used_memory: int | None  # bytes; None where NVML does not know it (MIG, WDDM)


class GpuReading(TypedDict):
    """The monitor's view (docs/gpu-metrics.schema.json: $defs gpu): a device NVML
    answered for; a field it would not give is None, its reason in errors."""

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
    """The monitor's view ($defs failedGpu) of a device that could not be read at all:
    lost, or not found."""

    index: int
    uuid: str  # the name it was asked for by
    errors: dict[str, str]
    error: str


class Device(NamedTuple):
    """The inventory's view: a device found by ``Nvml.devices``."""

    index: str  # "0", or "0:1" for MIG instance 1 on GPU 0
    uuid: str
    name: str | None  # None: NVML would not say
    memory: int | None  # total bytes; None: NVML would not say
    parent: str | None = None  # the GPU's UUID, for a MIG instance


class HostScan(NamedTuple):
    """The watchdog's view: one read of the host, every device's record with each
    process on it once (spawner/watchdog turns each into its reading, a ``GpuSample``);
    ``error`` says why there is none (NVML down), gpus then []."""

    gpus: list[NvmlDevice]
    error: str | None = None


class XidEvent(NamedTuple):
    """An XID error NVML reported for a GPU."""

    uuid: str  # the whole GPU's, also when MIG is on
    xid: int  # e.g. 79: the GPU has fallen off the bus
    gpu_instance: int | None = None  # the MIG GPU instance id (NvmlDevice's), when named


class Nvml:
    """A ``pynvml`` module (imported when first needed), started once, failing as reasons."""

    _sessions = threading.Lock()  # NVML counts inits and shutdowns: one session at a time

    def __init__(self, module: ModuleType | Any = None, retry_seconds: float = 0.0):
        self._module = module  # pynvml, or a fake with its names; None: import pynvml
        self.retry_seconds = retry_seconds
        self.initialized = False
        # Counts the starts: handles and event sets of an earlier start are stale.
        self.generation = 0
        self._last: dict[int, list[NvmlDevice]] = {}  # host_gpus: the last good records per GPU
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
        try:  # the module once imported, without the property: this is called often
            module = self._module if self._module is not None else self.module
            value = getattr(module, function)(*args)
        except Exception as e:  # NVMLError_NotSupported, _GpuIsLost, a missing function, …
            raise NvmlError(reason(e)) from e
        return value.decode() if isinstance(value, bytes) else value

    def query(self, function: str, *args: Any, errors: dict[str, str] | None = None,
              field: str = "") -> Any:
        """``call()``, but a failure is None, its reason noted in ``errors[field]``."""
        try:  # as call(), making no NvmlError: the walk's NotSupported (no MIG) is common
            module = self._module if self._module is not None else self.module
            value = getattr(module, function)(*args)
        except Exception as e:
            if errors is not None:
                errors[field] = reason(e)
            return None
        return value.decode() if isinstance(value, bytes) else value

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

    # --- the reader: one record per device -------------------------------------------

    def walk(self, fields: Collection[str]) -> list[list[NvmlDevice]]:
        """Every GPU NVML sees, by index, each as its records: the GPU's own, or its MIG
        instances' when MIG is on (none when it has none). A GPU that cannot be read
        (lost, or an instance that cannot be identified) is one record that did not
        answer, ``unknown:<index>``: one lost GPU does not take the others out. Raises
        NvmlError only when NVML cannot count the GPUs (see count())."""
        gpus: list[list[NvmlDevice]] = []
        for i in range(self.count()):
            try:
                gpus.append(self._gpu(i, fields))
            except NvmlError as e:
                gpus.append([self._failed(f"unknown:{i}", i, e)])
        return gpus

    def _gpu(self, i: int, fields: Collection[str]) -> list[NvmlDevice]:
        """GPU ``i``'s records; raises NvmlError when the GPU cannot be read."""
        handle = self.call("nvmlDeviceGetHandleByIndex", i)
        uuid = self.call("nvmlDeviceGetUUID", handle)  # a GPU off the bus fails here first
        mode = self.query("nvmlDeviceGetMigMode", handle)  # NotSupported without MIG
        if mode is None or mode[0] != self.constant("NVML_DEVICE_MIG_ENABLE", 1):
            return [self._read(handle, uuid, i, fields)]
        records = []
        for j in range(self.call("nvmlDeviceGetMaxMigDeviceCount", handle)):
            mig = self.query("nvmlDeviceGetMigDeviceHandleByIndex", handle, j)
            if mig is not None:  # None: NotFound, this slot holds no instance
                mig_uuid = self.call("nvmlDeviceGetUUID", mig)
                records.append(self._read(mig, mig_uuid, i, fields, j, uuid))
        return records

    def find(self, ident: str | int, fields: Collection[str]) -> NvmlDevice:
        """One device by UUID (a GPU's or a MIG instance's) or by number (an int); one
        that cannot be found or identified is a record that did not answer, under
        ``ident``. With "index" in ``fields``, a device found by UUID says its GPU's."""
        number = ident if isinstance(ident, int) else None
        try:
            handle = self.call("nvmlDeviceGetHandleByIndex", number) if number is not None \
                else self.call("nvmlDeviceGetHandleByUUID", ident)
            uuid = self.call("nvmlDeviceGetUUID", handle)  # a GPU off the bus fails here first
        except NvmlError as e:
            return self._failed(str(ident), -1 if number is None else number, e)
        if number is None and "index" in fields:
            found = self.query("nvmlDeviceGetIndex", handle)  # a MIG instance has none
            number = found if isinstance(found, int) else None
        return self._read(handle, uuid, -1 if number is None else number, fields)

    def _failed(self, uuid: str, index: int, error: NvmlError) -> NvmlDevice:
        state = LOST if self.is_error(error, "NVML_ERROR_GPU_IS_LOST", 15) else UNREADABLE
        return NvmlDevice(uuid, index, state=state, error=str(error))

    def _read(self, handle: Any, uuid: str, index: int, fields: Collection[str],
              mig: int | None = None, parent: str | None = None) -> NvmlDevice:
        """The ``fields`` of one device, each read once; a failure is None, noted."""
        device = NvmlDevice(uuid, index, mig, parent)
        errors, call = device.errors, self.call

        def get(key: str, function: str, *args: Any) -> Any:
            try:
                return call(function, handle, *args)
            except NvmlError as e:
                errors[key] = str(e)
                if device.state == OK and self.is_error(e, "NVML_ERROR_GPU_IS_LOST", 15):
                    device.state, device.error = LOST, str(e)  # off the bus between two reads
                return None

        if "name" in fields:
            device.name = get("name", "nvmlDeviceGetName")
        if "gpu_instance" in fields and mig is not None:
            device.gpu_instance = get("gpu_instance", "nvmlDeviceGetGpuInstanceId")
        if "memory" in fields:
            memory = get("memory", "nvmlDeviceGetMemoryInfo")
            if memory is not None:
                device.memory_total, device.memory_used, device.memory_free = (
                    int(memory.total), int(memory.used), int(memory.free))
        if "utilization" in fields:  # not for MIG instances
            rates = get("utilization", "nvmlDeviceGetUtilizationRates")
            device.utilization = rates.gpu / 100 if rates is not None else None
        if "temperature" in fields:
            device.temperature = get("temperature", "nvmlDeviceGetTemperature",
                                     self.constant("NVML_TEMPERATURE_GPU", 0))
        if "power" in fields:
            power = get("power", "nvmlDeviceGetPowerUsage")
            device.power_draw = power / 1000 if power is not None else None  # mW -> W
        if "power_limit" in fields:
            limit = get("power_limit", "nvmlDeviceGetEnforcedPowerLimit")
            device.power_limit = limit / 1000 if limit is not None else None
        if "processes" in fields:
            compute = get("processes", "nvmlDeviceGetComputeRunningProcesses")
            # No compute list at all: the graphics list alone would undercount.
            if compute is not None:
                # Graphics contexts are rare in notebooks but hold memory all the same;
                # datacenter GPUs answer NotSupported.
                graphics = get("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses") \
                    if "graphics_processes" in fields else None
                device.processes = [_process(p) for p in (*compute, *(graphics or ()))]
        return device

    # --- the hub's view: the inventory and free memory --------------------------------

    def devices(self) -> tuple[list[Device], list[tuple[int, str]]]:
        """Every device NVML sees, with MIG instances in place of their GPU when MIG is
        on; and (GPU index, reason) for each GPU left out because it failed."""
        found: list[Device] = []
        skipped: list[tuple[int, str]] = []
        for records in self.walk(INVENTORY_FIELDS):
            for d in records:
                if not d.answered:
                    skipped.append((d.index, d.error or ""))
                    continue
                index = str(d.index) if d.mig is None else f"{d.index}:{d.mig}"
                found.append(Device(index, d.uuid, d.name, d.memory_total, d.parent))
        return found, skipped

    def free_memory(self, uuids: Iterable[str]) -> dict[str, int]:
        """Free bytes per UUID, for the devices NVML can read."""
        result: dict[str, int] = {}
        for uuid in uuids:
            free = self.find(uuid, ("memory",)).memory_free
            if free is not None:
                result[uuid] = free
        return result

    # --- the monitor's view: one reading of each visible device ---------------------

    def readings(self, visible: list[str] | None) -> list[GpuReading | FailedGpu]:
        """A reading of each device in ``visible`` (UUIDs or numbers, as in
        NVIDIA_VISIBLE_DEVICES; None: all, by number). A device that cannot be found or
        read gets its own error, so one lost GPU does not hide the others; raises
        NvmlError only when NVML cannot count the GPUs."""
        idents: list[str | int] = list(range(self.count())) if visible is None else [
            int(v) if v.isdigit() else v for v in visible]
        return [_reading(i, self.find(ident, MONITOR_FIELDS))
                for i, ident in enumerate(idents)]

    # --- the watchdog's view: every device of the host, with host PIDs ---------------

    def host_gpus(self, expected: Iterable[str] = ()) -> HostScan:
        """Every device NVML sees (MIG instances in place of their GPU when MIG is on),
        with the host PIDs of the processes on it. Starts NVML and keeps it started
        (after a failure, tried again only once retry_seconds passed). Never raises:
        NVML down is ``HostScan([], reason)``; a GPU that cannot be read is in the list
        with its state and ``error``, under the UUIDs it had at its last good read, so its servers
        can be told. ``expected``: UUIDs the caller knows of (from its containers'
        labels) that must not vanish silently: one NVML no longer lists is reported
        lost too. Blocking: call it in a thread."""
        try:
            self.start()
            walked = self.walk(HOST_FIELDS)
        except NvmlError as e:
            return HostScan([], str(e))
        devices: list[NvmlDevice] = []
        for i, records in enumerate(walked):
            if records and not records[0].answered:  # the GPU failed: its one record
                # named as at its last good read, if there was one
                records = [_gone(d, records[0]) for d in self._last.get(i, [])] or records
            else:
                self._last[i] = records
            devices.extend(records)
        listed = {d.uuid for d in devices}
        for uuid in dict.fromkeys(expected):
            if uuid not in listed:
                devices.append(self._unlisted(uuid))
        for d in devices:
            if d.processes is not None:
                d.processes = _each_pid_once(d.processes)
        return HostScan(devices)

    def _unlisted(self, uuid: str) -> NvmlDevice:
        """An expected device that the host's list lacks: lost, unless NVML finds it."""
        device = self.find(uuid, HOST_FIELDS | {"index"})
        if device.answered:
            return device
        known = [d for records in self._last.values() for d in records if d.uuid == uuid]
        return _gone(known[0], device) if known else device


def _process(p: Any) -> HostProcess:
    used = getattr(p, "usedGpuMemory", None)  # pynvml: None when not available
    return HostProcess(int(p.pid), used if isinstance(used, int) else None)


def _reading(position: int, d: NvmlDevice) -> GpuReading | FailedGpu:
    if not d.answered:
        return FailedGpu(index=position, uuid=d.uuid, errors=d.errors, error=d.error or "")
    return GpuReading(
        index=position, uuid=d.uuid, errors=d.errors, name=d.name,
        memory_used=d.memory_used, memory_total=d.memory_total, utilization=d.utilization,
        temperature=d.temperature, power_draw=d.power_draw, power_limit=d.power_limit,
        processes=_summary(d.processes) if d.processes is not None else None,
    )


def _summary(processes: list[HostProcess]) -> ProcessSummary:
    # NVML gives host PIDs, which mean nothing inside the container, and on a
    # shared GPU other users' processes: only how many and how much.
    used = [p.used_memory for p in processes]
    known = all(u is not None for u in used)  # not known under MIG
    return ProcessSummary(count=len(used), used_memory=sum(used) if known else None)


def _each_pid_once(processes: list[HostProcess]) -> list[HostProcess]:
    """A PID can hold a compute and a graphics context: its first, once."""
    seen: dict[int, HostProcess] = {}
    for p in processes:
        seen.setdefault(p.pid, p)
    return list(seen.values())


def _gone(last: NvmlDevice, failure: NvmlDevice) -> NvmlDevice:
    """A device as it was last read, now failing: its names kept, its values unknown."""
    return NvmlDevice(last.uuid, last.index, last.mig, last.parent, failure.state,
                      failure.error, name=last.name, gpu_instance=last.gpu_instance,
                      memory_total=last.memory_total)


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
