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
  ``BudgetMemory`` below, so a restarted hub tells nothing twice.

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
KINDS = (GPUS, GPU_USAGE, PREEMPTIONS, BUDGET_MEMORY)


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


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``path`` whole: a temporary file beside it, renamed over it, so a reader
    sees the old text or the new, never half of one. Raises OSError."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=".quota-spawner.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
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


class SharedDocument:
    """A kind of shared document as a class: where it is kept (``KIND``), the version of
    its shape (``VERSION``, written into the document, or, where the document is a bare
    list, implied by it), and its JSON: ``to_json`` for its writer, ``from_json`` for
    every reader. ``from_json`` never raises: it takes the JSON as stored (or the
    document itself, as it is) and gives None for anything that is not this document
    of this version; a field of the wrong type reads as unknown (None, or empty)."""

    KIND: ClassVar[Kind]
    VERSION: ClassVar[int]

    def to_json(self) -> Any:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: Any) -> Self | None:
        raise NotImplementedError

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
