"""The GPU monitor extension (spawner/notebook/monitor/): units with FakeNvml, then its
endpoints on a real ``jupyter server`` that reads fake GPUs from a state file."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import time
from datetime import datetime

import pytest
from metrics_schema import validate
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from fake_pynvml import (
    FakeGpu,
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
)
from monitor_server import TOKEN, GiB, MonitorServer, gpu_state, start_servers
from spawner.contract import visible_devices
from spawner.notebook import checkpoint
from spawner.notebook.monitor import metrics
from spawner.notebook.monitor.collector import GpuMonitor
from spawner.notebook.monitor.handlers import js_string
from spawner.notebook.monitor.report import metrics_report


@pytest.fixture(autouse=True)
def no_preemption(tmp_path, monkeypatch):
    """Reports built here read no notice from the machine's /tmp/quota-spawner."""
    monkeypatch.setattr(checkpoint, "NOTICE", str(tmp_path / "no-preemption.json"))


def monitor(*gpus: FakeGpu, visible: str = "all", nvml: FakeNvml | None = None,
            env: dict[str, str] | None = None, **config) -> tuple[GpuMonitor, FakeNvml]:
    nvml = nvml if nvml is not None else FakeNvml(gpus)
    return GpuMonitor(nvml=nvml, env={"NVIDIA_VISIBLE_DEVICES": visible, **(env or {})},
                      **config), nvml


# --- NVIDIA_VISIBLE_DEVICES ---------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (None, []),  # unset: not a GPU container
    ("", []),
    ("void", []),
    ("none", []),
    (" VOID ", []),
    ("None", []),
    ("all", None),
    ("ALL", None),
    ("GPU-a", ["GPU-a"]),
    ("GPU-a,GPU-b", ["GPU-a", "GPU-b"]),
    (" GPU-a , MIG-b0 ,", ["GPU-a", "MIG-b0"]),
    ("0,1", ["0", "1"]),
])
def test_visible_devices(value, expected):
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    assert visible_devices(env) == expected


# --- one sample ---------------------------------------------------------------


def test_sample_reads_every_field_with_units():
    gpu = FakeGpu("GPU-a", name="NVIDIA A100", memory=40 * GiB, used=3 * GiB, utilization=45,
                  temperature=61, power=123_456, power_limit=300_000,
                  processes=[(4242, 2**20), (4343, None)])
    mon, _ = monitor(gpu, visible="GPU-a")
    reading = mon.sample()
    assert reading["status"] == "ok" and reading["message"] == ""
    [g] = reading["gpus"]
    assert g == {
        "index": 0, "uuid": "GPU-a", "name": "NVIDIA A100", "errors": {},
        "memory_used": 3 * GiB, "memory_total": 40 * GiB,
        "utilization": 0.45,  # % -> ratio
        "temperature": 61,
        "power_draw": 123.456, "power_limit": 300.0,  # mW -> W
        # how many and how much only: no host PIDs, no command lines, no user names
        "processes": {"count": 2, "used_memory": None},  # one process's memory unknown
    }


def test_sample_old_bindings_return_bytes():
    mon, _ = monitor(visible="GPU-a",
                     nvml=FakeNvml([FakeGpu("GPU-a", name="Tesla T4")], bytes_strings=True))
    [g] = mon.sample()["gpus"]
    assert g["uuid"] == "GPU-a" and g["name"] == "Tesla T4"


def test_sample_by_uuid_and_by_index():
    gpus = [FakeGpu("GPU-a"), FakeGpu("GPU-b", utilization=80), FakeGpu("GPU-c")]
    mon, _ = monitor(*gpus, visible="GPU-c,GPU-a")
    assert [(g["index"], g["uuid"]) for g in mon.sample()["gpus"]] == [(0, "GPU-c"), (1, "GPU-a")]
    mon, _ = monitor(*gpus, visible="1")
    [g] = mon.sample()["gpus"]
    assert (g["uuid"], g["utilization"]) == ("GPU-b", 0.8)
    mon, _ = monitor(*gpus, visible="all")
    assert [g["uuid"] for g in mon.sample()["gpus"]] == ["GPU-a", "GPU-b", "GPU-c"]


def test_sample_mig_instance():
    parent = FakeGpu("GPU-p", mig_mode=1, mig=[FakeGpu("MIG-p0", memory=10 * GiB, used=GiB)])
    mon, _ = monitor(parent, visible="MIG-p0")
    [g] = mon.sample()["gpus"]
    assert (g["uuid"], g["memory_total"], g["memory_used"]) == ("MIG-p0", 10 * GiB, GiB)


def test_unsupported_field_is_none_with_an_error_note():
    nvml = FakeNvml([FakeGpu("GPU-a", used=GiB), FakeGpu("GPU-b", fail={
        "nvmlDeviceGetTemperature": NVMLError_NoPermission})])
    nvml.fail["nvmlDeviceGetPowerUsage"] = NVMLError_NotSupported  # every GPU
    mon, _ = monitor(nvml=nvml, visible="GPU-a,GPU-b")
    reading = mon.sample()
    assert reading["status"] == "ok"
    a, b = reading["gpus"]
    assert a["power_draw"] is None and a["errors"] == {"power": "Not Supported"}
    assert a["memory_used"] == GiB and a["power_limit"] == 700.0 and a["temperature"] == 35
    assert b["temperature"] is None and b["power_draw"] is None
    assert b["errors"] == {"temperature": "Insufficient Permissions", "power": "Not Supported"}
    assert "error" not in a and "error" not in b


def test_every_field_unsupported_still_a_reading():
    names = ["nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
             "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage",
             "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetComputeRunningProcesses"]
    nvml = FakeNvml([FakeGpu("GPU-a")], fail=dict.fromkeys(names, NVMLError_NotSupported))
    mon, _ = monitor(nvml=nvml, visible="GPU-a")
    [g] = mon.sample()["gpus"]
    for field in ("name", "memory_used", "memory_total", "utilization", "temperature",
                  "power_draw", "power_limit", "processes"):
        assert g[field] is None, field
    assert set(g["errors"]) == {"name", "memory", "utilization", "temperature", "power",
                                "power_limit", "processes"}
    report = metrics_report(_recorded(mon))
    assert report["gpus"][0]["memory_fraction"] is None and report["warning"] is None


def test_lost_gpu_has_its_own_error_and_others_still_read():
    lost = FakeGpu("GPU-b", fail={"nvmlDeviceGetUUID": NVMLError_GpuIsLost})
    mon, _ = monitor(FakeGpu("GPU-a", utilization=30), lost, FakeGpu("GPU-c", used=GiB),
                     visible="GPU-a,GPU-b,GPU-c")
    reading = mon.sample()
    assert reading["status"] == "ok"
    a, b, c = reading["gpus"]
    assert b == {"index": 1, "uuid": "GPU-b", "errors": {}, "error": "GPU is lost"}
    assert a["utilization"] == 0.3 and c["memory_used"] == GiB
    mon.record(reading)
    report = metrics_report(mon)
    assert report["gpus"][1]["error"] == "GPU is lost"
    assert report["gpus"][2]["memory_limit"] == 80 * GiB  # FakeGpu's default


def test_gpu_whose_lookup_fails_has_its_own_error():
    # real NVML: nvmlDeviceGetHandleByUUID gives GPU_IS_LOST for a GPU off the bus
    mon, _ = monitor(FakeGpu("GPU-a", utilization=10), visible="GPU-gone,GPU-a")
    reading = mon.sample()
    assert reading["status"] == "ok"
    gone, a = reading["gpus"]
    assert gone == {"index": 0, "uuid": "GPU-gone", "errors": {}, "error": "Not Found"}
    assert a["utilization"] == 0.1
    mon, _ = monitor(FakeGpu("GPU-a"), visible="0,5")
    assert [g.get("error") for g in mon.sample()["gpus"]] == [None, "Invalid Argument"]


def test_nvml_failing_after_init_is_an_error_not_an_exception():
    nvml = FakeNvml([FakeGpu("GPU-a")], fail={"nvmlDeviceGetCount": NVMLError_DriverNotLoaded})
    mon, _ = monitor(nvml=nvml, visible="all")
    reading = mon.sample()
    assert (reading["status"], reading["gpus"]) == ("error", [])
    assert reading["message"] == "Cannot read the GPUs: Driver Not Loaded."
    assert nvml.calls[-1] == "nvmlShutdown" and nvml.initialized == 0  # NVML stopped


def test_nvml_lost_after_init_is_started_again_after_the_retry_delay():
    nvml = FakeNvml([FakeGpu("GPU-a")], fail={"nvmlDeviceGetCount": NVMLError_DriverNotLoaded})
    mon, _ = monitor(nvml=nvml, visible="all", retry_seconds=30)
    mon.retry_seconds = 0.3  # a setting changed later applies too
    assert mon.sample()["message"] == "Cannot read the GPUs: Driver Not Loaded."
    calls = len(nvml.calls)
    assert mon.sample()["message"] == "Cannot read the GPUs: Driver Not Loaded."
    assert len(nvml.calls) == calls  # within the delay: NVML not asked
    del nvml.fail["nvmlDeviceGetCount"]  # the driver is back
    time.sleep(0.35)
    reading = mon.sample()
    assert reading["status"] == "ok" and nvml.calls.count("nvmlInit") == 2


@pytest.mark.parametrize("error, text", [
    (NVMLError_LibraryNotFound, "NVML is not available: NVML Shared Library Not Found."),
    (NVMLError_DriverNotLoaded, "NVML is not available: Driver Not Loaded."),
])
def test_nvml_init_failure_is_a_plain_error_retried_later(error, text):
    mon, nvml = monitor(FakeGpu("GPU-a"), visible="GPU-a",
                        nvml=FakeNvml([FakeGpu("GPU-a")], init_error=error), retry_seconds=0.3)
    for _ in range(3):
        reading = mon.sample()
        mon.record(reading)
        assert (reading["status"], reading["message"]) == ("error", text)
        assert reading["gpus"] == []
    assert "Traceback" not in text and "NVMLError" not in text
    assert nvml.calls.count("nvmlInit") == 1  # not again before retry_seconds
    time.sleep(0.35)
    assert mon.sample()["status"] == "error"
    assert nvml.calls.count("nvmlInit") == 2
    nvml.init_error = None  # the driver came back
    time.sleep(0.35)
    reading = mon.sample()
    assert reading["status"] == "ok" and reading["gpus"][0]["uuid"] == "GPU-a"
    assert nvml.calls.count("nvmlInit") == 3
    mon.sample()
    assert nvml.calls.count("nvmlInit") == 3  # initialized once, then kept
    mon.close()
    assert nvml.calls[-1] == "nvmlShutdown" and nvml.initialized == 0


def test_pynvml_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    mon = GpuMonitor(env={"NVIDIA_VISIBLE_DEVICES": "GPU-a"})
    reading = mon.sample()
    assert reading["status"] == "error"
    assert reading["message"] == "The NVML binding (nvidia-ml-py) is not installed."


@pytest.mark.parametrize("visible", ["void", "", "none"])
def test_no_gpu_never_touches_nvml(visible, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    mon, nvml = monitor(FakeGpu("GPU-a"), visible=visible)
    reading = mon.sample()
    assert reading["status"] == "no_gpu"
    assert reading["message"] == "No GPU assigned to this server."
    assert reading["gpus"] == []
    assert nvml.calls == []
    mon.close()
    assert nvml.calls == []
    # without a fake: pynvml is never even imported
    assert GpuMonitor(env={"NVIDIA_VISIBLE_DEVICES": visible}).sample()["status"] == "no_gpu"


def test_nvml_sees_no_gpu():
    mon, _ = monitor(visible="all")
    reading = mon.sample()
    assert reading["status"] == "no_gpu"
    assert reading["message"] == "NVML sees no GPU in this server."


# --- the collector ------------------------------------------------------------


def _recorded(mon: GpuMonitor) -> GpuMonitor:
    mon.record(mon.sample())
    return mon


def reading(t: float, *utilization: float | None, used: int = 0) -> dict:
    return {"time": t, "status": "ok", "message": "", "gpus": [
        {"index": i, "uuid": f"GPU-{i}", "utilization": u, "memory_used": used}
        for i, u in enumerate(utilization)]}


def test_history_is_bounded():
    mon, _ = monitor(FakeGpu("GPU-a"), interval=0.5, history_seconds=5)
    assert mon.history_length == 11  # history_seconds / interval + 1
    for t in range(30):
        mon.record(reading(1000 + t, 0.5, used=t))
    assert len(mon.history) == 11
    assert [s["gpus"][0]["memory_used"] for s in mon.history] == list(range(19, 30))
    # a sample keeps only what the sparklines need
    assert mon.history[-1] == {"time": 1029, "gpus": [
        {"uuid": "GPU-0", "utilization": 0.5, "memory_used": 29}]}
    mon.record({"time": 1030, "status": "error", "message": "x", "gpus": []})
    assert len(mon.history) == 11 and mon.history[-1]["time"] == 1029  # errors add nothing
    assert mon.latest["status"] == "error"
    assert GpuMonitor(env={}).history.maxlen == 901  # defaults: 900 s at 1 s


def busy_monitor(**config) -> GpuMonitor:
    config = {"interval": 1.0, "busy_window": 60.0, **config}
    return monitor(FakeGpu("GPU-0"), **config)[0]


def test_one_busy_reading_is_not_busy():
    mon = busy_monitor()
    mon.record(reading(0, 1.0))
    assert not mon.busy
    mon = busy_monitor()
    for t in range(60):
        mon.record(reading(t, 0.0))
    mon.record(reading(60, 1.0))  # a spike in an idle window
    assert not mon.busy


def test_busy_needs_enough_samples_in_the_window():
    mon = busy_monitor()  # needs max(3, 60 / 1 / 3) = 20 samples
    for t in range(19):
        mon.record(reading(t, 0.9))
        assert not mon.busy, t
    mon.record(reading(19, 0.9))
    assert mon.busy
    short = busy_monitor(busy_window=2.0, interval=0.2)  # max(3, 3.33) = 3
    for t, expected in ((0, False), (0.2, False), (0.4, True)):
        short.record(reading(t, 0.9))
        assert short.busy == expected, t


@pytest.mark.parametrize("busy_of_each_4, expected", [
    (4, True), (3, True), (2, True),  # at least busy_fraction (half) of the samples
    (1, False), (0, False),
])
def test_sustained_fraction_is_busy(busy_of_each_4, expected):
    mon = busy_monitor(busy_window=59.0)  # 60 samples in the window: 15 per busy in 4
    for t in range(120):
        mon.record(reading(t, 0.5 if t % 4 < busy_of_each_4 else 0.0))
    assert mon.busy == expected


def test_idle_stays_idle():
    mon = busy_monitor()
    for t in range(200):
        mon.record(reading(t, 0.0, None))
        assert not mon.busy


def test_busy_run_then_idle_ends_busy():
    mon = busy_monitor()
    for t in range(100):
        mon.record(reading(t, 0.95))
    assert mon.busy
    # window [now-60, now] holds 61 samples; busy while those of the run (160 - now) >= 30.5
    for t in range(100, 130):
        mon.record(reading(t, 0.0))
        assert mon.busy, t  # a dip does not end a run
    mon.record(reading(130, 0.0))
    assert not mon.busy


def test_busy_rule_details():
    mon = busy_monitor()
    for t in range(60):  # busy on any GPU counts; None reads as idle
        mon.record(reading(t, None, 0.2))
    assert mon.busy
    mon.record(reading(300, 0.0))  # after a gap: only one sample left in the window
    assert not mon.busy
    edge = busy_monitor(busy_utilization=0.5)
    for t in range(30):
        edge.record(reading(t, 0.5))  # exactly busy_utilization counts
    assert edge.busy
    below = busy_monitor(busy_utilization=0.5)
    for t in range(30):
        below.record(reading(t, 0.49))
    assert not below.busy
    errors = busy_monitor()
    for t in range(30):
        errors.record(reading(t, 0.9))
    errors.record({"time": 200, "status": "error", "message": "gone", "gpus": []})
    assert not errors.busy  # an error later on: no samples left in the window


async def test_tick_samples_off_the_loop_and_calls_back():
    mon, nvml = monitor(FakeGpu("GPU-a", utilization=70), visible="GPU-a")
    seen, broken = [], []

    def boom(_reading):
        broken.append(1)
        raise RuntimeError("a broken callback")

    mon.on_sample += [boom, seen.append]
    await mon.tick()
    assert mon.latest["status"] == "ok" and len(mon.history) == 1
    assert broken and seen == [mon.latest]  # one failing callback does not stop the rest

    def fail():
        raise ValueError("bug")

    mon.sample = fail
    await mon.tick()
    assert mon.latest["status"] == "error"
    assert mon.latest["message"] == "Sampling failed: bug."
    mon.close()


async def test_tick_skips_while_a_sample_is_running():
    mon, _ = monitor(FakeGpu("GPU-a"), visible="GPU-a")
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return mon._state("ok", "", [])

    mon.sample = slow
    await asyncio.gather(mon.tick(), mon.tick(), mon.tick())
    assert len(calls) == 1


# --- the report ---------------------------------------------------------------


def report_for(used: int, total: int = 80 * GiB, limit: str | None = None, **config) -> dict:
    env = {} if limit is None else {"GPU_MEMORY_LIMIT": limit}
    mon, _ = monitor(FakeGpu("GPU-a", memory=total, used=used), visible="GPU-a", env=env,
                     **config)
    return metrics_report(_recorded(mon))


def test_report_memory_limit_from_env():
    report = report_for(2 * GiB, limit=str(8 * GiB))
    assert report["gpu_memory_limit"] == 8 * GiB
    [g] = report["gpus"]
    assert (g["memory_limit"], g["memory_limit_source"]) == (8 * GiB, "GPU_MEMORY_LIMIT")
    assert g["memory_fraction"] == 0.25 and g["memory_total"] == 80 * GiB
    # a cap above the GPU's own memory: the GPU's memory is the limit
    [g] = report_for(40 * GiB, limit=str(100 * GiB))["gpus"]
    assert g["memory_limit"] == 80 * GiB and g["memory_fraction"] == 0.5


@pytest.mark.parametrize("limit", [None, "", "abc", "0", "-5", "1.5G"])
def test_report_without_a_usable_limit_uses_the_total(limit):
    report = report_for(20 * GiB, limit=limit)
    assert report["gpu_memory_limit"] is None
    [g] = report["gpus"]
    assert (g["memory_limit"], g["memory_limit_source"]) == (80 * GiB, "total")
    assert g["memory_fraction"] == 0.25


def test_warning_at_exactly_the_threshold():
    limit = 10_000_000_000
    at = report_for(9_000_000_000, total=limit * 2, limit=str(limit))
    assert at["gpus"][0]["memory_fraction"] == 0.9
    assert at["warning"] == at["gpus"][0]["warning"] == "GPU memory at 90% of your 9.31 GiB limit"
    below = report_for(8_900_000_000, total=limit * 2, limit=str(limit))
    assert below["warning"] is None and below["gpus"][0]["warning"] is None
    just_below = report_for(8_999_999_999, total=limit * 2, limit=str(limit))
    assert just_below["warning"] is None


def test_warning_text():
    report = report_for(math.ceil(0.93 * 8 * GiB), limit=str(8 * GiB))
    assert report["warning"] == "GPU memory at 93% of your 8 GiB limit"
    assert report["gpus"][0]["warning"] == report["warning"]
    # no cap: the GPU's own memory
    report = report_for(math.ceil(0.95 * 80 * GiB))
    assert report["warning"] == "GPU memory at 95% of this GPU's 80 GiB limit"
    # a cap as large as the card (or larger) is no cap: the card's memory applies
    full = report_for(80 * GiB, limit=str(100 * GiB))
    assert full["warning"] == "GPU memory at 100% of this GPU's 80 GiB limit"
    assert full["gpus"][0]["memory_limit_source"] == "total"
    assert full["gpus"][0]["memory_limit"] == 80 * GiB


def test_custom_warning_threshold():
    report = report_for(5 * GiB, limit=str(8 * GiB), warning_threshold=0.6)
    assert report["warning_threshold"] == 0.6
    assert report["warning"] == "GPU memory at 62% of your 8 GiB limit"
    assert report_for(4 * GiB, limit=str(8 * GiB), warning_threshold=0.6)["warning"] is None
    # the default threshold would not warn at 62%
    assert report_for(5 * GiB, limit=str(8 * GiB))["warning"] is None


def test_report_warning_is_the_first_gpus():
    mon, _ = monitor(FakeGpu("GPU-a", used=GiB), FakeGpu("GPU-b", used=79 * GiB),
                     visible="GPU-a,GPU-b")
    report = metrics_report(_recorded(mon))
    assert [g["warning"] for g in report["gpus"]] == [
        None, "GPU memory at 99% of this GPU's 80 GiB limit"]
    assert report["warning"] == report["gpus"][1]["warning"]


def test_report_fields_and_history():
    mon, _ = monitor(FakeGpu("GPU-a", utilization=20), visible="GPU-a", interval=0.5,
                     warning_threshold=0.8)
    starting = metrics_report(mon)
    assert (starting["status"], starting["gpus"], starting["busy"]) == ("starting", [], False)
    _recorded(mon)
    _recorded(mon)
    report = metrics_report(mon)
    assert report["version"] == 1 and report["status"] == "ok" and report["message"] == ""
    assert report["interval"] == 0.5 and report["warning_threshold"] == 0.8
    assert report["time"] == mon.latest["time"] and abs(report["time"] - time.time()) < 5
    assert "history" not in report
    full = metrics_report(mon, history=True)
    assert len(full["history"]) == 2
    assert full["history"][0]["gpus"] == [{"uuid": "GPU-a", "utilization": 0.2, "memory_used": 0}]
    json.dumps(full)  # plain JSON


# --- Prometheus gauges --------------------------------------------------------

GAUGES = {
    "jupyter_gpu_memory_used_bytes": "memory_used",
    "jupyter_gpu_memory_total_bytes": "memory_total",
    "jupyter_gpu_utilization_ratio": "utilization",
    "jupyter_gpu_temperature_celsius": "temperature",
    "jupyter_gpu_power_watts": "power_draw",
}


def gauge(name: str, uuid: str, index: int) -> float | None:
    return REGISTRY.get_sample_value(name, {"uuid": uuid, "index": str(index)})


def test_prometheus_update_sets_and_clears():
    mon, nvml = monitor(FakeGpu("GPU-prom-a", used=3 * GiB, memory=16 * GiB, utilization=42,
                                temperature=55, power=150_500),
                        FakeGpu("GPU-prom-b"), visible="GPU-prom-a,GPU-prom-b")
    first = mon.sample()
    metrics.update(first)
    assert gauge("jupyter_gpu_memory_used_bytes", "GPU-prom-a", 0) == 3 * GiB
    assert gauge("jupyter_gpu_memory_total_bytes", "GPU-prom-a", 0) == 16 * GiB
    assert gauge("jupyter_gpu_utilization_ratio", "GPU-prom-a", 0) == 0.42
    assert gauge("jupyter_gpu_temperature_celsius", "GPU-prom-a", 0) == 55
    assert gauge("jupyter_gpu_power_watts", "GPU-prom-a", 0) == 150.5
    for name in GAUGES:
        assert gauge(name, "GPU-prom-b", 1) is not None, name
    # a field that stops reading, and a GPU that is lost, drop out
    nvml.fail["nvmlDeviceGetPowerUsage"] = NVMLError_NotSupported
    nvml.gpus[1].fail["nvmlDeviceGetUUID"] = NVMLError_GpuIsLost
    metrics.update(mon.sample())
    assert gauge("jupyter_gpu_power_watts", "GPU-prom-a", 0) is None
    assert gauge("jupyter_gpu_memory_used_bytes", "GPU-prom-a", 0) == 3 * GiB
    for name in GAUGES:
        assert gauge(name, "GPU-prom-b", 1) is None, name
    # an error or no GPU: nothing at all
    metrics.update({"time": 0, "status": "error", "message": "x", "gpus": []})
    for name in GAUGES:
        assert gauge(name, "GPU-prom-a", 0) is None, name


def test_js_string_is_safe_in_a_script():
    for value in ["/user/a</script><script>alert(1)//", "/user/o'neil&co/", '/user/"x"\\/']:
        literal = js_string(value)
        assert not re.search(r"[<>&]", literal)
        assert json.loads(literal) == value  # a valid JS string with the same value


# --- the endpoints on a real jupyter server ------------------------------------

BASE_URL = "/user/o'neil/"  # a quote in the base_url, as a user name can bring one
INTERVAL_ARGS = ("--GpuMonitor.interval=0.2", "--GpuMonitor.busy_window=2")


def two_gpus(used_a: int, utilization: int = 0) -> dict:
    return {"gpus": [gpu_state(used_a, utilization),
                     gpu_state(GiB, 0, uuid="GPU-b", power=250_000, temperature=48,
                               processes=[[1234, GiB]])]}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Three servers started together: two fake GPUs with an 8 GiB cap, no GPU, no driver."""
    tmp = tmp_path_factory.mktemp("monitor")
    gpu = MonitorServer(tmp / "gpu", two_gpus(4 * GiB),
                        {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
                         "GPU_MEMORY_LIMIT": str(8 * GiB)},
                        INTERVAL_ARGS, base_url=BASE_URL)
    void = MonitorServer(tmp / "void", two_gpus(GiB), {"NVIDIA_VISIBLE_DEVICES": "void"},
                         INTERVAL_ARGS)
    broken = MonitorServer(tmp / "broken", {**two_gpus(GiB),
                                            "init_error": "NVMLError_DriverNotLoaded"},
                           {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}, INTERVAL_ARGS)
    start_servers(gpu, void, broken)
    yield {"gpu": gpu, "void": void, "broken": broken}
    for server in (gpu, void, broken):
        server.stop()


@pytest.fixture
def server(servers):
    """The GPU server, GPU-a at 4 GiB of its 8 GiB cap and idle."""
    server = servers["gpu"]
    server.write_state(two_gpus(4 * GiB))
    server.wait_for(lambda b: b["gpus"][0]["memory_used"] == 4 * GiB
                    and b["gpus"][0]["utilization"] == 0, what="the initial state")
    return server


def test_api_and_page_need_the_token(server):
    r = server.get("api/gpu/metrics", token=False, allow_redirects=False)
    assert r.status_code == 403
    assert "GPU-a" not in r.text
    r = server.get("gpu", token=False, allow_redirects=False)
    assert r.status_code == 302
    assert "/login" in r.headers["Location"]
    r = server.get("api/gpu/metrics", token=False, headers={"Authorization": "token wrong"})
    assert r.status_code == 403
    r = server.get("api/gpu/metrics", token=False, params={"token": TOKEN})
    assert r.status_code == 200


def test_api_report_matches_the_schema(server):
    r = server.get("api/gpu/metrics")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.headers["Cache-Control"] == "no-store"
    body = r.json()
    validate(body)
    assert (body["status"], body["interval"], body["gpu_memory_limit"]) == ("ok", 0.2, 8 * GiB)
    a, b = body["gpus"]
    assert (a["uuid"], a["index"], b["uuid"], b["index"]) == ("GPU-a", 0, "GPU-b", 1)
    assert a["memory_used"] == 4 * GiB and a["memory_total"] == 16 * GiB
    assert (a["memory_limit"], a["memory_fraction"]) == (8 * GiB, 0.5)
    assert b["processes"] == {"count": 1, "used_memory": GiB}
    assert body["warning"] is None


def test_api_preemption_notice(server):
    """Read from the notice file at each request: written, broken, withdrawn."""
    assert server.metrics()["preemption"] is None
    notice = {"version": 1, "by": "bob", "by_role": "urgent-debug", "role": "gpu-training",
              "gpus": ["GPU-a"], "reason": "bob needs 1 GPU.",
              "signalled_at": time.time() - 8, "deadline": time.time() + 112,
              "grace_period": 120.0}
    try:
        server.write_notice(notice)
        body = server.metrics(history=True)
        validate(body)
        preemption = body["preemption"]
        assert 100 < preemption.pop("seconds_left") <= 112
        assert preemption == notice
        server.write_notice('{"version": 1, "by": "bob", "dead')  # a partial write
        body = server.metrics()
        validate(body)
        assert body["preemption"] is None
        server.write_notice({**notice, "deadline": time.time() - 5})
        assert server.metrics()["preemption"]["seconds_left"] == 0  # the stop is under way
    finally:
        server.clear_notice()
    assert server.metrics()["preemption"] is None


def test_api_warning_threshold(server):
    server.write_state(two_gpus(math.ceil(0.93 * 8 * GiB)))
    body = server.wait_for(lambda b: b["warning"] is not None, what="the warning")
    validate(body)
    assert body["warning"] == "GPU memory at 93% of your 8 GiB limit"
    assert body["gpus"][0]["warning"] == body["warning"]
    server.write_state(two_gpus(4 * GiB))
    body = server.wait_for(lambda b: b["gpus"][0]["memory_used"] == 4 * GiB)
    assert body["warning"] is None and body["gpus"][0]["memory_fraction"] == 0.5


def test_api_history(server):
    # a server just started has one reading; the next comes an interval later
    deadline = time.monotonic() + 5
    body = server.metrics(history=True)
    while len(body["history"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        body = server.metrics(history=True)
    validate(body)
    assert len(body["history"]) >= 2
    times = [s["time"] for s in body["history"]]
    assert times == sorted(times) and times[-1] <= body["time"]
    assert body["history"][-1]["gpus"][0] == {"uuid": "GPU-a", "utilization": 0.0,
                                              "memory_used": 4 * GiB}
    for flag in ("0", "no"):
        assert "history" not in server.get(f"api/gpu/metrics?history={flag}").json()


def test_prometheus_metrics(server):
    r = server.get("metrics")
    assert r.status_code == 200
    samples = {(s.name, s.labels.get("uuid"), s.labels.get("index")): s.value
               for family in text_string_to_metric_families(r.text)
               for s in family.samples if s.name in GAUGES}
    for name in GAUGES:
        assert (name, "GPU-a", "0") in samples, name
        assert (name, "GPU-b", "1") in samples, name
    assert samples["jupyter_gpu_memory_used_bytes", "GPU-a", "0"] == 4 * GiB
    assert samples["jupyter_gpu_memory_total_bytes", "GPU-a", "0"] == 16 * GiB
    assert samples["jupyter_gpu_utilization_ratio", "GPU-a", "0"] == 0.0
    assert samples["jupyter_gpu_temperature_celsius", "GPU-b", "1"] == 48
    assert samples["jupyter_gpu_power_watts", "GPU-b", "1"] == 250.0
    assert server.get("metrics", token=False).status_code == 403


def test_page_is_self_contained_and_escapes_the_base_url(server):
    r = server.get("gpu")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/html")
    page = r.text
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:[a-z]+:)?//""", page, re.I)
    assert not re.search(r"url\(|@import|<link|<iframe|<img", page, re.I)
    # the only absolute URL is the SVG namespace, which is a name, not a request
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) <= {"http://www.w3.org/2000/svg"}
    assert "__METRICS_URL__" not in page and "__REFRESH_MS__" not in page
    m = re.search(r"const METRICS_URL = (.*);", page)
    assert m and json.loads(m.group(1)) == BASE_URL + "api/gpu/metrics"
    assert "const REFRESH_MS = 500;" in page  # interval 0.2 s, at least 0.5 s between polls


def test_no_gpu_server(servers):
    server = servers["void"]
    body = server.metrics(history=True)
    validate(body)
    assert body["status"] == "no_gpu"
    assert body["message"] == "No GPU assigned to this server."
    assert body["gpus"] == [] and body["history"] == [] and body["warning"] is None
    assert server.get("gpu").status_code == 200
    r = server.get("metrics")
    assert "jupyter_gpu_memory_used_bytes{" not in r.text


def test_nvml_error_server_still_serves(servers):
    server = servers["broken"]
    body = server.metrics()
    validate(body)
    assert body["status"] == "error"
    assert "Driver Not Loaded" in body["message"]
    assert "Traceback" not in body["message"]
    assert body["gpus"] == []
    assert server.get("api/status").status_code == 200
    assert server.get("gpu").status_code == 200
    assert server.get("metrics").status_code == 200


def last_activity(server: MonitorServer) -> datetime:
    r = server.get("api/status")
    r.raise_for_status()
    return datetime.fromisoformat(r.json()["last_activity"].replace("Z", "+00:00"))


def test_polling_is_not_activity_but_a_busy_gpu_is(server):
    # idle GPU: polling the API and the page does not count as activity
    server.wait_for(lambda b: not b["busy"], what="idle")
    before = last_activity(server)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        server.metrics(history=True)
        server.get("gpu")
        time.sleep(0.1)
    assert last_activity(server) == before

    # busy GPU: the monitor marks activity, and keeps marking it
    server.write_state(two_gpus(4 * GiB, utilization=90))
    body = server.wait_for(lambda b: b["busy"], what="busy")
    assert body["gpus"][0]["utilization"] == 0.9
    busy_at = last_activity(server)
    assert busy_at > before
    time.sleep(0.5)
    assert last_activity(server) > busy_at

    # idle again: within the window busy ends, and so does the activity
    server.write_state(two_gpus(4 * GiB, utilization=0))
    server.wait_for(lambda b: not b["busy"], timeout=5, what="idle again")
    settled = last_activity(server)
    time.sleep(0.6)
    assert last_activity(server) == settled
