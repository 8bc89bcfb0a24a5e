"""The one NVML layer (spawner/gpu/nvml.py), on the fake pynvml: starting once, failures as
reasons, the retry delay, decoded text, lost GPUs, unsupported fields and MIG."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import spawner
from fake_pynvml import (
    FakeGpu,
    FakeNvml,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
)
from spawner.gpu.nvml import (
    HOST_FIELDS,
    INVENTORY_FIELDS,
    LOST,
    MONITOR_FIELDS,
    NOT_INSTALLED,
    OK,
    UNREADABLE,
    Device,
    HostProcess,
    Nvml,
    NvmlDevice,
    NvmlError,
    NvmlNotInstalled,
    NvmlUnavailable,
    reason,
)

G = 2**30


def started(*gpus: FakeGpu, **fake) -> tuple[Nvml, FakeNvml]:
    nvml = FakeNvml(gpus, **fake)
    lib = Nvml(nvml)
    lib.start()
    return lib, nvml


# --- starting and stopping ----------------------------------------------------------


def test_starts_once_and_stops_once():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    lib = Nvml(nvml)
    assert nvml.calls == []  # nothing before the first start
    lib.start()
    lib.start()
    assert lib.initialized and nvml.calls == ["nvmlInit"] and nvml.initialized == 1
    lib.stop()
    lib.stop()
    assert not lib.initialized and nvml.calls == ["nvmlInit", "nvmlShutdown"]
    assert nvml.initialized == 0
    lib.start()  # started again after a stop
    assert nvml.initialized == 1


def test_concurrent_starts_start_once():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    lib = Nvml(nvml)
    barrier = threading.Barrier(16)

    def start():
        barrier.wait()
        lib.start()

    threads = [threading.Thread(target=start) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert nvml.calls.count("nvmlInit") == 1 and nvml.initialized == 1


def test_a_failing_shutdown_is_ignored():
    lib, nvml = started(FakeGpu("GPU-a"), fail={"nvmlShutdown": NVMLError_GpuIsLost})
    lib.stop()
    assert not lib.initialized and nvml.calls[-1] == "nvmlShutdown"


@pytest.mark.parametrize("error, text", [
    (NVMLError_LibraryNotFound, "NVML Shared Library Not Found"),
    (NVMLError_DriverNotLoaded, "Driver Not Loaded"),
])
def test_init_failure_is_unavailable_with_nvmls_reason(error, text):
    nvml = FakeNvml([FakeGpu("GPU-a")], init_error=error)
    lib = Nvml(nvml)
    with pytest.raises(NvmlUnavailable) as info:
        lib.start()
    assert str(info.value) == text and not isinstance(info.value, NvmlNotInstalled)
    assert isinstance(info.value.__cause__, error)
    lib.stop()
    assert nvml.calls == ["nvmlInit"]  # no shutdown without an init
    assert not lib.initialized


def test_binding_not_installed_is_imported_lazily(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    lib = Nvml()  # nothing imported yet
    with pytest.raises(NvmlNotInstalled) as info:
        lib.start()
    assert str(info.value) == NOT_INSTALLED == "the NVML binding (nvidia-ml-py) is not installed"
    assert isinstance(info.value, NvmlUnavailable)


def test_retry_delay_after_a_failed_start():
    nvml = FakeNvml([FakeGpu("GPU-a")], init_error=NVMLError_DriverNotLoaded)
    lib = Nvml(nvml, retry_seconds=0.3)
    for _ in range(3):
        with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
            lib.start()
    assert nvml.calls.count("nvmlInit") == 1  # not again before retry_seconds
    nvml.init_error = None  # the driver came back
    with pytest.raises(NvmlUnavailable):
        lib.start()  # still within the delay
    time.sleep(0.35)
    lib.start()
    assert lib.initialized and nvml.calls.count("nvmlInit") == 2


def test_no_retry_delay_by_default():
    nvml = FakeNvml([FakeGpu("GPU-a")], init_error=NVMLError_DriverNotLoaded)
    lib = Nvml(nvml)
    for _ in range(3):
        with pytest.raises(NvmlUnavailable):
            lib.start()
    assert nvml.calls.count("nvmlInit") == 3


def test_losing_the_gpu_count_stops_nvml_until_the_retry():
    lib, nvml = started(FakeGpu("GPU-a"), fail={"nvmlDeviceGetCount": NVMLError_DriverNotLoaded})
    lib.retry_seconds = 0.3
    with pytest.raises(NvmlError, match="Driver Not Loaded") as info:
        lib.count()
    assert not isinstance(info.value, NvmlUnavailable)  # it started, then stopped answering
    assert not lib.initialized and nvml.initialized == 0
    with pytest.raises(NvmlError) as again:
        lib.start()  # the same error, without calling NVML
    assert again.value is info.value and nvml.calls.count("nvmlInit") == 1
    del nvml.fail["nvmlDeviceGetCount"]
    time.sleep(0.35)
    lib.start()
    assert lib.count() == 1 and nvml.calls.count("nvmlInit") == 2


def test_sessions_pair_init_and_shutdown_one_at_a_time():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    seen = []

    def session():
        with Nvml(nvml).session() as lib:
            seen.append(nvml.initialized)
            time.sleep(0.01)
            assert lib.count() == 1

    threads = [threading.Thread(target=session) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1] * 8  # never two sessions at once
    assert nvml.calls.count("nvmlInit") == nvml.calls.count("nvmlShutdown") == 8
    assert nvml.initialized == 0


def test_a_session_that_cannot_start_raises_and_shuts_nothing_down():
    nvml = FakeNvml(init_error=NVMLError_DriverNotLoaded)
    with pytest.raises(NvmlUnavailable), Nvml(nvml).session():
        pytest.fail("the block runs only with NVML started")
    assert nvml.calls == ["nvmlInit"]


def test_a_session_shuts_down_after_an_error():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    with pytest.raises(ValueError), Nvml(nvml).session():
        raise ValueError("a bug in the block")
    assert nvml.calls[-1] == "nvmlShutdown" and nvml.initialized == 0


# --- calls ------------------------------------------------------------------------------


@pytest.mark.parametrize("bytes_strings", [False, True])
def test_text_is_decoded(bytes_strings):
    lib, _ = started(FakeGpu("GPU-a", name="Tesla T4"), bytes_strings=bytes_strings)
    handle = lib.call("nvmlDeviceGetHandleByIndex", 0)
    assert lib.call("nvmlDeviceGetUUID", handle) == "GPU-a"
    assert lib.call("nvmlDeviceGetName", handle) == "Tesla T4"


def test_every_failure_of_a_call_is_an_nvml_error_with_a_reason():
    lib, _ = started(FakeGpu("GPU-a", fail={"nvmlDeviceGetPowerUsage": NVMLError_NotSupported}))
    handle = lib.call("nvmlDeviceGetHandleByIndex", 0)
    with pytest.raises(NvmlError, match="^Not Supported$"):
        lib.call("nvmlDeviceGetPowerUsage", handle)
    with pytest.raises(NvmlError, match="^Not Found$"):
        lib.call("nvmlDeviceGetHandleByUUID", "GPU-gone")
    with pytest.raises(NvmlError, match="nvmlDeviceGetNothing"):  # an older binding
        lib.call("nvmlDeviceGetNothing", handle)
    errors: dict[str, str] = {}
    assert lib.query("nvmlDeviceGetPowerUsage", handle, errors=errors, field="power") is None
    assert lib.query("nvmlDeviceGetPowerUsage", handle) is None  # nowhere to note it
    assert lib.query("nvmlDeviceGetEnforcedPowerLimit", handle, errors=errors) == 700_000
    assert errors == {"power": "Not Supported"}


def test_reason_is_the_errors_text_or_its_type():
    assert reason(NVMLError_GpuIsLost()) == "GPU is lost"
    assert reason(RuntimeError()) == "RuntimeError"


# --- the one reader: a record per device ---------------------------------------------


def test_one_walk_gives_a_record_per_device_mig_included_lost_gpus_as_states():
    gpus = [FakeGpu("GPU-a", memory=80 * G, used=30 * G, utilization=57,
                    processes=[(4242, 20 * G)], graphics=[(4242, 20 * G), (4243, G)]),
            FakeGpu("GPU-b", mig_mode=1, mig=[
                FakeGpu("MIG-b0", memory=10 * G, used=G, processes=[(99, None)],
                        fail={"nvmlDeviceGetUtilizationRates": NVMLError_NotSupported}),
                None,
                FakeGpu("MIG-b2", fail={"nvmlDeviceGetMemoryInfo": NVMLError_GpuIsLost})]),
            FakeGpu("GPU-c", lost=True),  # off the bus: its lookup fails
            FakeGpu("GPU-d", fail={"nvmlDeviceGetUUID": NVMLError})]  # Unknown Error
    lib, nvml = started(*gpus)
    a, b, c, d = lib.walk(HOST_FIELDS)
    assert a == [NvmlDevice(
        "GPU-a", 0, name="NVIDIA H100 80GB HBM3", memory_total=80 * G, memory_used=30 * G,
        memory_free=50 * G, utilization=0.57,
        processes=[HostProcess(4242, 20 * G), HostProcess(4242, 20 * G), HostProcess(4243, G)])]
    b0, b2 = b
    assert (b0.uuid, b0.index, b0.mig, b0.parent, b0.gpu_instance) == ("MIG-b0", 1, 0, "GPU-b", 0)
    assert (b0.state, b0.error, b0.errors) == (OK, None, {"utilization": "Not Supported"})
    assert b0.memory_total == 10 * G and b0.processes == [HostProcess(99, None)]
    # lost between two reads: what was read up to then stays
    assert (b2.uuid, b2.mig, b2.state, b2.error) == ("MIG-b2", 2, LOST, "GPU is lost")
    assert b2.errors == {"memory": "GPU is lost"} and b2.name == "NVIDIA H100 80GB HBM3"
    assert b2.answered
    assert c == [NvmlDevice("unknown:2", 2, state=LOST, error="GPU is lost")]
    assert d == [NvmlDevice("unknown:3", 3, state=UNREADABLE, error="Unknown Error")]
    assert not c[0].answered and not d[0].answered
    calls = Counter(nvml.calls)
    assert calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 7  # GPU-b's slots, each once
    assert calls["nvmlDeviceGetName"] == 3  # GPU-a, MIG-b0 and MIG-b2, each once


def test_a_record_holds_the_fields_asked_for_each_read_once():
    lib, nvml = started(FakeGpu("GPU-a", used=G, temperature=61, power=123_456,
                                processes=[(7, G)]))
    [[device]] = lib.walk(INVENTORY_FIELDS)
    assert (device.name, device.memory_total, device.memory_used) == (
        "NVIDIA H100 80GB HBM3", 80 * G, G)
    assert (device.utilization, device.temperature, device.processes) == (None, None, None)
    nvml.calls.clear()
    [[device]] = lib.walk(MONITOR_FIELDS)
    assert (device.temperature, device.power_draw, device.power_limit) == (61, 123.456, 700.0)
    assert device.processes == [HostProcess(7, G)]  # compute only: graphics not asked for
    assert set(Counter(nvml.calls).values()) == {1}
    assert "nvmlDeviceGetGraphicsRunningProcesses" not in nvml.calls


def test_find_reads_one_device_by_uuid_or_number():
    gpus = [FakeGpu("GPU-a"), FakeGpu("GPU-b", lost=True),
            FakeGpu("GPU-c", mig_mode=1, mig=[FakeGpu("MIG-c0", memory=10 * G)])]
    lib, _ = started(*gpus)
    mig = lib.find("MIG-c0", {"memory", "index"})
    assert (mig.uuid, mig.memory_total, mig.state) == ("MIG-c0", 10 * G, OK)
    assert mig.index == -1  # a MIG instance has no index of its own
    assert lib.find("GPU-a", {"index"}).index == 0 and lib.find(0, ()).uuid == "GPU-a"
    assert lib.find("GPU-a", ()).index == -1  # not asked for
    assert lib.find(1, ()) == NvmlDevice("1", 1, state=LOST, error="GPU is lost")
    assert lib.find("GPU-b", ()) == NvmlDevice("GPU-b", -1, state=LOST, error="GPU is lost")
    assert lib.find("GPU-gone", ()) == NvmlDevice("GPU-gone", -1, state=UNREADABLE,
                                                  error="Not Found")
    assert lib.find(7, ()).error == "Invalid Argument"


def test_only_the_nvml_layer_calls_nvml_and_it_walks_and_reads_devices_once():
    package = Path(spawner.__file__).parent
    layer = package / "gpu" / "nvml.py"
    nvml_names = re.compile(r"\bpynvml\b|\bnvml[A-Z]\w*")
    others = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
              if path != layer and nvml_names.search(path.read_text())]
    assert others == []
    source = layer.read_text()
    assert source.count('"nvmlDeviceGetMigDeviceHandleByIndex"') == 1  # one MIG walk
    assert source.count('"nvmlDeviceGetMemoryInfo"') == 1  # one device read
    assert source.count('"nvmlDeviceGetComputeRunningProcesses"') == 1


# --- the hub's reads ---------------------------------------------------------------------


def test_devices_with_mig_instances_in_place_of_their_gpu():
    gpus = [FakeGpu("GPU-a", "NVIDIA H100 80GB HBM3", 80 * G, mig_mode=0),
            FakeGpu("GPU-b", "NVIDIA A100-SXM4-40GB", 40 * G, mig_mode=1,
                    mig=[FakeGpu("MIG-b0", "3g.20gb", 20 * G), None,
                         FakeGpu("MIG-b2", "1g.5gb", 5 * G)]),
            FakeGpu("GPU-c", mig_mode=1)]  # MIG on, no instances: nothing
    lib, _ = started(*gpus)
    assert lib.devices() == ([
        Device("0", "GPU-a", "NVIDIA H100 80GB HBM3", 80 * G),
        Device("1:0", "MIG-b0", "3g.20gb", 20 * G, "GPU-b"),
        Device("1:2", "MIG-b2", "1g.5gb", 5 * G, "GPU-b"),
    ], [])


def test_devices_skip_a_lost_gpu_and_leave_unsupported_fields_unknown():
    gpus = [FakeGpu("GPU-a", fail={"nvmlDeviceGetUUID": NVMLError_GpuIsLost}),
            FakeGpu("GPU-b", memory=40 * G, fail={"nvmlDeviceGetName": NVMLError_NotSupported,
                                                  "nvmlDeviceGetMemoryInfo": NVMLError_NoPermission}),
            FakeGpu("GPU-c", mig_mode=1, mig=[FakeGpu("MIG-c0", fail={
                "nvmlDeviceGetUUID": NVMLError_GpuIsLost})])]
    lib, _ = started(*gpus)
    assert lib.devices() == ([Device("1", "GPU-b", None, None)],
                             [(0, "GPU is lost"), (2, "GPU is lost")])


def test_free_memory_of_the_devices_nvml_can_read():
    gpus = [FakeGpu("GPU-a", memory=80 * G, used=30 * G),
            FakeGpu("GPU-b", mig_mode=1, mig=[FakeGpu("MIG-b0", memory=20 * G, used=5 * G)],
                    fail={"nvmlDeviceGetMemoryInfo": NVMLError_GpuIsLost})]
    lib, _ = started(*gpus)
    assert lib.free_memory(["GPU-a", "MIG-b0", "GPU-b", "GPU-missing"]) == {
        "GPU-a": 50 * G, "MIG-b0": 15 * G}


# --- the monitor's reading ------------------------------------------------------------


def test_a_full_reading_in_the_apis_units_and_order():
    gpu = FakeGpu("GPU-a", name="NVIDIA A100", memory=40 * G, used=3 * G, utilization=45,
                  temperature=61, power=123_456, power_limit=300_000,
                  processes=[(4242, 2**20), (4343, 2**21)])
    lib, _ = started(gpu)
    [reading] = lib.readings(["GPU-a"])
    assert list(reading) == ["index", "uuid", "errors", "name", "memory_used", "memory_total",
                             "utilization", "temperature", "power_draw", "power_limit",
                             "processes"]  # the order the API's JSON has
    assert reading == {
        "index": 0, "uuid": "GPU-a", "errors": {}, "name": "NVIDIA A100",
        "memory_used": 3 * G, "memory_total": 40 * G, "utilization": 0.45, "temperature": 61,
        "power_draw": 123.456, "power_limit": 300.0,
        "processes": {"count": 2, "used_memory": 3 * 2**20},
    }


def test_unsupported_fields_are_none_with_their_reason():
    names = {"name": "nvmlDeviceGetName", "memory": "nvmlDeviceGetMemoryInfo",
             "utilization": "nvmlDeviceGetUtilizationRates",
             "temperature": "nvmlDeviceGetTemperature", "power": "nvmlDeviceGetPowerUsage",
             "power_limit": "nvmlDeviceGetEnforcedPowerLimit",
             "processes": "nvmlDeviceGetComputeRunningProcesses"}
    lib, _ = started(FakeGpu("GPU-a"), fail=dict.fromkeys(names.values(), NVMLError_NotSupported))
    [reading] = lib.readings(None)
    assert reading["errors"] == dict.fromkeys(names, "Not Supported")
    assert list(reading["errors"]) == list(names)  # in the order read
    for field in ("name", "memory_used", "memory_total", "utilization", "temperature",
                  "power_draw", "power_limit", "processes"):
        assert reading[field] is None, field
    assert "error" not in reading


def test_a_lost_gpu_gets_its_own_error_and_the_others_are_read():
    gpus = [FakeGpu("GPU-a", utilization=30),
            FakeGpu("GPU-b", fail={"nvmlDeviceGetUUID": NVMLError_GpuIsLost})]
    lib, _ = started(*gpus)
    a, b, gone, out_of_range = lib.readings(["GPU-a", "1", "GPU-gone", "7"])
    assert a["utilization"] == 0.3
    assert b == {"index": 1, "uuid": "1", "errors": {}, "error": "GPU is lost"}
    assert gone == {"index": 2, "uuid": "GPU-gone", "errors": {}, "error": "Not Found"}
    assert out_of_range["error"] == "Invalid Argument"
    assert [g["uuid"] for g in lib.readings(None)] == ["GPU-a", "1"]  # all: by number


def test_a_mig_instance_reading_has_no_process_memory():
    parent = FakeGpu("GPU-p", mig_mode=1, mig=[FakeGpu("MIG-p0", memory=10 * G, used=G,
                                                       processes=[(1, None)])])
    lib, _ = started(parent)
    [reading] = lib.readings(["MIG-p0"])
    assert (reading["uuid"], reading["memory_total"], reading["memory_used"]) == (
        "MIG-p0", 10 * G, G)
    assert reading["processes"] == {"count": 1, "used_memory": None}
