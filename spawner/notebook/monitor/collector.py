"""The collector: samples NVML on a timer, off the event loop, and keeps history.

On the same timer, in the same thread, it reads the home's use where the home has a
size (home.py): one small file, so the API never reads it per request.

It also applies the busy rule: the GPU counts as busy when, over the last
``busy_window`` seconds, at least ``busy_fraction`` of the samples show some
GPU at ``busy_utilization`` or more. One reading never decides it, so a
short spike does not keep an idle server alive and a dip does not end a run.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypedDict

from tornado.ioloop import IOLoop, PeriodicCallback
from traitlets import Float, observe
from traitlets.config import LoggingConfigurable

from spawner.contract import gpu_memory_limit, visible_devices
from spawner.gpu.nvml import (
    FailedGpu,
    GpuReading,
    Nvml,
    NvmlError,
    NvmlNotInstalled,
    NvmlUnavailable,
    reason,
)
from spawner.notebook.monitor.home import HomeReading, not_read_yet, read_home


class Sample(TypedDict):
    """One reading: the API's time, status, message and gpus (docs/gpu-metrics.schema.json)."""

    time: float
    status: str  # "ok", "no_gpu", "error" or "starting"
    message: str  # "" when ok, else one sentence
    gpus: list[GpuReading | FailedGpu]  # empty unless ok


class HistoryGpu(TypedDict):
    uuid: str
    utilization: float | None
    memory_used: int | None


class HistoryEntry(TypedDict):
    """What the history keeps of a reading with status ok: what the sparklines need."""

    time: float
    gpus: list[HistoryGpu]


def failure_message(error: NvmlError) -> str:
    """The sentence a reading shows when NVML cannot be used."""
    if isinstance(error, NvmlNotInstalled):
        text = str(error)
    elif isinstance(error, NvmlUnavailable):  # library not found, driver not loaded
        text = f"NVML is not available: {error}"
    else:  # started, then could not count the GPUs: the driver gone (or reloaded)
        text = f"Cannot read the GPUs: {error}"
    return f"{text[:1].upper()}{text[1:]}."


class GpuMonitor(LoggingConfigurable):
    """Configure with ``c.GpuMonitor.<name>`` in the notebook server's config."""

    interval = Float(1.0, config=True, help="Seconds between NVML samples.")
    history_seconds = Float(900.0, config=True, help="How much history to keep (seconds).")
    warning_threshold = Float(
        0.9, config=True,
        help="Warn when GPU memory use reaches this fraction of the limit that applies.",
    )
    busy_utilization = Float(
        0.1, config=True, help="A sample counts as busy when a GPU's utilization is this or more."
    )
    busy_window = Float(60.0, config=True, help="Seconds of samples the busy rule looks at.")
    busy_fraction = Float(
        0.5, config=True, help="The share of busy samples in the window that makes the GPU busy."
    )
    retry_seconds = Float(30.0, config=True, help="Seconds between tries when NVML is missing.")
    home_stale_after = Float(
        180.0, config=True,
        help="The home's use counts as stale when its file is older than this (seconds); "
             "the watchdog rewrites it at least every minute.",
    )

    def __init__(self, nvml: ModuleType | None = None, env: dict[str, str] | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        # kept started; after a failure, tried again every retry_seconds (see spawner.gpu.nvml)
        self.nvml = Nvml(nvml, retry_seconds=self.retry_seconds)
        self._env = dict(os.environ) if env is None else env
        self.visible = visible_devices(self._env)
        self.history: deque[HistoryEntry] = deque(maxlen=self.history_length)
        self.latest: Sample = self._state("starting", "No sample yet.")
        self.busy = False
        # the home's use; None where the home has no size (no DISK_LIMIT)
        self.home: HomeReading | None = not_read_yet(self._env)
        self.on_sample: list[Callable[[Sample], None]] = []
        self._timer: PeriodicCallback | None = None
        self._sampling = False

    @observe("retry_seconds")
    def _retry_seconds_changed(self, change: dict[str, Any]) -> None:
        if hasattr(self, "nvml"):  # set later than the config in __init__
            self.nvml.retry_seconds = change["new"]

    @property
    def history_length(self) -> int:
        return max(1, int(self.history_seconds / self.interval) + 1)

    def memory_limit_env(self) -> int | None:
        return gpu_memory_limit(self._env)

    # --- sampling (blocking; runs in a thread) ---------------------------------

    def _state(self, status: str, message: str = "",
               gpus: list[GpuReading | FailedGpu] | None = None) -> Sample:
        return Sample(time=time.time(), status=status, message=message, gpus=gpus or [])

    def sample(self) -> Sample:
        """One reading: status "ok", "no_gpu" or "error", never an exception."""
        if self.visible == []:
            return self._state("no_gpu", "No GPU assigned to this server.")
        try:
            self.nvml.start()  # once; after a failure, again only after retry_seconds
            gpus = self.nvml.readings(self.visible)
        except NvmlError as e:
            return self._state("error", failure_message(e))
        if not gpus:
            return self._state("no_gpu", "NVML sees no GPU in this server.")
        return self._state("ok", "", gpus)

    def sample_all(self) -> tuple[Sample, HomeReading | None]:
        """One tick's work in one thread: the GPUs and the home."""
        return self.sample(), read_home(self._env)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self.nvml.stop()

    # --- on the event loop ------------------------------------------------------

    def start(self) -> None:
        self._timer = PeriodicCallback(self.tick, self.interval * 1000)
        self._timer.start()
        IOLoop.current().add_callback(self.tick)  # the first sample now, not after a period

    async def tick(self) -> None:
        if self._sampling:  # a slow NVML call: skip, never pile up threads
            return
        self._sampling = True
        try:
            reading, self.home = await asyncio.to_thread(self.sample_all)
        except Exception as e:  # a bug here must not stop the timer
            reading = self._state("error", f"Sampling failed: {reason(e)}.")
        finally:
            self._sampling = False
        self.record(reading)

    def record(self, reading: Sample) -> None:
        self.latest = reading
        if reading["status"] == "ok":
            self.history.append(HistoryEntry(time=reading["time"], gpus=[
                HistoryGpu(uuid=g["uuid"], utilization=g.get("utilization"),
                           memory_used=g.get("memory_used")) for g in reading["gpus"]]))
        self.busy = self.is_busy(reading["time"])
        for callback in self.on_sample:
            try:
                callback(reading)
            except Exception as e:
                self.log.warning("GPU monitor callback failed: %s", e)

    def is_busy(self, now: float) -> bool:
        window = []
        for s in reversed(self.history):  # newest first: stop at the window's start
            if s["time"] < now - self.busy_window:
                break
            window.append(s)
        # at least 3 samples and a third of the window, so one reading never decides
        needed = max(3, int(self.busy_window / self.interval / 3))
        if len(window) < needed:
            return False
        busy = sum(
            any((g["utilization"] or 0) >= self.busy_utilization for g in s["gpus"])
            for s in window
        )
        return busy >= self.busy_fraction * len(window)
