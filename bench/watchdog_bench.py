"""The watchdog: CPU per cycle with 8 GPUs and 50 servers, and alert latency to a receiver.

Two parts, both run unless one is chosen:

--cycle    50 REAL containers on the test engine (quota-spawner/base:local running
           ``sleep 3600``, named wdbench-NN, labelled as the spawner labels its
           containers, with a hub id of the bench's own, 64 MiB and half a CPU each),
           shared 7 ways over 8 FAKE GPUs: each container's main host PID is in the
           fake NVML's process list, so the PID-to-container mapping reads the real
           /proc/PID/cgroup, and each container's real cgroup is read. A
           ``QuotaWatchdog`` is built in this process with tests/fake_pynvml.py's
           FakeNvml in place of the NVML binding and no hub (``hub_api_url`` empty:
           ``HubDirectory.refresh`` returns at once) and runs ``cycle()`` itself:
           the engine, NVML and cgroup reads in a thread, the rules, the gauges and
           the incident file. Timed: this process's CPU (``time.process_time``, every
           thread) and wall time per cycle,
             - steady cycles: the engine's container list only, as in most cycles
               (``Containers`` inspects a container when first seen and again every
               ``refresh`` = 60 s);
             - inspect cycles (``refresh`` 0): the list and 50 inspects each time;
             - the mean at a 5 s interval, one inspect cycle in 12: the target
               (< 2% of one core, i.e. < 100 ms of CPU per cycle) is checked on it.
           Then the same cycles again, each part timed where it is called: the
           engine (list + inspect, the Docker client's side), /proc and cgroups,
           NVML (the fake: its Python side only, real NVML is measured on a GPU
           machine), rules, metrics, the incident file, and the rest. The engine's
           own CPU (dockerd answering) is not in this process: it is read from
           /proc for dockerd and shown apart (others may be using the engine too).
           The comparison is the least an nvidia-smi-polling script pays per cycle:
           one ``subprocess.run(["/bin/true"])`` (monitor_bench's spawn floor: no
           nvidia-smi here, and its own NVML start-up comes on top), without the
           ``docker ps``/``docker inspect`` such a script needs for the mapping.

--latency  The watchdog as a process (``python -m spawner.watchdog``, as
           tests/e2e/test_e2e_watchdog.py runs it, without a hub), every 1 s, with
           ``memory_hold`` 5 s and one json:// channel to a real local HTTP receiver
           (tests/receivers.HttpReceiver); the fake NVML module first on its path,
           with no GPUs. One real container (256 MiB) in which a python3 process
           grows the working set to 86% of the limit (sized from the working set
           ``CgroupReader`` reads), touching every page, and writes the time it
           finished: the crossing (the container's clock is the host's; the
           crossing of 80% lies within the allocation, whose duration is shown).
           The alert time is when the receiver got the message. Each round then
           kills the allocation and waits for the resolved message, and the next
           one starts at a random phase of the watchdog's cycle. Target:
           hold + 2 cycles.

    .venv/bin/python bench/watchdog_bench.py                 # both parts (about 2 minutes)
    .venv/bin/python bench/watchdog_bench.py --cycle --cycles 100
    .venv/bin/python bench/watchdog_bench.py --latency --rounds 10

Needs the test engine (scripts/test-dockerd.sh) and quota-spawner/base:local; no
GPU. Every container it makes is removed at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean, median
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import docker  # noqa: E402
from baseline import pct, run_parts  # noqa: E402
from monitor_bench import spawn_cost  # noqa: E402
from receivers import HttpReceiver, Request  # noqa: E402

from fake_pynvml import FakeGpu, FakeNvml  # noqa: E402
from harness import (  # noqa: E402
    TEST_DOCKER_HOST,
    WatchdogProcess,
    install_fake_nvml,
    write_fake_nvml_state,
)
from spawner.contract import (  # noqa: E402
    GPU_MEMORY_LIMIT,
    GPU_MODE_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    IMAGE_LABEL,
    ROLE_LABEL,
    USER_LABEL,
)
from spawner.gpu.nvml import Nvml, XidWatcher  # noqa: E402
from spawner.watchdog import app as watchdog_app  # noqa: E402
from spawner.watchdog.app import QuotaWatchdog  # noqa: E402
from spawner.watchdog.containers import server_from_inspect  # noqa: E402
from spawner.watchdog.host import CgroupReader  # noqa: E402
from spawner.watchdog.hub_api import HubDirectory  # noqa: E402

PREFIX = "wdbench-"
HUB_ID = "wdbench-hub"  # the bench's containers only: the watchdog and the clean-up go by it
IMAGE = "quota-spawner/base:local"
MiB, GiB = 1 << 20, 1 << 30
GPU_MEMORY = 80 * GiB
SHARE = 7  # servers per GPU at most: 50 over 8 GPUs
INTERVAL = 5.0  # QuotaWatchdog.interval's default
REFRESH = 60.0  # Containers.refresh's default: each container inspected once a minute
TARGET_SHARE = 0.02  # of one core at INTERVAL
HIGH, ALLOCATE = 0.80, 0.86  # WatchdogRules.memory_high's default; where the allocation goes


def engine() -> docker.DockerClient:
    return docker.DockerClient(base_url=TEST_DOCKER_HOST, version="auto")


def remove_all(client: docker.DockerClient) -> int:
    """Remove every container of the bench (its hub label or its name prefix)."""
    found = {c.id: c for c in client.containers.list(
        all=True, filters={"label": f"{HUB_LABEL}={HUB_ID}"})}
    found.update({c.id: c for c in client.containers.list(all=True, filters={"name": PREFIX})
                  if c.name.startswith(PREFIX)})

    def remove(container: Any) -> None:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(remove, found.values()))
    return len(found)


def labels(user: str, gpu: str = "", mode: str = "") -> dict[str, str]:
    """The labels the spawner writes, for the bench's hub."""
    return {USER_LABEL: user, ROLE_LABEL: "lab" if gpu else "small", IMAGE_LABEL: "base",
            HUB_LABEL: HUB_ID, GPUS_LABEL: gpu, GPU_MODE_LABEL: mode}


def run_container(client: docker.DockerClient, name: str, command: list[str],
                  memory: int, gpu: str = "", mode: str = "",
                  env: dict[str, str] | None = None) -> tuple[Any, int]:
    """A running container and its main process's host PID."""
    container = client.containers.run(
        IMAGE, command, name=name, detach=True, labels=labels(name, gpu, mode),
        environment=env or {}, mem_limit=memory, memswap_limit=memory,
        cpu_period=100_000, cpu_quota=50_000)  # half a CPU, as DockerSpawner writes it
    container.reload()
    return container, int(container.attrs["State"]["Pid"])


def _bail(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # through the finally blocks: the containers go


# --- cycle ---------------------------------------------------------------------------


def start_servers(client: docker.DockerClient, n: int, gpus: list[str],
                  cap: int) -> list[tuple[Any, int, str]]:
    """n sleeping containers, in parallel; (container, host PID, GPU) each."""
    def one(i: int) -> tuple[Any, int, str]:
        gpu = gpus[i % len(gpus)]
        container, pid = run_container(
            client, f"{PREFIX}{i:02d}", ["sleep", "3600"], 64 * MiB, gpu, f"shared:{SHARE}",
            {GPU_MEMORY_LIMIT: str(cap)})
        return container, pid, gpu

    pool = ThreadPoolExecutor(8)
    try:
        return list(pool.map(one, range(n)))
    finally:  # on Ctrl-C too: nothing still being created once the clean-up runs
        pool.shutdown(wait=True, cancel_futures=True)


def fake_gpus(uuids: list[str], servers: list[tuple[Any, int, str]], cap: int) -> list[FakeGpu]:
    """The 8 GPUs, each listing its servers' main PIDs; one server in 7 at 95% of its
    cap (a pending GPU memory alert), half the GPUs idle (pending waste notices)."""
    fractions = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.95)  # of the cap; len == SHARE
    gpus = []
    for i, uuid in enumerate(uuids):
        processes = [(pid, int(cap * fractions[j % SHARE]))
                     for j, (_, pid, gpu) in enumerate(servers) if gpu == uuid]
        gpus.append(FakeGpu(uuid, name="NVIDIA H100 80GB HBM3", memory=GPU_MEMORY,
                            used=sum(p[1] for p in processes),
                            utilization=70 if i % 2 == 0 else 0, processes=processes))
    return gpus


def make_watchdog(state_file: Path, gpus: list[FakeGpu]) -> QuotaWatchdog:
    watchdog = QuotaWatchdog()
    watchdog.initialize([f"--QuotaWatchdog.hub_id={HUB_ID}", "--QuotaWatchdog.metrics_port=0",
                         f"--QuotaWatchdog.state_file={state_file}",
                         f"--QuotaWatchdog.docker_host={TEST_DOCKER_HOST}",
                         "--Application.log_level=ERROR"])
    watchdog.dcgm_mapping_dir = ""
    watchdog.hub = HubDirectory("", "", watchdog.log)  # no hub: refresh() returns at once
    watchdog.nvml = Nvml(FakeNvml(gpus))  # FAKE: the host's NVML boundary only
    watchdog.xids = XidWatcher(watchdog.nvml, log=watchdog.log)
    watchdog._sending, watchdog._saved = set(), ""  # what run() sets up for cycle()
    return watchdog


class Split:
    """Each part's process CPU, timed where the watchdog calls it."""

    PARTS = ("engine", "/proc+cgroup", "NVML (fake)", "rules", "metrics", "incident file")

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(self.PARTS, 0.0)
        self._undo: list[Callable[[], None]] = []

    def wrap(self, part: str, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        had = name in getattr(owner, "__dict__", {})

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.cpu[part] += time.process_time() - t0

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original) if had
                          else delattr(owner, name))

    def install(self, watchdog: QuotaWatchdog) -> None:
        client = watchdog.containers.client
        self.wrap("engine", client, "containers")
        self.wrap("engine", client, "inspect_container")
        self.wrap("/proc+cgroup", watchdog.cgroups, "read")
        self.wrap("/proc+cgroup", watchdog_app, "gpu_memory_by_container")
        self.wrap("NVML (fake)", watchdog.nvml, "host_gpus")
        self.wrap("NVML (fake)", watchdog.xids, "poll")
        self.wrap("rules", watchdog.book, "evaluate")
        self.wrap("metrics", watchdog.metrics, "update")
        self.wrap("incident file", watchdog.book, "save")

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


def dockerd_cpu() -> float | None:
    """The test engine's dockerd CPU seconds so far, from /proc; None when unknown."""
    try:
        pid = int(Path("/run/quota-spawner-test/docker.pid").read_text())
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def timed_cycles(watchdog: QuotaWatchdog, n: int) -> tuple[list[float], list[float]]:
    """n cycles back to back: process CPU and wall seconds of each."""
    cpus, walls = [], []
    for _ in range(n):
        c0, w0 = time.process_time(), time.perf_counter()
        await watchdog.cycle()
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0)
    nvml = watchdog.nvml.module
    nvml.calls.clear()  # the fake's call log, not the watchdog's
    return cpus, walls


async def measure(watchdog: QuotaWatchdog, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["first"] = await timed_cycles(watchdog, 1)  # inspects all, locates every cgroup
    await timed_cycles(watchdog, 2)  # warm: every CpuMeter has a previous reading
    for kind, refresh in (("steady", REFRESH), ("inspect", 0.0)):
        watchdog.containers.refresh = refresh
        d0 = dockerd_cpu()
        out[kind] = await timed_cycles(watchdog, n)
        d1 = dockerd_cpu()
        out[f"{kind} dockerd"] = None if d0 is None or d1 is None else (d1 - d0) / n
    for kind, refresh in (("steady", REFRESH), ("inspect", 0.0)):
        watchdog.containers.refresh = refresh
        split = Split()
        split.install(watchdog)
        try:
            cpus, _ = await timed_cycles(watchdog, n)
        finally:
            split.remove()
        out[f"{kind} split"] = {part: cpu / n for part, cpu in split.cpu.items()}
        out[f"{kind} split"]["rest"] = sum(cpus) / n - sum(split.cpu.values()) / n
    watchdog.containers.refresh = REFRESH
    snapshot = await asyncio.to_thread(watchdog.collect)
    out["snapshot"] = snapshot
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def cycle_bench(n_servers: int, n_gpus: int, cycles: int, spawns: int) -> dict[str, str]:
    print(f"\n== cycle: QuotaWatchdog.cycle() in this process, {n_servers} real containers, "
          f"{n_gpus} FAKE GPUs shared up to {SHARE} ways, {cycles} cycles of each kind",
          flush=True)
    client = engine()
    left = remove_all(client)
    if left:
        print(f"   removed {left} containers an earlier run left behind")
    uuids = [f"GPU-wdbench-{i:04d}-0000-0000-{i:012x}" for i in range(n_gpus)]
    cap = GPU_MEMORY // SHARE
    work = Path(tempfile.mkdtemp(prefix="wdbench-"))
    try:
        t0 = time.perf_counter()
        servers = start_servers(client, n_servers, uuids, cap)
        print(f"   {len(servers)} containers started in {time.perf_counter() - t0:.1f}s "
              f"(8 threads)", flush=True)
        watchdog = make_watchdog(work / "incidents.json", fake_gpus(uuids, servers, cap))
        result = asyncio.run(measure(watchdog, cycles))
    finally:
        t0 = time.perf_counter()
        removed = remove_all(client)
        print(f"   removed {removed} containers in {time.perf_counter() - t0:.1f}s", flush=True)
        shutil.rmtree(work, ignore_errors=True)

    snapshot = result["snapshot"]
    mapped = sum(1 for s in snapshot.servers.values() if s.gpu_memory)
    with_memory = sum(1 for s in snapshot.servers.values() if s.memory_working_set is not None)
    with_cpu = sum(1 for s in snapshot.servers.values() if s.cpu_used is not None)
    print(f"   last snapshot: {len(snapshot.servers)} servers, {len(snapshot.gpus)} GPUs; "
          f"GPU memory mapped by PID for {mapped}, working set read for {with_memory}, "
          f"CPU for {with_cpu}")
    if mapped != n_servers or with_memory != n_servers:
        print("   !! not every server was mapped and read: the numbers below are not of "
              "the full load")

    steady_cpu, steady_wall = result["steady"]
    inspect_cpu, inspect_wall = result["inspect"]
    every = REFRESH / INTERVAL  # cycles per inspect cycle at the default settings
    amortized = (mean(steady_cpu) * (every - 1) + mean(inspect_cpu)) / every
    amortized_wall = (mean(steady_wall) * (every - 1) + mean(inspect_wall)) / every
    share = amortized / INTERVAL
    spawn = spawn_cost(spawns)
    floor = spawn["cpu_us"] / 1e6

    print(f"\n    {'cycles':<30} {'CPU p50':>9} {'CPU p95':>9} {'CPU mean':>9} "
          f"{'wall p50':>9} {'wall p95':>9}   dockerd CPU/cycle")
    first_cpu, first_wall = result["first"]
    for label, cpus, walls, dockerd in (
            ("first (inspect + locate)", first_cpu, first_wall, None),
            ("steady (list only)", steady_cpu, steady_wall, result["steady dockerd"]),
            (f"inspect (list + {n_servers} inspects)", inspect_cpu, inspect_wall,
             result["inspect dockerd"])):
        print(f"    {label:<30} {ms(pct(cpus, 0.5)):>9} {ms(pct(cpus, 0.95)):>9} "
              f"{ms(mean(cpus)):>9} {ms(pct(walls, 0.5)):>9} {ms(pct(walls, 0.95)):>9}   "
              f"{'-' if dockerd is None else ms(dockerd)}")
    print(f"    at a {INTERVAL:g} s interval, one inspect cycle in {every:g}: "
          f"{ms(amortized)} CPU ({ms(amortized_wall)} wall) per cycle = "
          f"{share * 100:.2f}% of one core (target < {TARGET_SHARE * 100:g}%: "
          f"< {ms(TARGET_SHARE * INTERVAL)} per cycle)")
    print("    CPU is this process's, every thread; dockerd's answers to the list and the "
          "inspects are not in it\n    (its column: dockerd's CPU from /proc over the same "
          "cycles, 10 ms ticks, with whatever else the engine did).")

    print(f"\n    where the CPU goes, per cycle (each part timed where it is called; "
          f"{cycles} cycles each):")
    print(f"      {'part':<16} {'steady':>9} {'inspect':>9}")
    for part in (*Split.PARTS, "rest"):
        print(f"      {part:<16} {ms(result['steady split'][part]):>9} "
              f"{ms(result['inspect split'][part]):>9}")
    print("      engine = the Docker client's side of list + inspect (HTTP, JSON); "
          "NVML (fake) = the fake's\n      Python answers and the watchdog's reading of them, "
          "no driver; rest = the thread hop,\n      the CPU meter, the snapshot, the loop.")

    print(f"\n  subprocess floor: {spawns} x subprocess.run([{spawn['path']!r}], "
          f"capture_output=True): {spawn['cpu_us']:.0f} µs CPU ({spawn['parent_us']:.0f} "
          f"here + {spawn['child_us']:.0f} in the child), {spawn['wall_us']:.0f} µs wall")
    print("    what an nvidia-smi-polling script pays per cycle at least, before nvidia-smi "
          "starts NVML, and\n    before the docker ps / docker inspect it needs to know "
          "whose PIDs they are.")
    nvml_part = result["steady split"]["NVML (fake)"]
    print(f"  ratio watchdog cycle / one spawn (CPU): {amortized / floor:.2f}; NVML part "
          f"alone / one spawn: {nvml_part / floor:.3f}", flush=True)
    ok = share < TARGET_SHARE
    return {
        "servers, GPUs": f"{n_servers} real containers, {n_gpus} fake GPUs "
                         f"({mapped} mapped by PID)",
        "steady cycle CPU": f"p50 {ms(pct(steady_cpu, 0.5))}, p95 {ms(pct(steady_cpu, 0.95))}"
                            f"; wall p50 {ms(pct(steady_wall, 0.5))}",
        "inspect cycle CPU": f"p50 {ms(pct(inspect_cpu, 0.5))}, "
                             f"p95 {ms(pct(inspect_cpu, 0.95))}; wall p50 "
                             f"{ms(pct(inspect_wall, 0.5))}",
        f"per cycle at {INTERVAL:g} s": f"{ms(amortized)} CPU = {share * 100:.2f}% of one core",
        "ratio to target (2%)": f"{share / TARGET_SHARE:.2f}  {'ok' if ok else 'MISSED'}",
        "ratio to one /bin/true spawn": f"{amortized / floor:.2f} (floor "
                                        f"{spawn['cpu_us']:.0f} µs CPU)",
        "not counted": "dockerd's side of list/inspect; real NVML (GPU machine)",
    }


# --- latency --------------------------------------------------------------------------


class TimedReceiver(HttpReceiver):
    """The tests' HTTP receiver, noting when each request arrived (host clock)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.arrived: dict[int, float] = {}

    def _record(self, request: Request) -> None:
        self.arrived[id(request)] = time.time()
        super()._record(request)

    def messages(self, kind: str, user: str) -> list[tuple[float, dict[str, Any]]]:
        """(arrival, body) of the memory rule's messages about ``user`` of this kind."""
        found = []
        for r in list(self.requests):
            body = r.body if isinstance(r.body, dict) else {}
            text, title = body.get("message", ""), body.get("title", "")
            if "Incident: memory:" not in text or f"Who: {user} (" not in text:
                continue
            got = ("resolve" if title.startswith("[resolved]")
                   else "remind" if "] still:" in title else "open")
            if got == kind:
                found.append((self.arrived[id(r)], body))
        return found

    def wait_for(self, kind: str, user: str, count: int, timeout: float) -> float | None:
        """The arrival of the count-th such message; None when it did not come in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.messages(kind, user)
            if len(found) >= count:
                return found[count - 1][0]
            time.sleep(0.01)
        return None


ALLOCATOR = """\
import os, sys, time
grow = int(sys.argv[1])
t0 = time.time()
b = bytearray(grow)
b[::4096] = b"x" * len(range(0, grow, 4096))  # every page touched: in the working set
t1 = time.time()
open("/tmp/alloc.pid", "w").write(str(os.getpid()))
open("/tmp/alloc.done.tmp", "w").write(f"{t0!r} {t1!r}")
os.rename("/tmp/alloc.done.tmp", "/tmp/alloc.done")
time.sleep(3600)
"""


def allocation_done(container: Any, timeout: float = 60) -> tuple[float, float]:
    """(start, end) of the allocation, the container's clock (the host's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, out = container.exec_run(["cat", "/tmp/alloc.done"])
        if code == 0:
            t0, t1 = out.decode().split()
            return float(t0), float(t1)
        time.sleep(0.05)
    raise RuntimeError("The allocation did not finish")


def latency_bench(rounds: int, interval: float, hold: float) -> dict[str, str]:
    target = hold + 2 * interval
    memory = 256 * MiB
    name = f"{PREFIX}mem"
    print(f"\n== latency: threshold crossing to the message at a real HTTP receiver; the "
          f"watchdog as a process, every {interval:g} s, memory_hold {hold:g} s; a real "
          f"container ({memory // MiB} MiB), {rounds} rounds", flush=True)
    client = engine()
    left = remove_all(client)
    if left:
        print(f"   removed {left} containers an earlier run left behind")
    work = Path(tempfile.mkdtemp(prefix="wdbench-"))
    (work / "nvml").mkdir()
    fake = install_fake_nvml(work / "nvml")
    write_fake_nvml_state(fake, {"gpus": []})
    latencies: list[float] = []
    resolves: list[float] = []
    rows: list[str] = []
    watchdog: WatchdogProcess | None = None
    try:
        with TimedReceiver() as http:
            config = f"""
c.WatchdogRules.memory_hold = {hold}
c.Notifier.retry_delay = 0.2
c.Notifier.timeout = 3
c.Notifier.channels = [{{"name": "webhook", "url": "json://{http.base[len('http://'):]}/hook"}}]
"""
            container, _ = run_container(client, name, ["sleep", "3600"], memory)
            server = server_from_inspect(client.api.inspect_container(container.id))
            assert server is not None
            reader = CgroupReader()
            watchdog = WatchdogProcess(work, fake, config, interval,
                                       env={"QUOTA_SPAWNER_HUB_ID": HUB_ID})
            watchdog.start()
            time.sleep(2 * interval)  # it has seen the container, and read its cgroup
            for r in range(1, rounds + 1):
                before = reader.read(server).working_set or 0
                grow = int(ALLOCATE * memory) - before
                container.exec_run(["python3", "-c", ALLOCATOR, str(grow)], detach=True)
                began, crossed = allocation_done(container)
                now_set = reader.read(server).working_set or 0
                arrived = http.wait_for("open", name, r, timeout=target + 30)
                if arrived is None:
                    raise RuntimeError(f"No alert in round {r}:\n{watchdog.log()[-3000:]}")
                latencies.append(arrived - crossed)
                time.sleep(random.uniform(0, interval))  # the free at a random phase too
                code, out = container.exec_run(["sh", "-c", "kill $(cat /tmp/alloc.pid) && "
                                                "rm /tmp/alloc.done /tmp/alloc.pid"])
                freed = time.time()
                if code != 0:
                    raise RuntimeError(f"Could not end the allocation: {out!r}")
                resolved = http.wait_for("resolve", name, r, timeout=30)
                if resolved is None:
                    raise RuntimeError(f"No resolve in round {r}:\n{watchdog.log()[-3000:]}")
                resolves.append(resolved - freed)
                row = (f"    round {r}: working set {before / MiB:.0f} -> "
                       f"{now_set / MiB:.0f} MiB ({now_set / memory:.0%} of "
                       f"{memory // MiB} MiB), allocation {ms(crossed - began)}; alert "
                       f"{latencies[-1]:.2f} s after; resolved {resolves[-1]:.2f} s after "
                       f"the free")
                rows.append(row)
                print(row, flush=True)
                # A random phase against the watchdog's cycle: rounds must not lock
                # onto it (each round starts right after a resolve, itself a cycle).
                time.sleep(interval + random.uniform(0, interval))
            opened = len(http.messages("open", name))
    finally:
        if watchdog is not None:
            watchdog.stop()
        remove_all(client)
        shutil.rmtree(work, ignore_errors=True)

    worst, middle = max(latencies), median(latencies)
    ok = worst <= target
    print(f"\n    alert latency: median {middle:.2f} s, max {worst:.2f} s, target hold + 2 "
          f"cycles = {target:g} s; ratio (max) {worst / target:.2f} "
          f"{'ok' if ok else 'MISSED'}")
    print(f"    resolve latency (free to resolved message, no hold): median "
          f"{median(resolves):.2f} s, max {max(resolves):.2f} s")
    print(f"    {opened} alerts for {rounds} incidents (one per incident). The crossing of "
          f"{HIGH:.0%} lies within the allocation,\n    so the latency from the crossing is "
          "at most the allocation's duration longer than shown.", flush=True)
    return {
        "alert latency": f"median {middle:.2f} s, max {worst:.2f} s ({rounds} rounds)",
        "target (hold + 2 cycles)": f"{target:g} s (hold {hold:g} s, cycle {interval:g} s)",
        "ratio max / target": f"{worst / target:.2f}  {'ok' if ok else 'MISSED'}",
        "ratio median / target": f"{middle / target:.2f}",
        "resolve latency": f"median {median(resolves):.2f} s, max {max(resolves):.2f} s",
        "alerts per incident": f"{opened}/{rounds}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycle", action="store_true", help="only the CPU-per-cycle part")
    parser.add_argument("--latency", action="store_true", help="only the alert-latency part")
    parser.add_argument("--servers", type=int, default=50, help="containers (default 50)")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs (default 8)")
    parser.add_argument("--cycles", type=int, default=40,
                        help="timed cycles of each kind (default 40)")
    parser.add_argument("--spawns", type=int, default=200,
                        help="/bin/true spawns timed (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="latency rounds (default 5)")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="the watchdog's interval in the latency part (default 1 s)")
    parser.add_argument("--hold", type=float, default=5.0,
                        help="memory_hold in the latency part (default 5 s)")
    args = parser.parse_args()
    if args.servers > args.gpus * SHARE:
        parser.error(f"at most {SHARE} servers per GPU")
    signal.signal(signal.SIGTERM, _bail)
    both = not (args.cycle or args.latency)
    parts: list[tuple[str, Callable[[], dict[str, str]]]] = []
    if args.cycle or both:
        parts.append(("cycle", lambda: cycle_bench(args.servers, args.gpus, args.cycles,
                                                   args.spawns)))
    if args.latency or both:
        parts.append(("latency", lambda: latency_bench(args.rounds, args.interval, args.hold)))
    run_parts("watchdog_bench", parts, lambda: "; load average now {:.2f} {:.2f} {:.2f} on {} "
              "CPUs".format(*os.getloadavg(), os.cpu_count()))


if __name__ == "__main__":
    main()
