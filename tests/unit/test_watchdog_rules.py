"""The watchdog's rules and incident book (spawner/watchdog/rules.py): pure code, no NVML."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from traitlets import TraitError
from traitlets.config import Config

from spawner.watchdog import rules as R
from spawner.watchdog.model import GpuSample, Server, ServerSample, Snapshot
from spawner.watchdog.rules import Event, Incident, IncidentBook, WatchdogRules

GiB = 2**30
CARD = 80 * GiB
UUID = "GPU-aaaa"


def make_server(name: str = "quota-alice", cid: str | None = None, gpus=(UUID,),
                mode: str = "exclusive", memory: int | None = 4 * GiB,
                gpu_limit: int | None = None) -> Server:
    return Server(container_id=cid or f"id-{name}", name=name, user=name.removeprefix("quota-"),
                  role="student", image="pytorch", hub_id="hub-1", gpus=tuple(gpus),
                  gpu_mode=mode if gpus else "", memory_limit=memory, cpus=2.0,
                  gpu_memory_limit=gpu_limit, pid=1234, started=0.0)


def make_gpu(uuid: str = UUID, index: int = 0, total: int | None = CARD,
             util: float | None = 0.5, lost: str | None = None, xids=()) -> GpuSample:
    return GpuSample(uuid=uuid, index=index, memory_total=total, utilization=util, lost=lost,
                     xids=list(xids))


def sample(server: Server, gpu_used: dict[str, int] | None = None,
           working_set: int | None = None, oom_kills: int = 0) -> ServerSample:
    return ServerSample(server=server, gpu_memory=dict(gpu_used or {}),
                        memory_working_set=working_set, oom_kills=oom_kills)


def snap(t: float, *samples: ServerSample, gpus: list[GpuSample] | None = None,
         zombies=()) -> Snapshot:
    gpus = [make_gpu()] if gpus is None else gpus
    return Snapshot(time=t, host="gpu-host-1", gpus={g.uuid: g for g in gpus},
                    servers={s.server.container_id: s for s in samples}, zombies=list(zombies))


def gpu_at(t: float, fraction: float, server: Server | None = None,
           util: float | None = 0.5) -> Snapshot:
    """One server using ``fraction`` of the card's memory at time ``t``."""
    server = server or make_server()
    return snap(t, sample(server, {UUID: round(CARD * fraction)}), gpus=[make_gpu(util=util)])


def kinds(events: list[Event], rule: str | None = None) -> list[str]:
    return [e.kind for e in events if rule is None or e.incident.rule == rule]


def walk(book: IncidentBook, rules: WatchdogRules, snapshots, rule: str | None = None):
    """(time, kinds) of every cycle that produced events of ``rule``."""
    out = []
    for s in snapshots:
        got = kinds(book.evaluate(s, rules), rule)
        if got:
            out.append((s.time, got))
    return out


@pytest.fixture
def rules() -> WatchdogRules:
    return WatchdogRules()


# --- settings --------------------------------------------------------------------


def test_defaults_are_the_issues():
    r = WatchdogRules()
    assert (r.gpu_memory_high, r.gpu_memory_clear, r.gpu_memory_hold) == (0.90, 0.85, 60)
    assert (r.memory_high, r.memory_clear, r.memory_hold) == (0.80, 0.75, 60)
    assert r.idle_gpu_hold == 2 * 3600 and r.idle_gpu_utilization == 0
    assert r.reminder == 4 * 3600 and r.zombie_hold == 0 and r.disabled_rules == []


def test_settings_come_from_config():
    c = Config()
    c.WatchdogRules.gpu_memory_high = 0.95
    c.WatchdogRules.reminder = 600
    c.WatchdogRules.disabled_rules = ["gpu_idle"]
    r = WatchdogRules(config=c)
    assert (r.gpu_memory_high, r.reminder) == (0.95, 600)
    assert not r.enabled("gpu_idle") and r.enabled("oom")


@pytest.mark.parametrize("name, value", [
    ("gpu_memory_high", 0), ("memory_clear", -0.1), ("gpu_memory_hold", -1),
    ("reminder", -5), ("disabled_rules", ["gpu_memroy"]),
])
def test_bad_settings_are_refused(name, value):
    with pytest.raises(TraitError):
        WatchdogRules(**{name: value})


def test_clear_above_high_is_refused():
    r = WatchdogRules(memory_high=0.7)  # the default clear, 0.75, is now above it
    with pytest.raises(ValueError, match="memory_clear"):
        r.check()
    with pytest.raises(ValueError):
        IncidentBook().evaluate(snap(0), r)


@pytest.mark.parametrize("server, gpu, limit", [
    (make_server(mode="exclusive"), make_gpu(), CARD),
    (make_server(mode="exclusive", gpu_limit=10 * GiB), make_gpu(), CARD),
    (make_server(mode="shared:4", gpu_limit=20 * GiB), make_gpu(), 20 * GiB),
    (make_server(mode="shared:4"), make_gpu(), CARD),
    (make_server(mode="shared:4"), make_gpu(total=None), None),
    (make_server(mode="exclusive"), None, None),
])
def test_gpu_memory_limit(server, gpu, limit):
    assert R.gpu_memory_limit(server, gpu) == limit


# --- GPU memory ------------------------------------------------------------------


def test_crossing_for_less_than_the_hold_sends_nothing(rules):
    book = IncidentBook()
    series = [gpu_at(t, f) for t, f in [(0, 0.5), (5, 0.95), (30, 0.97), (64, 0.99), (65, 0.5)]]
    assert walk(book, rules, series) == []
    assert not book.open and not book.pending


def test_crossing_for_the_hold_opens_exactly_once(rules):
    book = IncidentBook()
    series = [gpu_at(t, 0.92) for t in range(0, 600, 5)]
    assert walk(book, rules, series) == [(60, ["open"])]
    (incident,) = book.open.values()
    assert incident.key == f"gpu_memory:quota-alice:{UUID}"
    assert (incident.since, incident.opened, incident.severity) == (0, 60, "warning")
    assert incident.gpu_uuid == UUID and incident.gpu_index == 0
    assert incident.limit == CARD and incident.percent == pytest.approx(92, abs=0.01)
    assert incident.server.user == "alice" and incident.host == "gpu-host-1"
    assert "92% of the card" in incident.what


@pytest.mark.parametrize("fraction", [0.90, 0.9000001, 1.0, 1.3])
def test_at_or_above_high_counts(rules, fraction):
    book = IncidentBook()
    assert walk(book, rules, [gpu_at(0, fraction), gpu_at(60, fraction)]) == [(60, ["open"])]


def test_a_dip_below_high_restarts_the_hold(rules):
    book = IncidentBook()
    series = [gpu_at(0, 0.95), gpu_at(40, 0.88), gpu_at(45, 0.95), gpu_at(100, 0.95),
              gpu_at(105, 0.95)]
    assert walk(book, rules, series) == [(105, ["open"])]


def test_hovering_between_clear_and_high_sends_nothing_more(rules):
    book = IncidentBook()
    series = [gpu_at(0, 0.95), gpu_at(60, 0.95)]
    series += [gpu_at(60 + 5 * i, (0.86, 0.89, 0.91, 0.95, 0.851)[i % 5]) for i in range(1, 200)]
    assert walk(book, rules, series) == [(60, ["open"])]
    assert len(book.open) == 1


@pytest.mark.parametrize("fraction, resolves", [(0.85, True), (0.84, True), (0.0, True),
                                                (0.8501, False), (0.89, False)])
def test_dropping_to_clear_resolves_once(rules, fraction, resolves):
    book = IncidentBook()
    events = walk(book, rules, [gpu_at(0, 0.95), gpu_at(60, 0.95), gpu_at(70, fraction),
                                gpu_at(80, fraction)])
    assert events == ([(60, ["open"]), (70, ["resolve"])] if resolves else [(60, ["open"])])


def test_the_resolve_event_says_why_and_keeps_the_history(rules):
    book = IncidentBook()
    walk(book, rules, [gpu_at(0, 0.95), gpu_at(60, 0.95)])
    (event,) = book.evaluate(gpu_at(90, 0.5), rules)
    assert event.kind == "resolve"
    i = event.incident
    assert (i.since, i.opened, i.resolved) == (0, 60, 90)
    assert i.reason == "GPU memory is down to 50% of the card."
    assert i.percent == pytest.approx(95)  # the numbers of the incident; the reason has the rest
    assert not book.open


def test_a_new_crossing_after_a_resolve_is_a_new_incident(rules):
    book = IncidentBook()
    series = [gpu_at(t, f) for t, f in [(0, .95), (60, .95), (70, .5), (80, .95), (139, .95),
                                        (140, .95)]]
    assert walk(book, rules, series) == [(60, ["open"]), (70, ["resolve"]), (140, ["open"])]


def test_a_reminder_every_four_hours(rules):
    book = IncidentBook()
    series = [gpu_at(t, 0.95) for t in range(0, 9 * 3600, 30)]
    assert walk(book, rules, series) == [(60, ["open"]), (60 + 4 * 3600, ["remind"]),
                                         (60 + 8 * 3600, ["remind"])]


def test_a_reminder_shows_the_latest_numbers(rules):
    book = IncidentBook()
    walk(book, rules, [gpu_at(0, 0.95), gpu_at(60, 0.95), gpu_at(3600, 0.87)])
    (event,) = book.evaluate(gpu_at(60 + 4 * 3600, 0.99), rules)
    assert event.kind == "remind" and event.incident.percent == pytest.approx(99)
    assert event.incident.opened == 60 and event.incident.last_sent == 60 + 4 * 3600


def test_no_reminders_when_set_to_zero():
    book = IncidentBook()
    series = [gpu_at(t, 0.95) for t in range(0, 30 * 3600, 600)]
    assert walk(book, WatchdogRules(reminder=0), series) == [(600, ["open"])]


def test_an_event_is_a_copy(rules):
    book = IncidentBook()
    walk(book, rules, [gpu_at(0, 0.95)])
    (event,) = book.evaluate(gpu_at(60, 0.95), rules)
    book.evaluate(gpu_at(70, 0.5), rules)
    assert event.incident.resolved is None and event.incident.percent == pytest.approx(95)


def test_server_gone_resolves_with_the_reason(rules):
    book = IncidentBook()
    walk(book, rules, [gpu_at(0, 0.95), gpu_at(60, 0.95)])
    (event,) = book.evaluate(snap(70), rules)
    assert event.kind == "resolve" and event.incident.reason == "the server stopped"
    assert not book.open and not book.pending


def test_server_gone_drops_a_pending_crossing(rules):
    book = IncidentBook()
    walk(book, rules, [gpu_at(0, 0.95)])
    assert book.evaluate(snap(30), rules) == []
    assert not book.pending
    # It comes back: the hold starts again.
    assert walk(book, rules, [gpu_at(40, 0.95), gpu_at(90, 0.95), gpu_at(100, 0.95)]) == \
        [(100, ["open"])]


def test_a_restarted_server_with_the_same_name_is_a_new_incident(rules):
    book = IncidentBook()
    walk(book, rules, [gpu_at(0, 0.95), gpu_at(60, 0.95)])
    again = make_server(cid="id-new")
    events = book.evaluate(gpu_at(65, 0.95, again), rules)
    assert [(e.kind, e.incident.server.container_id) for e in events] == \
        [("resolve", "id-quota-alice")]
    assert walk(book, rules, [gpu_at(120, 0.95, again), gpu_at(125, 0.95, again)]) == \
        [(125, ["open"])]


def test_shared_gpu_counts_against_its_own_cap(rules):
    shared = make_server(mode="shared:4", gpu_limit=20 * GiB)
    other = make_server("quota-bob", mode="shared:4", gpu_limit=20 * GiB)
    book = IncidentBook()

    def at(t):
        # alice uses 19 GiB of her 20 GiB cap; bob 2 GiB; the card is far from full.
        return snap(t, sample(shared, {UUID: 19 * GiB}), sample(other, {UUID: 2 * GiB}))

    events = [e for t in (0, 60) for e in book.evaluate(at(t), rules)]
    assert [(e.kind, e.incident.server.name) for e in events] == [("open", "quota-alice")]
    assert events[0].incident.limit == 20 * GiB
    assert "95% of its GPU memory cap" in events[0].incident.what


def test_one_incident_per_gpu(rules):
    two = make_server(gpus=(UUID, "GPU-bbbb"))
    gpus = [make_gpu(), make_gpu("GPU-bbbb", 1)]
    book = IncidentBook()
    for t in (0, 60):
        events = book.evaluate(snap(t, sample(two, {UUID: int(CARD * .95), "GPU-bbbb": 1}),
                                    gpus=gpus), rules)
    assert [(e.incident.gpu_uuid, e.incident.gpu_index) for e in events] == [(UUID, 0)]


def test_an_unreadable_gpu_changes_nothing(rules):
    """A lost card reads as unknown: a pending hold runs on, an open incident stays."""
    lost = [make_gpu(lost="GPU is lost")]
    book = IncidentBook()
    s = make_server()
    series = [gpu_at(0, 0.95), snap(30, sample(s), gpus=lost), gpu_at(60, 0.95),
              snap(100, sample(s), gpus=lost), snap(200, sample(s), gpus=[])]
    assert walk(book, rules, series, "gpu_memory") == [(60, ["open"])]
    assert list(book.open) == [f"gpu_memory:quota-alice:{UUID}", f"gpu_lost:{UUID}"]


def test_a_server_with_no_processes_on_its_gpu_uses_none(rules):
    book = IncidentBook()
    assert walk(book, rules, [snap(t, sample(make_server())) for t in (0, 100)]) == []


# --- container memory ------------------------------------------------------------


def mem_at(t: float, fraction: float | None, limit: int | None = 4 * GiB) -> Snapshot:
    s = make_server(gpus=(), memory=limit)
    ws = None if fraction is None else round(4 * GiB * fraction)
    return snap(t, sample(s, working_set=ws), gpus=[])


@pytest.mark.parametrize("series, expected", [
    ([(0, .5), (100, .5)], []),
    ([(0, .85), (59, .85), (60, .5)], []),
    ([(0, .80), (60, .80)], [(60, ["open"])]),
    ([(0, .85), (60, .85), (70, .78), (80, .79)], [(60, ["open"])]),
    ([(0, .85), (60, .85), (70, .75)], [(60, ["open"]), (70, ["resolve"])]),
    ([(0, .85), (30, .79), (60, .85)], []),
    ([(0, .85), (30, None), (60, .85)], [(60, ["open"])]),  # unknown keeps the hold
    ([(0, .85), (60, .85), (70, None), (80, None)], [(60, ["open"])]),
    ([(0, 1.0), (60, 1.0), (4 * 3600 + 59, .9), (4 * 3600 + 60, .9), (4 * 3600 + 70, .1)],
     [(60, ["open"]), (4 * 3600 + 60, ["remind"]), (4 * 3600 + 70, ["resolve"])]),
])
def test_container_memory(rules, series, expected):
    book = IncidentBook()
    assert walk(book, rules, [mem_at(t, f) for t, f in series], "memory") == expected


def test_container_memory_incident(rules):
    book = IncidentBook()
    (event,) = [e for t in (0, 60) for e in book.evaluate(mem_at(t, 0.9), rules)]
    i = event.incident
    assert i.key == "memory:quota-alice" and i.rule == "memory" and i.gpu_uuid is None
    assert i.limit == 4 * GiB and i.percent == pytest.approx(90, abs=0.01)
    assert i.what == "Memory at 90% of the limit: 3.6 GiB of 4 GiB."


def test_no_memory_limit_no_memory_incident(rules):
    book = IncidentBook()
    assert walk(book, rules, [mem_at(t, 5.0, limit=None) for t in (0, 100)]) == []


# --- OOM kills -------------------------------------------------------------------


def oom_at(t: float, kills: int, server: Server | None = None) -> Snapshot:
    return snap(t, sample(server or make_server(gpus=()), oom_kills=kills), gpus=[])


def test_the_first_sighting_sets_the_baseline(rules):
    book = IncidentBook()
    assert walk(book, rules, [oom_at(0, 3), oom_at(5, 3)]) == []


def test_a_growing_counter_is_one_message_and_no_resolve(rules):
    book = IncidentBook()
    assert walk(book, rules, [oom_at(0, 3), oom_at(5, 4), oom_at(10, 4), oom_at(15, 6),
                              oom_at(4 * 3600 + 20, 6)]) == [(5, ["open"]), (15, ["open"])]
    assert not book.open and not book.pending


def test_the_oom_incident(rules):
    book = IncidentBook()
    book.evaluate(oom_at(0, 0), rules)
    (event,) = book.evaluate(oom_at(5, 2), rules)
    i = event.incident
    assert (i.key, i.rule, i.severity) == ("oom:quota-alice", "oom", "critical")
    assert (i.value, i.limit, i.opened, i.resolved) == (2, 4 * GiB, 5, 5)
    assert i.what == "2 processes of the server were killed for lack of memory " \
                     "(the limit is 4 GiB)."


def test_an_engine_report_opens_even_for_a_gone_container(rules):
    book = IncidentBook()
    s = make_server(gpus=())
    book.evaluate(oom_at(0, 0, s), rules)
    (event,) = book.evaluate(snap(5, gpus=[]), rules, oom_events=[s])
    assert event.kind == "open" and event.incident.server == s
    assert book.evaluate(snap(10, gpus=[]), rules) == []
    assert book.oom == {}


@pytest.mark.parametrize("cycles, expected", [
    # (counter, engine events) per cycle -> cycles with a message
    ([(0, 0), (1, 1)], [1]),  # both sources, same cycle: one message
    ([(0, 0), (1, 0), (1, 1)], [1]),  # the engine's report comes a cycle late
    ([(0, 0), (0, 1), (1, 0)], [1]),  # the counter grows a cycle late
    ([(0, 0), (0, 2), (1, 0), (3, 0)], [1, 3]),  # a third kill
    ([(0, 1)], [0]),  # reported on the first sighting
    ([(5, 0), (1, 0)], [1]),  # a counter that went down was reset: it counts from 0
])
def test_oom_counter_and_engine_count_the_same_kills(rules, cycles, expected):
    book = IncidentBook()
    s = make_server(gpus=())
    got = []
    for t, (counter, reported) in enumerate(cycles):
        if kinds(book.evaluate(oom_at(t, counter, s), rules, oom_events=[s] * reported)):
            got.append(t)
    assert got == expected


def test_oom_counters_of_two_servers_are_apart(rules):
    a, b = make_server("quota-a", gpus=()), make_server("quota-b", gpus=())
    book = IncidentBook()
    book.evaluate(snap(0, sample(a, oom_kills=1), sample(b, oom_kills=7), gpus=[]), rules)
    events = book.evaluate(snap(5, sample(a, oom_kills=2), sample(b, oom_kills=7), gpus=[]),
                           rules)
    assert [e.incident.key for e in events] == ["oom:quota-a"]


# --- GPUs: lost, XID, idle -------------------------------------------------------


def test_an_xid_is_one_message(rules):
    holder = make_server()
    book = IncidentBook()
    events = book.evaluate(snap(0, sample(holder), gpus=[make_gpu(xids=[79])]), rules)
    assert kinds(events) == ["open"]
    i = events[0].incident
    assert (i.key, i.severity, i.value, i.server) == (f"xid:{UUID}", "critical", 79, holder)
    assert i.resolved == 0 and "XID error 79" in i.what and "quota-alice" in i.what
    assert walk(book, rules, [snap(t, sample(holder)) for t in range(5, 5 * 3600, 300)]) == []
    assert not book.open
    # Another one later is another message.
    assert kinds(book.evaluate(snap(6 * 3600, gpus=[make_gpu(xids=[48])]), rules)) == ["open"]


@pytest.mark.parametrize("xids, severity", [([13], "warning"), ([43, 31], "warning"),
                                            ([43, 79], "critical"), ([48], "critical")])
def test_xid_severity(rules, xids, severity):
    (event,) = IncidentBook().evaluate(snap(0, gpus=[make_gpu(xids=xids)]), rules)
    assert event.incident.severity == severity


def lost_at(t: float, lost: str | None, listed: bool = True) -> Snapshot:
    return snap(t, sample(make_server()), gpus=[make_gpu(lost=lost, util=None)] if listed else [])


def test_a_lost_gpu_lasts_until_it_reads_again(rules):
    book = IncidentBook()
    series = [lost_at(0, None), lost_at(5, "GPU is lost"), lost_at(10, "GPU is lost"),
              lost_at(15, None, listed=False), lost_at(4 * 3600 + 5, "GPU is lost"),
              lost_at(4 * 3600 + 10, None)]
    assert walk(book, rules, series, "gpu_lost") == [
        (5, ["open"]), (4 * 3600 + 5, ["remind"]), (4 * 3600 + 10, ["resolve"])]


def test_the_lost_gpu_incident(rules):
    (event,) = IncidentBook().evaluate(lost_at(0, "GPU is lost"), rules)
    i = event.incident
    assert (i.key, i.severity, i.gpu_index) == (f"gpu_lost:{UUID}", "critical", 0)
    assert i.server.name == "quota-alice"  # the one holder
    assert i.what == "NVML cannot read the GPU: GPU is lost. It is held by quota-alice."
    book = IncidentBook()
    book.evaluate(lost_at(0, "GPU is lost"), rules)
    (event,) = book.evaluate(lost_at(5, None), rules)
    assert event.incident.what == i.what and event.incident.reason == "The GPU reads again."


def test_a_lost_gpu_stays_open_when_its_holder_stops(rules):
    book = IncidentBook()
    book.evaluate(lost_at(0, "GPU is lost"), rules)
    assert book.evaluate(snap(5, gpus=[make_gpu(lost="GPU is lost")]), rules) == []


def idle_at(t: float, util: float | None, server: Server | None = None) -> Snapshot:
    return snap(t, sample(server or make_server()), gpus=[make_gpu(util=util)])


H = 3600


@pytest.mark.parametrize("series, expected", [
    ([(0, 0.0), (2 * H - 1, 0.0)], []),
    ([(0, 0.0), (2 * H, 0.0)], [(2 * H, ["open"])]),
    ([(0, 0.0), (H, 0.01), (2 * H, 0.0), (3 * H, 0.0)], []),  # use restarts the clock
    ([(0, 0.0), (H, None), (2 * H, 0.0)], [(2 * H, ["open"])]),  # unknown is no use
    ([(0, None), (3 * H, None)], []),  # and no idleness
    ([(0, None), (H, 0.0), (3 * H - 1, None), (3 * H, 0.0)], [(3 * H, ["open"])]),
    ([(0, 0.0), (2 * H, 0.0), (3 * H, None), (4 * H, 0.3)], [(2 * H, ["open"]),
                                                            (4 * H, ["resolve"])]),
])
def test_an_idle_gpu(rules, series, expected):
    book = IncidentBook()
    assert walk(book, rules, [idle_at(t, u) for t, u in series], "gpu_idle") == expected


def test_the_idle_incident_is_a_notice(rules):
    book = IncidentBook()
    book.evaluate(idle_at(0, 0.0), rules)
    (event,) = book.evaluate(idle_at(2 * H, 0.0), rules)
    i = event.incident
    assert (i.key, i.severity, i.since) == (f"gpu_idle:quota-alice:{UUID}", "info", 0)
    (event,) = book.evaluate(idle_at(2 * H + 5, 0.42), rules)
    assert event.incident.reason == "The GPU is in use again (42%)."


def test_an_idle_threshold_can_be_set():
    book, r = IncidentBook(), WatchdogRules(idle_gpu_utilization=0.05, idle_gpu_hold=60)
    assert walk(book, r, [idle_at(t, 0.04) for t in (0, 60)], "gpu_idle") == [(60, ["open"])]


def test_a_server_without_gpus_is_never_idle(rules):
    book = IncidentBook()
    s = make_server(gpus=())
    assert walk(book, rules, [idle_at(t, 0.0, s) for t in (0, 3 * H)]) == []


# --- zombies ---------------------------------------------------------------------


def test_a_zombie_opens_at_once_and_resolves_when_gone(rules):
    zombie = make_server("quota-old")
    book = IncidentBook()
    series = [snap(0, zombies=[zombie]), snap(5, zombies=[zombie]), snap(10)]
    assert walk(book, rules, series) == [(0, ["open"]), (10, ["resolve"])]


def test_the_zombie_incident(rules):
    zombie = make_server("quota-old")
    book = IncidentBook()
    (event,) = book.evaluate(snap(0, zombies=[zombie]), rules)
    i = event.incident
    assert (i.key, i.severity, i.server, i.value) == ("zombie:quota-old", "warning", zombie, 1)
    assert UUID in i.what
    (event,) = book.evaluate(snap(5), rules)
    assert event.incident.reason == "the container no longer holds GPUs unclaimed"


def test_a_zombie_hold():
    zombie = make_server("quota-old")
    book, r = IncidentBook(), WatchdogRules(zombie_hold=300)
    series = [snap(t, zombies=[zombie]) for t in (0, 100, 299, 300, 305)]
    assert walk(book, r, series) == [(300, ["open"])]


# --- disabled rules --------------------------------------------------------------


def test_a_disabled_rule_raises_nothing():
    book, r = IncidentBook(), WatchdogRules(disabled_rules=["gpu_memory", "oom"])
    assert walk(book, r, [gpu_at(t, 0.99) for t in range(0, 200, 10)]) == []
    assert walk(book, r, [oom_at(0, 0), oom_at(5, 1)]) == []


def test_disabling_a_rule_resolves_its_incidents(rules):
    book = IncidentBook()
    walk(book, rules, [gpu_at(0, 0.99), gpu_at(60, 0.99)])
    (event,) = book.evaluate(gpu_at(70, 0.99), WatchdogRules(disabled_rules=["gpu_memory"]))
    assert event.kind == "resolve" and event.incident.reason == "the rule was turned off"


# --- the book on disk ------------------------------------------------------------


def busy_book(rules: WatchdogRules) -> IncidentBook:
    """An open GPU memory incident, a pending memory crossing and an OOM baseline."""
    book = IncidentBook()
    s = make_server(memory=4 * GiB)

    def at(t, gpu, mem):
        return snap(t, sample(s, {UUID: int(CARD * gpu)}, int(4 * GiB * mem), oom_kills=2))

    book.evaluate(at(0, 0.95, 0.5), rules)
    book.evaluate(at(60, 0.95, 0.5), rules)
    book.evaluate(at(70, 0.95, 0.9), rules)
    return book


def test_save_and_load_round_trip(rules, tmp_path):
    book = busy_book(rules)
    assert set(book.open) == {f"gpu_memory:quota-alice:{UUID}"}
    assert set(book.pending) == {"memory:quota-alice"}
    path = tmp_path / "state" / "incidents.json"
    book.save(path)
    loaded = IncidentBook.load(path)
    assert loaded == book
    assert loaded.open[f"gpu_memory:quota-alice:{UUID}"].server.gpus == (UUID,)
    assert json.loads(path.read_text())["version"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["incidents.json"]  # no temporary left


def test_after_a_restart_nothing_is_announced_again(rules, tmp_path):
    path = tmp_path / "incidents.json"
    busy_book(rules).save(path)
    book = IncidentBook.load(path)
    s = make_server()

    def at(t, gpu, mem):
        return snap(t, sample(s, {UUID: int(CARD * gpu)}, int(4 * GiB * mem), oom_kills=2))

    # The memory crossing began at 70 before the restart: it opens at 130, not 190.
    events = [(t, e.kind, e.incident.rule) for t in (80, 125, 130, 4 * H + 59, 4 * H + 60)
              for e in book.evaluate(at(t, 0.95, 0.9), rules)]
    assert events == [(130, "open", "memory"), (4 * H + 60, "remind", "gpu_memory")]


def test_an_oom_kill_during_a_restart_is_reported(rules, tmp_path):
    path = tmp_path / "incidents.json"
    book = IncidentBook()
    book.evaluate(oom_at(0, 1), rules)
    book.save(path)
    assert kinds(IncidentBook.load(path).evaluate(oom_at(50, 2), rules)) == ["open"]


def test_a_restart_after_the_server_stopped_resolves(rules, tmp_path):
    path = tmp_path / "incidents.json"
    busy_book(rules).save(path)
    events = IncidentBook.load(path).evaluate(snap(500), rules)
    assert [(e.kind, e.incident.reason) for e in events] == [("resolve", "the server stopped")]


def test_saving_again_replaces_the_file(rules, tmp_path):
    path = tmp_path / "incidents.json"
    busy_book(rules).save(path)
    IncidentBook().save(path)
    assert IncidentBook.load(path) == IncidentBook()


def test_a_failed_save_keeps_the_last_file(rules, tmp_path, monkeypatch):
    path = tmp_path / "incidents.json"
    busy_book(rules).save(path)
    before = path.read_text()
    book = busy_book(rules)
    book.open["x"] = Incident(key="x", rule="oom", severity="info", server=None, since=0,
                              value=object())  # not JSON
    with pytest.raises(TypeError):
        book.save(path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["incidents.json"]


def test_a_missing_file_starts_empty(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        assert IncidentBook.load(tmp_path / "nothing.json") == IncidentBook()
    assert "No incident file" in caplog.text


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", '{"version": 2, "open": []}',
                                  '{"version": 1, "open": 5}', "\x00\x01"])
def test_a_corrupt_file_starts_empty_with_a_warning(tmp_path, text):
    path = tmp_path / "incidents.json"
    path.write_text(text)
    log = logging.getLogger("test.watchdog.corrupt")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log.addHandler(handler)
    try:
        assert IncidentBook.load(path, log) == IncidentBook()
    finally:
        log.removeHandler(handler)
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "unreadable" in records[0].getMessage()
    assert (tmp_path / "incidents.json.corrupt").read_text() == text  # kept for a look
    assert not path.exists()


def test_a_bad_entry_is_skipped_and_the_rest_kept(rules, tmp_path, caplog):
    path = tmp_path / "incidents.json"
    busy_book(rules).save(path)
    data = json.loads(path.read_text())
    data["open"].append({"key": "broken"})
    data["open"].append({**data["open"][0], "key": "weird", "rule": "no-such-rule"})
    data["pending"][0]["new_field_of_a_later_version"] = 1
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        book = IncidentBook.load(path)
    assert set(book.open) == {f"gpu_memory:quota-alice:{UUID}"}
    assert set(book.pending) == {"memory:quota-alice"}
    assert caplog.text.count("Skipping") == 2


# --- properties ------------------------------------------------------------------


def reference(series: list[tuple[float, float]], rules: WatchdogRules) -> list[tuple[float, str]]:
    """The GPU memory rule, written out as plainly as possible."""
    out, is_open, since = [], False, None
    for t, f in series:
        if is_open:
            if f <= rules.gpu_memory_clear:
                out.append((t, "resolve"))
                is_open = False
        elif f >= rules.gpu_memory_high:
            since = t if since is None else since
            if t - since >= rules.gpu_memory_hold:
                out.append((t, "open"))
                is_open, since = True, None
        else:
            since = None
    return out


fractions = st.one_of(st.sampled_from([0.84, 0.85, 0.86, 0.89, 0.8999, 0.90, 0.91, 0.97]),
                      st.floats(0.0, 1.1))
# (seconds since the last cycle, the fraction of the card, whether the watchdog restarts first)
steps = st.lists(st.tuples(st.integers(1, 40), fractions, st.booleans()), min_size=1,
                 max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps=steps)
def test_a_random_walk_matches_the_plain_rule(steps):
    """Around the thresholds, with restarts between cycles: never two opens for one
    incident without a resolve between, never an open before the hold, never a resolve
    above the clear threshold."""
    rules = WatchdogRules(reminder=0)
    t, series = 0, []
    for dt, f, restart in steps:
        t += dt
        series.append((t, f, restart))
    book = IncidentBook()
    got = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "incidents.json"
        for t, f, restart in series:
            if restart:
                book.save(path)
                book = IncidentBook.load(path)
            # The fraction as the watchdog computes it: whole bytes of a whole card.
            used = round(CARD * f)
            got += [(t, e.kind) for e in book.evaluate(
                snap(t, sample(make_server(), {UUID: used})), rules)
                if e.incident.rule == "gpu_memory"]
    expected = reference([(t, round(CARD * f) / CARD) for t, f, _ in series], rules)
    assert got == expected
    assert all(a[1] != b[1] for a, b in zip(got, got[1:], strict=False))  # open, resolve, …
