"""The watchdog's reads of the host: which container a PID is in, and its cgroup's usage.

NVML lists the processes on a GPU by host PID; ``/proc/PID/cgroup`` names
the cgroup of each, and a container's cgroup path carries its id: Docker's
(``/docker/<id>`` with the cgroupfs driver, ``/system.slice/docker-<id>.scope``
with the systemd one, on cgroup v1 and v2 alike), and on a Kubernetes node
containerd's and CRI-O's (``.../kubepods-...-pod<uid>.slice/cri-containerd-<id>.scope``,
``crio-<id>.scope``, or ``/kubepods/burstable/pod<uid>/<id>`` with cgroupfs).
So each user's own GPU memory is known even when several containers share
one card. Kubernetes does not say a container's PIDs, so ``MainPids`` finds
them in ``/proc``, and ``visible_gpus`` reads which GPUs the NVIDIA container
toolkit gave it.

Container memory and CPU come from the container's own cgroup, found from
its main PID the same way, so both drivers and both cgroup versions work
without knowing how the engine was set up:

- memory: the working set as cAdvisor (and so ``docker stats`` and the
  kubelet) computes it, usage minus inactive file cache, since page cache
  the kernel can drop is not what gets a container OOM-killed;
- CPU: the cumulative CPU time, turned into cores by ``CpuMeter``;
- OOM kills: the cgroup's cumulative counter.

The watchdog needs the host's view: the host's PID namespace (``/proc``)
and cgroup namespace (``/sys/fs/cgroup``), i.e. ``pid: host`` and
``cgroup: host`` when it runs in a container. Where it has a cgroup namespace
of its own (a Kubernetes pod), the paths in ``/proc/PID/cgroup`` are relative
to it (``/../../kubepods.slice/...``); the container's folder is then found
by its name under ``cgroup_root``, the host's tree mounted there. Every function here reads
files and blocks: call it in a thread. A process or container that ends
between two reads is an ordinary event here, never an error: it reads as
None.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spawner.contract import NVIDIA_VISIBLE_DEVICES, visible_devices
from spawner.watchdog.model import GpuSample, Server

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")

# One path segment that names a container: "<id>" (cgroupfs driver:
# "/docker/<id>", under a --cgroup-parent, or a pod's folder) or
# "docker-<id>.scope", "cri-containerd-<id>.scope", "crio-<id>.scope" (systemd
# driver; CRI-O's cgroupfs one drops ".scope"). CRI-O's "crio-conmon-<id>" is
# its monitor, not the container.
_SCOPE = re.compile(r"^(?:docker|cri-containerd|crio)-([0-9a-f]{64})(?:\.scope)?$")
_BARE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class _CgroupLine:
    controllers: tuple[str, ...]  # () for the cgroup v2 line ("0::/path")
    path: str


def _read_cgroup_file(pid: int, proc: Path) -> list[_CgroupLine] | None:
    """The lines of /proc/PID/cgroup; None when the process is gone or unreadable."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except (OSError, ValueError):  # gone (ENOENT, ESRCH), not ours (EACCES)
        return None
    lines = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers = tuple(c for c in parts[1].split(",") if c)
        lines.append(_CgroupLine(controllers, parts[2]))
    return lines


def _container_in_path(path: str) -> tuple[str, str] | None:
    """(container id, the container's own cgroup path) from a cgroup path, or None.

    The deepest segment naming a container wins: a process in a sub-cgroup
    (``/docker/<id>/foo``) belongs to ``<id>``, and with an engine inside a
    container (``/docker/<outer>/docker/<inner>``) the inner one is the
    container that engine knows.
    """
    segments = path.split("/")
    for i in range(len(segments) - 1, -1, -1):
        segment = segments[i]
        match = _SCOPE.match(segment)
        if match:
            return match.group(1), "/".join(segments[: i + 1])
        if _BARE.match(segment):
            return segment, "/".join(segments[: i + 1])
    return None


def _container_of_lines(lines: list[_CgroupLine]) -> tuple[str, str] | None:
    # The first line naming a container: the controllers agree on a container's
    # path, but on a hybrid host the v2 line may show only systemd's "/".
    for line in lines:
        found = _container_in_path(line.path)
        if found:
            return found
    return None


def container_id_of(pid: int, proc: Path = PROC) -> str | None:
    """The Docker container id (64 hex digits) that host PID ``pid`` runs in.

    None for a process outside any container, and for one that ended (or
    cannot be read) before its cgroup file was read. Blocks.
    """
    lines = _read_cgroup_file(pid, proc)
    if lines is None:
        return None
    found = _container_of_lines(lines)
    return found[0] if found else None


class MainPids:
    """Each container's main PID, found in ``/proc`` (Kubernetes does not say it): the
    lowest PID in the container, kept while it stays there. Blocks."""

    def __init__(self, proc: Path = PROC):
        self.proc = Path(proc)
        self._pids: dict[str, int] = {}

    def find(self, container_ids: Iterable[str]) -> dict[str, int]:
        """Container id → its main PID, for those of ``container_ids`` that have one; a
        scan of /proc only when one is new or its PID is gone."""
        wanted = set(container_ids)
        found = {cid: pid for cid, pid in self._pids.items()
                 if cid in wanted and container_id_of(pid, self.proc) == cid}
        if wanted - set(found):
            try:
                pids = sorted(int(e.name) for e in self.proc.iterdir() if e.name.isdigit())
            except OSError:
                pids = []
            for pid in pids:
                cid = container_id_of(pid, self.proc)
                if cid in wanted and cid not in found:
                    found[cid] = pid
        self._pids = found
        return dict(found)


# Where the NVIDIA container toolkit lists the devices it was asked for with the
# device plugin's volume-mounts strategy (NVIDIA_VISIBLE_DEVICES names the folder).
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"


def visible_gpus(pid: int, proc: Path = PROC) -> tuple[str, ...]:
    """The GPU and MIG UUIDs the container of ``pid`` was given, as the NVIDIA device
    plugin asked the container toolkit for them: NVIDIA_VISIBLE_DEVICES in the
    process's environment (the envvar strategy), or the folder it names (the
    volume-mounts strategy). Empty when neither names UUIDs (no GPU, indices, CDI).
    Reading another process's environment needs the host's PID namespace and
    ptrace rights. Blocks."""
    try:
        environ = (proc / str(pid) / "environ").read_bytes().decode(errors="replace")
    except OSError:
        return ()
    env = dict(v.partition("=")[::2] for v in environ.split("\0") if v)
    value = env.get(NVIDIA_VISIBLE_DEVICES, "").strip()
    if value.startswith(DEVICE_LIST_ROOT):
        try:
            ids = sorted(e.name for e in (proc / str(pid) / "root" / value.lstrip("/")).iterdir())
        except OSError:
            return ()
    else:
        ids = visible_devices(env) or []  # "all" or none: no UUIDs to name
    # time-slicing's replicas are "<uuid>::<n>"; one GPU however many replicas
    uuids = (i.strip().split("::")[0] for i in ids)
    return tuple(dict.fromkeys(u for u in uuids if u.startswith(("GPU-", "MIG-"))))


# --- the container's cgroup ---------------------------------------------------------


@dataclass(frozen=True)
class ContainerUsage:
    """One container's cgroup counters; a field is None when it could not be read."""

    working_set: int | None = None  # bytes: usage minus inactive file cache
    cpu_seconds: float | None = None  # cumulative CPU time
    oom_kills: int | None = None  # cumulative OOM kills in the cgroup


@dataclass(frozen=True)
class _Location:
    """Where one container's counters are: v1 per-controller folders, or one v2 folder."""

    memory: Path | None  # v1 memory controller folder
    cpuacct: Path | None  # v1 cpuacct controller folder
    unified: Path | None  # the v2 folder, on a host without v1 controllers


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_keyed(path: Path) -> dict[str, int] | None:
    """A flat-keyed cgroup file ("key value" per line), e.g. memory.stat."""
    try:
        text = path.read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                values[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return values


def _under(root: Path, cgroup_path: str) -> Path | None:
    relative = cgroup_path.strip("/")
    if ".." in relative.split("/"):  # another cgroup namespace's view: not ours to read
        return None
    return root / relative if relative else root


def _container_folder(root: Path, line: _CgroupLine, container_id: str) -> Path | None:
    """The folder of ``container_id``'s cgroup under ``root`` from one line; None when
    the line names another container or none (a PID reused since), or it is gone."""
    found = _container_in_path(line.path)
    if found is None or found[0] != container_id:
        return None
    folder = _under(root, found[1])
    if folder is None:  # another cgroup namespace's view: the host's tree, by name
        folder = _find_folder(root, found[1].rsplit("/", 1)[-1])
    return folder if folder is not None and folder.is_dir() else None


def _find_folder(root: Path, name: str, depth: int = 8) -> Path | None:
    """The folder called ``name`` (a container's, unique) at most ``depth`` levels
    under ``root``; None when there is none."""
    level = [root]
    for _ in range(depth):
        below = []
        for folder in level:
            try:
                children = [c for c in folder.iterdir() if c.is_dir()]
            except OSError:
                continue
            for child in children:
                if child.name == name:
                    return child
            below += children
        level = below
    return None


def _v1_folder(root: Path, controller: str, lines: list[_CgroupLine],
               container_id: str) -> Path | None:
    for line in lines:
        if controller in line.controllers:
            # Mounted under its own name, or under the joined list
            # ("cpu,cpuacct") with the single names as symlinks.
            for mount in (controller, ",".join(line.controllers)):
                folder = _container_folder(root / mount, line, container_id)
                if folder is not None:
                    return folder
            return None
    return None


class CgroupReader:
    """Reads a server's cgroup counters, locating its cgroup from its main PID.

    ``root`` is the cgroup mount (``/sys/fs/cgroup``) and ``proc`` the host's
    ``/proc``; both are parameters for tests. A container's location is kept
    while its main PID stays the same (a restart gives a new one); ``prune``
    forgets containers that are gone. Blocks.
    """

    def __init__(self, root: Path = CGROUP_ROOT, proc: Path = PROC):
        self.root = Path(root)
        self.proc = Path(proc)
        self._locations: dict[str, tuple[int, _Location]] = {}

    def _locate(self, server: Server) -> _Location | None:
        """The server's cgroup folders; None when its main PID is gone or in another container."""
        cached = self._locations.get(server.container_id)
        if cached and cached[0] == server.pid:
            return cached[1]
        if server.pid <= 0:
            return None
        lines = _read_cgroup_file(server.pid, self.proc)
        if not lines:
            return None
        # Each controller's folder from its own line, each checked to be this
        # container's: a PID reused after the container ended must not lend
        # its numbers.
        memory = _v1_folder(self.root, "memory", lines, server.container_id)
        cpuacct = _v1_folder(self.root, "cpuacct", lines, server.container_id)
        unified = None
        if all(not line.controllers for line in lines):  # only the "0::" line: cgroup v2
            unified = _container_folder(self.root, lines[0], server.container_id)
        if memory is None and cpuacct is None and unified is None:
            return None
        location = _Location(memory, cpuacct, unified)
        self._locations[server.container_id] = (server.pid, location)
        return location

    def read(self, server: Server) -> ContainerUsage:
        """The server's working set, CPU seconds and OOM kills; None for what cannot be read."""
        location = self._locate(server)
        if location is None:
            return ContainerUsage()
        if location.unified is not None:
            usage = _v2_usage(location.unified)
        else:
            usage = _v1_usage(location.memory, location.cpuacct)
        if usage == ContainerUsage():
            # Every read failed: the container ended since it was located.
            self._locations.pop(server.container_id, None)
        return usage

    def prune(self, alive: Iterable[str]) -> None:
        """Forget the containers whose ids are not in ``alive``."""
        keep = set(alive)
        for container_id in list(self._locations):
            if container_id not in keep:
                del self._locations[container_id]


def _working_set(usage: int | None, stat: dict[str, int] | None, inactive_key: str) -> int | None:
    if usage is None:
        return None
    inactive = (stat or {}).get(inactive_key, 0)
    return max(0, usage - inactive)


def _v1_usage(memory: Path | None, cpuacct: Path | None) -> ContainerUsage:
    working_set = oom_kills = None
    if memory is not None:
        working_set = _working_set(_read_int(memory / "memory.usage_in_bytes"),
                                   _read_keyed(memory / "memory.stat"), "total_inactive_file")
        oom_control = _read_keyed(memory / "memory.oom_control")
        # Kernels before 4.13 have no oom_kill line: no kill was counted.
        oom_kills = None if oom_control is None else oom_control.get("oom_kill", 0)
    cpu_seconds = None
    if cpuacct is not None:
        nanoseconds = _read_int(cpuacct / "cpuacct.usage")
        cpu_seconds = None if nanoseconds is None else nanoseconds / 1e9
    return ContainerUsage(working_set, cpu_seconds, oom_kills)


def _v2_usage(folder: Path) -> ContainerUsage:
    working_set = _working_set(_read_int(folder / "memory.current"),
                               _read_keyed(folder / "memory.stat"), "inactive_file")
    cpu_stat = _read_keyed(folder / "cpu.stat")
    usec = None if cpu_stat is None else cpu_stat.get("usage_usec")
    events = _read_keyed(folder / "memory.events")
    oom_kills = None if events is None else events.get("oom_kill", 0)
    return ContainerUsage(working_set, None if usec is None else usec / 1e6, oom_kills)


class CpuMeter:
    """CPU use in cores over one cycle, from each container's cumulative CPU seconds."""

    def __init__(self) -> None:
        self._previous: dict[str, tuple[float, float]] = {}

    def rate(self, container_id: str, cpu_seconds: float | None, now: float) -> float | None:
        """Cores used since this container's previous reading; None on the first one.

        A counter that went back (the container restarted) starts over.
        ``now`` is a monotonic clock's seconds.
        """
        if cpu_seconds is None:
            self._previous.pop(container_id, None)
            return None
        previous = self._previous.get(container_id)
        self._previous[container_id] = (cpu_seconds, now)
        if previous is None:
            return None
        delta_cpu, delta_time = cpu_seconds - previous[0], now - previous[1]
        if delta_time <= 0 or delta_cpu < 0:
            return None
        return delta_cpu / delta_time

    def prune(self, alive: Iterable[str]) -> None:
        """Forget the containers whose ids are not in ``alive``."""
        keep = set(alive)
        for container_id in list(self._previous):
            if container_id not in keep:
                del self._previous[container_id]


# --- GPU memory per container ---------------------------------------------------------


def gpu_memory_by_container(
    gpus: Iterable[GpuSample], proc: Path = PROC,
) -> dict[str, dict[str, int]]:
    """Container id → {GPU UUID → bytes its processes use}, from NVML's process lists.

    Processes outside any container, and those that ended before their
    cgroup was read, are left out. A process whose memory NVML does not know
    (``used_memory`` None, as under MIG) counts 0 bytes but still maps its
    container to the GPU, so a holder is never lost. Blocks.
    """
    containers: dict[int, str | None] = {}  # one lookup per PID in this call
    usage: dict[str, dict[str, int]] = {}
    for gpu in gpus:
        for process in gpu.processes:
            if process.pid not in containers:
                containers[process.pid] = container_id_of(process.pid, proc)
            container_id = containers[process.pid]
            if container_id is None:
                continue
            per_gpu = usage.setdefault(container_id, {})
            per_gpu[gpu.uuid] = per_gpu.get(gpu.uuid, 0) + (process.used_memory or 0)
    return usage
