"""The watchdog's Prometheus side: its gauges, ``/metrics``, and dcgm-exporter's job map.

``WatchdogMetrics`` owns a ``CollectorRegistry`` of its own (never the
process-wide one, which a hub or a test may fill with other things). The
per-server and per-GPU gauges are built from one ``Snapshot`` in ``update``
and swapped in whole, so a scrape sees one cycle, never half of two, and a
server or GPU that is gone is simply not in the next set. Every label value
(user names included) reaches the exposition through prometheus_client,
which escapes it; nothing here writes exposition text by hand.

``metrics_app`` / ``serve_metrics`` serve the registry at ``/metrics`` from
the watchdog's tornado IOLoop, behind an optional bearer token.

``write_dcgm_mapping`` writes dcgm-exporter's HPC job-mapping files (one
file per GPU index holding the user names on it), so dcgm-exporter's own
metrics get an ``hpc_job`` label naming the user. docs/watchdog.md and
deploy/ (alert rules, dashboard, scrape config) build on these names.
"""

from __future__ import annotations

import hmac
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import tornado.httpserver
import tornado.web
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from spawner.watchdog.model import HostFigures, Server, Snapshot, home_size, homes_of
from spawner.watchdog.rules import gpu_memory_limit

PREFIX = "quota_spawner_"
SERVER_LABELS = ("user", "role", "image", "server")
HOME_LABELS = ("user", "role", "home")  # a home: its user's, a running server's role, its folder
GPU_LABELS = ("gpu_uuid", "gpu_index")
SERVER_GPU_LABELS = SERVER_LABELS + GPU_LABELS
# QuotaWatchdog.metrics_port's default; deploy/prometheus/scrape.yml uses it.
DEFAULT_METRICS_PORT = 9835

# name (without the prefix), help, labels; built fresh from every snapshot
SNAPSHOT_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "server_gpu_memory_used_bytes": (
        "GPU memory used by the server's own processes on this GPU", SERVER_GPU_LABELS),
    "server_gpu_memory_limit_bytes": (
        "The server's GPU memory limit on this GPU: the card for an exclusive GPU, "
        "GPU_MEMORY_LIMIT for a shared one", SERVER_GPU_LABELS),
    "server_gpu_utilization_ratio": (
        "Utilization of a GPU the server holds, 0 to 1 (the whole card's, also when shared)",
        SERVER_GPU_LABELS),
    "server_memory_working_set_bytes": (
        "Container memory working set: usage minus inactive file cache", SERVER_LABELS),
    "server_memory_limit_bytes": ("Container memory limit", SERVER_LABELS),
    "server_cpu_used_cpus": ("CPUs (cores) the container used over the last cycle",
                             SERVER_LABELS),
    "server_cpu_quota_cpus": ("The container's CPU quota, in CPUs", SERVER_LABELS),
    "gpu_holders": ("How many servers hold this GPU", GPU_LABELS),
    "gpu_memory_used_bytes": ("GPU memory in use on the card, by anyone", GPU_LABELS),
    "gpu_memory_total_bytes": ("GPU memory of the card", GPU_LABELS),
    "gpu_utilization_ratio": ("GPU utilization, 0 to 1", GPU_LABELS),
    "gpu_lost": ("1 when NVML cannot read the GPU (lost, fallen off the bus), else 0",
                 GPU_LABELS),
    "zombie_server": ("1 for each container of this hub that holds GPUs that no running "
                      "server claims", SERVER_LABELS),
    "watchdog_servers": ("Notebook servers the watchdog saw in its last cycle", ()),
    # the host: the servers above together, and the engine they run on
    "host_cpu_reserved_cpus": (
        "CPUs the servers on this host reserve together: the sum of their roles' CPUs "
        "(CPU_LIMIT), else of their CPU limits", ()),
    "host_memory_reserved_bytes": (
        "Memory the servers on this host reserve together: the sum of their memory limits",
        ()),
    "host_cpu_used_cpus": ("CPUs (cores) the servers on this host used together over the "
                           "last cycle", ()),
    "host_memory_working_set_bytes": ("Memory working set of the servers on this host "
                                      "together", ()),
    "host_cpu_capacity_cpus": ("CPUs of the engine (docker info NCPU)", ()),
    "host_memory_capacity_bytes": ("Memory of the engine (docker info MemTotal)", ()),
    # the users' homes (docs/disk.md), when the watchdog reads them
    "home_used_bytes": ("What a running server's home holds, as its quota counts it",
                        HOME_LABELS),
    "home_limit_bytes": ("The home's size: its server's quota-spawner.disk, else its quota's "
                         "limit", HOME_LABELS),
    "homes_filesystem_size_bytes": ("Size of the filesystem that holds the homes", ()),
    "homes_filesystem_used_bytes": ("Used on the filesystem that holds the homes", ()),
    "homes_filesystem_free_bytes": ("Free on the filesystem that holds the homes, for users "
                                    "(statvfs f_bavail)", ()),
    "homes_reserved_bytes": ("The homes' sizes together, every home's on the filesystem", ()),
}
# Counters (exposed as …_total): the cgroup's own cumulative OOM-kill counter, and the
# XID errors NVML reported on each GPU since the watchdog started. Both start at 0 with
# their server or GPU, so Prometheus's increase() sees the first one too.
OOM_KILLS = "server_oom_kills"
XID_ERRORS = "gpu_xid_errors"


def _server_labels(server: Server) -> list[str]:
    return [server.user, server.role, server.image, server.name]


class _SnapshotCollector:
    """Yields the families that the last ``build`` made; swapped whole under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[Metric] = self._empty()
        self._xids: dict[str, int] = {}  # by GPU UUID, since the start

    @staticmethod
    def _empty() -> list[Metric]:
        families: list[Metric] = [
            GaugeMetricFamily(PREFIX + name, text, labels=labels)
            for name, (text, labels) in SNAPSHOT_GAUGES.items()
        ]
        families.append(CounterMetricFamily(
            PREFIX + OOM_KILLS, "OOM kills in the container's memory cgroup since it started",
            labels=SERVER_LABELS))
        families.append(CounterMetricFamily(
            PREFIX + XID_ERRORS, "XID errors NVML reported on the GPU since the watchdog started",
            labels=GPU_LABELS))
        return families

    def describe(self) -> Iterator[Metric]:
        return iter(self._empty())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._families
        return iter(families)

    def build(self, snapshot: Snapshot) -> None:
        families = {f.name: f for f in self._empty()}

        def add(name: str, labels: list[str], value: float | None) -> None:
            if value is not None:
                families[PREFIX + name].add_metric(labels, float(value))

        holders: dict[str, int] = {}
        for sample in snapshot.servers.values():
            server = sample.server
            labels = _server_labels(server)
            add("server_memory_working_set_bytes", labels, sample.memory_working_set)
            add("server_memory_limit_bytes", labels, server.memory_limit)
            add("server_cpu_used_cpus", labels, sample.cpu_used)
            add("server_cpu_quota_cpus", labels, server.cpus)
            add(OOM_KILLS, labels, sample.oom_kills)
            for uuid in server.gpus:
                holders[uuid] = holders.get(uuid, 0) + 1
            # its GPUs, and any other GPU its processes turn up on
            for uuid in dict.fromkeys([*server.gpus, *sample.gpu_memory]):
                gpu = snapshot.gpus.get(uuid)
                if gpu is None:
                    continue  # NVML does not list it: no index to label it with
                gpu_labels = [*labels, uuid, str(gpu.index)]
                if not gpu.lost:
                    add("server_gpu_memory_used_bytes", gpu_labels,
                        sample.gpu_memory.get(uuid, 0))
                    add("server_gpu_utilization_ratio", gpu_labels, gpu.utilization)
                # the rules' own limit, so a gauge and an alert never disagree
                add("server_gpu_memory_limit_bytes", gpu_labels, gpu_memory_limit(server, gpu))
        for uuid, gpu in snapshot.gpus.items():
            labels = [uuid, str(gpu.index)]
            add("gpu_holders", labels, holders.get(uuid, 0))
            add("gpu_lost", labels, 1 if gpu.lost else 0)
            self._xids[uuid] = self._xids.get(uuid, 0) + len(gpu.xids)
            add(XID_ERRORS, labels, self._xids[uuid])
            if not gpu.lost:
                add("gpu_memory_used_bytes", labels, gpu.memory_used)
                add("gpu_memory_total_bytes", labels, gpu.memory_total)
                add("gpu_utilization_ratio", labels, gpu.utilization)
        for zombie in snapshot.zombies:
            add("zombie_server", _server_labels(zombie), 1)
        add("watchdog_servers", [], len(snapshot.servers))
        host = HostFigures.of(snapshot)
        add("host_cpu_reserved_cpus", [], host.cpus_reserved)
        add("host_memory_reserved_bytes", [], host.memory_reserved)
        add("host_cpu_used_cpus", [], host.cpu_used)
        add("host_memory_working_set_bytes", [], host.memory_used)
        add("host_cpu_capacity_cpus", [], snapshot.engine_cpus)
        add("host_memory_capacity_bytes", [], snapshot.engine_memory)
        disk = snapshot.disk
        if disk is not None and disk.homes is not None:
            for home, server in homes_of(snapshot).items():
                use = disk.homes.get(home)
                if use is not None:
                    labels = [server.user, server.role, home]
                    add("home_used_bytes", labels, use.used)
                    add("home_limit_bytes", labels, home_size(server, use))
            add("homes_reserved_bytes", [], disk.reserved if disk.enforced else None)
        if disk is not None and disk.space is not None:
            add("homes_filesystem_size_bytes", [], disk.space.size)
            add("homes_filesystem_used_bytes", [], disk.space.used)
            add("homes_filesystem_free_bytes", [], disk.space.free)
        with self._lock:
            self._families = list(families.values())


class WatchdogMetrics:
    """The watchdog's metrics, in a registry of their own (``self.registry``).

    ``update`` is cheap (no I/O) and safe from any thread; so are the other
    setters. A scrape never blocks on an update for longer than a swap.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._snapshot = _SnapshotCollector()
        self.registry.register(self._snapshot)
        self.cycle_duration = Gauge(
            PREFIX + "watchdog_cycle_duration_seconds",
            "How long the watchdog's last cycle took", registry=self.registry)
        self.last_cycle = Gauge(
            PREFIX + "watchdog_last_cycle_timestamp_seconds",
            "When the watchdog's last cycle read the host, epoch seconds",
            registry=self.registry)
        self.open_incidents = Gauge(
            PREFIX + "watchdog_open_incidents", "Incidents open now, by rule", ["rule"],
            registry=self.registry)
        self.notifications_sent = Counter(
            PREFIX + "watchdog_notifications_sent", "Messages a channel accepted",
            ["channel"], registry=self.registry)
        self.notifications_failed = Counter(
            PREFIX + "watchdog_notifications_failed",
            "Messages a channel failed to deliver, after all its tries", ["channel"],
            registry=self.registry)
        # From the hub's event log: no series until the first one, as for the channels.
        self.preemptions = Counter(
            PREFIX + "preemptions",
            "Servers the hub chose to preempt (its notices, withdrawn ones included), by "
            "the server's role and the role it was preempted for", ["role", "by_role"],
            registry=self.registry)
        self._incident_rules: set[str] = set()
        self._lock = threading.Lock()

    def update(self, snapshot: Snapshot,
               open_incidents: Mapping[str, int] | None = None) -> None:
        """Replace every per-server and per-GPU series with the snapshot's.

        ``open_incidents`` (rule → count), when given, goes to ``set_open_incidents``.
        """
        self._snapshot.build(snapshot)
        self.last_cycle.set(snapshot.time)
        if open_incidents is not None:
            self.set_open_incidents(open_incidents)

    def cycle_done(self, seconds: float) -> None:
        """How long the cycle took, reading, rules and writing included."""
        self.cycle_duration.set(seconds)

    def set_open_incidents(self, by_rule: Mapping[str, int]) -> None:
        """Open incidents per rule; a rule left out of ``by_rule`` drops its series.

        Pass every rule (with 0 for none open) so that dashboards show zeros.
        """
        with self._lock:
            for rule, count in by_rule.items():
                self.open_incidents.labels(rule=rule).set(count)
            for gone in self._incident_rules - set(by_rule):
                self.open_incidents.remove(gone)
            self._incident_rules = set(by_rule)

    def notification_sent(self, channel: str) -> None:
        self.notifications_sent.labels(channel=channel).inc()

    def notification_failed(self, channel: str) -> None:
        self.notifications_failed.labels(channel=channel).inc()

    def preemption(self, role: str, by_role: str) -> None:
        """One preemption notice of the hub's, counted when the watchdog reads it."""
        self.preemptions.labels(role=role, by_role=by_role).inc()

    def metric_names(self) -> set[str]:
        """The names of the series PromQL may select (a counter's is its ``…_total``)."""
        return {family.name + "_total" if family.type == "counter" else family.name
                for family in self.registry.collect()}


# --- /metrics ---------------------------------------------------------------------------


class MetricsHandler(tornado.web.RequestHandler):
    """``GET /metrics``: the registry in the format the scraper asks for (text or OpenMetrics).

    With a token set, a request must carry ``Authorization: Bearer <token>``;
    any other gets 403. Rendering reads only what ``update`` built, so it
    runs on the IOLoop.
    """

    def initialize(self, registry: CollectorRegistry, token: str | None = None) -> None:
        self.registry = registry
        self.token = token

    def get(self) -> None:
        if self.token:
            scheme, _, given = self.request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), self.token.encode()):
                raise tornado.web.HTTPError(403, reason="A bearer token is required")
        encoder, content_type = choose_encoder(self.request.headers.get("Accept", ""))
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-store")
        self.finish(encoder(self.registry))


def metrics_app(registry: CollectorRegistry, token: str | None = None) -> tornado.web.Application:
    """A tornado application serving ``registry`` at ``/metrics`` (and nothing else)."""
    return tornado.web.Application(
        [("/metrics", MetricsHandler, {"registry": registry, "token": token or None})],
        compress_response=True)


def serve_metrics(metrics: WatchdogMetrics | CollectorRegistry, host: str = "",
                  port: int = DEFAULT_METRICS_PORT,
                  token: str | None = None) -> tornado.httpserver.HTTPServer:
    """Serve ``/metrics`` on host:port on the current IOLoop; ``stop()`` the server to close.

    ``host=""`` listens on every address: give a token, or bind to one that
    only the Prometheus server reaches, since the metrics name every user.
    """
    registry = metrics.registry if isinstance(metrics, WatchdogMetrics) else metrics
    server = tornado.httpserver.HTTPServer(metrics_app(registry, token))
    server.listen(port, address=host)
    return server


# --- dcgm-exporter's HPC job mapping ------------------------------------------------------

# dcgm-exporter (--hpc-job-mapping-dir, DCGM_HPC_JOB_MAPPING_DIR) reads every file of the
# directory whose name is a whole number, takes it as a GPU index, and reads its lines as
# job ids: each of its metrics of that GPU is repeated once per job, with the label
# hpc_job="<job id>". Other names are ignored, so the temporary files here start with a dot.
_INDEX_FILE = re.compile(r"[0-9]+")
_TEMP_PREFIX = ".quota-spawner-"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def dcgm_job_map(snapshot: Snapshot) -> dict[int, list[str]]:
    """GPU index → the users whose servers hold it, sorted, each once.

    The job id is the user name: dcgm-exporter's hpc_job label then names the
    user, which is what its users want to group by. Control characters (a
    newline would split one name into two jobs) become "_". A GPU that NVML
    does not list, or never listed (index -1), has no index and is left out.
    """
    jobs: dict[int, set[str]] = {}
    for sample in snapshot.servers.values():
        for uuid in sample.server.gpus:
            gpu = snapshot.gpus.get(uuid)
            if gpu is not None and gpu.index >= 0:
                jobs.setdefault(gpu.index, set()).add(_CONTROL.sub("_", sample.server.user))
    return {index: sorted(users) for index, users in sorted(jobs.items())}


def write_dcgm_mapping(directory: str | os.PathLike[str],
                       snapshot: Snapshot) -> dict[int, list[str]]:
    """Write the job-mapping files for ``snapshot`` into ``directory``; returns the map.

    Each file is replaced atomically (written beside it, then renamed), so
    dcgm-exporter never reads half a file; a file whose content is unchanged
    is left alone. Files of GPUs that no server holds any more are removed.
    The directory is the watchdog's own: any other index file in it is
    removed too. Blocking (files): call it in a thread.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    mapping = dcgm_job_map(snapshot)
    for index, users in mapping.items():
        _replace(root / str(index), "".join(user + "\n" for user in users))
    for path in root.iterdir():
        stale_index = _INDEX_FILE.fullmatch(path.name) and int(path.name) not in mapping
        # temporary files a crash left behind are removed too
        if (stale_index or path.name.startswith(_TEMP_PREFIX)) and path.is_file():
            path.unlink(missing_ok=True)
    return mapping


def _replace(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(temp, 0o644)  # dcgm-exporter may run as another user
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise

