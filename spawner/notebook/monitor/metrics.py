"""Prometheus gauges for the server's own /metrics (jupyter_server serves the registry)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Gauge

if TYPE_CHECKING:
    from spawner.notebook.monitor.collector import Sample

LABELS = ("uuid", "index")

MEMORY_USED = Gauge("jupyter_gpu_memory_used_bytes", "GPU memory in use", LABELS)
MEMORY_TOTAL = Gauge("jupyter_gpu_memory_total_bytes", "GPU memory in all", LABELS)
UTILIZATION = Gauge("jupyter_gpu_utilization_ratio", "GPU utilization, 0 to 1", LABELS)
TEMPERATURE = Gauge("jupyter_gpu_temperature_celsius", "GPU temperature", LABELS)
POWER = Gauge("jupyter_gpu_power_watts", "GPU power draw", LABELS)
FIELDS = (
    (MEMORY_USED, "memory_used"),
    (MEMORY_TOTAL, "memory_total"),
    (UTILIZATION, "utilization"),
    (TEMPERATURE, "temperature"),
    (POWER, "power_draw"),
)


def update(reading: Sample) -> None:
    """Set every gauge from one reading; a field NVML could not read is left out."""
    for gauge, _ in FIELDS:
        gauge.clear()  # GPUs that vanished, or fields that stopped reading, go away
    for gpu in reading.get("gpus", []):
        labels = {"uuid": gpu.get("uuid", ""), "index": str(gpu.get("index", ""))}
        for gauge, field in FIELDS:
            value = gpu.get(field)
            if value is not None:
                gauge.labels(**labels).set(value)
