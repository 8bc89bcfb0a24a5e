"""The watchdog's rules, and the book of incidents they open and resolve.

``WatchdogRules`` holds the thresholds (``c.WatchdogRules.<name>``).
``IncidentBook.evaluate`` applies them to one ``Snapshot`` and says what
changed, as ``Event``s: one ``open`` per incident, a ``remind`` every
``reminder`` seconds while it lasts, one ``resolve`` when it ends. The book is
kept in a JSON file between runs, so a restarted watchdog announces nothing
twice and its hold timers continue.

Pure code: no NVML, no engine, no clock; the time is the snapshot's. Only
``save`` and ``load`` block (file I/O).

How a reading counts, for each rule: *high* (the condition holds), *low*
(between the clear and the high threshold: an open incident stays, a pending
crossing is dropped, since the hold needs the condition without a break),
*clear* (an open incident resolves) or *unknown* (nothing can be read: nothing
changes, timers run on).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from traitlets import Float, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from spawner.quota.units import format_human
from spawner.watchdog import disk_words
from spawner.watchdog.disk_words import DISK_RULES, HOME_DISK, HOMES_FILESYSTEM
from spawner.watchdog.limits import MessageLimits
from spawner.watchdog.model import (
    GpuSample,
    Server,
    ServerSample,
    Snapshot,
    home_size,
    homes_of,
)
from spawner.watchdog.text import name as plain_name

# --- the rules -------------------------------------------------------------------

GPU_MEMORY = "gpu_memory"  # a server's own GPU memory against its GPU limit
MEMORY = "memory"  # a container's working set against its memory limit
OOM = "oom"  # a process of the container was OOM-killed
GPU_LOST = "gpu_lost"  # NVML cannot read a GPU
XID = "xid"  # NVML reported an XID error on a GPU
GPU_IDLE = "gpu_idle"  # a GPU held by a server shows no utilisation
ZOMBIE = "zombie"  # a container of this hub holds GPUs that no server claims
# HOME_DISK (a user's home near its size) and HOMES_FILESYSTEM (the filesystem that holds
# the homes nearly full) are worded in disk_words.py.
# The rules that read the host and keep incidents (and an open-incidents gauge each).
RULES = (GPU_MEMORY, MEMORY, OOM, GPU_LOST, XID, GPU_IDLE, ZOMBIE, *DISK_RULES)
# Rules that tell what the hub's event log says (hub_events.py): no incident to keep.
PREEMPTION = "preemption"  # the hub stops a server to free its GPUs for a higher priority
BUDGET = "budget"  # a GPU-hour budget of a running server's user nears its end or is spent
ROLE_REQUEST = "role_request"  # a user asked for a bigger role; it was decided or withdrawn
HUB_EVENT_RULES = (PREEMPTION, BUDGET, ROLE_REQUEST)
# Every name disabled_rules and a channel's rules take.
ALL_RULES = RULES + HUB_EVENT_RULES

# Rules about one event, not a state: they open and close in the same cycle.
INSTANT_RULES = (OOM, XID)
# Rules whose incident ends when its server stops.
SERVER_RULES = (GPU_MEMORY, MEMORY, GPU_IDLE)

# XIDs that a program's own fault causes (illegal address, bad instruction, a
# killed context), not the card: a warning, not critical.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})

Severity = Literal["critical", "warning", "info"]
State = Literal["high", "low", "clear", "unknown"]


class WatchdogRules(Configurable):
    """The watchdog's thresholds, hold times and reminders (docs/watchdog.md#rules)."""

    gpu_memory_high = Float(
        0.90, config=True,
        help="""A server's own GPU memory, as a fraction of its GPU limit (the card for
        exclusive roles, the role's gpu_memory for shared ones), at or above which
        an alert is raised once it lasts gpu_memory_hold seconds.""",
    )
    gpu_memory_clear = Float(
        0.85, config=True,
        help="""The fraction at or below which a GPU memory alert ends. Between it and
        gpu_memory_high nothing changes, so a job hovering at the threshold does not flap.""",
    )
    gpu_memory_hold = Float(
        60.0, config=True,
        help="Seconds GPU memory must stay at or above gpu_memory_high before the alert.",
    )
    memory_high = Float(
        0.80, config=True,
        help="""A container's memory working set (usage minus inactive file cache), as a
        fraction of its memory limit, at or above which an alert is raised once it lasts
        memory_hold seconds.""",
    )
    memory_clear = Float(
        0.75, config=True, help="The fraction at or below which a memory alert ends.",
    )
    memory_hold = Float(
        60.0, config=True,
        help="Seconds memory must stay at or above memory_high before the alert.",
    )
    idle_gpu_hold = Float(
        2 * 3600.0, config=True,
        help="""Seconds a GPU held by a server may show no utilisation before a waste
        notice goes to the admins.""",
    )
    idle_gpu_utilization = Float(
        0.0, config=True,
        help="""Utilisation (0 to 1) at or below which a held GPU counts as idle. A GPU
        whose utilisation NVML cannot read counts as neither idle nor busy.""",
    )
    home_disk_high = Float(
        0.90, config=True,
        help="""A user's home's use, as a fraction of its size (the role's disk), at or
        above which the user and the admins are told, once it lasts home_disk_hold
        seconds.""",
    )
    home_disk_clear = Float(
        0.85, config=True, help="The fraction at or below which a home's alert ends.",
    )
    home_disk_hold = Float(
        60.0, config=True,
        help="Seconds a home must stay at or above home_disk_high before the alert.",
    )
    homes_filesystem_high = Float(
        0.90, config=True,
        help="""The filesystem that holds the homes, used as a fraction of what it holds
        and has free (as df counts it), at or above which the admins are told, once it
        lasts homes_filesystem_hold seconds.""",
    )
    homes_filesystem_clear = Float(
        0.85, config=True,
        help="The fraction at or below which the homes' filesystem's alert ends.",
    )
    homes_filesystem_hold = Float(
        60.0, config=True,
        help="Seconds the homes' filesystem must stay at or above homes_filesystem_high "
             "before the alert.",
    )
    zombie_hold = Float(
        0.0, config=True,
        help="""Seconds a container of this hub may hold GPUs unclaimed by any server
        before the alert. The hub stops such containers after its zombie_grace_period.""",
    )
    reminder = Float(
        4 * 3600.0, config=True,
        help="Seconds between reminders while an incident lasts; 0 sends none.",
    )
    disabled_rules = List(
        Unicode(), config=True,
        help=f"""Rules that raise nothing, by name: {", ".join(ALL_RULES)}. Their open
        incidents end with a resolved message.""",
    )

    @validate("gpu_memory_high", "gpu_memory_clear", "memory_high", "memory_clear",
              "home_disk_high", "home_disk_clear", "homes_filesystem_high",
              "homes_filesystem_clear")
    def _positive_fraction(self, proposal: Any) -> float:
        if not proposal.value > 0:
            raise TraitError(f"{proposal.trait.name} must be above 0, not {proposal.value}")
        return proposal.value

    @validate("gpu_memory_hold", "memory_hold", "idle_gpu_hold", "zombie_hold", "reminder",
              "idle_gpu_utilization", "home_disk_hold", "homes_filesystem_hold")
    def _not_negative(self, proposal: Any) -> float:
        if not proposal.value >= 0:
            raise TraitError(f"{proposal.trait.name} must be 0 or more, not {proposal.value}")
        return proposal.value

    @validate("disabled_rules")
    def _known_rules(self, proposal: Any) -> list[str]:
        unknown = sorted(set(proposal.value) - set(ALL_RULES))
        if unknown:
            raise TraitError(f"disabled_rules names unknown rules {unknown}; "
                             f"the rules are {', '.join(ALL_RULES)}")
        return proposal.value

    def check(self) -> None:
        """ValueError when a clear threshold is above its high one (traits are set one by one)."""
        for name in ("gpu_memory", "memory", HOME_DISK, HOMES_FILESYSTEM):
            high, clear = getattr(self, f"{name}_high"), getattr(self, f"{name}_clear")
            if clear > high:
                raise ValueError(f"{name}_clear ({clear:g}) must not be above "
                                 f"{name}_high ({high:g})")

    def enabled(self, rule: str) -> bool:
        return rule not in self.disabled_rules


# --- incidents -------------------------------------------------------------------


@dataclass
class Incident:
    """One thing that is wrong, from its first crossing to its end.

    Pending (crossing, not yet announced) while ``opened`` is None; open while
    ``opened`` is set and ``resolved`` is None.
    """

    key: str  # the same across cycles and restarts, e.g. "gpu_memory:quota-alice:GPU-…"
    rule: str
    severity: Severity
    server: Server | None  # the server it concerns, if one
    since: float  # the first crossing, epoch seconds
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    home: str | None = None  # the home's folder name (rule home_disk)
    value: float | None = None  # bytes, a count, a utilisation or an XID, by rule
    limit: float | None = None
    percent: float | None = None  # value against limit, 0 to 100 (or more)
    host: str = ""
    what: str = ""  # a short sentence: what is wrong, with the numbers
    opened: float | None = None  # when it was announced
    last_sent: float | None = None  # the last announcement or reminder
    resolved: float | None = None
    reason: str = ""  # why it ended, once resolved
    # The hub's event it tells (rules preemption, budget), its fields checked (hub_events.py).
    hub_event: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.server is not None:
            data["server"]["gpus"] = list(self.server.gpus)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Incident:
        # Fields a newer version added are ignored; missing ones take their defaults.
        data = {k: v for k, v in data.items() if k in _INCIDENT_FIELDS}
        server = data.get("server")
        if server is not None:
            server = {k: v for k, v in server.items() if k in _SERVER_FIELDS}
            server["gpus"] = tuple(server.get("gpus") or ())
            data["server"] = Server(**server)
        incident = cls(**data)
        if incident.rule not in RULES or incident.severity not in ("critical", "warning", "info"):
            raise ValueError(f"unknown rule or severity in {incident.key!r}")
        return incident


_INCIDENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Incident))
_SERVER_FIELDS = frozenset(f.name for f in dataclasses.fields(Server))


@dataclass
class Event:
    """What a cycle changed: a message to send. ``incident`` is a copy, as of this cycle."""

    kind: Literal["open", "remind", "resolve"]
    incident: Incident


@dataclass
class _Reading:
    """One rule's reading for one key in this cycle."""

    state: State
    incident: Incident  # the numbers of this reading, as a fresh (pending) incident
    hold: float = 0.0
    reason: str = ""  # why it reads clear, for the resolved message


@dataclass
class _OomCounter:
    """What the book knows of one container's OOM kills (by container id)."""

    last: int  # the cgroup counter at the last sighting
    growth: int = 0  # how much the counter grew since the book first saw it
    events: int = 0  # kills the engine reported
    reported: int = 0  # kills announced

    @property
    def known(self) -> int:
        # Both sources count the same kills, often in different cycles: the
        # larger is what is known, so one kill is never announced twice.
        return max(self.growth, self.events)


@dataclass
class EventCursor:
    """How far the watchdog has read the hub's event log (hub_events.py)."""

    path: str
    offset: int = 0  # bytes: the end of the last whole line read
    inode: int | None = None  # the file's, to tell a new file from the one read (None: none)


@dataclass
class IncidentBook:
    """Pending crossings and open incidents; ``evaluate`` once per cycle.

    It also keeps ``events``, where the hub's event log was read to, so that
    the file saved after a cycle records both what was announced and what was
    read, and a restart tells nothing twice; and ``messages``, how many
    messages about each user each channel got this hour (limits.py), so that a
    restart neither lifts the limit nor loses a digest.
    """

    pending: dict[str, Incident] = field(default_factory=dict)
    open: dict[str, Incident] = field(default_factory=dict)
    oom: dict[str, _OomCounter] = field(default_factory=dict)
    events: EventCursor | None = None  # None: never read; the first read starts at the end
    messages: MessageLimits = field(default_factory=MessageLimits)

    def evaluate(self, snapshot: Snapshot, rules: WatchdogRules,
                 oom_events: Iterable[Server] = ()) -> list[Event]:
        """Apply the rules to one snapshot; the messages to send, in order.

        ``oom_events`` are the servers the engine reported OOM-killed since the
        last cycle, once per kill (a container whose main process was killed
        may already be gone from the snapshot).
        """
        rules.check()
        now = snapshot.time
        readings = {}
        for reading in _readings(snapshot, rules):
            readings[reading.incident.key] = reading
        events: list[Event] = []

        for key, incident in list(self.open.items()):
            reading = readings.get(key)
            gone = (incident.rule in SERVER_RULES and incident.server is not None
                    and incident.server.container_id not in snapshot.servers)
            if gone:
                events.append(self._resolve(key, now, "the server stopped"))
            elif not rules.enabled(incident.rule):
                events.append(self._resolve(key, now, "the rule was turned off"))
            elif reading is None:
                owner = snapshot.elsewhere.get(incident.gpu_uuid or "")
                if incident.rule == GPU_LOST and owner is not None:
                    events.append(self._resolve(key, now, f"{plain_name(owner)}'s watchdog "
                                                "reads it; it is that node's GPU, not this host's"))
                elif incident.rule == GPU_LOST:
                    pass  # a lost GPU lasts until it reads again, even if NVML no longer lists it
                elif incident.rule in DISK_RULES:
                    ended = _disk_gone(incident, snapshot)
                    if ended:
                        events.append(self._resolve(key, now, ended))
                else:
                    events.append(self._resolve(key, now, _gone_reason(incident.rule)))
            elif reading.state == "clear":
                events.append(self._resolve(key, now, reading.reason))
            else:
                if reading.state != "unknown":
                    _update(incident, reading.incident)
                if (rules.reminder > 0 and incident.last_sent is not None
                        and now - incident.last_sent >= rules.reminder):
                    incident.last_sent = now
                    events.append(Event("remind", dataclasses.replace(incident)))

        for key, pending in list(self.pending.items()):
            reading = readings.get(key)
            keep = (reading is not None and reading.state in ("high", "unknown")
                    and rules.enabled(pending.rule)
                    and _same_server(pending.server, reading.incident.server))
            if not keep:
                del self.pending[key]
            elif reading.state == "high":
                _update(pending, reading.incident)

        for key, reading in readings.items():
            if reading.state != "high" or key in self.open:
                continue
            if reading.incident.rule in INSTANT_RULES:
                events.append(_instant(reading.incident, now))
                continue
            pending = self.pending.setdefault(key, reading.incident)
            if now - pending.since >= reading.hold:
                del self.pending[key]
                pending.opened = pending.last_sent = now
                self.open[key] = pending
                events.append(Event("open", dataclasses.replace(pending)))

        events.extend(self._oom(snapshot, rules, oom_events))
        return events

    def _resolve(self, key: str, now: float, reason: str) -> Event:
        incident = self.open.pop(key)
        incident.resolved = now
        incident.reason = reason
        return Event("resolve", dataclasses.replace(incident))

    def _oom(self, snapshot: Snapshot, rules: WatchdogRules,
             oom_events: Iterable[Server]) -> list[Event]:
        """OOM kills: the cgroup counter's growth, or the engine's report, whichever is more."""
        servers = {s.server.container_id: s.server for s in snapshot.servers.values()}
        for sample in snapshot.servers.values():
            cid = sample.server.container_id
            count = self.oom.get(cid)
            if count is None:  # the first sighting sets the baseline
                self.oom[cid] = _OomCounter(last=sample.oom_kills)
                continue
            # A counter that went down was reset (a restarted container): it
            # counts from 0 again.
            count.growth += (sample.oom_kills - count.last if sample.oom_kills >= count.last
                             else sample.oom_kills)
            count.last = sample.oom_kills
        for server in oom_events:
            servers.setdefault(server.container_id, server)
            sample = snapshot.servers.get(server.container_id)
            count = self.oom.setdefault(
                server.container_id, _OomCounter(last=sample.oom_kills if sample else 0))
            count.events += 1

        events = []
        for cid, count in sorted(self.oom.items()):
            new = count.known - count.reported
            if new <= 0 or cid not in servers:
                continue
            count.reported = count.known
            if not rules.enabled(OOM):
                continue
            server = servers[cid]
            limit = server.memory_limit
            what = (f"{'A process' if new == 1 else f'{new} processes'} of the server "
                    f"{'was' if new == 1 else 'were'} killed for lack of memory"
                    + (f" (the limit is {format_human(limit)})." if limit else "."))
            incident = Incident(
                key=f"{OOM}:{server.name}", rule=OOM, severity="critical", server=server,
                since=snapshot.time, value=new, limit=limit, host=snapshot.host, what=what)
            events.append(_instant(incident, snapshot.time))
        # Forget containers that are gone; one that comes back is seen afresh.
        for cid in list(self.oom):
            if cid not in snapshot.servers:
                del self.oom[cid]
        return events

    # --- persistence -------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "open": [i.to_json() for i in self.open.values()],
            "pending": [i.to_json() for i in self.pending.values()],
            "oom": {cid: dataclasses.asdict(c) for cid, c in self.oom.items()},
            "events": dataclasses.asdict(self.events) if self.events else None,
            "messages": self.messages.to_json(),
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the book to ``path`` atomically (a temporary file, then a rename). Blocks."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str],
             log: logging.Logger | None = None) -> IncidentBook:
        """The book saved at ``path``; an empty one when there is none or it is unreadable.

        Blocks. An unreadable file is logged as a warning and renamed to
        ``<path>.corrupt`` so the next save does not destroy the evidence; a
        single bad entry is skipped with a warning, the rest are kept.
        """
        log = log or logging.getLogger("quota_spawner.watchdog")
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            log.info("No incident file at %s yet; starting with no incidents.", path)
            return cls()
        except OSError as e:
            log.warning("Cannot read the incident file %s (%s); starting with no "
                        "incidents, so open ones may be announced again.", path, e)
            return cls()
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != 1:
                raise ValueError("not an incident file of version 1")
            entries = {"open": list(data.get("open") or ()),
                       "pending": list(data.get("pending") or ()),
                       "oom": dict(data.get("oom") or {}),
                       "events": data.get("events"),
                       "messages": data.get("messages")}
        except (ValueError, TypeError) as e:
            log.warning("The incident file %s is unreadable (%s); starting with no "
                        "incidents, so open ones may be announced again. It is kept as %s.",
                        path, e, path.name + ".corrupt")
            try:
                os.replace(path, path.with_name(path.name + ".corrupt"))
            except OSError:
                pass
            return cls()
        book = cls()
        for name in ("open", "pending"):
            for entry in entries[name]:
                try:
                    incident = Incident.from_json(entry)
                except (TypeError, ValueError, KeyError, AttributeError) as e:
                    log.warning("Skipping an unreadable %s incident in %s: %s", name, path, e)
                    continue
                if name == "open" and incident.opened is None:
                    log.warning("Skipping open incident %s in %s: it has no opened time",
                                incident.key, path)
                    continue
                getattr(book, name)[incident.key] = incident
        for cid, entry in entries["oom"].items():
            try:
                book.oom[str(cid)] = _OomCounter(**entry)
            except TypeError as e:
                log.warning("Skipping the OOM counter of %s in %s: %s", cid, path, e)
        if entries["events"] is not None:
            try:
                book.events = _cursor(entries["events"])
            except (TypeError, ValueError) as e:
                # Read from the end again: events written meanwhile are missed, none twice.
                log.warning("Skipping the event log position in %s: %s", path, e)
        book.messages = MessageLimits.from_json(entries["messages"], log, str(path))
        return book


def _cursor(entry: Any) -> EventCursor:
    """The saved ``events`` entry; fields a newer version added are ignored."""
    if not isinstance(entry, dict):
        raise TypeError(f"not an object: {entry!r}")
    cursor = EventCursor(**{k: v for k, v in entry.items() if k in _CURSOR_FIELDS})
    if not isinstance(cursor.path, str) or not isinstance(cursor.offset, int) \
            or cursor.offset < 0 or not isinstance(cursor.inode, int | None):
        raise ValueError(f"not a position in a file: {entry!r}")
    return cursor


_CURSOR_FIELDS = frozenset(f.name for f in dataclasses.fields(EventCursor))


# --- readings --------------------------------------------------------------------


def _instant(incident: Incident, now: float) -> Event:
    """An incident about one event: announced once, closed at once, never reminded.

    No resolve event follows: a kill or an XID is over when it is reported,
    and a second message right after the first would say nothing new.
    """
    incident.opened = incident.last_sent = incident.resolved = now
    incident.reason = "a single event"
    return Event("open", incident)


def _update(incident: Incident, reading: Incident) -> None:
    """The latest numbers, so reminders and the resolved message show them."""
    for name in ("value", "limit", "percent", "what", "gpu_index", "server"):
        setattr(incident, name, getattr(reading, name))


def _same_server(a: Server | None, b: Server | None) -> bool:
    return (a.container_id if a else None) == (b.container_id if b else None)


def _disk_gone(incident: Incident, snapshot: Snapshot) -> str:
    """Why a disk incident without a reading this cycle ends; "" while it lasts: a home
    whose user has no server running stays full until they free it, and a cycle that
    cannot read the homes changes nothing."""
    disk = snapshot.disk
    if disk is None or (incident.rule == HOME_DISK and disk.enforced is False):
        return "the homes are no longer watched"
    if incident.rule == HOME_DISK and disk.homes is not None \
            and incident.home not in disk.homes:
        return disk_words.HOME_GONE
    return ""


def _gone_reason(rule: str) -> str:
    if rule == ZOMBIE:
        return "the container no longer holds GPUs unclaimed"
    return "it no longer applies"


def _holders(snapshot: Snapshot, uuid: str) -> list[Server]:
    return sorted((s.server for s in snapshot.servers.values() if uuid in s.server.gpus),
                  key=lambda s: s.name)


def _threshold(value: float | None, limit: float | None, high: float,
               clear: float) -> tuple[State, float | None]:
    if value is None or not limit:
        return "unknown", None
    fraction = value / limit
    if fraction >= high:
        return "high", fraction
    if fraction <= clear:
        return "clear", fraction
    return "low", fraction


def gpu_memory_limit(server: Server, gpu: GpuSample | None) -> int | None:
    """A server's GPU memory limit on one GPU: GPU_MEMORY_LIMIT on a shared GPU, else the card."""
    if server.shared_gpu and server.gpu_memory_limit:
        return server.gpu_memory_limit
    return gpu.memory_total if gpu is not None else None


def _readings(snapshot: Snapshot, rules: WatchdogRules) -> Iterable[_Reading]:
    for sample in snapshot.servers.values():
        if rules.enabled(GPU_MEMORY):
            yield from _gpu_memory(snapshot, sample, rules)
        if rules.enabled(MEMORY):
            yield _memory(snapshot, sample, rules)
        if rules.enabled(GPU_IDLE):
            yield from _gpu_idle(snapshot, sample, rules)
    for gpu in snapshot.gpus.values():
        holders = _holders(snapshot, gpu.uuid)
        if rules.enabled(GPU_LOST):
            yield _gpu_lost(snapshot, gpu, holders)
        if rules.enabled(XID) and gpu.xids:
            # Instant: opened now with no hold, closed in the same cycle by evaluate.
            yield _xid(snapshot, gpu, holders)
    if rules.enabled(ZOMBIE):
        for zombie in snapshot.zombies:
            yield _zombie(snapshot, zombie, rules)
    if snapshot.disk is not None:
        if rules.enabled(HOME_DISK):
            yield from _home_disk(snapshot, rules)
        if rules.enabled(HOMES_FILESYSTEM):
            yield from _homes_filesystem(snapshot, rules)


def _gpu_memory(snapshot: Snapshot, sample: ServerSample,
                rules: WatchdogRules) -> Iterable[_Reading]:
    server = sample.server
    for uuid in dict.fromkeys((*server.gpus, *sample.gpu_memory)):
        gpu = snapshot.gpus.get(uuid)
        limit = gpu_memory_limit(server, gpu)
        used = None if gpu is None or gpu.lost else sample.gpu_memory.get(uuid, 0)
        state, fraction = _threshold(used, limit, rules.gpu_memory_high, rules.gpu_memory_clear)
        percent = None if fraction is None else fraction * 100
        capped = server.shared_gpu and server.gpu_memory_limit
        whose = "its GPU memory cap" if capped else "the card"
        what = (f"GPU memory at {percent:.0f}% of {whose}: {format_human(used)} of "
                f"{format_human(limit)}." if percent is not None and used is not None and limit
                else "GPU memory cannot be read.")
        incident = Incident(
            key=f"{GPU_MEMORY}:{server.name}:{uuid}", rule=GPU_MEMORY, severity="warning",
            server=server, since=snapshot.time, gpu_uuid=uuid,
            gpu_index=gpu.index if gpu else None, value=used, limit=limit, percent=percent,
            host=snapshot.host, what=what)
        yield _Reading(state, incident, rules.gpu_memory_hold,
                       f"GPU memory is down to {percent:.0f}% of {whose}."
                       if percent is not None else "")


def _memory(snapshot: Snapshot, sample: ServerSample, rules: WatchdogRules) -> _Reading:
    server = sample.server
    used, limit = sample.memory_working_set, server.memory_limit
    state, fraction = _threshold(used, limit, rules.memory_high, rules.memory_clear)
    percent = None if fraction is None else fraction * 100
    what = (f"Memory at {percent:.0f}% of the limit: {format_human(used)} of "
            f"{format_human(limit)}." if percent is not None and used is not None and limit
            else "Memory use cannot be read.")
    incident = Incident(
        key=f"{MEMORY}:{server.name}", rule=MEMORY, severity="warning", server=server,
        since=snapshot.time, value=used, limit=limit, percent=percent, host=snapshot.host,
        what=what)
    return _Reading(state, incident, rules.memory_hold,
                    f"Memory is down to {percent:.0f}% of the limit."
                    if percent is not None else "")


def _gpu_idle(snapshot: Snapshot, sample: ServerSample,
              rules: WatchdogRules) -> Iterable[_Reading]:
    server = sample.server
    for uuid in server.gpus:
        gpu = snapshot.gpus.get(uuid)
        utilization = None if gpu is None or gpu.lost else gpu.utilization
        # Unknown utilisation (MIG, an unsupported card, a failed read) is
        # neither idle nor busy: a waste notice needs a reading of 0.
        if utilization is None:
            state: State = "unknown"
        elif utilization <= rules.idle_gpu_utilization:
            state = "high"
        else:
            state = "clear"
        hours = rules.idle_gpu_hold / 3600
        incident = Incident(
            key=f"{GPU_IDLE}:{server.name}:{uuid}", rule=GPU_IDLE, severity="info",
            server=server, since=snapshot.time, gpu_uuid=uuid,
            gpu_index=gpu.index if gpu else None, value=utilization,
            limit=rules.idle_gpu_utilization,
            percent=None if utilization is None else utilization * 100, host=snapshot.host,
            what=f"The GPU has shown no utilisation for {hours:g} hours or more.")
        yield _Reading(state, incident, rules.idle_gpu_hold,
                       f"The GPU is in use again ({(utilization or 0) * 100:.0f}%).")


def _gpu_lost(snapshot: Snapshot, gpu: GpuSample, holders: list[Server]) -> _Reading:
    names = ", ".join(s.name for s in holders)
    incident = Incident(
        key=f"{GPU_LOST}:{gpu.uuid}", rule=GPU_LOST, severity="critical",
        server=holders[0] if len(holders) == 1 else None, since=snapshot.time,
        gpu_uuid=gpu.uuid, gpu_index=gpu.index, host=snapshot.host,
        what=f"NVML cannot read the GPU: {gpu.lost}."
             + (f" It is held by {names}." if names else ""))
    return _Reading("high" if gpu.lost else "clear", incident, 0.0, "The GPU reads again.")


def _xid(snapshot: Snapshot, gpu: GpuSample, holders: list[Server]) -> _Reading:
    names = ", ".join(s.name for s in holders)
    application = all(x in APPLICATION_XIDS for x in gpu.xids)
    codes = ", ".join(str(x) for x in gpu.xids)
    incident = Incident(
        key=f"{XID}:{gpu.uuid}", rule=XID, severity="warning" if application else "critical",
        server=holders[0] if len(holders) == 1 else None, since=snapshot.time,
        gpu_uuid=gpu.uuid, gpu_index=gpu.index, value=gpu.xids[-1], host=snapshot.host,
        what=f"NVML reported XID error{'s' if len(gpu.xids) > 1 else ''} {codes} on the GPU."
             + (f" It is held by {names}." if names else ""))
    return _Reading("high", incident, 0.0)


def _zombie(snapshot: Snapshot, zombie: Server, rules: WatchdogRules) -> _Reading:
    gpus = ", ".join(zombie.gpus) or "GPUs"
    incident = Incident(
        key=f"{ZOMBIE}:{zombie.name}", rule=ZOMBIE, severity="warning", server=zombie,
        since=snapshot.time, value=len(zombie.gpus), host=snapshot.host,
        what=f"The container {zombie.name} holds {gpus} but no server of the hub claims it.")
    return _Reading("high", incident, rules.zombie_hold)


def _home_disk(snapshot: Snapshot, rules: WatchdogRules) -> Iterable[_Reading]:
    """Each running server's home against its size; unknown while the homes cannot be
    read. A home without a size (its role has none) is not judged."""
    disk = snapshot.disk
    if disk is None or disk.enforced is False:
        return
    for home, server in homes_of(snapshot).items():
        use = disk.homes.get(home) if disk.homes is not None else None
        size = home_size(server, use)
        if disk.homes is not None and (use is None or not size):
            continue  # not a home of a size: nothing to judge
        used = use.used if use is not None else None
        state, fraction = _threshold(used, size, rules.home_disk_high, rules.home_disk_clear)
        percent = None if fraction is None else fraction * 100
        incident = Incident(
            key=f"{HOME_DISK}:{home}", rule=HOME_DISK, severity="warning", server=server,
            since=snapshot.time, home=home, value=used, limit=size, percent=percent,
            host=snapshot.host, what=disk_words.home_what(used, size, percent))
        yield _Reading(state, incident, rules.home_disk_hold, disk_words.home_cleared(percent))


def _homes_filesystem(snapshot: Snapshot, rules: WatchdogRules) -> Iterable[_Reading]:
    """The filesystem that holds the homes, used against what it holds and has free, as
    df counts it (its reserved blocks are no one's); none while it cannot be read."""
    disk = snapshot.disk
    space = disk.space if disk is not None else None
    if disk is None or space is None:
        return
    state, fraction = _threshold(space.used, space.used + space.free,
                                 rules.homes_filesystem_high, rules.homes_filesystem_clear)
    percent = None if fraction is None else fraction * 100
    incident = Incident(
        key=HOMES_FILESYSTEM, rule=HOMES_FILESYSTEM, severity="warning", server=None,
        since=snapshot.time, value=space.used, limit=space.used + space.free,
        percent=percent, host=snapshot.host,
        what=disk_words.filesystem_what(str(space.path), space.used, space.free,
                                        disk.reserved, percent))
    yield _Reading(state, incident, rules.homes_filesystem_hold,
                   disk_words.filesystem_cleared(percent))
