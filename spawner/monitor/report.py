"""The JSON that GET {base_url}api/gpu/metrics returns (docs/gpu-metrics.schema.json)."""

from __future__ import annotations

from typing import Any

from ..contract import GPU_MEMORY_LIMIT
from ..quota.units import format_human
from .collector import GpuMonitor

SCHEMA_VERSION = 1


def memory_warning(used: int, limit: int, threshold: float, capped: bool) -> str | None:
    """'GPU memory at 93% of your 20 GiB limit', once use reaches the threshold."""
    if limit <= 0 or used / limit < threshold:
        return None
    whose = "your" if capped else "this GPU's"
    return f"GPU memory at {used / limit:.0%} of {whose} {format_human(limit)} limit"


def gpu_report(gpu: dict[str, Any], cap: int | None, threshold: float) -> dict[str, Any]:
    report = dict(gpu)
    used, total = gpu.get("memory_used"), gpu.get("memory_total")
    capped = bool(cap) and (not total or cap < total)  # a cap above the card is no cap
    limit = cap if capped else total
    report["memory_limit"] = limit
    report["memory_limit_source"] = GPU_MEMORY_LIMIT if capped else "total"
    if used is not None and limit:
        report["memory_fraction"] = used / limit
        report["warning"] = memory_warning(used, limit, threshold, capped)
    else:
        report["memory_fraction"] = None
        report["warning"] = None
    return report


def metrics_report(monitor: GpuMonitor, history: bool = False) -> dict[str, Any]:
    latest = monitor.latest
    cap = monitor.memory_limit_env()
    gpus = [gpu_report(g, cap, monitor.warning_threshold) if "error" not in g else dict(g)
            for g in latest["gpus"]]
    body: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "time": latest["time"],
        "status": latest["status"],
        "message": latest["message"],
        "interval": monitor.interval,
        "warning_threshold": monitor.warning_threshold,
        "gpu_memory_limit": cap,
        "busy": monitor.busy,
        "gpus": gpus,
        "warning": next((g["warning"] for g in gpus if g.get("warning")), None),
    }
    if history:
        body["history"] = list(monitor.history)
    return body
