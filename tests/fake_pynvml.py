"""A FAKE of the ``pynvml`` module (nvidia-ml-py), for tests on machines without a GPU.

Code that reads GPUs through NVML (spawner/gpu/inventory.py, the GPU monitor)
takes the NVML module as an argument. Tests pass a ``FakeNvml`` instead: it
has the pynvml names that code uses, answers from a list of ``FakeGpu``, and
fails the way real NVML does: no library, no driver, a field that is not
supported, a GPU that fell off the bus. CI machines have no driver, so this
is the only way to test those paths; the device tests check the real thing.

It is a fake, not a simulator: values are whatever the test sets.

    nvml = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b", mig_mode=1, mig=[FakeGpu("MIG-b0")])])
    nvml.fail["nvmlDeviceGetPowerUsage"] = NVMLError_NotSupported   # for every GPU
    FakeNvml(init_error=NVMLError_DriverNotLoaded)                   # a host without a driver
    nvml.gpus[0].lost = True                                         # fell off the bus
    nvml.xid("GPU-a", 79)                                            # an XID event on GPU-a

Events: an XID reaches every event set registered for XID errors on its GPU
(the parent GPU for a MIG instance's UUID). Unlike real NVML, one injected
before any set is registered for that GPU waits for the first such set, so a
test need not race the watcher's start. ``nvmlShutdown`` invalidates the sets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    """As in pynvml: str() is NVML's own text for the error code in ``value``."""

    value = 999
    text = "Unknown Error"

    def __str__(self) -> str:
        return self.text


class NVMLError_Uninitialized(NVMLError):
    value, text = 1, "Uninitialized"


class NVMLError_InvalidArgument(NVMLError):
    value, text = 2, "Invalid Argument"


class NVMLError_NotSupported(NVMLError):
    value, text = 3, "Not Supported"


class NVMLError_NoPermission(NVMLError):
    value, text = 4, "Insufficient Permissions"


class NVMLError_NotFound(NVMLError):
    value, text = 6, "Not Found"


class NVMLError_Timeout(NVMLError):
    value, text = 10, "Timeout"


class NVMLError_DriverNotLoaded(NVMLError):
    value, text = 9, "Driver Not Loaded"


class NVMLError_LibraryNotFound(NVMLError):
    value, text = 12, "NVML Shared Library Not Found"


class NVMLError_GpuIsLost(NVMLError):
    value, text = 15, "GPU is lost"


@dataclass(eq=False)
class FakeGpu:
    """One GPU, or one MIG instance when it sits in another FakeGpu's ``mig``."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory: int = 80 * 2**30  # total bytes
    used: int = 0  # bytes in use
    utilization: int = 0  # % of time a kernel ran
    memory_utilization: int = 0  # % of time memory was read or written
    temperature: int = 35  # °C
    power: int = 70_000  # mW
    power_limit: int = 700_000  # mW
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)  # graphics processes
    mig_mode: int | None = None  # None: no MIG support; 0 off; 1 on
    mig: list[FakeGpu | None] = field(default_factory=list)  # per slot; None: empty slot
    max_mig: int = 7
    fail: dict[str, type[NVMLError]] = field(default_factory=dict)  # function -> error raised
    lost: bool = False  # off the bus: every call on it (and its lookup) says GPU is lost
    events: bool = True  # False: it reports no events (nvmlDeviceGetSupportedEventTypes)


@dataclass(eq=False)
class FakeEventSet:
    """What nvmlEventSetCreate returns: the GPUs registered, the events not yet read."""

    registered: dict[str, int] = field(default_factory=dict)  # GPU UUID -> event types
    queue: list[SimpleNamespace] = field(default_factory=list)
    valid: bool = True  # False once freed, or NVML shut down


class FakeNvml:
    """Module-like: pass an instance where the code takes ``nvml``."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    nvmlEventTypeNone = 0
    nvmlEventTypeSingleBitEccError = 1
    nvmlEventTypeDoubleBitEccError = 2
    nvmlEventTypeXidCriticalError = 8
    NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of an event that names no MIG instance

    def __init__(
        self,
        gpus: Iterable[FakeGpu] = (),
        init_error: type[NVMLError] | None = None,  # nvmlInit raises it (no library, no driver)
        fail: dict[str, type[NVMLError]] | None = None,  # function -> error, for every GPU
        bytes_strings: bool = False,  # old bindings return UUIDs and names as bytes
    ):
        self.gpus = list(gpus)
        self.init_error = init_error
        self.fail = dict(fail or {})
        self.bytes_strings = bytes_strings
        self.initialized = 0  # nvmlInit calls not yet matched by nvmlShutdown
        self.calls: list[str] = []  # every function called, in order
        self.event_sets: list[FakeEventSet] = []  # the valid ones
        self.pending: list[SimpleNamespace] = []  # XIDs no set was registered for yet

    def _enter(self, function: str, gpu: FakeGpu | None = None) -> None:
        self.calls.append(function)
        if self.initialized <= 0:
            raise NVMLError_Uninitialized()
        if gpu is not None and gpu.lost:
            raise NVMLError_GpuIsLost()
        error = (gpu.fail.get(function) if gpu else None) or self.fail.get(function)
        if error is not None:
            raise error()

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.bytes_strings else value

    # --- library ----------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1
        if self.initialized <= 0:
            for event_set in self.event_sets:
                event_set.valid = False
            self.event_sets.clear()

    # --- devices ----------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        if self.gpus[index].lost:
            raise NVMLError_GpuIsLost()
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByUUID")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            for device in (gpu, *(m for m in gpu.mig if m is not None)):
                if device.uuid == uuid:
                    if device.lost or gpu.lost:
                        raise NVMLError_GpuIsLost()
                    return device
        raise NVMLError_NotFound()

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        if handle not in self.gpus:
            raise NVMLError_NotSupported()  # a MIG instance has no index of its own
        return self.gpus.index(handle)

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str | bytes:
        self._enter("nvmlDeviceGetUUID", handle)
        return self._str(handle.uuid)

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str | bytes:
        self._enter("nvmlDeviceGetName", handle)
        return self._str(handle.name)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=handle.memory, used=handle.used,
                               free=handle.memory - handle.used)

    # --- MIG --------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        if handle.mig_mode is None:
            raise NVMLError_NotSupported()
        return handle.mig_mode, handle.mig_mode  # (current, pending)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        if handle.mig_mode is None:
            raise NVMLError_NotSupported()
        return handle.max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not handle.mig_mode or not 0 <= index < handle.max_mig:
            raise NVMLError_InvalidArgument()
        child = handle.mig[index] if index < len(handle.mig) else None
        if child is None:
            raise NVMLError_NotFound()
        return child

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeGpu) -> int:
        """A MIG instance's GPU instance id: here, its slot (as in xid())."""
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        for gpu in self.gpus:
            if handle in gpu.mig:
                return gpu.mig.index(handle)
        raise NVMLError_InvalidArgument()  # a whole GPU has none

    # --- monitoring -------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=handle.utilization, memory=handle.memory_utilization)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument()
        return handle.temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return handle.power

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        return handle.power_limit

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.graphics]

    # --- events -----------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        if not handle.events:
            raise NVMLError_NotSupported()
        return (self.nvmlEventTypeSingleBitEccError | self.nvmlEventTypeDoubleBitEccError
                | self.nvmlEventTypeXidCriticalError)

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, types: int,
                                 event_set: FakeEventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        if not handle.events:
            raise NVMLError_NotSupported()
        if not event_set.valid:
            raise NVMLError_InvalidArgument()
        event_set.registered[handle.uuid] = event_set.registered.get(handle.uuid, 0) | types
        self._deliver()

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> SimpleNamespace:
        """The oldest event not read; Timeout at once when there is none (no waiting)."""
        self._enter("nvmlEventSetWait")
        if not event_set.valid:
            raise NVMLError_InvalidArgument()
        if not event_set.queue:
            raise NVMLError_Timeout()
        return event_set.queue.pop(0)

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        if not event_set.valid:
            raise NVMLError_InvalidArgument()
        event_set.valid = False
        self.event_sets.remove(event_set)

    # --- what tests do to it ------------------------------------------------

    def xid(self, uuid: str, code: int, ident: str | None = None) -> None:
        """An XID error on the device ``uuid`` (a GPU, or a MIG instance: its GPU's
        event, naming the instance's GPU instance id, its slot). ``ident`` rides along
        as ``event.fake_id``."""
        for gpu in self.gpus:
            slots = {m.uuid: j for j, m in enumerate(gpu.mig) if m is not None}
            if uuid == gpu.uuid or uuid in slots:
                break
        else:
            raise ValueError(f"no fake GPU {uuid}")
        self.pending.append(SimpleNamespace(
            device=gpu, eventType=self.nvmlEventTypeXidCriticalError, eventData=code,
            gpuInstanceId=slots.get(uuid, self.NO_INSTANCE), computeInstanceId=self.NO_INSTANCE,
            fake_id=ident))
        self._deliver()

    def _deliver(self) -> None:
        waiting = []
        for event in self.pending:
            sets = [s for s in self.event_sets
                    if s.registered.get(event.device.uuid, 0) & event.eventType]
            for event_set in sets:
                event_set.queue.append(event)
            if not sets:
                waiting.append(event)
        self.pending = waiting
