"""``quota-spawner watchdog``: the loop that reads, judges, tells and exports.

Each cycle (``interval``, 5 s by default):

1. in a thread: the notebook containers (``containers.py``; on a
   Kubernetes node, ``source = "kubernetes"``, the node's notebook pods,
   ``pods.py``), NVML on the host (``spawner.gpu.nvml``), each GPU process
   mapped to its container by PID and each container's cgroup (``host.py``),
   as one ``Snapshot``, each GPU a ``GpuSample`` (spawner/usage/gpu_readings.py), which
   is also what this node's ``gpu-usage`` document carries to the host map; with a
   homes' root, every home's use in one quota query and the filesystem's room
   (``homes.py``);
2. on the loop: the hub's users (``hub_api.py``), for routing and for
   zombies; the rules (``rules.py``) turn the snapshot into events, and the
   hub's event log (``hub_events.py``) adds its preemptions;
3. each event goes to its channels (``notify.py``) in the background, so a
   slow channel never delays the next cycle, and on its own, so one that
   cannot be worded or sent is one line in the log and the others go on;
   past a few messages about one user in an hour, a channel gets the rest in
   one digest when the hour ends (``limits.py``, kept in the incident book);
   the gauges (``metrics.py``) and dcgm-exporter's job mapping are updated,
   and the incidents saved;
4. in a thread: each server's sample is folded into its session in the
   usage ledger (``spawner.usage.ledger``), when there is one; and each running
   server's ``home.json`` and this node's ``homes`` document are written (``homes.py``).

SIGINT or SIGTERM (how the hub stops its services) ends the loop after its
cycle: one line in the log, exit status 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from traitlets import CaselessStrEnum, Float, Integer, TraitError, Unicode, default
from traitlets.config import Application

from spawner.common.outages import OutageLog
from spawner.contract import HOME_USE_STATE
from spawner.gpu.nvml import OK, Nvml, NvmlDevice, XidEvent, XidWatcher
from spawner.homes.detect import CHOICES as HOME_MECHANISMS
from spawner.policy.config import hub_id_from_secret_file
from spawner.usage.documents import (
    GPU_USAGE,
    DatabaseDocuments,
    Documents,
    FolderDocuments,
    write_atomically,
)
from spawner.usage.event_log import EVENTS_FILE
from spawner.usage.events import HubEvent, Preemption
from spawner.usage.gpu_readings import (
    GpuSample,
    GpuUsage,
    HostTotals,
    IdleGpu,
    ServerReading,
    held_elsewhere,
    stale_after,
)
from spawner.usage.ledger import Ledger, Sample, default_url
from spawner.watchdog.containers import Containers, EngineClient, EngineUnreachable, OomEvents
from spawner.watchdog.homes import HomeUseFiles, HomeWatch, disk_document
from spawner.watchdog.host import CgroupReader, CpuMeter, gpu_memory_by_container
from spawner.watchdog.hub_api import HubDirectory
from spawner.watchdog.hub_events import (
    for_hub,
    hub_event_messages,
    read_new,
    read_new_rows,
)
from spawner.watchdog.metrics import WatchdogMetrics, serve_metrics, write_dcgm_mapping
from spawner.watchdog.model import HostFigures, Server, ServerSample, Snapshot
from spawner.watchdog.notify import Notifier
from spawner.watchdog.pods import Pods, kube_api
from spawner.watchdog.rules import GPU_IDLE, RULES, Event, EventCursor, IncidentBook, WatchdogRules
from spawner.watchdog.text import name, number, one_line

# A container is a zombie only if the hub's answer that lacks its server was asked for
# at least this long after the container started: the engine's clock and the
# watchdog's may differ a little, and a normal start is never a false alarm.
ZOMBIE_CLOCK_MARGIN = 2.0
# After SIGINT or SIGTERM, how long messages on their way may still take.
STOP_GRACE = 5.0


class QuotaWatchdog(Application):
    name = "quota-spawner-watchdog"
    description = "Watch this host's notebook servers: GPU and memory alerts, Prometheus gauges."
    classes = [WatchdogRules, Notifier]
    aliases = {
        "config-file": "QuotaWatchdog.config_file",
        "test-channel": "QuotaWatchdog.test_channel",
        "interval": "QuotaWatchdog.interval",
        "log-level": "Application.log_level",
    }
    # When each container was first seen (epoch seconds): its start, for the zombie
    # check, where the engine does not say it. Replaced each cycle, never changed in place.
    _first_seen: dict[str, float] = {}
    _ledger: Ledger | None = None
    _ledger_lock = threading.Lock()

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # what can keep failing each cycle, each told once until it works again
        self._events_lapse = OutageLog()  # the hub's event log cannot be read
        self._usage_lapse = OutageLog()  # the usage ledger cannot be written
        self._gpu_usage_lapse = OutageLog()  # the GPU readings cannot be saved
        self._engine_lapse = OutageLog()  # the engine cannot be reached
        self._elsewhere_lapse = OutageLog()  # the other nodes' readings cannot be read
        self._home_files_lapse = OutageLog()  # the homes' home.json cannot be written
        self._homes_lapse = OutageLog()  # the homes document cannot be saved
        self._left: set[str] = set()  # the GPUs left to other nodes' watchdogs, as told
        self._started: float | None = None  # when ``run`` began watching
        self._sending: set[asyncio.Task[Any]] = set()  # messages on their way
        self._saved = ""  # the incident book as last saved
        self.homes: HomeWatch | None = None  # with a homes' root
        self.home_files: HomeUseFiles | None = None

    config_file = Unicode(
        os.environ.get("QUOTA_SPAWNER_WATCHDOG_CONFIG", ""), config=True,
        help="A Python config file: c.QuotaWatchdog, c.WatchdogRules, c.Notifier "
             "(docs/watchdog.md).")
    interval = Float(5.0, config=True, help="Seconds between cycles.")
    hub_id = Unicode(
        os.environ.get("QUOTA_SPAWNER_HUB_ID", ""), config=True,
        help="Watch only the containers of this hub (their quota-spawner.hub label); "
             "empty: every notebook container on the engine.")
    hub_secret_file = Unicode(
        os.environ.get("QUOTA_SPAWNER_HUB_SECRET_FILE", ""), config=True,
        help="""With no hub_id: the hub's cookie_secret_file, from which the hub derives
        its id (QuotaSpawner.hub_id's default), so the watchdog derives the same.""")
    hub_prefix = Unicode(os.environ.get("QUOTA_SPAWNER_PREFIX", "quota"), config=True,
                         help="QuotaSpawner.prefix, for the hub id derived from the secret.")
    hub_api_url = Unicode(os.environ.get("JUPYTERHUB_API_URL", ""), config=True,
                          help="The hub's API, for users' groups and servers.")
    api_token = Unicode(os.environ.get("JUPYTERHUB_API_TOKEN", ""), config=True,
                        help="A token with list:users, read:users:groups, read:servers.")
    hub_url = Unicode(config=True, help="The hub's public URL, for the links in messages.")
    docker_host = Unicode(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"),
                          config=True, help="The engine the notebook containers run on.")
    source = CaselessStrEnum(
        ["docker", "kubernetes"], os.environ.get("QUOTA_SPAWNER_WATCHDOG_SOURCE", "docker"),
        config=True,
        help="""Where the notebook servers are: "docker", the containers of docker_host;
        "kubernetes", the pods of QuotaKubeSpawner on this node (node_name), read from
        the Kubernetes API, with this node's /proc and cgroups (docs/kubernetes.md).""")
    node_name = Unicode(
        os.environ.get("NODE_NAME", ""), config=True,
        help="With source kubernetes: this node's name (the DaemonSet's spec.nodeName).")
    kube_namespace = Unicode(
        os.environ.get("QUOTA_SPAWNER_KUBE_NAMESPACE", ""), config=True,
        help="With source kubernetes: the notebook pods' namespace; empty: every namespace.")
    state_file = Unicode(config=True, help="Where open incidents are kept across restarts.")
    events_file = Unicode(
        config=True,
        help=f"""The hub's event log, whose preemptions are told to the people of the
        servers stopped, as a file. Default: $QUOTA_SPAWNER_EVENTS_FILE when set, else
        empty when there is a usage_db (its events table, which the hub writes with its
        ledger: no folder need be shared), else {EVENTS_FILE} in
        $QUOTA_SPAWNER_STATE_DIR when set. Empty: the events table of usage_db, or
        none.""")
    usage_db = Unicode(
        config=True,
        help="""The usage ledger (docs/usage.md), into whose sessions each cycle's samples
        are folded: the hub's QuotaSpawner.usage_db. Default: $QUOTA_SPAWNER_USAGE_DB when
        set, else the hub's default in $QUOTA_SPAWNER_STATE_DIR when set. Empty or "none":
        not recorded.""")
    gpu_usage_file = Unicode(
        config=True,
        help=f"""Where each cycle's per-GPU, per-server and host numbers are written as a
        file, for the admins' host map. Default: empty when there is a usage_db (they go to
        its database, this node's row of the hub's "gpu-usage" document: no folder need be
        shared), else {GPU_USAGE.file} in $QUOTA_SPAWNER_STATE_DIR when set; empty: no
        file.""")
    host_name = Unicode(socket.gethostname(), config=True, help="This host, in messages.")
    metrics_ip = Unicode(os.environ.get("QUOTA_SPAWNER_METRICS_IP", "127.0.0.1"), config=True,
                         help="Address of /metrics.")
    metrics_port = Integer(9835, config=True, help="Port of /metrics; 0: no /metrics.")
    metrics_token = Unicode(os.environ.get("QUOTA_SPAWNER_METRICS_TOKEN", ""), config=True,
                            help="Bearer token /metrics asks for; empty: none.")
    dcgm_mapping_dir = Unicode(
        os.environ.get("DCGM_HPC_JOB_MAPPING_DIR", ""), config=True,
        help="Write dcgm-exporter's HPC job mapping here (one file per GPU index).")
    test_channel = Unicode(
        "", config=True,
        help="Send one test message to this channel URL, say whether it arrived, and exit.")
    home_root = Unicode(
        config=True,
        help="""The hub's homes' root (c.QuotaSpawner.home_root): each cycle every home's
        use is read with one quota query, for the home and filesystem alerts, the gauges,
        each server's home.json and the host map (docs/disk.md). Default:
        $QUOTA_SPAWNER_HOME_ROOT. Empty: homes are not read.""")
    home_mechanism = CaselessStrEnum(
        list(HOME_MECHANISMS), "auto", config=True,
        help="The hub's c.QuotaSpawner.home_mechanism: auto, btrfs, xfs, ext4, image or "
             "none.")
    home_use_dir = Unicode(
        config=True,
        help=f"""Where each running server's home.json is written, in a folder per home
        that the hub makes and mounts into the server. Default: {HOME_USE_STATE} in
        $QUOTA_SPAWNER_STATE_DIR when set; empty: none.""")
    proc_root = Unicode("/proc", config=True, help="The host's /proc (mounted, in a container).")
    cgroup_root = Unicode("/sys/fs/cgroup", config=True, help="The host's cgroup tree.")

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.INFO

    @default("log_format")
    def _log_format_default(self) -> str:
        return "[%(levelname)1.1s %(asctime)s %(name)s] %(message)s"

    @default("hub_url")
    def _hub_url_default(self) -> str:
        return os.environ.get("JUPYTERHUB_PUBLIC_URL", "http://127.0.0.1:8000")

    @default("state_file")
    def _state_file_default(self) -> str:
        state = os.environ.get("QUOTA_SPAWNER_STATE_DIR", ".")
        return str(Path(state) / "watchdog-incidents.json")

    @default("usage_db")
    def _usage_db_default(self) -> str:
        if "QUOTA_SPAWNER_USAGE_DB" in os.environ:  # set empty: not recorded
            return os.environ["QUOTA_SPAWNER_USAGE_DB"]
        state = os.environ.get("QUOTA_SPAWNER_STATE_DIR", "")
        return default_url(state) if state else ""

    @default("events_file")
    def _events_file_default(self) -> str:
        if "QUOTA_SPAWNER_EVENTS_FILE" in os.environ:  # set empty: not read
            return os.environ["QUOTA_SPAWNER_EVENTS_FILE"]
        if self.usage_db and self.usage_db != "none":
            return ""  # the ledger's events table, which the hub writes with its ledger
        # Only in a state folder the hub named: "." would be a guess at the hub's.
        state = os.environ.get("QUOTA_SPAWNER_STATE_DIR", "")
        return str(Path(state) / EVENTS_FILE) if state else ""

    @default("home_root")
    def _home_root_default(self) -> str:
        return os.environ.get("QUOTA_SPAWNER_HOME_ROOT", "")

    @default("home_mechanism")
    def _home_mechanism_default(self) -> str:
        return os.environ.get("QUOTA_SPAWNER_HOME_MECHANISM", "") or "auto"

    @default("home_use_dir")
    def _home_use_dir_default(self) -> str:
        state = os.environ.get("QUOTA_SPAWNER_STATE_DIR", "")
        return str(Path(state) / HOME_USE_STATE) if state else ""

    @default("gpu_usage_file")
    def _gpu_usage_file_default(self) -> str:
        if self.usage_db and self.usage_db != "none":
            return ""  # the database's row, which the host map reads
        state = os.environ.get("QUOTA_SPAWNER_STATE_DIR", "")
        return str(Path(state) / GPU_USAGE.file) if state else ""

    @property
    def node(self) -> str:
        """This watchdog's node, which keys its readings: the Kubernetes node, else the
        host's name."""
        return self.node_name or self.host_name

    def initialize(self, argv: list[str] | None = None) -> None:
        self.parse_command_line(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
            self.parse_command_line(argv)  # the command line wins over the file
        try:
            self.rules = WatchdogRules(parent=self)
            self.rules.check()  # a clear threshold above its high one: refused at start
            self.notifier = Notifier(parent=self, log=self.log)
            mechanism = self.home_mechanism  # a wrong name from the environment: refused
        except (TraitError, ValueError) as error:
            # a setting an admin wrote: one sentence that names it, not a traceback
            where = f"in {self.config_file} or on the command line" if self.config_file \
                else "on the command line"
            self.log.critical("The watchdog does not start: %s. Fix it %s.",
                              str(error).rstrip("."), where)
            self.exit(2)
        # apprise says why a channel failed in its own log: into ours, warnings up
        apprise_log = logging.getLogger("apprise")
        apprise_log.handlers, apprise_log.propagate = list(self.log.handlers), False
        apprise_log.setLevel(logging.WARNING)
        if self.test_channel:
            return  # start() sends the test message; no engine or NVML needed
        self.find_hub_id()
        if self.source == "kubernetes":
            self.containers = self.oom_events = self.pods()
        else:
            # connected at the first cycle: an engine that is down now is told, not fatal
            client = EngineClient(self.docker_host)
            self.containers = Containers(client, self.hub_id)
            self.oom_events = OomEvents(client, self.hub_id, self.log)
        self.nvml = Nvml()
        self.xids = XidWatcher(self.nvml, log=self.log)
        self._last_gpus: dict[str, GpuSample] = {}
        self.cgroups = CgroupReader(root=Path(self.cgroup_root), proc=Path(self.proc_root))
        self.cpu = CpuMeter()
        self.hub = HubDirectory(self.hub_api_url, self.api_token, self.log)
        self.metrics = WatchdogMetrics()
        self.book = IncidentBook.load(Path(self.state_file), self.log)
        if self.home_root:  # opened at the first cycle, in its thread
            self.homes = HomeWatch(self.home_root, mechanism, self.log)
            if self.home_use_dir:
                self.home_files = HomeUseFiles(self.home_use_dir, self.log)

    def pods(self) -> Pods:
        """This node's notebook pods, as the servers and their OOM kills."""
        if not self.node_name:
            self.log.critical("QuotaWatchdog.source is kubernetes, but node_name is empty: "
                              "set NODE_NAME from the pod's spec.nodeName")
            self.exit(2)
        return Pods(kube_api(self.log), self.node_name, self.kube_namespace, self.hub_id,
                    Path(self.proc_root), self.log)

    def find_hub_id(self) -> None:
        """The hub's id from its cookie secret, once the hub has written it (the first
        start of a hub can come after the watchdog's); until then, every hub's containers."""
        if self.hub_id or not self.hub_secret_file:
            return
        self.hub_id = hub_id_from_secret_file(self.hub_prefix, self.hub_secret_file) or ""
        if self.hub_id and hasattr(self, "containers"):
            self.containers.hub_id = self.oom_events.hub_id = self.hub_id
            self.log.info("The hub's id is %s: watching only its containers", self.hub_id)

    # --- one cycle ---------------------------------------------------------------

    def collect(self) -> Snapshot:
        """Everything this cycle reads (blocking: NVML, the engine, /proc and cgroups)."""
        now, tick = time.time(), time.monotonic()
        servers = self.containers.servers()
        disk = self.homes.read() if self.homes is not None else None
        elsewhere = self.gpus_elsewhere(now)
        gpus = self.read_gpus(servers, elsewhere)
        by_container = gpu_memory_by_container(gpus.values(), Path(self.proc_root))
        samples = {}
        homes = disk.homes if disk is not None and disk.homes is not None else {}
        for server in servers:
            usage = self.cgroups.read(server)
            home = self.homes.home_of(server.user) if self.homes is not None else None
            use = homes.get(home) if home is not None else None
            samples[server.container_id] = ServerSample(
                server=server,
                gpu_memory=by_container.get(server.container_id, {}),
                memory_working_set=usage.working_set,
                cpu_used=self.cpu.rate(server.container_id, usage.cpu_seconds, tick),
                oom_kills=usage.oom_kills or 0,
                home_used=use.used if use is not None else None,
                home=home,
            )
        self.cpu.prune(samples)
        self.cgroups.prune(samples)
        engine = self.containers.engine_size()
        return Snapshot(time=now, host=self.host_name, gpus=gpus, servers=samples,
                        engine_cpus=engine[0] if engine else None,
                        engine_memory=engine[1] if engine else None,
                        elsewhere={u: n for u, n in elsewhere.items() if u not in gpus},
                        disk=disk)

    def read_gpus(self, servers: list[Server],
                  elsewhere: dict[str, str] | None = None) -> dict[str, GpuSample]:
        """Every GPU of the host; the ones a server holds or that were seen before are
        reported lost, with NVML's reason, when NVML cannot read them (or at all). A GPU
        this host's NVML never listed is left to another node's watchdog that holds it
        (``elsewhere``, UUID -> node): it is that node's, not lost."""
        elsewhere = elsewhere or {}
        own = {u for u, g in self._last_gpus.items() if g.index >= 0}  # listed here before
        wanted = {uuid for s in servers for uuid in s.gpus} | set(self._last_gpus)
        expected = wanted - (set(elsewhere) - own)
        scan = self.nvml.host_gpus(expected)
        xids = self.xids.poll() if not scan.error else []
        found = {d.uuid: reading_of(d, xids) for d in scan.gpus}
        if scan.error:  # NVML itself is down: every GPU a server holds is out of reach
            for uuid in sorted(expected):
                last = self._last_gpus.get(uuid)
                # -1: never seen, so no index; the messages name it by its UUID
                found[uuid] = GpuSample(uuid=uuid, index=last.index if last else -1,
                                        name=last.name if last else "GPU", lost=scan.error)
        self._last_gpus = {u: g for u, g in found.items() if not u.startswith("unknown:")}
        left = (wanted & set(elsewhere)) - set(found)
        for uuid in sorted(left - self._left):
            self.log.info("%s is left to %s's watchdog, which reads it: this host's NVML "
                          "does not list it, so it is not reported lost here", name(uuid),
                          name(elsewhere[uuid]))
        self._left = left
        return found

    def gpus_elsewhere(self, now: float) -> dict[str, str]:
        """The GPUs other nodes' watchdogs hold (``held_elsewhere``), by UUID, from
        their fresh rows of the hub's ``GPU_USAGE`` document in the ledger; empty
        without a ledger, or while the rows cannot be read (logged once). In its first
        cycles (as long as readings stay fresh) older rows count too: a watchdog started
        with this one has not written yet. Blocking."""
        if not self.usage_db or self.usage_db == "none":
            return {}
        try:
            rows = GpuUsage.read_all(DatabaseDocuments(self._ledger_now().engine, self.hub_id))
        except Exception as error:  # a database that is down or not made yet
            self._elsewhere_lapse.failed(
                self.log, error, "Cannot read the other watchdogs' GPU readings (%s); a "
                "GPU that a container here holds and this host's NVML does not list is "
                "reported lost until they can be read", error)
            return {}
        self._elsewhere_lapse.works(self.log, "The other watchdogs' GPU readings can be "
                                    "read again")
        starting = self._started is not None and now - self._started < stale_after(
            self.interval)
        return held_elsewhere(rows, self.node, now, any_age=starting)

    async def zombies(self, snapshot: Snapshot) -> list[Server]:
        """Containers holding GPUs whose user has no server in the hub (once it answered).

        Only by an answer the hub gave after the container started (with
        ``ZOMBIE_CLOCK_MARGIN``): the hub records a server before its container
        starts, so that answer would name it, while an older one cannot. A fresh
        read is asked for first; when it is not allowed yet (the last read is under
        2 s old) or fails, such a container waits for a later cycle's answer.
        """
        self._first_seen = {cid: self._first_seen.get(cid, snapshot.time)
                            for cid in snapshot.servers}

        def unclaimed() -> list[Server]:
            return [s.server for s in snapshot.servers.values()
                    if s.server.gpus and not self.hub.has_server(s.server.user)]

        def began(server: Server) -> float:
            return server.started if server.started is not None \
                else self._first_seen[server.container_id]

        def judged(server: Server) -> bool:
            read = self.hub.read_at
            return read is not None and read >= began(server) + ZOMBIE_CLOCK_MARGIN

        if not self.hub.known:
            return []
        if not all(judged(s) for s in unclaimed()):
            await self.hub.refresh(force=True)
        return [s for s in unclaimed() if judged(s)]

    async def cycle(self) -> None:
        began = time.monotonic()
        self.find_hub_id()
        snapshot = await asyncio.to_thread(self.collect)
        await self.hub.refresh()
        snapshot.zombies = await self.zombies(snapshot)
        events = self.book.evaluate(snapshot, self.rules, self.oom_events.take())
        for event in events:
            self._spawn(self.notify(event))
        told = await self.hub_events(snapshot)
        if told:  # one after the other: a notice must not come after its follow-up
            self._spawn(self.notify_in_order(told))
        self._spawn(self.send_digests())
        opened = Counter(i.rule for i in self.book.open.values())
        self.metrics.update(snapshot, {rule: opened.get(rule, 0) for rule in RULES})
        if self.dcgm_mapping_dir:
            await asyncio.to_thread(write_dcgm_mapping, Path(self.dcgm_mapping_dir), snapshot)
        if self.usage_db and self.usage_db != "none":
            await asyncio.to_thread(self.record_usage, snapshot)
        if self.gpu_usage_file or (self.usage_db and self.usage_db != "none"):
            await asyncio.to_thread(self.write_gpu_usage, snapshot)
        if self.homes is not None:
            await asyncio.to_thread(self.publish_homes, snapshot)
        saved = json.dumps(self.book.to_json(), sort_keys=True)
        if saved != self._saved:  # most cycles change nothing: no write
            await asyncio.to_thread(self.book.save, Path(self.state_file))
            self._saved = saved
        self.metrics.cycle_done(time.monotonic() - began)

    def _spawn(self, sending: Any) -> None:
        task = asyncio.ensure_future(sending)
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[Any]) -> None:
        """A sending task is done; what it raised is one line in the log, never asyncio's
        "Task exception was never retrieved" with a traceback."""
        self._sending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            self.log.error("Sending failed (%s: %s)", type(error).__name__,
                           one_line(str(error)))

    async def hub_events(self, snapshot: Snapshot) -> list[Event]:
        """The messages (preemptions, budgets) for what the hub appended to its event log
        since the last cycle.

        The book's position moves on (saved with it after the cycle). A log
        that cannot be read is logged once, until it can be, and holds up nothing else.
        """
        where = self.events_source
        if not where:
            return []
        try:
            found, self.book.events = await asyncio.to_thread(self._read_events)
        except Exception as error:  # a file or a database that cannot be read now
            self._events_lapse.failed(
                self.log, error, "Cannot read the hub's event log %s (%s); preemptions and "
                "budget notices are not told until it can be read", where, error)
            return []
        self._events_lapse.works(self.log, "The hub's event log %s can be read again", where)
        told: list[Event] = []
        for event in for_hub(found, self.hub_id):
            notice = HubEvent.from_json(event)
            if isinstance(notice, Preemption):  # counted whether or not the rule is on
                self.metrics.preemption(notice.role, notice.by_role)
            # each on its own: one the watchdog cannot word must not drop the others
            try:
                told += hub_event_messages([event], self.rules, snapshot)
            except Exception as error:
                self.log.error("Cannot tell the hub's event %s (%s: %s); it is skipped",
                               describe_hub_event(event), type(error).__name__,
                               one_line(str(error)))
        return told

    @property
    def events_source(self) -> str:
        """Where the hub's event log is read: the file in a shared state folder, else the
        ledger's ``events`` table (a watchdog on another machine); "" for nowhere."""
        if self.events_file:
            return self.events_file
        if self.usage_db and self.usage_db != "none":
            return f"the events table of {make_url(self.usage_db).render_as_string()}"
        return ""

    def _read_events(self) -> tuple[list[dict[str, Any]], EventCursor]:
        if self.events_file:
            return read_new(self.events_file, self.book.events)
        return read_new_rows(self._ledger_now().engine, self.events_source, self.book.events,
                             self.node)

    def _ledger_now(self) -> Ledger:
        """The hub's ledger, opened once it exists (blocking; LedgerNotReady before). The
        event reads and the samples' folding ask from two threads: one opens it."""
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = Ledger(self.usage_db, self.log, create=False)
                self.log.info("Using the usage ledger %s", self._ledger.url_text)
            return self._ledger

    def record_usage(self, snapshot: Snapshot) -> None:
        """Fold the cycle's samples into the ledger's open sessions (blocking). A ledger
        the hub has not created yet, or that fails, is logged once and tried next cycle."""
        try:
            self._ledger_now().fold(usage_samples(snapshot))
        except Exception as error:
            self._usage_lapse.failed(self.log, error, "Cannot record usage samples (%s); "
                                     "trying again each cycle", error)
            return
        self._usage_lapse.works(self.log, "Usage samples are recorded again")

    def write_gpu_usage(self, snapshot: Snapshot) -> None:
        """This cycle's GPU numbers as this node's row of the hub's ``GPU_USAGE`` document
        in the ledger's database, and to ``gpu_usage_file`` when named (blocking); a
        failure is logged once, until a write succeeds again."""
        text = json.dumps(gpu_usage_snapshot(snapshot, self.book, self.interval, self.node),
                          sort_keys=True)
        try:
            if self.usage_db and self.usage_db != "none":
                DatabaseDocuments(self._ledger_now().engine, self.hub_id).write(
                    GPU_USAGE, text, node=self.node)
            if self.gpu_usage_file:
                write_atomically(self.gpu_usage_file, text)
        except Exception as error:  # a full disk, a database that is down or not made yet
            self._gpu_usage_lapse.failed(self.log, error, "Cannot save this cycle's GPU "
                                         "readings (%s); trying again each cycle", error)
            return
        self._gpu_usage_lapse.works(self.log, "This cycle's GPU readings are saved again")

    def homes_documents(self) -> Documents | None:
        """Where this node's ``homes`` document goes: the ledger's database, else the state
        folder's file (a watchdog without a ledger, beside its hub); None for neither."""
        if self.usage_db and self.usage_db != "none":
            return DatabaseDocuments(self._ledger_now().engine, self.hub_id)
        state = os.environ.get("QUOTA_SPAWNER_STATE_DIR", "")
        return FolderDocuments(state) if state else None

    def publish_homes(self, snapshot: Snapshot) -> None:
        """Each running server's home.json, and this node's ``homes`` document (blocking);
        a failure of either is logged once, until it works again."""
        if self.home_files is not None:
            try:
                self.home_files.write(snapshot)
            except OSError as error:
                self._home_files_lapse.failed(self.log, error, "Cannot write the homes' use "
                                              "for their servers (%s); trying again each "
                                              "cycle", error)
            else:
                self._home_files_lapse.works(self.log, "The homes' use is written for their "
                                             "servers again")
        document = disk_document(snapshot, self.interval, self.node)
        if document is None:
            return
        try:
            documents = self.homes_documents()
            if documents is not None:
                document.write(documents, node=self.node)
        except Exception as error:  # a database that is down or not made yet, a full disk
            self._homes_lapse.failed(self.log, error, "Cannot save this cycle's homes for "
                                     "the host map (%s); trying again each cycle", error)
            return
        self._homes_lapse.works(self.log, "This cycle's homes are saved again")

    async def notify_in_order(self, events: list[Event]) -> None:
        for event in events:  # notify never raises: one failure does not stop the rest
            await self.notify(event)

    async def notify(self, event: Event) -> None:
        """One event to its channels; every event is in the log too, channels or not.

        Never raises: an event that cannot be worded or sent is one line in the
        log, with its incident's key, and the cycle's other events go on.
        """
        try:
            message = self.notifier.message(event)
            self.log.warning("%s | %s", message.title, message.body.replace("\n", " | "))
            results = await self.notifier.send(event, self.hub.groups_for, message=message,
                                               limits=self.book.messages)
        except Exception as error:
            self.log.error("Cannot tell %s of %s (%s: %s); it is skipped", event.kind,
                           one_line(event.incident.key), type(error).__name__,
                           one_line(str(error)))
            return
        for channel, delivered in results.items():
            if delivered:
                self.metrics.notification_sent(channel)
            else:
                self.metrics.notification_failed(channel)

    async def send_digests(self) -> None:
        """The digests of the messages about a user held back since their hour began
        (notify.py), once it has ended; counted as the channels' other messages."""
        for channel, delivered in await self.notifier.send_digests(self.book.messages):
            if delivered:
                self.metrics.notification_sent(channel)
            else:
                self.metrics.notification_failed(channel)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Cycle until ``stop`` is set (never, without one), then let the messages on
        their way finish for up to ``STOP_GRACE`` seconds."""
        stop = stop or asyncio.Event()
        self.oom_events.start()
        if self.metrics_port:
            serve_metrics(self.metrics, self.metrics_ip, self.metrics_port, self.metrics_token)
        self.log.info("Watching %s every %gs (hub %s); incidents in %s; hub events from %s",
                      self.docker_host, self.interval, self.hub_id or "any", self.state_file,
                      self.events_source or "nowhere")
        self.log_gpus_of_other_nodes()
        self._started = time.time()
        while not stop.is_set():
            began = time.monotonic()
            try:
                await self.cycle()
            except EngineUnreachable as error:  # down or restarting: said once, not a trace
                self._engine_lapse.failed(self.log, error, "Cannot reach the engine at %s "
                                          "(%s); trying again each cycle", self.docker_host,
                                          error)
            except Exception:  # one bad cycle must not end the watch
                self.log.exception("Watchdog cycle failed")
            else:
                self._engine_lapse.works(self.log, "The engine at %s answers again",
                                         self.docker_host)
            left = max(0.0, self.interval - (time.monotonic() - began))
            try:
                await asyncio.wait_for(stop.wait(), left)
            except asyncio.TimeoutError:
                pass
        if self._sending:
            await asyncio.wait(set(self._sending), timeout=STOP_GRACE)

    def log_gpus_of_other_nodes(self) -> None:
        """Say at start what becomes of a GPU that a container on this engine holds and
        this host's NVML does not list (two watchdogs on one engine, each with its own
        GPUs): left to the node whose watchdog reads it, which needs the ledger."""
        if self.usage_db and self.usage_db != "none":
            self.log.info("This node is %s: a GPU that a container here holds and this "
                          "host's NVML does not list is left to the node whose watchdog "
                          "reads it (its fresh readings in the ledger), else reported lost",
                          self.node)
        else:
            self.log.warning("This node is %s, and without a usage_db it cannot read the "
                             "other watchdogs' readings: a GPU that a container here holds "
                             "and this host's NVML does not list is reported lost. Two "
                             "watchdogs on one engine need the ledger", self.node)

    async def serve(self) -> str:
        """``run`` until SIGINT or SIGTERM (the hub stops its services with these); the
        name of the signal. The first ends the watch after its cycle; a second, at once."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        main = asyncio.ensure_future(self.run(stop))
        got: list[str] = []

        def on_signal(signum: signal.Signals) -> None:
            got.append(signum.name)
            if stop.is_set():
                main.cancel()
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
        # The handlers stay until the loop closes: a signal while asyncio.run winds down
        # must not raise KeyboardInterrupt there.
        try:
            await main
        except asyncio.CancelledError:
            if not got:  # cancelled by someone else, not a signal
                raise
        return got[0] if got else ""

    def start(self) -> None:
        if self.test_channel:
            try:
                delivered = self.notifier.test_channel(self.test_channel)
            except ValueError as error:  # a typo in the URL: a usage error, said plainly
                print(f"Cannot test this channel: {str(error).rstrip('.')}.", file=sys.stderr)
                self.exit(2)
            print("delivered" if delivered else "NOT delivered; the log above says why")
            self.exit(0 if delivered else 1)
        stopped_by = asyncio.run(self.serve())
        self.log.info("Watchdog stopped (%s)", stopped_by or "done")


def usage_samples(snapshot: Snapshot) -> list[Sample]:
    """Each server's usage this cycle, as the ledger folds it: CPU and memory from its
    cgroup, GPU utilisation as the mean of its GPUs', GPU memory of its own processes,
    its home's use.
    No GPU figures for a server whose GPUs are all another node's: its watchdog folds
    them, and this node's zeros would halve their means."""
    samples = []
    for sample in snapshot.servers.values():
        server = sample.server
        gpus = [u for u in server.gpus if u not in snapshot.elsewhere]
        utils = [g.utilization for u in server.gpus
                 if (g := snapshot.gpus.get(u)) is not None and g.utilization is not None]
        samples.append(Sample(
            hub=server.hub_id, container=server.name, time=snapshot.time, cpu=sample.cpu_used,
            memory=sample.memory_working_set,
            gpu_util=sum(utils) / len(utils) if utils else None,
            gpu_memory=sum(sample.gpu_memory.values()) if gpus else None,
            oom_kills=sample.oom_kills, home_used=sample.home_used))
    return samples


def reading_of(device: NvmlDevice, xids: list[XidEvent]) -> GpuSample:
    """The watchdog's reading of one device from its NVML record, with the XID errors
    NVML reported for it (or, for a MIG instance, its GPU) this cycle."""
    return GpuSample(
        uuid=device.uuid, index=device.index, name=device.name or "GPU",
        memory_used=device.memory_used, memory_total=device.memory_total,
        utilization=device.utilization,
        lost=device.error if device.state != OK else None,
        processes=list(device.processes or []),
        xids=[e.xid for e in xids if e.uuid in (device.uuid, device.parent)])


def gpu_usage_snapshot(snapshot: Snapshot, book: IncidentBook, interval: float,
                       node: str = "") -> dict[str, Any]:
    """One cycle's GPU and host numbers as this node's ``gpu-usage`` document, in its
    JSON (``GpuUsage``, spawner/usage/gpu_readings.py, has the format): the cycle's GPU
    readings as they are, each server's, the open ``gpu_idle`` incidents and the host's
    figures (``HostFigures``). ``node``: this watchdog's node (default: the host)."""
    idle = sorted(
        (IdleGpu(i.gpu_uuid, i.server.name if i.server else None,
                 i.server.user if i.server else None, i.since, i.opened)
         for i in book.open.values() if i.rule == GPU_IDLE and i.gpu_uuid),
        key=lambda d: (d.uuid, d.server or ""))
    figures = HostFigures.of(snapshot)
    return GpuUsage(
        time=snapshot.time, host=snapshot.host, node=node or snapshot.host,
        interval=interval, gpus=dict(snapshot.gpus),
        servers={s.server.name: ServerReading(
            user=s.server.user, role=s.server.role, gpus=tuple(s.server.gpus),
            gpu_memory=dict(s.gpu_memory), cpus=s.server.cpus_reserved,
            memory=s.server.memory_limit, cpu_used=s.cpu_used,
            memory_used=s.memory_working_set) for s in snapshot.servers.values()},
        idle=idle,
        host_totals=HostTotals(
            servers=figures.servers, cpus=figures.cpus_reserved,
            memory=figures.memory_reserved, cpu_used=figures.cpu_used,
            memory_used=figures.memory_used, engine_cpus=snapshot.engine_cpus,
            engine_memory=snapshot.engine_memory)).to_json()


def describe_hub_event(event: dict[str, Any]) -> str:
    """One hub event for the log, safe whatever its fields hold: 'role-request 7 of
    student1 at 1e+13'."""
    kind = event.get("event")
    parts = [name(kind) if isinstance(kind, str) and kind else "(no kind)"]
    if "id" in event:
        parts.append(name(event["id"]) if isinstance(event["id"], str | int)
                     else number(event["id"]))
    if isinstance(event.get("user"), str) and event["user"]:
        parts.append(f"of {name(event['user'])}")
    if "time" in event:
        parts.append(f"at {number(event['time'])}")
    return " ".join(parts)


main = QuotaWatchdog.launch_instance
