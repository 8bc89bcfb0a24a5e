"""GPU monitor: what the collector costs per sample, and how fast the JSON API answers.

Two parts, both run unless one is chosen:

--collector  spawner.notebook.monitor's GpuMonitor in this process, on tests/fake_pynvml.py's
             FakeNvml holding 1, 4 and 8 GPUs (2 processes on each): process
             CPU time and wall time of sample() + record() per sample, i.e. the
             whole tick minus the hop to a thread, with the callbacks the
             extension installs (the Prometheus gauges and the activity mark).
             The history is filled first and the samples are stamped one
             interval apart, so the history ring and the busy window hold what
             they hold in steady state. With the fake NVML this is the
             Python-side cost only; what the real NVML calls cost is measured on
             a GPU machine (tests/e2e/test_gpu_device.py compares NVML with an
             ``nvidia-smi`` subprocess). As this machine's side of that
             comparison, it times spawning /bin/true the way a caller of
             nvidia-smi would (subprocess.run, output captured): the floor of
             any nvidia-smi call, before nvidia-smi itself does anything.

--api        A real ``jupyter server`` subprocess with the extension enabled and
             the fake ``pynvml`` (tests/fake_nvml_container) reading 2 fake GPUs
             from $FAKE_NVML_STATE: the tests' server, tests/monitor_server.py.
             The collector samples every 0.05 s and keeps 901 samples, as many
             as a full 15-minute history at the default 1 s interval, so
             ``?history=1`` reaches its steady-state size in 45 s. 20 clients
             (threads, each its own requests.Session and connection) poll as
             fast as they can, in ABBA rounds: GET /api/gpu/metrics against
             jupyter_server's own GET /api/status, ratios of p50 and p99; then
             at the page's own rate (one ``?history=1`` on load, then the plain
             JSON every second, the rate the page uses at the default interval);
             then ``?history=1`` as fast as they can once the history is full.
             The server's CPU time per request comes from /proc, and so does its
             idle CPU (the collector at 20 Hz). The server is stopped at the end.

    .venv/bin/python bench/monitor_bench.py                  # both parts (about a minute)
    .venv/bin/python bench/monitor_bench.py --collector --samples 5000
    .venv/bin/python bench/monitor_bench.py --api --seconds 20 --clients 20

Needs no GPU, no Docker and no root. Clients and server share this machine's
CPUs (and the GIL, for the clients), so latencies are those of a loaded box:
compare endpoints within one run, and rerun when other work was running
(the load average at the start is printed).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from baseline import pct, run_parts  # noqa: E402

from fake_pynvml import FakeGpu, FakeNvml  # noqa: E402
from monitor_server import TOKEN, MonitorServer  # noqa: E402
from spawner.notebook.monitor import metrics  # noqa: E402
from spawner.notebook.monitor.collector import GpuMonitor  # noqa: E402

GiB = 1 << 30
DEFAULT_INTERVAL = 1.0  # GpuMonitor.interval's default
DEFAULT_HISTORY = 900.0  # GpuMonitor.history_seconds's default


def page_period(interval: float) -> float:
    """How often the page polls (spawner/notebook/monitor/handlers.py's __REFRESH_MS__)."""
    return min(2.0, max(0.5, interval))


def fake_gpus(n: int) -> list[FakeGpu]:
    """n busy-ish GPUs with processes: every read_gpu field has something to read."""
    return [FakeGpu(f"GPU-{i:08x}-bench-0000-0000-{i:012x}", used=(3 + i) * GiB,
                    utilization=85 if i % 2 == 0 else 0, temperature=40 + i,
                    power=150_000 + i * 1000,
                    processes=[(4000 + 2 * i, GiB), (4001 + 2 * i, 2 * GiB)])
            for i in range(n)]


# --- collector ---------------------------------------------------------------

def collector_run(n_gpus: int, samples: int) -> dict[str, Any]:
    nvml = FakeNvml(fake_gpus(n_gpus))
    monitor = GpuMonitor(nvml=nvml, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    settings: dict[str, Any] = {}

    def mark_activity(_reading: dict[str, Any]) -> None:  # as the extension's
        from jupyter_server._tz import utcnow

        if monitor.busy:
            settings["gpu_last_activity"] = utcnow()

    monitor.on_sample += [metrics.update, mark_activity]
    clock = time.perf_counter_ns
    stamp = time.time() - (samples + monitor.history_length) * monitor.interval

    # Warm-up: fill the history ring (steady state), samples one interval apart.
    for _ in range(monitor.history_length):
        reading = monitor.sample()
        reading["time"] = stamp
        monitor.record(reading)
        stamp += monitor.interval
    nvml.calls.clear()  # the fake's call log, not the monitor's

    sample_ns: list[int] = []
    record_ns: list[int] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(samples):
        t0 = clock()
        reading = monitor.sample()
        t1 = clock()
        reading["time"] = stamp  # virtual clock: one interval later each time
        monitor.record(reading)
        t2 = clock()
        sample_ns.append(t1 - t0)
        record_ns.append(t2 - t1)
        stamp += monitor.interval
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0

    # Two parts of record(), alone: the busy rule and the Prometheus gauges.
    last, parts, reps = stamp - monitor.interval, {}, max(1, samples // 4)
    for name, call in (("is_busy", lambda: monitor.is_busy(last)),
                       ("gauges", lambda: metrics.update(monitor.latest))):
        t0 = time.process_time()
        for _ in range(reps):
            call()
        parts[name] = (time.process_time() - t0) / reps * 1e6
    assert monitor.latest["status"] == "ok", monitor.latest
    assert len(monitor.latest["gpus"]) == n_gpus
    assert len(monitor.history) == monitor.history_length
    total_ns = [a + b for a, b in zip(sample_ns, record_ns, strict=True)]
    window = sum(1 for s in monitor.history if s["time"] >= stamp - monitor.busy_window)
    return {
        "gpus": n_gpus,
        "cpu_us": cpu / samples * 1e6,
        "wall_us": wall / samples * 1e6,
        "p50_us": pct(total_ns, 0.5) / 1000,
        "p99_us": pct(total_ns, 0.99) / 1000,
        "sample_us": sum(sample_ns) / samples / 1000,
        "record_us": sum(record_ns) / samples / 1000,
        "nvml_calls": len(nvml.calls) / samples,
        "history": len(monitor.history),
        "window": window,
        "busy": monitor.busy,
        "busy_window": monitor.busy_window,
        "is_busy_us": parts["is_busy"],
        "gauges_us": parts["gauges"],
    }


def spawn_cost(n: int) -> dict[str, float]:
    """/bin/true through subprocess.run, output captured: the floor of any nvidia-smi call."""
    true = shutil.which("true") or "/bin/true"
    for _ in range(5):
        subprocess.run([true], capture_output=True, check=True)
    walls: list[float] = []
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([true], capture_output=True, check=True)
        walls.append(time.perf_counter() - t0)
    parent = time.process_time() - cpu0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    return {
        "path": true,
        "wall_us": sum(walls) / n * 1e6,
        "p50_us": pct(walls, 0.5) * 1e6,
        "p99_us": pct(walls, 0.99) * 1e6,
        "cpu_us": (parent + child) / n * 1e6,
        "parent_us": parent / n * 1e6,
        "child_us": child / n * 1e6,
    }


def share(cpu_us: float, interval: float = DEFAULT_INTERVAL) -> str:
    return f"{cpu_us / (interval * 1e6) * 100:.4f}% of one core"


def collector_bench(gpu_counts: list[int], samples: int, spawns: int) -> dict[str, str]:
    print(f"\n== collector: GpuMonitor.sample() + record() on FakeNvml, {samples} samples "
          f"per size, 2 processes per GPU, history full "
          f"({int(DEFAULT_HISTORY / DEFAULT_INTERVAL) + 1} samples), callbacks: Prometheus "
          f"gauges + activity mark", flush=True)
    print("   The fake NVML answers from Python objects: this is the monitor's Python-side "
          "cost only.\n   The real NVML calls (driver ioctls) come on top; "
          "tests/e2e/test_gpu_device.py measures them\n   on a GPU machine, against an nvidia-smi "
          "subprocess.")
    rows = [collector_run(n, samples) for n in gpu_counts]
    print(f"\n    {'GPUs':>4} {'CPU µs/sample':>14} {'µs/GPU':>8} {'wall µs':>8} "
          f"{'p50 µs':>7} {'p99 µs':>7} {'sample()':>9} {'record()':>9} {'NVML calls':>10}"
          f"   CPU at the default 1 s interval")
    for row in rows:
        print(f"    {row['gpus']:4d} {row['cpu_us']:14.1f} {row['cpu_us'] / row['gpus']:8.1f} "
              f"{row['wall_us']:8.1f} {row['p50_us']:7.1f} {row['p99_us']:7.1f} "
              f"{row['sample_us']:9.1f} {row['record_us']:9.1f} {row['nvml_calls']:10.0f}"
              f"   {share(row['cpu_us'])}")
    last = rows[-1]
    print("    sample() = the NVML reads; record() = history, busy rule, gauges, activity "
          "mark;\n    wall µs = mean wall per tick, p50/p99 of the same. Parts of record(), "
          "timed alone (CPU µs per call):")
    for row in rows:
        print(f"      {row['gpus']} GPU{'s' if row['gpus'] > 1 else ' '}  is_busy() "
              f"{row['is_busy_us']:6.1f}   Prometheus gauges (metrics.update) "
              f"{row['gauges_us']:6.1f}")
    print(f"    is_busy() scans the whole {last['history']}-sample ring to find the "
          f"{last['window']} samples in its {last['busy_window']:g} s window, whatever the "
          f"GPU count.", flush=True)

    spawn = spawn_cost(spawns)
    print(f"\n  subprocess floor: {spawns} x subprocess.run([{spawn['path']!r}], "
          f"capture_output=True)\n"
          f"    wall mean {spawn['wall_us']:.0f} µs (p50 {spawn['p50_us']:.0f}, p99 "
          f"{spawn['p99_us']:.0f}); CPU {spawn['cpu_us']:.0f} µs per spawn "
          f"({spawn['parent_us']:.0f} here + {spawn['child_us']:.0f} in the child) = "
          f"{share(spawn['cpu_us'])} at 1 spawn/s")
    print("    nvidia-smi's own start-up (it loads and initialises NVML on every run) comes "
          "on top of this floor.")
    print("\n  ratio one sample / one /bin/true spawn (lower: the in-process sample is "
          "cheaper):")
    for row in rows:
        print(f"    {row['gpus']} GPU{'s' if row['gpus'] > 1 else ' '}  "
              f"CPU {row['cpu_us'] / spawn['cpu_us']:.3f}   "
              f"wall {row['wall_us'] / spawn['wall_us']:.3f}   "
              f"(a spawn costs {spawn['cpu_us'] / row['cpu_us']:.0f}x the sample's CPU)")
    print(flush=True)

    result = {}
    for row in rows:
        result[f"{row['gpus']} GPU{'s' if row['gpus'] > 1 else ''} CPU per sample"] = (
            f"{row['cpu_us']:.1f} µs ({row['cpu_us'] / row['gpus']:.1f} µs/GPU), "
            f"{share(row['cpu_us'])} at 1 s")
    result["/bin/true spawn (floor)"] = (f"{spawn['wall_us']:.0f} µs wall, "
                                         f"{spawn['cpu_us']:.0f} µs CPU")
    for row in (rows[0], rows[-1]):
        result[f"sample/spawn CPU, {row['gpus']} GPU{'s' if row['gpus'] > 1 else ''}"] = (
            f"{row['cpu_us'] / spawn['cpu_us']:.3f} "
            f"(wall {row['wall_us'] / spawn['wall_us']:.3f})")
    result["scope"] = "Python side only (fake NVML); real NVML: tests/e2e/test_gpu_device.py"
    return result


# --- API ---------------------------------------------------------------------

def proc_cpu(pid: int) -> float:
    """utime + stime of a process, in seconds (clock ticks: 10 ms resolution)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server(MonitorServer):
    """The tests' `jupyter server` (tests/monitor_server.py) in a temporary folder: the
    bench's collector interval and history, ``gpus`` of fake_gpus(), and its CPU time."""

    headers = {"Authorization": f"token {TOKEN}"}

    def __init__(self, interval: float, history_entries: int, gpus: int):
        # history_seconds a half interval over, so float rounding cannot drop a slot
        history_seconds = (history_entries - 1 + 0.5) * interval
        super().__init__(Path(tempfile.mkdtemp(prefix="quota-monitor-bench-")),
                         {"gpus": [asdict(gpu) for gpu in fake_gpus(gpus)]},
                         {"NVIDIA_VISIBLE_DEVICES": "all"},
                         args=(f"--GpuMonitor.interval={interval}",
                               f"--GpuMonitor.history_seconds={history_seconds}"))

    def start_timed(self, timeout: float = 90) -> float:
        """Start it; the seconds until its first sample has read the fake GPUs."""
        begin = time.perf_counter()
        self.start().wait_ready(timeout)
        if self.metrics()["status"] != "ok":
            raise RuntimeError(f"the monitor reads no GPUs: {self.metrics()}")
        return time.perf_counter() - begin

    def cpu(self) -> float:
        assert self.proc is not None
        return proc_cpu(self.proc.pid)

    def history(self) -> tuple[int, int]:
        """(samples in the history, response bytes) of one GET ?history=1."""
        r = self.get("api/gpu/metrics?history=1")
        r.raise_for_status()
        return len(r.json()["history"]), len(r.content)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


class Poll:
    """Latencies (seconds), errors and sizes of one endpoint's requests."""

    def __init__(self, label: str):
        self.label = label
        self.latency: list[float] = []
        self.errors: list[str] = []
        self.sizes: list[int] = []
        self.wall = 0.0
        self.server_cpu = 0.0
        self.client_cpu = 0.0
        self.has_cpu = True  # False: the CPU columns mean nothing (requests within another run)
        self.others = 0  # requests made in the same run but counted in another Poll

    def add(self, other: Poll) -> None:
        self.latency += other.latency
        self.errors += other.errors
        self.sizes += other.sizes
        self.wall += other.wall
        self.server_cpu += other.server_cpu
        self.client_cpu += other.client_cpu

    @property
    def count(self) -> int:
        return len(self.latency)

    def ms(self, q: float) -> float:
        return pct(self.latency, q) * 1000 if self.latency else float("nan")

    def server_us(self, idle_share: float) -> float:
        """The server's CPU per request, less what the idle server (the collector) used."""
        n = self.count + len(self.errors) + self.others
        return max(0.0, self.server_cpu - idle_share * self.wall) / max(1, n) * 1e6

    def row(self, idle_share: float) -> str:
        if not self.latency:
            return f"    {self.label:<30} no requests; errors {len(self.errors)}"
        n = self.count + len(self.errors) + self.others
        size = sum(self.sizes) / len(self.sizes) if self.sizes else 0
        rate = f"{self.count / self.wall:7.0f}" if self.has_cpu else f"{'-':>7}"
        cpu = (f"{self.server_us(idle_share):8.0f} {self.client_cpu / n * 1e6:8.0f}"
               if self.has_cpu else f"{'-':>8} {'-':>8}")
        return (f"    {self.label:<30} {self.count:7d} {rate} "
                f"{self.ms(0.5):7.1f} {self.ms(0.99):7.1f} {max(self.latency) * 1000:7.1f} "
                f"{len(self.errors):6d} {size:9.0f} {cpu}")


HEADER = (f"    {'endpoint':<30} {'requests':>7} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'errors':>6} {'bytes':>9} {'srv µs/r':>8} {'cli µs/r':>8}")


def one_get(session: requests.Session, url: str, into: Poll) -> None:
    t0 = time.perf_counter()
    try:
        r = session.get(url, timeout=30)
        elapsed = time.perf_counter() - t0
        if r.status_code != 200:
            into.errors.append(f"HTTP {r.status_code}")
        else:
            into.latency.append(elapsed)
            into.sizes.append(len(r.content))
    except requests.RequestException as e:
        into.errors.append(type(e).__name__)


def poll(server: Server, label: str, clients: int, seconds: float,
         client_loop: Callable[[requests.Session, float, Poll, int], None]) -> Poll:
    """``clients`` threads run ``client_loop(session, deadline, into, i)`` at once."""
    results = [Poll(label) for _ in range(clients)]
    sessions = []
    for _ in range(clients):
        session = requests.Session()
        session.headers.update(server.headers)
        session.get(f"{server.origin}/api/status", timeout=30)  # open the connection
        sessions.append(session)
    barrier = threading.Barrier(clients + 1)
    span: dict[str, float] = {}

    def worker(i: int) -> None:
        barrier.wait()
        client_loop(sessions[i], span["deadline"], results[i], i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    cpu0, client0 = server.cpu(), time.process_time()
    begin = time.perf_counter()
    span["deadline"] = begin + seconds
    barrier.wait()
    for thread in threads:
        thread.join()
    merged = Poll(label)
    for result in results:
        merged.add(result)
    merged.wall = time.perf_counter() - begin
    merged.server_cpu = server.cpu() - cpu0
    merged.client_cpu = time.process_time() - client0
    for session in sessions:
        session.close()
    return merged


def flat_out(url: str) -> Callable[[requests.Session, float, Poll, int], None]:
    def loop(session: requests.Session, deadline: float, into: Poll, _i: int) -> None:
        while time.perf_counter() < deadline:
            one_get(session, url, into)
    return loop


def page_like(server: Server, period: float, loads: Poll,
              ) -> Callable[[requests.Session, float, Poll, int], None]:
    """As the page: ?history=1 once on load, then the plain JSON every ``period``."""
    metrics_url = f"{server.origin}/api/gpu/metrics"
    lock = threading.Lock()

    def loop(session: requests.Session, deadline: float, into: Poll, i: int) -> None:
        rng = random.Random(i)
        start = time.perf_counter() + rng.uniform(0, period)  # pages open at different times
        time.sleep(max(0.0, start - time.perf_counter()))
        load = Poll(loads.label)
        one_get(session, metrics_url + "?history=1", load)
        with lock:
            loads.add(load)
        tick = start + period
        while tick < deadline:
            time.sleep(max(0.0, tick - time.perf_counter()))
            one_get(session, metrics_url, into)
            tick += period
            while tick < time.perf_counter():  # setInterval does not queue missed ticks
                tick += period
    return loop


def api_bench(clients: int, seconds: float, page_seconds: float, period: float,
              interval: float, history_entries: int, idle: float, settle: float = 2.0,
              ) -> dict[str, str]:
    server = Server(interval, history_entries, gpus=2)
    load = os.getloadavg()
    print(f"\n== API: jupyter server + spawner.notebook.monitor, fake pynvml with 2 GPUs, "
          f"collector "
          f"every {interval:g} s keeping {history_entries} samples; {clients} clients "
          f"(threads); {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}", flush=True)
    try:
        ready = server.start_timed()
        print(f"  server ready in {ready:.1f}s on {server.origin} (pid {server.proc.pid}), "
              f"state in {server.workdir}", flush=True)

        time.sleep(settle)  # jupyterlab and jupyter_lsp finish starting after "ready"
        cpu0, wall0 = server.cpu(), time.perf_counter()
        time.sleep(idle)
        idle_share = (server.cpu() - cpu0) / (time.perf_counter() - wall0)
        ticks = 1 / interval
        print(f"  idle server (collector at {ticks:g} Hz, whole tick with thread hop and the "
              f"fake module's file check): {idle_share * 100:.1f}% of a core, "
              f"~{idle_share / ticks * 1e6:.0f} µs per tick (10 ms /proc resolution)",
              flush=True)

        metrics_url = f"{server.origin}/api/gpu/metrics"
        status_url = f"{server.origin}/api/status"
        fast = {"metrics": Poll("GET /api/gpu/metrics"), "status": Poll("GET /api/status")}
        urls = {"metrics": metrics_url, "status": status_url}
        half = seconds / 2
        for name in ("metrics", "status", "status", "metrics"):  # ABBA: drift hits both
            fast[name].add(poll(server, fast[name].label, clients, half, flat_out(urls[name])))
        print(f"\n  as fast as they can, {seconds:g}s per endpoint (two ABBA rounds of "
              f"{half:g}s):\n{HEADER}")
        for p in fast.values():
            print(p.row(idle_share))
        ratio50 = fast["metrics"].ms(0.5) / fast["status"].ms(0.5)
        ratio99 = fast["metrics"].ms(0.99) / fast["status"].ms(0.99)
        cpu_ratio = (fast["metrics"].server_us(idle_share)
                     / max(1e-9, fast["status"].server_us(idle_share)))
        print(f"    ratio metrics / status: p50 {ratio50:.2f}, p99 {ratio99:.2f}; "
              f"throughput {fast['metrics'].count / fast['status'].count:.2f}; "
              f"server CPU per request {cpu_ratio:.2f}")
        client_us = fast["status"].client_cpu / max(1, fast["status"].count) * 1e6
        if client_us > fast["status"].server_us(idle_share):
            print("    the clients spent more CPU per request than the server: with "
                  f"{os.cpu_count()} CPUs they, not the server, set the pace, and latency "
                  "includes their wait for the GIL", flush=True)

        page = loads = None
        if page_seconds > 0:
            loads = Poll("  page load: ?history=1")
            page = poll(server, f"page rate: every {period:g}s", clients, page_seconds,
                        page_like(server, period, loads))
            print(f"\n  at the page's rate ({clients} pages, each one ?history=1 on load, "
                  f"then the JSON every {period:g}s, for {page_seconds:g}s):\n{HEADER}")
            loads.has_cpu = False  # spread over the page run, and counted in it
            page.others = loads.count + len(loads.errors)
            print(page.row(idle_share))
            print(loads.row(idle_share))

        entries, size = server.history()
        wait_begin = time.perf_counter()
        fill_deadline = wait_begin + history_entries * interval * 3 + 30
        while entries < history_entries and time.perf_counter() < fill_deadline:
            time.sleep(min(1.0, (history_entries - entries) * interval))
            entries, size = server.history()
        waited = time.perf_counter() - wait_begin
        full = "full" if entries >= history_entries else f"NOT full ({entries} samples)"
        hist = Poll(f"GET ?history=1 ({entries} samp.)")
        hist.add(poll(server, hist.label, clients, seconds, flat_out(metrics_url + "?history=1")))
        print(f"\n  ?history=1 once the history is {full} (waited {waited:.0f}s for it), "
              f"{seconds:g}s as fast as they can:\n{HEADER}")
        print(hist.row(idle_share))
        h50 = hist.ms(0.5) / fast["status"].ms(0.5)
        h99 = hist.ms(0.99) / fast["status"].ms(0.99)
        print(f"    response {size:,} bytes for {entries} samples x 2 GPUs "
              f"({size / max(1, entries):.0f} bytes per sample); ratio to /api/status: "
              f"p50 {h50:.2f}, p99 {h99:.2f}; to the plain JSON: "
              f"p50 {hist.ms(0.5) / fast['metrics'].ms(0.5):.2f}", flush=True)
        errors = sum(len(p.errors) for p in (*fast.values(), hist, *(
            [page, loads] if page else [])))
        if errors:
            kinds: dict[str, int] = {}
            for p in (*fast.values(), hist, *([page, loads] if page else [])):
                for e in p.errors:
                    kinds[e] = kinds.get(e, 0) + 1
            print(f"    errors: {kinds}")
        print("  latency is measured in the client threads (they share this machine's "
              "CPUs with the server, and the GIL among themselves); srv µs/r is the "
              "server's CPU per request\n  from /proc (10 ms ticks) less the idle server's; "
              "cli µs/r is the clients' CPU per request.",
              flush=True)
    finally:
        server.stop()

    def line(p: Poll) -> str:
        return (f"p50 {p.ms(0.5):.1f} / p99 {p.ms(0.99):.1f} / max "
                f"{max(p.latency, default=float('nan')) * 1000:.1f} ms, {p.count} req, "
                f"{len(p.errors)} errors")

    result = {
        f"metrics, {clients} clients flat out": line(fast["metrics"]),
        f"status, {clients} clients flat out": line(fast["status"]),
        "metrics / status": f"p50 {ratio50:.2f}, p99 {ratio99:.2f}, server CPU {cpu_ratio:.2f}",
        "server CPU per request": (f"metrics {fast['metrics'].server_us(idle_share):.0f} µs, "
                                   f"status {fast['status'].server_us(idle_share):.0f} µs, "
                                   f"?history=1 {hist.server_us(idle_share):.0f} µs"),
    }
    if page is not None:
        result[f"metrics at page rate ({period:g}s)"] = line(page)
    result[f"?history=1 ({entries} samples)"] = line(hist)
    result["?history=1 / status"] = f"p50 {h50:.2f}, p99 {h99:.2f}; {size:,} bytes"
    result["idle server (collector)"] = f"{idle_share * 100:.1f}% of a core at {ticks:g} Hz"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collector", action="store_true", help="only the collector part")
    parser.add_argument("--api", action="store_true", help="only the API part")
    parser.add_argument("--samples", type=int, default=2000,
                        help="timed samples per GPU count (default 2000)")
    parser.add_argument("--gpus", default="1,4,8", help="GPU counts (default 1,4,8)")
    parser.add_argument("--spawns", type=int, default=200,
                        help="/bin/true spawns timed (default 200)")
    parser.add_argument("--clients", type=int, default=20,
                        help="concurrent API clients (default 20)")
    parser.add_argument("--seconds", type=float, default=10,
                        help="seconds of flat-out polling per endpoint (default 10)")
    parser.add_argument("--page-seconds", type=float, default=20,
                        help="seconds of polling at the page's rate; 0 skips it (default 20)")
    parser.add_argument("--page-period", type=float, default=page_period(DEFAULT_INTERVAL),
                        help="the page's poll period (default %(default)gs: what the page "
                             "uses at the default 1 s interval)")
    parser.add_argument("--interval", type=float, default=0.05,
                        help="the server's GpuMonitor.interval (default 0.05s)")
    parser.add_argument("--history-entries", type=int,
                        default=int(DEFAULT_HISTORY / DEFAULT_INTERVAL) + 1,
                        help="samples the server keeps (default %(default)s: a full "
                             "15-minute history at 1 s)")
    parser.add_argument("--idle", type=float, default=5,
                        help="seconds the idle server's CPU is measured (default 5)")
    args = parser.parse_args()
    both = not (args.collector or args.api)
    parts: list[tuple[str, Callable[[], dict[str, str]]]] = []
    if args.collector or both:
        counts = [int(n) for n in args.gpus.split(",")]
        parts.append(("collector", lambda: collector_bench(counts, args.samples, args.spawns)))
    if args.api or both:
        parts.append(("API", lambda: api_bench(
            args.clients, args.seconds, args.page_seconds, args.page_period, args.interval,
            args.history_entries, args.idle)))
    run_parts("monitor_bench", parts, lambda: "; load average now {:.2f} {:.2f} {:.2f} on {} "
              "CPUs".format(*os.getloadavg(), os.cpu_count()))


if __name__ == "__main__":
    main()
