"""Two watchdogs on one engine, each with its own GPUs: a GPU that a container here holds
and this host's NVML does not list is another node's when that node's watchdog reads it.

The watchdog of node b (its NVML lists GPU-b only) sees ann's container, which holds
GPU-a, node a's. It calls GPU-a lost only while no fresh row of another node in the
ledger shows that node holds it; a lost incident it opened before (node a's watchdog
started later) resolves once node a's row says so.

The app's own ``collect`` on the real NVML layer over the FAKE pynvml, a real SQLite
ledger and the real rules; an engine that lists ann's container stands in for Docker.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from fake_pynvml import FakeGpu, FakeNvml
from spawner.gpu.nvml import Nvml
from spawner.usage.documents import GPU_USAGE, DatabaseDocuments
from spawner.usage.ledger import Ledger
from spawner.watchdog.app import QuotaWatchdog, gpu_usage_snapshot, usage_samples
from spawner.watchdog.host import CgroupReader, CpuMeter
from spawner.watchdog.model import GpuSample, Server, Snapshot
from spawner.watchdog.rules import GPU_LOST, IncidentBook, WatchdogRules

HUB = "hub-1"
G = 2**30
LOG = "test.watchdog.other_nodes"
ANN = Server(container_id="c1", name="quota-ann", user="ann", role="gpu", image="pytorch",
             hub_id=HUB, gpus=("GPU-a",), gpu_mode="exclusive")


class NoXids:
    def poll(self) -> list:
        return []


class Engine:
    """The engine both watchdogs watch: ann's container, and nothing of the engine's size."""

    def servers(self) -> list[Server]:
        return [ANN]

    def engine_size(self) -> None:
        return None


def node_b(ledger_url: str, folder: Path) -> QuotaWatchdog:
    app = QuotaWatchdog(usage_db=ledger_url, hub_id=HUB, host_name="node-b", interval=1.0,
                        proc_root=str(folder))
    app.nvml, app.xids, app._last_gpus = Nvml(FakeNvml([FakeGpu("GPU-b")])), NoXids(), {}
    app.containers, app.cpu = Engine(), CpuMeter()
    app.cgroups = CgroupReader(root=folder, proc=folder)
    app.log = logging.getLogger(LOG)
    return app


def write_row(ledger: Ledger, node: str, gpus: dict[str, GpuSample], at: float) -> None:
    data = gpu_usage_snapshot(Snapshot(time=at, host=node, gpus=gpus), IncidentBook(), 1.0)
    DatabaseDocuments(ledger.engine, HUB).write(GPU_USAGE, json.dumps({**data, "node": node}),
                                                node=node)


def cycle(app: QuotaWatchdog, book: IncidentBook) -> tuple[Snapshot, list]:
    """What one cycle reads, and the rules' verdict on it."""
    snap = app.collect()
    return snap, book.evaluate(snap, WatchdogRules())


def test_a_gpu_another_node_reads_is_not_called_lost(tmp_path, ledger, ledger_url, caplog):
    now = time.time()
    write_row(ledger, "node-a", {"GPU-a": GpuSample("GPU-a", 0, "H200", 6 * G, 80 * G, 0.61)},
              now - 1)
    app, book = node_b(ledger_url, tmp_path), IncidentBook()
    with caplog.at_level(logging.INFO, logger=LOG):
        snap, events = cycle(app, book)
        cycle(app, book)
    assert sorted(snap.gpus) == ["GPU-b"] and snap.elsewhere == {"GPU-a": "node-a"}
    assert events == [] and not book.open
    told = [r.getMessage() for r in caplog.records if "left to" in r.getMessage()]
    assert told == ["GPU-a is left to node-a's watchdog, which reads it: this host's NVML "
                    "does not list it, so it is not reported lost here"]  # once
    # its own row says nothing of GPU-a, so the host map shows node a's reading alone
    assert "GPU-a" not in gpu_usage_snapshot(snap, book, 1.0)["gpus"]
    # and ann's session gets no GPU zeros from here: node a's watchdog samples her GPU
    (sample,) = usage_samples(snap)
    assert sample.gpu_util is None and sample.gpu_memory is None


def test_without_a_fresh_reading_of_another_node_it_is_lost(tmp_path, ledger, ledger_url):
    """No other row, a stale one, or one whose node does not see GPU-a either: lost."""
    now = time.time()
    app = node_b(ledger_url, tmp_path)
    for row in (None, ("node-a", GpuSample("GPU-a", 0, "H200", 0, 80 * G, 0.1), now - 60),
                ("node-c", GpuSample("GPU-a", -1, lost="Not Found"), now)):
        if row is not None:
            write_row(ledger, row[0], {"GPU-a": row[1]}, row[2])
        book = IncidentBook()
        snap, events = cycle(app, book)
        assert snap.gpus["GPU-a"].lost == "Not Found" and snap.elsewhere == {}
        assert [(e.kind, e.incident.rule) for e in events] == [("open", GPU_LOST)]


def test_just_started_it_waits_for_the_other_watchdog_to_write(tmp_path, ledger, ledger_url):
    """Both watchdogs restarted together: node a's row is old for the first cycles
    (fresh readings' time: 10 s here), after which GPU-a is lost unless it writes."""
    now = time.time()
    write_row(ledger, "node-a", {"GPU-a": GpuSample("GPU-a", 0, "H200", 0, 80 * G, 0.1)},
              now - 60)
    app, book = node_b(ledger_url, tmp_path), IncidentBook()
    app._started = now - 1
    snap, events = cycle(app, book)
    assert "GPU-a" not in snap.gpus and events == []
    app._started = now - 10
    snap, events = cycle(app, book)
    assert snap.gpus["GPU-a"].lost and [e.kind for e in events] == ["open"]


def test_a_lost_incident_ends_once_the_gpus_node_reads_it(tmp_path, ledger, ledger_url):
    """Node b started first and called GPU-a lost; node a's watchdog then writes its row."""
    now = time.time()
    app, book = node_b(ledger_url, tmp_path), IncidentBook()
    _, events = cycle(app, book)
    assert [e.kind for e in events] == ["open"]
    write_row(ledger, "node-a", {"GPU-a": GpuSample("GPU-a", 0, "H200", 0, 80 * G, 0.1)}, now)
    snap, events = cycle(app, book)
    (event,) = events
    assert event.kind == "resolve" and event.incident.rule == GPU_LOST
    assert event.incident.reason == ("node-a's watchdog reads it; it is that node's GPU, "
                                     "not this host's")
    assert "GPU-a" not in snap.gpus and not book.open


def test_its_own_lost_gpu_stays_lost_whatever_other_nodes_say(tmp_path, ledger, ledger_url):
    """A GPU this host's NVML listed is this node's: lost here is lost, even where another
    node's row holds it too (two watchdogs on one host)."""
    now = time.time()
    write_row(ledger, "node-a", {"GPU-b": GpuSample("GPU-b", 0, "H200", 0, 80 * G, 0.1)}, now)
    app, book = node_b(ledger_url, tmp_path), IncidentBook()
    cycle(app, book)
    assert app._last_gpus["GPU-b"].index == 0
    app.nvml._module.gpus[0].lost = True  # off the bus
    snap, events = cycle(app, book)
    assert snap.gpus["GPU-b"].lost and snap.elsewhere == {}
    assert [(e.kind, e.incident.key) for e in events] == [("open", "gpu_lost:GPU-b")]
    (sample,) = usage_samples(snap)  # no row holds ann's GPU-a: this node reports it
    assert sample.gpu_memory == 0


def test_the_start_says_what_becomes_of_another_nodes_gpu(tmp_path, ledger_url, caplog):
    alone = QuotaWatchdog(usage_db="none", host_name="node-b")
    alone.log = logging.getLogger(LOG)
    with caplog.at_level(logging.INFO, logger=LOG):
        node_b(ledger_url, tmp_path).log_gpus_of_other_nodes()
        alone.log_gpus_of_other_nodes()
    with_ledger, without = (r for r in caplog.records if "This node is node-b" in r.getMessage())
    assert with_ledger.levelno == logging.INFO
    assert "is left to the node whose watchdog reads it" in with_ledger.getMessage()
    assert without.levelno == logging.WARNING
    assert without.getMessage().endswith("Two watchdogs on one engine need the ledger")
