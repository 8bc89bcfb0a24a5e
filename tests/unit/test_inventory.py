"""The GPU inventory: NVML discovery (through the fake pynvml), free memory, and the
declared inventory."""

from __future__ import annotations

import re
import sys

import pytest

from fake_pynvml import (
    FakeGpu,
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
)
from spawner.gpu.inventory import (
    GpuDevice,
    Inventory,
    declared_inventory,
    discover_nvml,
    free_memory,
)

G = 2**30


def two_gpus() -> list[FakeGpu]:
    return [FakeGpu("GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * G, used=30 * G),
            FakeGpu("GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40 * G)]


@pytest.mark.parametrize("bytes_strings", [False, True])
def test_discover_two_gpus(bytes_strings):
    nvml = FakeNvml(two_gpus(), bytes_strings=bytes_strings)
    assert discover_nvml(nvml) == Inventory((
        GpuDevice("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * G),
        GpuDevice("1", "GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40 * G),
    ), "nvml", "")
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert nvml.initialized == 0


def test_discover_mig_instances_replace_their_gpu():
    gpus = two_gpus()
    gpus[1].mig_mode = 1
    gpus[1].mig = [FakeGpu("MIG-b0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * G), None,
                   FakeGpu("MIG-b2", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5 * G)]
    gpus[0].mig_mode = 0  # MIG capable, but off: the whole GPU
    nvml = FakeNvml(gpus)
    inv = discover_nvml(nvml)
    assert inv.devices == (
        GpuDevice("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * G),
        GpuDevice("1:0", "MIG-b0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * G, "GPU-bbbb"),
        GpuDevice("1:2", "MIG-b2", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5 * G, "GPU-bbbb"),
    )
    assert inv.uuids == ("GPU-aaaa", "MIG-b0", "MIG-b2")
    assert nvml.initialized == 0


def test_mig_on_without_instances_offers_nothing_of_that_gpu():
    gpus = two_gpus()
    gpus[0].mig_mode = 1
    assert discover_nvml(FakeNvml(gpus)).uuids == ("GPU-bbbb",)


@pytest.mark.parametrize("error, reason", [
    (NVMLError_LibraryNotFound, "NVML: NVML Shared Library Not Found"),
    (NVMLError_DriverNotLoaded, "NVML: Driver Not Loaded"),
])
def test_no_library_or_driver_is_a_reason_not_an_exception(error, reason):
    nvml = FakeNvml(two_gpus(), init_error=error)
    assert discover_nvml(nvml) == Inventory((), "none", reason)
    assert nvml.calls == ["nvmlInit"]  # no shutdown without an init
    assert free_memory(["GPU-aaaa"], nvml) == {}


def test_binding_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    inv = discover_nvml()
    assert inv == Inventory((), "none", "the NVML binding (nvidia-ml-py) is not installed")
    assert inv.describe() == "no GPUs (the NVML binding (nvidia-ml-py) is not installed)"
    assert free_memory(["GPU-x"]) == {}


@pytest.mark.parametrize("function, error, reason", [
    ("nvmlDeviceGetCount", NVMLError_NoPermission, "NVML: Insufficient Permissions"),
    ("nvmlDeviceGetHandleByIndex", NVMLError_GpuIsLost,
     "GPU 0 skipped: NVML: GPU is lost; GPU 1 skipped: NVML: GPU is lost"),
])
def test_error_mid_discovery_gives_empty_inventory_and_shuts_down(function, error, reason):
    nvml = FakeNvml(two_gpus(), fail={function: error})
    assert discover_nvml(nvml) == Inventory((), "none", reason)
    assert nvml.calls[-1] == "nvmlShutdown" and nvml.initialized == 0


@pytest.mark.parametrize("lost", ["a whole GPU", "a MIG instance"])
def test_a_lost_gpu_is_skipped_and_the_others_kept(lost):
    gpus = [*two_gpus(), FakeGpu("GPU-cccc", mig_mode=1, mig=[FakeGpu("MIG-c0", memory=10 * G)])]
    if lost == "a whole GPU":
        gpus[0].fail["nvmlDeviceGetUUID"] = NVMLError_GpuIsLost
        index, kept = 0, [("1", "GPU-bbbb"), ("2:0", "MIG-c0")]
    else:  # none of that GPU's instances, and nothing half-read
        gpus[2].mig[0].fail["nvmlDeviceGetUUID"] = NVMLError_GpuIsLost
        index, kept = 2, [("0", "GPU-aaaa"), ("1", "GPU-bbbb")]
    nvml = FakeNvml(gpus)
    inv = discover_nvml(nvml)
    assert (inv.source, inv.reason) == ("nvml", f"GPU {index} skipped: NVML: GPU is lost")
    assert [(d.index, d.uuid) for d in inv.devices] == kept
    assert nvml.initialized == 0


def test_unsupported_fields_become_unknown():
    gpus = two_gpus()
    gpus[0].fail["nvmlDeviceGetMemoryInfo"] = NVMLError_NotSupported
    gpus[1].fail["nvmlDeviceGetName"] = NVMLError_NotSupported
    nvml = FakeNvml(gpus, fail={"nvmlShutdown": NVMLError_GpuIsLost})  # and a failing shutdown
    assert discover_nvml(nvml).devices == (
        GpuDevice("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", None),
        GpuDevice("1", "GPU-bbbb", "GPU", 40 * G),
    )


def test_no_gpus_found():
    inv = discover_nvml(FakeNvml([]))
    assert inv == Inventory((), "none", "NVML found no GPUs")
    assert inv.describe() == "no GPUs (NVML found no GPUs)"


def test_free_memory():
    gpus = two_gpus()
    gpus[1].mig_mode = 1
    gpus[1].mig = [FakeGpu("MIG-b0", memory=20 * G, used=5 * G)]
    gpus[1].fail["nvmlDeviceGetMemoryInfo"] = NVMLError_GpuIsLost
    nvml = FakeNvml(gpus)
    assert free_memory(["GPU-aaaa", "MIG-b0", "GPU-bbbb", "GPU-missing"], nvml) == {
        "GPU-aaaa": 50 * G, "MIG-b0": 15 * G}
    assert nvml.initialized == 0


def test_declared_inventory():
    inv = declared_inventory([
        {"uuid": "GPU-1", "name": "A100", "memory": "80G"},
        {"uuid": " GPU-2 "},
        {"uuid": "MIG-3", "index": "0:1", "memory": 5 * G, "parent": "GPU-1"},
    ])
    assert inv == Inventory((
        GpuDevice("0", "GPU-1", "A100", 80 * G),
        GpuDevice("1", "GPU-2", "GPU", None),
        GpuDevice("0:1", "MIG-3", "GPU", 5 * G, "GPU-1"),
    ), "declared")
    assert inv.describe() == "3 GPUs from declared: 0: A100 GPU-1, 1: GPU GPU-2, 0:1: GPU MIG-3"
    assert declared_inventory([]) == Inventory((), "declared")


@pytest.mark.parametrize("entries, message", [
    ([{"uuid": "GPU-1"}, {"uuid": "GPU-1"}], "GPU GPU-1 is declared twice"),
    ([{"name": "A100"}], "GPU 0 in the declared inventory needs a 'uuid'"),
    ([{"uuid": "GPU-1"}, {"uuid": ""}], "GPU 1 in the declared inventory needs a 'uuid'"),
    ([{"uuid": "GPU-1,GPU-2"}], "without commas or spaces"),
    ([{"uuid": "GPU 1"}], "without commas or spaces"),
    ([{"uuid": "GPU-1", "memory": "lots"}], "cannot read 'lots' as a size"),
])
def test_declared_inventory_rejects(entries, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        declared_inventory(entries)


def test_fake_matches_real_pynvml_error_texts():
    pynvml = pytest.importorskip("pynvml")
    for name in ("LibraryNotFound", "DriverNotLoaded", "NotSupported", "NotFound",
                 "GpuIsLost", "NoPermission"):
        real, fake = getattr(pynvml, f"NVMLError_{name}"), getattr(FakeNvml, f"NVMLError_{name}")
        assert str(real()) == str(fake()) and real().value == fake().value, name
