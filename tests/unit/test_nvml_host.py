"""The watchdog's reads of the host through the one NVML layer (spawner/gpu/nvml.py), on
the FAKE pynvml: every device with the host PIDs on it, lost GPUs kept with their reason,
MIG, unsupported fields, NVML down and its retry delay, XID errors through NVML events;
and the container fake (tests/fake_nvml_container) that the watchdog process imports."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from fake_pynvml import (
    FakeGpu,
    FakeNvml,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_NotSupported,
)
from harness import install_fake_nvml, write_fake_nvml_state
from spawner.gpu.nvml import HostProcess, HostScan, Nvml, NvmlDevice, XidEvent, XidWatcher

G = 2**30
ROOT = Path(__file__).resolve().parents[2]


def by_uuid(scan: HostScan) -> dict[str, NvmlDevice]:
    assert scan.error is None
    return {gpu.uuid: gpu for gpu in scan.gpus}


# --- the devices, with host PIDs ----------------------------------------------------


def test_every_gpu_with_its_host_pids_and_memory():
    nvml = FakeNvml([
        FakeGpu("GPU-a", memory=80 * G, used=30 * G, utilization=57,
                processes=[(4242, 20 * G), (4343, 10 * G)]),
        FakeGpu("GPU-b", name="NVIDIA A100", memory=40 * G),
    ])
    scan = Nvml(nvml).host_gpus()
    a, b = scan.gpus
    assert a == NvmlDevice(uuid="GPU-a", index=0, mig=None, parent=None, gpu_instance=None,
                           name="NVIDIA H100 80GB HBM3", memory_used=30 * G,
                           memory_total=80 * G, memory_free=50 * G, utilization=0.57,
                           processes=[HostProcess(4242, 20 * G), HostProcess(4343, 10 * G)],
                           errors={}, error=None)
    assert b.index == 1 and b.name == "NVIDIA A100" and b.processes == []
    assert b.error is None and b.utilization == 0.0


def test_nvml_stays_started_across_reads():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    lib = Nvml(nvml)
    for _ in range(3):
        lib.host_gpus()
    assert nvml.calls.count("nvmlInit") == 1 and "nvmlShutdown" not in nvml.calls
    assert lib.initialized


def test_graphics_processes_count_once_per_pid():
    nvml = FakeNvml([FakeGpu("GPU-a", processes=[(10, 2 * G)],
                             graphics=[(10, 2 * G), (11, G)])])
    (gpu,) = Nvml(nvml).host_gpus().gpus
    assert gpu.processes == [HostProcess(10, 2 * G), HostProcess(11, G)]


def test_graphics_not_supported_still_lists_compute_processes():
    nvml = FakeNvml([FakeGpu("GPU-a", processes=[(10, G)])],
                    fail={"nvmlDeviceGetGraphicsRunningProcesses": NVMLError_NotSupported})
    (gpu,) = Nvml(nvml).host_gpus().gpus
    assert gpu.processes == [HostProcess(10, G)]
    assert gpu.errors == {"graphics_processes": "Not Supported"} and gpu.error is None


def test_unsupported_fields_are_none_with_their_reason():
    nvml = FakeNvml([FakeGpu("GPU-a", used=G, processes=[(10, G)])], fail={
        "nvmlDeviceGetUtilizationRates": NVMLError_NotSupported,
        "nvmlDeviceGetComputeRunningProcesses": NVMLError_NotSupported,
        "nvmlDeviceGetName": NVMLError,
    })
    (gpu,) = Nvml(nvml).host_gpus().gpus
    assert gpu.utilization is None and gpu.processes is None and gpu.name is None
    assert gpu.memory_used == G and gpu.error is None
    assert gpu.errors == {"utilization": "Not Supported", "processes": "Not Supported",
                          "name": "Unknown Error"}
    # No process list at all: the graphics list alone would undercount.
    assert "nvmlDeviceGetGraphicsRunningProcesses" not in nvml.calls


def test_unknown_used_memory_is_none():
    # pynvml gives usedGpuMemory None where NVML does not know it (MIG, WDDM).
    nvml = FakeNvml([FakeGpu("GPU-a", processes=[(10, None), (11, G)])])
    (gpu,) = Nvml(nvml).host_gpus().gpus
    assert gpu.processes == [HostProcess(10, None), HostProcess(11, G)]


def test_text_as_bytes_is_decoded():
    nvml = FakeNvml([FakeGpu("GPU-a", name="Tesla T4")], bytes_strings=True)
    (gpu,) = Nvml(nvml).host_gpus().gpus
    assert gpu.uuid == "GPU-a" and gpu.name == "Tesla T4"


# --- lost GPUs ------------------------------------------------------------------------


def test_a_lost_gpu_among_good_ones_is_reported_lost_under_its_last_uuid():
    a, b, c = FakeGpu("GPU-a"), FakeGpu("GPU-b", processes=[(7, G)]), FakeGpu("GPU-c")
    nvml = FakeNvml([a, b, c])
    lib = Nvml(nvml)
    assert lib.host_gpus().gpus[1].error is None
    b.lost = True  # fell off the bus: its lookup by index fails now
    gpus = by_uuid(lib.host_gpus())
    assert list(gpus) == ["GPU-a", "GPU-b", "GPU-c"]
    assert gpus["GPU-b"].error == "GPU is lost" and gpus["GPU-b"].index == 1
    assert gpus["GPU-b"].name == "NVIDIA H100 80GB HBM3"  # as last read
    assert gpus["GPU-b"].processes is None and gpus["GPU-b"].memory_used is None
    assert gpus["GPU-a"].error is None and gpus["GPU-c"].error is None
    b.lost = False
    assert by_uuid(lib.host_gpus())["GPU-b"].error is None


def test_a_gpu_lost_before_it_was_ever_read_gets_a_placeholder_uuid():
    nvml = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b", lost=True)])
    gpus = by_uuid(Nvml(nvml).host_gpus())
    assert gpus["unknown:1"].error == "GPU is lost" and gpus["unknown:1"].index == 1
    assert gpus["GPU-a"].error is None


def test_a_gpu_lost_between_two_calls_is_lost():
    gpu = FakeGpu("GPU-a", fail={"nvmlDeviceGetMemoryInfo": NVMLError_GpuIsLost})
    (read,) = Nvml(FakeNvml([gpu])).host_gpus().gpus
    assert read.error == "GPU is lost" and read.errors["memory"] == "GPU is lost"


def test_an_expected_gpu_nvml_no_longer_lists_is_lost():
    nvml = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b")])
    lib = Nvml(nvml)
    lib.host_gpus()
    nvml.gpus.pop()  # the driver dropped it: the count went down
    gpus = by_uuid(lib.host_gpus(expected=["GPU-a", "GPU-b", "GPU-z"]))
    assert gpus["GPU-b"].error == "Not Found" and gpus["GPU-b"].index == 1
    assert gpus["GPU-z"].error == "Not Found" and gpus["GPU-z"].index == -1
    assert gpus["GPU-a"].error is None and len(gpus) == 3


def test_an_expected_device_found_by_uuid_is_read():
    child = FakeGpu("MIG-a1", processes=[(5, None)])
    nvml = FakeNvml([FakeGpu("GPU-a", mig_mode=0, mig=[child])])  # MIG off: not listed
    gpus = by_uuid(Nvml(nvml).host_gpus(expected=["MIG-a1"]))
    assert gpus["MIG-a1"].error is None and gpus["MIG-a1"].index == -1
    assert gpus["MIG-a1"].processes == [HostProcess(5, None)]


# --- MIG ------------------------------------------------------------------------------


def test_mig_instances_in_place_of_their_gpu():
    nvml = FakeNvml([
        FakeGpu("GPU-a"),
        FakeGpu("GPU-b", mig_mode=1, mig=[
            FakeGpu("MIG-b0", memory=10 * G, used=G, processes=[(99, None)]),
            None,
            FakeGpu("MIG-b2", memory=20 * G),
        ], fail={"nvmlDeviceGetUtilizationRates": NVMLError_NotSupported}),
    ])
    nvml.gpus[1].mig[0].fail["nvmlDeviceGetUtilizationRates"] = NVMLError_NotSupported
    gpus = by_uuid(Nvml(nvml).host_gpus())
    assert list(gpus) == ["GPU-a", "MIG-b0", "MIG-b2"]
    b0 = gpus["MIG-b0"]
    assert (b0.index, b0.mig, b0.parent, b0.gpu_instance) == (1, 0, "GPU-b", 0)
    assert b0.memory_total == 10 * G and b0.processes == [HostProcess(99, None)]
    assert b0.utilization is None and b0.errors == {"utilization": "Not Supported"}
    assert (gpus["MIG-b2"].index, gpus["MIG-b2"].mig) == (1, 2)
    assert gpus["MIG-b2"].gpu_instance == 2 and gpus["MIG-b2"].errors == {}
    assert gpus["GPU-a"].mig is None and gpus["GPU-a"].parent is None
    assert gpus["GPU-a"].gpu_instance is None
    assert "gpu_instance" not in gpus["GPU-a"].errors  # not asked of a whole GPU


def test_a_lost_mig_gpu_reports_each_of_its_instances_lost():
    b = FakeGpu("GPU-b", mig_mode=1, mig=[FakeGpu("MIG-b0"), FakeGpu("MIG-b1")])
    nvml = FakeNvml([FakeGpu("GPU-a"), b])
    lib = Nvml(nvml)
    lib.host_gpus()
    b.lost = True
    gpus = by_uuid(lib.host_gpus())
    assert [(u, g.error, g.parent) for u, g in gpus.items()] == [
        ("GPU-a", None, None), ("MIG-b0", "GPU is lost", "GPU-b"),
        ("MIG-b1", "GPU is lost", "GPU-b")]


# --- NVML down ----------------------------------------------------------------------


def test_init_failure_is_a_reason_and_retried_after_the_delay():
    nvml = FakeNvml([FakeGpu("GPU-a")], init_error=NVMLError_DriverNotLoaded)
    lib = Nvml(nvml, retry_seconds=0.3)
    assert lib.host_gpus() == HostScan([], "Driver Not Loaded")
    assert lib.host_gpus() == HostScan([], "Driver Not Loaded")
    assert nvml.calls.count("nvmlInit") == 1  # not again before the delay
    nvml.init_error = None
    time.sleep(0.35)
    scan = lib.host_gpus()
    assert scan.error is None and [g.uuid for g in scan.gpus] == ["GPU-a"]
    assert nvml.calls.count("nvmlInit") == 2


def test_a_driver_gone_mid_life_is_a_reason_and_nvml_is_started_again():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    lib = Nvml(nvml)
    lib.host_gpus()
    nvml.fail["nvmlDeviceGetCount"] = NVMLError_DriverNotLoaded
    assert lib.host_gpus() == HostScan([], "Driver Not Loaded")
    assert not lib.initialized and nvml.initialized == 0  # stopped: its handles are stale
    del nvml.fail["nvmlDeviceGetCount"]
    assert lib.host_gpus().error is None and nvml.calls.count("nvmlInit") == 2


def test_not_installed_is_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    scan = Nvml().host_gpus()
    assert scan == HostScan([], "the NVML binding (nvidia-ml-py) is not installed")


# --- XID errors -----------------------------------------------------------------------


def test_xid_events_are_delivered_once():
    nvml = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b")])
    watcher = XidWatcher(Nvml(nvml))
    assert watcher.poll() == [] and watcher.error is None
    assert watcher.watched == {"GPU-a": 0, "GPU-b": 1} and watcher.skipped == {}
    nvml.xid("GPU-b", 79)
    nvml.xid("GPU-a", 48)
    nvml.xid("GPU-b", 94)
    assert watcher.poll() == [XidEvent("GPU-b", 79), XidEvent("GPU-a", 48),
                              XidEvent("GPU-b", 94)]
    assert watcher.poll() == []
    assert nvml.calls.count("nvmlEventSetCreate") == 1  # one set for the watcher's life


def test_an_xid_before_the_first_poll_is_not_missed():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    nvml.xid("GPU-a", 13)
    assert XidWatcher(Nvml(nvml)).poll() == [XidEvent("GPU-a", 13)]


def test_an_xid_on_a_mig_instance_names_its_gpu_and_instance():
    nvml = FakeNvml([FakeGpu("GPU-a", mig_mode=1, mig=[None, FakeGpu("MIG-a1")])])
    lib = Nvml(nvml)
    watcher = XidWatcher(lib)
    watcher.poll()
    nvml.xid("MIG-a1", 43)
    nvml.xid("GPU-a", 31)
    assert watcher.poll() == [XidEvent("GPU-a", 43, 1), XidEvent("GPU-a", 31, None)]
    # The instance the event names, as the host read names it:
    (mig,) = lib.host_gpus().gpus
    assert (mig.uuid, mig.parent, mig.gpu_instance) == ("MIG-a1", "GPU-a", 1)


def test_other_event_types_are_not_xids():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    watcher = XidWatcher(Nvml(nvml))
    watcher.poll()
    nvml.xid("GPU-a", 79)
    nvml.event_sets[0].queue[0].eventType = nvml.nvmlEventTypeDoubleBitEccError
    assert watcher.poll() == []


def test_devices_without_event_support_are_skipped_and_told_once(caplog):
    nvml = FakeNvml([FakeGpu("GPU-a", events=False), FakeGpu("GPU-b"),
                     FakeGpu("GPU-c", lost=True)])
    watcher = XidWatcher(Nvml(nvml))
    with caplog.at_level(logging.WARNING, logger="spawner.gpu.nvml"):
        watcher.poll()
        watcher.poll()
    assert watcher.watched == {"GPU-b": 1}
    assert watcher.skipped == {"GPU-a": "Not Supported", "GPU 2": "GPU is lost"}
    told = [r.getMessage() for r in caplog.records]
    assert told == ["XID errors of GPU-a are not watched: Not Supported",
                    "XID errors of GPU 2 are not watched: GPU is lost"]
    nvml.xid("GPU-b", 79)
    assert watcher.poll() == [XidEvent("GPU-b", 79)]


def test_a_device_whose_events_lack_xids_is_skipped():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    nvml.nvmlDeviceGetSupportedEventTypes = lambda handle: nvml.nvmlEventTypeDoubleBitEccError
    watcher = XidWatcher(Nvml(nvml))
    watcher.poll()
    assert watcher.skipped == {"GPU-a": "it does not report XID errors as events"}
    assert "nvmlDeviceRegisterEvents" not in nvml.calls


def test_no_event_sets_at_all_is_a_reason_told_once(caplog):
    nvml = FakeNvml([FakeGpu("GPU-a")], fail={"nvmlEventSetCreate": NVMLError_NotSupported})
    watcher = XidWatcher(Nvml(nvml))
    with caplog.at_level(logging.WARNING, logger="spawner.gpu.nvml"):
        assert watcher.poll() == [] and watcher.poll() == []
    assert watcher.error == "Not Supported"
    assert [r.getMessage() for r in caplog.records] == [
        "XID errors are not watched: Not Supported"]


def test_nvml_down_is_a_reason_and_the_set_is_made_again_after_a_restart():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    lib = Nvml(nvml)
    watcher = XidWatcher(lib)
    watcher.poll()
    old = nvml.event_sets[0]
    nvml.fail["nvmlDeviceGetCount"] = NVMLError_DriverNotLoaded
    assert lib.host_gpus().error == "Driver Not Loaded"  # the host read took NVML down
    assert not old.valid  # gone with the shutdown
    nvml.init_error = NVMLError_DriverNotLoaded
    assert watcher.poll() == [] and watcher.error == "Driver Not Loaded"
    nvml.init_error = None
    del nvml.fail["nvmlDeviceGetCount"]
    nvml.xid("GPU-a", 79)
    assert watcher.poll() == [XidEvent("GPU-a", 79)]
    assert nvml.calls.count("nvmlEventSetCreate") == 2
    assert "nvmlEventSetFree" not in nvml.calls  # a stale set is not freed


def test_a_failing_wait_is_a_reason_and_the_set_is_made_again():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    watcher = XidWatcher(Nvml(nvml))
    watcher.poll()
    nvml.fail["nvmlEventSetWait"] = NVMLError_GpuIsLost
    assert watcher.poll() == [] and watcher.error == "GPU is lost"
    assert nvml.event_sets == [] and nvml.calls.count("nvmlEventSetFree") == 1
    del nvml.fail["nvmlEventSetWait"]
    watcher.poll()
    nvml.xid("GPU-a", 79)
    assert watcher.poll() == [XidEvent("GPU-a", 79)] and watcher.error is None


def test_a_storm_is_read_at_most_limit_per_poll():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    watcher = XidWatcher(Nvml(nvml), limit=3)
    watcher.poll()
    for code in range(5):
        nvml.xid("GPU-a", code)
    assert [e.xid for e in watcher.poll()] == [0, 1, 2]
    assert [e.xid for e in watcher.poll()] == [3, 4]


def test_close_frees_the_set():
    nvml = FakeNvml([FakeGpu("GPU-a")])
    lib = Nvml(nvml)
    watcher = XidWatcher(lib)
    watcher.poll()
    watcher.close()
    assert nvml.event_sets == [] and lib.initialized  # NVML itself is the caller's


# --- the container fake: a process that imports pynvml by name --------------------------


SCRIPT = """
import dataclasses, json, pynvml
from spawner.gpu.nvml import Nvml, XidWatcher
lib = Nvml(pynvml)
watcher = XidWatcher(lib)
scan = lib.host_gpus()
print(json.dumps({"scan": [[dataclasses.asdict(d) for d in scan.gpus], scan.error],
                  "xids": watcher.poll()}))
"""


def run_fake(folder: Path, script: str = SCRIPT, *args: str, **env_extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FAKE_NVML"))}
    env.update(PYTHONPATH=f"{folder}{os.pathsep}{ROOT}",
               FAKE_NVML_STATE=str(folder / "state.json"), **env_extra)
    out = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_container_fake_gives_processes_lost_gpus_and_mig(tmp_path):
    folder = install_fake_nvml(tmp_path)
    write_fake_nvml_state(folder, {"gpus": [
        {"uuid": "GPU-a", "used": G, "processes": [[4242, G]], "graphics": [[4243, None]]},
        {"uuid": "GPU-b", "lost": True},
        {"uuid": "GPU-c", "mig_mode": 1, "mig": [None, {"uuid": "MIG-c1"}],
         "fail": {"nvmlDeviceGetPowerUsage": "NVMLError_NotSupported"}},
    ], "fail": {"nvmlDeviceGetUtilizationRates": "NVMLError_NotSupported"}})
    (a, b, c) = run_fake(folder)["scan"][0]
    assert c["gpu_instance"] == 1
    assert a["uuid"] == "GPU-a" and a["processes"] == [[4242, G], [4243, None]]
    assert a["errors"] == {"utilization": "Not Supported"}
    assert b["uuid"] == "unknown:1" and b["error"] == "GPU is lost"
    assert (c["uuid"], c["index"], c["mig"], c["parent"]) == ("MIG-c1", 2, 1, "GPU-c")


def test_container_fake_delivers_each_xid_once_also_across_restarts(tmp_path):
    folder = install_fake_nvml(tmp_path)
    gpus = [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "mig_mode": 1, "mig": [{"uuid": "MIG-b0"}]}]
    write_fake_nvml_state(folder, {"gpus": gpus, "xids": [
        {"uuid": "GPU-a", "xid": 79}, {"uuid": "MIG-b0", "xid": 43, "id": "b"}]})
    assert run_fake(folder)["xids"] == [["GPU-a", 79, None], ["GPU-b", 43, 0]]
    assert run_fake(folder)["xids"] == []  # a restarted watchdog is not told again
    write_fake_nvml_state(folder, {"gpus": gpus, "xids": [
        {"uuid": "GPU-a", "xid": 79}, {"uuid": "MIG-b0", "xid": 43, "id": "b"},
        {"uuid": "GPU-b", "xid": 48}]})
    assert run_fake(folder)["xids"] == [["GPU-b", 48, None]]
    assert (folder / "state.json.xids-delivered").read_text().split() == ["0", "b", "2"]


REREAD = """
import json, sys, pynvml
from pathlib import Path
from spawner.gpu.nvml import Nvml, XidWatcher
sys.path.insert(0, sys.argv[1])
from harness import write_fake_nvml_state
folder, state = Path(sys.argv[2]), json.loads(sys.argv[3])
watcher = XidWatcher(Nvml(pynvml))
first = watcher.poll()
state["gpus"][0]["used"] = 1  # a new file: re-read, with the same xids
write_fake_nvml_state(folder, state)
second = watcher.poll()
state["xids"].append({"uuid": "GPU-a", "xid": 31})
write_fake_nvml_state(folder, state)
print(json.dumps({"first": first, "second": second, "third": watcher.poll()}))
"""


def test_container_fake_rereading_the_file_does_not_deliver_twice(tmp_path):
    folder = install_fake_nvml(tmp_path)
    state = {"gpus": [{"uuid": "GPU-a"}], "xids": [{"uuid": "GPU-a", "xid": 79}]}
    write_fake_nvml_state(folder, state)
    out = run_fake(folder, REREAD, str(ROOT / "tests"), str(folder), json.dumps(state))
    assert out == {"first": [["GPU-a", 79, None]], "second": [], "third": [["GPU-a", 31, None]]}


def test_container_fake_without_a_writable_record_delivers_once_per_process(tmp_path):
    folder = install_fake_nvml(tmp_path)
    write_fake_nvml_state(folder, {"gpus": [{"uuid": "GPU-a"}],
                                   "xids": [{"uuid": "GPU-a", "xid": 79}]})
    script = SCRIPT.replace('"xids": watcher.poll()', '"xids": watcher.poll() + watcher.poll()')
    # A folder where the record file should be: it cannot be written (also as root).
    unwritable = str(folder)
    for _ in range(2):
        out = run_fake(folder, script, FAKE_NVML_XIDS_DELIVERED=unwritable)
        assert out["xids"] == [["GPU-a", 79, None]]  # once per process, then again
