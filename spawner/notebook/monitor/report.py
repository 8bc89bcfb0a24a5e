"""The JSON that GET {base_url}api/gpu/metrics returns (docs/gpu-metrics.schema.json)."""

from __future__ import annotations

from typing import Any, TypedDict

from spawner.contract import GPU_MEMORY_LIMIT
from spawner.gpu.nvml import FailedGpu, GpuReading
from spawner.notebook.checkpoint import read_notice, seconds_left
from spawner.notebook.monitor.collector import GpuMonitor, HistoryEntry
from spawner.notebook.monitor.home import HomeReport, home_report
from spawner.quota.units import format_human

SCHEMA_VERSION = 1


class GpuReport(GpuReading):
    """A reading and what it is measured against ($defs gpu)."""

    memory_limit: int | None  # bytes: the cap where it is below the card's memory, else that
    memory_limit_source: str  # GPU_MEMORY_LIMIT or "total"
    memory_fraction: float | None
    warning: str | None


class _Report(TypedDict):
    version: int
    time: float
    status: str
    message: str
    interval: float
    warning_threshold: float
    gpu_memory_limit: int | None
    busy: bool
    gpus: list[GpuReport | FailedGpu]
    warning: str | None
    preemption: dict[str, Any] | None
    home: HomeReport | None


class Report(_Report, total=False):
    """The whole response; ``history`` only when asked for."""

    history: list[HistoryEntry]


def memory_warning(used: int, limit: int, threshold: float, capped: bool) -> str | None:
    """'GPU memory at 93% of your 20 GiB limit', once use reaches the threshold."""
    if limit <= 0 or used / limit < threshold:
        return None
    whose = "your" if capped else "this GPU's"
    return f"GPU memory at {used / limit:.0%} of {whose} {format_human(limit)} limit"


def gpu_report(gpu: GpuReading, cap: int | None, threshold: float) -> GpuReport:
    used, total = gpu["memory_used"], gpu["memory_total"]
    capped = bool(cap) and (not total or cap < total)  # a cap above the card is no cap
    limit = cap if capped else total
    known = used is not None and bool(limit)
    return GpuReport(
        **gpu,
        memory_limit=limit,
        memory_limit_source=GPU_MEMORY_LIMIT if capped else "total",
        memory_fraction=used / limit if known else None,
        warning=memory_warning(used, limit, threshold, capped) if known else None,
    )


def preemption_report(now: float | None = None) -> dict[str, Any] | None:
    """The hub's preemption notice plus ``seconds_left``; None when there is none.

    Read at every report, not sampled: the hub writes the notice and removes it
    again (a withdrawn preemption) at any time, and the read is one small file.
    """
    notice = read_notice()
    if notice is None:
        return None
    return {**notice, "seconds_left": seconds_left(notice, now=now)}


def metrics_report(monitor: GpuMonitor, history: bool = False) -> Report:
    latest = monitor.latest
    cap = monitor.memory_limit_env()
    gpus: list[GpuReport | FailedGpu] = [
        FailedGpu(**g) if "error" in g else gpu_report(g, cap, monitor.warning_threshold)
        for g in latest["gpus"]]
    body = Report(
        version=SCHEMA_VERSION,
        time=latest["time"],
        status=latest["status"],
        message=latest["message"],
        interval=monitor.interval,
        warning_threshold=monitor.warning_threshold,
        gpu_memory_limit=cap,
        busy=monitor.busy,
        gpus=gpus,
        warning=next((g["warning"] for g in gpus if g.get("warning")), None),
        preemption=preemption_report(),
        # read on the monitor's timer, not here: null where the home has no size
        home=home_report(monitor.home, monitor.home_stale_after),
    )
    if history:
        body["history"] = list(monitor.history)
    return body
