"""The small documents the product's processes publish for each other: their kinds,
where they live, their shapes, and how the pages read them. The one home of the shared
documents.

Besides the hub's REST API, the hub, the web app and the watchdogs share one thing:
the ledger's database. Each publishes a few JSON documents there, replaced whole on
each change, keyed by the hub's id, the document's kind and the node that wrote it
(table ``state_documents``, ``DatabaseDocuments``):

- ``GPUS``: the hub's GPU pool, host room and queue, ``PoolSnapshot``
  (gpu/snapshot.py, beside the pool it is taken of), for the host map and the editor;
- ``GPU_USAGE``: a watchdog's readings on its node, ``GpuUsage`` (usage/gpu_readings.py,
  beside their merge), one per node;
- ``PREEMPTIONS``: the preemptions in their grace (docker/evictor.py), ``Preemptions``
  below, read back by a restarted hub;
- ``BUDGET_MEMORY``: the budget notices already told this period (usage/budgets.py),
  ``BudgetMemory`` below, so a restarted hub tells nothing twice;
- ``HOMES``: a watchdog's reading of the users' homes on its node (watchdog/homes.py),
  ``DiskUsage`` below, one per node, for the host map and the class dashboard.

Each kind is one class (``SharedDocument``): its ``KIND``, the ``VERSION`` of its shape,
defined once, and its JSON both ways, ``to_json`` for its writer and ``from_json`` for
every reader. A document may be missing, half-written, old, or from another version:
``from_json`` reads what older writers stored as they meant it, and anything else as
None (unknown), never as an error, so a page never fails on one odd document.

A hub without a ledger (``usage_db = "none"``) keeps them as files in its state folder
(``FolderDocuments``), as before the database held them; readers that find no row fall
back to that folder's file, so a web app beside such a hub still draws its map.

Every method and reader blocks (a file or the database): call it from a thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from spawner.usage.schema import state_documents

NODE_LENGTH = 253  # a DNS name, as a Kubernetes node's


@dataclass(frozen=True)
class Kind:
    name: str  # the row's kind
    file: str  # the file in the state folder, without a database


GPUS = Kind("gpus", "quota-spawner-gpus.json")
GPU_USAGE = Kind("gpu-usage", "quota-spawner-gpu-usage.json")
PREEMPTIONS = Kind("preemptions", "quota-spawner-preemptions.json")
BUDGET_MEMORY = Kind("budget-memory", "quota-spawner-budgets.json")
HOMES = Kind("homes", "quota-spawner-homes.json")
KINDS = (GPUS, GPU_USAGE, PREEMPTIONS, BUDGET_MEMORY, HOMES)


@dataclass(frozen=True)
class Document:
    node: str  # "" for the hub's own documents
    time: float  # when it was written (epoch seconds)
    text: str  # JSON


class Documents(Protocol):
    """Where one hub's documents are kept (blocking)."""

    def write(self, kind: Kind, text: str, node: str = "") -> None:
        """Replace the document; raises OSError or the database's error."""

    def read(self, kind: Kind, node: str = "") -> Document | None:
        """The document, or None when there is none."""

    def read_all(self, kind: Kind) -> list[Document]:
        """Every node's document of ``kind``."""


class FolderDocuments:
    """The documents as files in a state folder: one per kind, whatever the node."""

    def __init__(self, folder: str):
        self.folder = folder

    def path(self, kind: Kind) -> str:
        return os.path.join(self.folder or ".", kind.file)

    def write(self, kind: Kind, text: str, node: str = "") -> None:
        write_atomically(self.path(kind), text)

    def read(self, kind: Kind, node: str = "") -> Document | None:
        path = self.path(kind)
        try:
            with open(path, encoding="utf-8") as f:
                return Document(node, os.fstat(f.fileno()).st_mtime, f.read())
        except (OSError, UnicodeDecodeError):
            return None

    def read_all(self, kind: Kind) -> list[Document]:
        found = self.read(kind)
        return [found] if found is not None else []


def write_atomically(path: str | os.PathLike[str], text: str, mode: int | None = None) -> None:
    """Write ``path`` whole: a temporary file beside it, renamed over it, so a reader
    sees the old text or the new, never half of one; ``mode``: its permissions (else
    0600, the owner's alone). Raises OSError."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=".quota-spawner.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class DatabaseDocuments:
    """One hub's documents in the ledger's database (``Documents``): a write is one upsert
    (``INSERT … ON CONFLICT DO UPDATE`` on SQLite and PostgreSQL), so two writers of the
    same row never deadlock and a reader sees the old text or the new."""

    def __init__(self, engine: Engine, hub: str, fallback: Documents | None = None):
        self.engine = engine
        self.hub = hub[:64]
        # read where the database has no row: the state folder's files of a hub before
        # its upgrade, or of a hub or watchdog that has no ledger
        self.fallback = fallback

    def write(self, kind: Kind, text: str, node: str = "") -> None:
        if len(node) > NODE_LENGTH:
            raise ValueError(f"a node's name has at most {NODE_LENGTH} characters")
        row = {"hub": self.hub, "kind": kind.name, "node": node, "time": time.time(),
               "body": text}
        dialect = self.engine.dialect.name
        insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(
            state_documents).values(**row)
        upsert = insert.on_conflict_do_update(
            index_elements=["hub", "kind", "node"],
            set_={"time": insert.excluded.time, "body": insert.excluded.body})
        with self.engine.begin() as connection:
            connection.execute(upsert)

    def read(self, kind: Kind, node: str = "") -> Document | None:
        found = self._select(kind, node)
        if found:
            return found[0]
        return self.fallback.read(kind, node) if self.fallback is not None else None

    def read_all(self, kind: Kind) -> list[Document]:
        found = self._select(kind, None)
        if found or self.fallback is None:
            return found
        return self.fallback.read_all(kind)

    def _select(self, kind: Kind, node: str | None) -> list[Document]:
        t = state_documents.c
        query = select(t.node, t.time, t.body).where(t.hub == self.hub, t.kind == kind.name)
        if node is not None:
            query = query.where(t.node == node)
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(t.node)).all()
        return [Document(row.node, row.time, row.body) for row in rows]


# --- a document's JSON ------------------------------------------------------------------


def number(value: Any) -> bool:
    """A JSON number, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_or_none(value: Any) -> Any:
    """``value`` when it is a JSON number, else None (unknown)."""
    # the types json.loads gives, by identity: a reader parses thousands of these a read
    return value if type(value) in (int, float) else None


def text_or_none(value: Any) -> str | None:
    """``value`` when it is a JSON string, else None (unknown)."""
    return value if type(value) is str else None


def json_object(text: str | None) -> dict[str, Any] | None:
    """The JSON object in ``text``; None when it is missing, half-written or not one."""
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# How fresh a watchdog's document is: one rule for each of its kinds (its GPU readings, its
# homes), judged by the cycle's time the document carries and the watchdog's interval.
STALE_CYCLES = 3  # a watchdog's readings older than this many of its intervals are stale
# ... and at least this old: they carry their cycle's start and are written at the
# cycle's end, so with a short interval a slow cycle would flicker between fresh and stale
MIN_STALE_AGE = 10.0
DEFAULT_INTERVAL = 5.0  # the watchdog's default, when its readings do not say


def stale_after(interval: float) -> float:
    """How old a watchdog's readings may be, at ``interval`` between its cycles, and
    still be fresh."""
    return max(STALE_CYCLES * interval, MIN_STALE_AGE)


class SharedDocument(ABC):
    """A kind of shared document as a class: where it is kept (``KIND``), the version of
    its shape (``VERSION``, written into the document, or, where the document is a bare
    list, implied by it), and its JSON: ``to_json`` for its writer, ``from_json`` for
    every reader. ``from_json`` never raises: it takes the JSON as stored (or the
    document itself, as it is) and gives None for anything that is not this document
    of this version; a field of the wrong type reads as unknown (None, or empty)."""

    KIND: ClassVar[Kind]
    VERSION: ClassVar[int]

    @abstractmethod
    def to_json(self) -> Any:
        """The document as its writer stores it."""

    @classmethod
    @abstractmethod
    def from_json(cls, data: Any) -> Self | None:
        """The document read from ``data``; None when it is not this document."""

    def to_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_text(cls, text: str | None) -> Self | None:
        """The document in ``text``; None when it is missing, half-written or odd."""
        try:
            data = json.loads(text) if text is not None else None
        except ValueError:
            return None
        return cls.from_json(data)

    def write(self, documents: Documents, node: str = "") -> None:
        """Replace the stored document (blocking); raises as ``Documents.write``."""
        documents.write(self.KIND, self.to_text(), node)

    @classmethod
    def read(cls, documents: Documents | None, node: str = "") -> Self | None:
        """The stored document; None when there is none, or it is odd (blocking)."""
        found = documents.read(cls.KIND, node) if documents is not None else None
        return cls.from_text(found.text) if found is not None else None

    @classmethod
    def read_all(cls, documents: Documents | None) -> list[Self]:
        """Every node's document of this kind, less the odd ones, by node (blocking)."""
        found = documents.read_all(cls.KIND) if documents is not None else []
        return [d for d in (cls.from_text(f.text) for f in found) if d is not None]


# --- the hub's own small documents ------------------------------------------------------


@dataclass(frozen=True)
class Preemptions(SharedDocument):
    """``PREEMPTIONS``: the preemptions in their grace (docker/evictor.py), each as the
    hub's event log recorded its ``preemption`` event, so that a restarted hub calls
    them off. Version 1 is a bare JSON list of those records, as 0.1 wrote it; a later
    version would be an object with its ``version``."""

    KIND = PREEMPTIONS
    VERSION = 1

    records: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> list[dict[str, Any]]:
        return list(self.records)

    @classmethod
    def from_json(cls, data: Any) -> Preemptions | None:
        if isinstance(data, Preemptions):
            return data
        if not isinstance(data, list):
            return None
        # a record that names no container cannot be called off: left out
        return cls(tuple(r for r in data if isinstance(r, dict) and r.get("container")))


@dataclass(frozen=True)
class Told:
    """A budget notice told to a user (usage/budgets.py): which, of which budget (its
    key and its gpu_hours, a new figure being a new budget), in which period (its start
    and its end, when it is forgotten), to whom."""

    event: str  # budget-warning or budget-spent
    budget: str  # the budget's key, e.g. "group:cs101"
    gpu_hours: float
    period: float  # the period's start, epoch seconds
    user: str
    resets_at: float  # the period's end

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "budget": self.budget, "gpu_hours": self.gpu_hours,
                "period": self.period, "user": self.user, "resets_at": self.resets_at}

    @classmethod
    def from_json(cls, data: Any) -> Told | None:
        if not isinstance(data, dict):
            return None
        texts = [data.get(k) for k in ("event", "budget", "user")]
        numbers = [data.get(k) for k in ("gpu_hours", "period", "resets_at")]
        if not all(isinstance(t, str) for t in texts) or not all(map(number, numbers)):
            return None
        (event, budget, user), (gpu_hours, start, end) = texts, numbers
        return cls(event, budget, float(gpu_hours), float(start), user, float(end))


@dataclass(frozen=True)
class BudgetMemory(SharedDocument):
    """``BUDGET_MEMORY``: the budget notices already told this period (usage/budgets.py),
    so that a restarted hub tells nothing twice. ``{"version": 1, "told": [...]}``. One
    entry that cannot be read makes the whole memory unknown: telling again beats
    telling part of it never."""

    KIND = BUDGET_MEMORY
    VERSION = 1

    told: tuple[Told, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"version": self.VERSION, "told": [t.to_json() for t in self.told]}

    @classmethod
    def from_json(cls, data: Any) -> BudgetMemory | None:
        if isinstance(data, BudgetMemory):
            return data
        if not isinstance(data, dict) or data.get("version") != cls.VERSION \
                or not isinstance(data.get("told"), list):
            return None
        told = [Told.from_json(t) for t in data["told"]]
        return cls(tuple(t for t in told if t is not None)) if None not in told else None


# --- a watchdog's homes ------------------------------------------------------------------


def _bytes(value: Any) -> int | None:
    """A count of bytes: a whole JSON number of 0 or more, else None (unknown)."""
    return int(value) if number(value) and value >= 0 and value == int(value) else None


@dataclass(frozen=True)
class HomeReading:
    """One home in a ``homes`` document: its folder's ``name``, the ``user`` whose running
    server the watchdog saw it for (None: no server of it runs on the node), what it
    holds and its size (``limit``; None: no size), in bytes."""

    name: str
    used: int | None
    limit: int | None
    user: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "name": self.name, "used": self.used, "limit": self.limit}

    @classmethod
    def from_json(cls, data: Any) -> HomeReading | None:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) \
                or not data["name"]:
            return None
        return cls(data["name"], _bytes(data.get("used")), _bytes(data.get("limit")),
                   text_or_none(data.get("user")))


@dataclass(frozen=True)
class Filesystem:
    """The filesystem that holds a node's homes, in bytes: its ``size``, what is ``used``
    and ``free`` (what a user may still write), and what the homes' sizes ``reserved``
    together (their sum; it may exceed the size, with an overcommit ratio)."""

    path: str | None = None
    size: int | None = None
    used: int | None = None
    free: int | None = None
    reserved: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "used": self.used, "free": self.free,
                "reserved": self.reserved}

    @classmethod
    def from_json(cls, data: Any) -> Filesystem | None:
        if not isinstance(data, dict):
            return None
        return cls(text_or_none(data.get("path")),
                   *(_bytes(data.get(k)) for k in ("size", "used", "free", "reserved")))


@dataclass(frozen=True)
class DiskUsage(SharedDocument):
    """``HOMES``: one node's homes in one watchdog cycle (watchdog/homes.py), for the host
    map and the class dashboard. ``{"version": 1, "node", "at" (the cycle's start, epoch
    seconds), "interval", "mechanism" (btrfs, xfs, ext4, image or none), "enforced",
    "sentence" (the mechanism's, as the hub logs it), "filesystem": {"path", "size",
    "used", "free", "reserved"} (null where the homes have no folder of their own),
    "homes": [{"user", "name", "used", "limit"}]}``, bytes throughout; fields are only
    ever added."""

    KIND = HOMES
    VERSION = 1

    node: str
    at: float
    interval: float = DEFAULT_INTERVAL
    mechanism: str | None = None
    enforced: bool = False
    sentence: str = ""
    filesystem: Filesystem | None = None
    homes: tuple[HomeReading, ...] = ()

    def state(self, now: float) -> str:
        """"fresh" or "stale", by the rule of every watchdog's document (``stale_after``)."""
        return "fresh" if now - self.at < stale_after(self.interval) else "stale"

    def to_json(self) -> dict[str, Any]:
        return {"version": self.VERSION, "node": self.node, "at": self.at,
                "interval": self.interval, "mechanism": self.mechanism,
                "enforced": self.enforced, "sentence": self.sentence,
                "filesystem": self.filesystem.to_json() if self.filesystem else None,
                "homes": [h.to_json() for h in self.homes]}

    @classmethod
    def from_json(cls, data: Any) -> DiskUsage | None:
        """The homes in ``data``; None when they are not this version's or have no time.
        Parts that are not what they should be read as unknown; an odd home is left out."""
        if isinstance(data, DiskUsage):
            return data
        if not isinstance(data, dict) or data.get("version") != cls.VERSION \
                or not number(data.get("at")):
            return None
        interval, homes = data.get("interval"), data.get("homes")
        found = [HomeReading.from_json(h) for h in homes] if isinstance(homes, list) else []
        return cls(
            node=text_or_none(data.get("node")) or "", at=data["at"],
            interval=interval if number(interval) and interval > 0 else DEFAULT_INTERVAL,
            mechanism=text_or_none(data.get("mechanism")),
            enforced=data.get("enforced") is True,
            sentence=text_or_none(data.get("sentence")) or "",
            filesystem=Filesystem.from_json(data.get("filesystem")),
            homes=tuple(sorted((h for h in found if h is not None), key=lambda h: h.name)))
