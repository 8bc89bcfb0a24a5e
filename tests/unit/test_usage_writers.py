"""Who writes to the usage ledger besides the hub's spawns: the writer thread
(``LedgerWriter``), the culler's reasons and the watchdog's samples. Real SQLite files in
tmp_path; the ledger of the writer tests is a fake. The ledger's fixtures are
tests/conftest.py's, its helpers tests/ledger_sessions.py's."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import datetime, timezone

import pytest
from ledger_sessions import (
    HUB,
    LOG,
    OTHER_HUB,
    G,
    open_session,
    outcome,
    ran,
    row,
    usage,
)

from spawner.hubconfig.culling import CullReasons, make_arbiter
from spawner.usage.ledger import (
    NO_LEDGER,
    Ledger,
    LedgerWriter,
    Sample,
)
from spawner.watchdog.app import QuotaWatchdog, usage_samples
from spawner.watchdog.model import GpuSample, Server, ServerSample, Snapshot

pytestmark = pytest.mark.usefixtures("quiet_alembic")

# --- 7. LedgerWriter ------------------------------------------------------------------------


class FakeSlowLedger:
    """Records which thread ran each call; the first call is the slowest."""

    def __init__(self):
        self.calls: list[tuple[str, int, str]] = []

    def note(self, label: str, delay: float) -> str:
        time.sleep(delay)
        current = threading.current_thread()
        self.calls.append((label, current.ident, current.name))
        return label.upper()


async def test_the_writer_runs_calls_in_order_on_one_thread_of_its_own():
    fake = FakeSlowLedger()
    writer = LedgerWriter(fake, LOG)
    labels = [f"call{i}" for i in range(6)]
    answers = await asyncio.gather(*(writer.note(label, 0.03 if i == 0 else 0.0)
                                     for i, label in enumerate(labels)))
    assert answers == [label.upper() for label in labels]
    assert [c[0] for c in fake.calls] == labels
    assert len({c[1] for c in fake.calls}) == 1
    assert fake.calls[0][1] != threading.get_ident()  # not the event loop's thread
    assert fake.calls[0][2].startswith("quota-ledger")


async def test_the_writer_on_a_real_ledger(ledger):
    writer = LedgerWriter(ledger, LOG)
    session = await writer.open(hub=HUB, user="ada", container="jupyter-ada", role="gpu",
                                image="torch", cpu_limit=4.0, mem_limit=16 * G,
                                requested=100.0)
    await writer.started(HUB, "jupyter-ada", "cid-ada", when=110.0)
    await writer.ready(HUB, "jupyter-ada", when=115.0)
    assert await writer.hint(HUB, "jupyter-ada", "preempted") is True
    assert await writer.close(HUB, "jupyter-ada", "stopped", when=200.0) == session
    assert outcome(ledger, session) == ("preempted", None, 200.0)


async def test_a_failing_call_is_logged_and_answers_none(ledger, caplog):
    writer = LedgerWriter(ledger, LOG)
    open_session(ledger)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        assert await writer.close(HUB, "jupyter-ada", "bored") is None
        assert await writer.call(ledger.hint, HUB, "jupyter-ada", "nope") is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "Usage ledger: close failed: bored"),
        (logging.ERROR, "Usage ledger: hint failed: nope")]
    assert await writer.open_containers(HUB) == {"jupyter-ada": 1}  # it goes on


async def test_no_ledger_answers_every_call_with_none():
    for name in ("open", "set_gpus", "started", "ready", "hint", "close", "anything"):
        call = getattr(NO_LEDGER, name)(HUB, "jupyter-ada", reason="stopped")
        assert asyncio.iscoroutine(call)
        assert await call is None


# --- 8. the culler's reasons and the watchdog's samples ------------------------------------


def culled_server(user: str = "ada", name: str = "", prefix: str = "/") -> dict:
    return {"name": name, "full_name": f"{user}/{name}",
            "url": f"{prefix}user/{user}/{name + '/' if name else ''}"}


def test_the_culler_hints_the_users_open_session_by_server_name(ledger):
    default = open_session(ledger, container="jupyter-ada")
    named = open_session(ledger, container="jupyter-ada-train", server="train")
    reasons = CullReasons(ledger.url, LOG)
    asyncio.run(reasons.tell(culled_server(name="train"), "culled"))
    assert [row(ledger, s)["hint"] for s in (default, named)] == [None, "culled"]
    asyncio.run(reasons.tell(culled_server(), "max-age"))
    assert [row(ledger, s)["hint"] for s in (default, named)] == ["max-age", "culled"]
    ledger.ready(HUB, "jupyter-ada", when=115.0)
    ledger.ready(HUB, "jupyter-ada-train", when=115.0)
    ledger.close(HUB, "jupyter-ada", "stopped", when=200.0)
    ledger.close(HUB, "jupyter-ada-train", "stopped", when=200.0)
    assert [row(ledger, s)["reason"] for s in (default, named)] == ["max-age", "culled"]


def test_an_escaped_user_name_is_unquoted(ledger):
    session = open_session(ledger, "ada@lab.org", container="jupyter-ada-40lab-2eorg")
    asyncio.run(CullReasons(ledger.url, LOG).tell(
        {"name": "", "url": "/user/ada%40lab.org/"}, "culled"))
    assert row(ledger, session)["hint"] == "culled"


def test_a_ledger_not_created_yet_is_a_warning_and_the_next_cull_tries_again(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'later' / 'usage.sqlite'}"
    reasons = CullReasons(url, LOG)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        asyncio.run(reasons.tell(culled_server(), "culled"))  # does not raise
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(
        logging.WARNING,
        f"Could not tell the usage ledger why ada is culled: the usage ledger at {url} does "
        "not exist yet; the hub creates it when it starts (or run: quota-spawner ledger "
        "upgrade)")]
    ledger = Ledger(url, LOG)  # the hub starts
    session = open_session(ledger)
    asyncio.run(reasons.tell(culled_server(), "culled"))
    assert row(ledger, session)["hint"] == "culled"
    ledger.dispose()


def test_without_a_ledger_the_culler_tells_nothing(tmp_path):
    for no_url in ("", "none"):
        asyncio.run(CullReasons(no_url, LOG).tell(culled_server(), "culled"))
    assert list(tmp_path.iterdir()) == []


QUOTAS = """\
images:
  pt: {image: quota-spawner/pytorch:latest}
roles:
  quick: {cpus: 1, memory: 1G, images: [pt], idle_timeout: 20m}
  long-run: {cpus: 1, memory: 1G, images: [pt], max_age: 72h}
assignments:
  default: [quick]
"""


def test_the_arbiter_tells_the_ledger_culled_or_max_age(ledger, tmp_path):
    from datetime import timedelta

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS)
    arbiter = make_arbiter(str(quotas), log=LOG, usage_db=ledger.url)
    idle = open_session(ledger, "ada")
    old = open_session(ledger, "bo")
    started = (datetime.now(timezone.utc) - timedelta(hours=80)).isoformat()
    assert asyncio.run(arbiter(
        inactive=timedelta(minutes=25), inactive_limit=3600,
        server=dict(culled_server("ada"), started=started,
                    user_options={"profile": "quick"})))
    assert asyncio.run(arbiter(
        inactive=timedelta(minutes=1), inactive_limit=3600,
        server=dict(culled_server("bo"), started=started,
                    user_options={"profile": "long-run"})))
    assert [row(ledger, s)["hint"] for s in (idle, old)] == ["culled", "max-age"]


def test_the_culler_hints_the_right_user_under_a_base_url(ledger):
    session = open_session(ledger)
    asyncio.run(CullReasons(ledger.url, LOG).tell(culled_server(prefix="/jhub/"), "culled"))
    assert row(ledger, session)["hint"] == "culled"


def nb_server(name: str, gpus=(), hub: str = HUB) -> Server:
    return Server(container_id=f"id-{name}", name=name, user=name, role="r", image="i",
                  hub_id=hub, gpus=tuple(gpus), gpu_mode="exclusive" if gpus else "")


def test_usage_samples_from_a_snapshot():
    snapshot = Snapshot(time=500.0, host="gpu-host-1", gpus={
        "GPU-a": GpuSample("GPU-a", 0, utilization=0.25),
        "GPU-b": GpuSample("GPU-b", 1, utilization=0.75),
        "GPU-c": GpuSample("GPU-c", 2, utilization=None, lost="GPU is lost"),
        "GPU-d": GpuSample("GPU-d", 3, utilization=1.0),  # nobody's
    }, servers={
        "id-two": ServerSample(nb_server("two", ["GPU-a", "GPU-b"]),
                               gpu_memory={"GPU-a": 3 * G, "GPU-b": G},
                               memory_working_set=2 * G, cpu_used=1.5, oom_kills=2),
        "id-cpu": ServerSample(nb_server("cpu", hub=OTHER_HUB), memory_working_set=G,
                               cpu_used=0.25, gpu_memory={"GPU-a": 5}),
        "id-blind": ServerSample(nb_server("blind", ["GPU-c", "GPU-gone"])),
    })
    assert usage_samples(snapshot) == [
        Sample(hub=HUB, container="two", time=500.0, cpu=1.5, memory=2 * G, gpu_util=0.5,
               gpu_memory=4 * G, oom_kills=2),
        Sample(hub=OTHER_HUB, container="cpu", time=500.0, cpu=0.25, memory=G,
               gpu_util=None, gpu_memory=None, oom_kills=0),
        Sample(hub=HUB, container="blind", time=500.0, cpu=None, memory=None, gpu_util=None,
               gpu_memory=0, oom_kills=0),
    ]
    assert usage_samples(Snapshot(time=1.0, host="h")) == []


def test_the_watchdog_folds_its_samples_once_the_hub_made_the_ledger(url, caplog):
    watchdog = QuotaWatchdog(hub_id=HUB, usage_db=url)
    watchdog.log = LOG
    snapshot = Snapshot(time=500.0, host="h", servers={
        "id-ada": ServerSample(nb_server("jupyter-ada"), cpu_used=0.5, memory_working_set=G)})
    with caplog.at_level(logging.INFO, logger=LOG.name):
        watchdog.record_usage(snapshot)
        watchdog.record_usage(snapshot)  # the same trouble is logged once
        ledger = Ledger(url, LOG)
        session = open_session(ledger)
        ran(ledger)
        caplog.clear()
        watchdog.record_usage(snapshot)
    assert [r.getMessage() for r in caplog.records if r.name == LOG.name] == [
        f"Using the usage ledger {url}", "Usage samples are recorded again"]
    assert usage(ledger, session) == dict(
        last_seen=500.0, cpu_samples=1, cpu_sum=0.5, cpu_peak=0.5, mem_samples=1,
        mem_sum=float(G), mem_peak=G, gpu_samples=0, gpu_util_sum=0.0, gpu_util_peak=None,
        gpu_mem_sum=0.0, gpu_mem_peak=None, oom_kills=0)
    ledger.dispose()


def test_the_watchdog_folds_each_homes_use_into_its_peak(ledger):
    watchdog = QuotaWatchdog(hub_id=HUB, usage_db=ledger.url)
    watchdog.log = LOG
    ada, bo = open_session(ledger, "ada"), open_session(ledger, "bo")
    ran(ledger, "jupyter-ada")
    ran(ledger, "jupyter-bo", container_id="cid-bo")
    for when, used in ((500.0, 3 * G), (505.0, 5 * G), (510.0, 4 * G)):
        watchdog.record_usage(Snapshot(time=when, host="h", servers={
            "id-ada": ServerSample(nb_server("jupyter-ada"), cpu_used=0.5, home_used=used),
            "id-bo": ServerSample(nb_server("jupyter-bo"), cpu_used=0.5)}))  # not read
    assert [row(ledger, s)["home_peak"] for s in (ada, bo)] == [5 * G, None]


def test_the_watchdog_logs_a_missing_ledger_once(url, caplog):
    watchdog = QuotaWatchdog(hub_id=HUB, usage_db=url)
    watchdog.log = LOG
    with caplog.at_level(logging.INFO, logger=LOG.name):
        watchdog.record_usage(Snapshot(time=1.0, host="h"))
        watchdog.record_usage(Snapshot(time=2.0, host="h"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOG.name] == [(
        logging.WARNING,
        f"Cannot record usage samples (the usage ledger at {url} does not exist yet; the hub "
        "creates it when it starts (or run: quota-spawner ledger upgrade)); trying again "
        "each cycle")]


def test_the_watchdog_finds_the_hubs_ledger_in_the_hubs_state_folder(monkeypatch, tmp_path):
    from spawner.watchdog.app import QuotaWatchdog

    monkeypatch.delenv("QUOTA_SPAWNER_USAGE_DB", raising=False)
    monkeypatch.delenv("QUOTA_SPAWNER_STATE_DIR", raising=False)
    assert QuotaWatchdog().usage_db == ""  # no state folder named: no guess
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    assert QuotaWatchdog().usage_db == f"sqlite:///{tmp_path / 'quota-spawner-usage.sqlite'}"
    monkeypatch.setenv("QUOTA_SPAWNER_USAGE_DB", "postgresql://q@db/usage")
    assert QuotaWatchdog().usage_db == "postgresql://q@db/usage"
    monkeypatch.setenv("QUOTA_SPAWNER_USAGE_DB", "")  # set empty: not recorded
    assert QuotaWatchdog().usage_db == ""
