"""The small documents the product's processes publish for each other, and where they live.

Besides the hub's REST API, the hub, the usage service and the watchdogs share one thing:
the ledger's database. Each publishes a few JSON documents there, replaced whole on
each change, keyed by the hub's id, the document's kind and the node that wrote it
(table ``state_documents``, spawner/usage/state_docs.py):

- ``GPUS``: the hub's GPU pool, host room and queue (gpu/snapshot.py), for the host map;
- ``GPU_USAGE``: a watchdog's readings on its node (watchdog/app.py), one per node;
- ``PREEMPTIONS``: the preemptions in their grace (docker/evictor.py), read back by a
  restarted hub;
- ``BUDGET_MEMORY``: the budget notices already told this period (usage/budgets.py), so
  a restarted hub tells nothing twice.

A hub without a ledger (``usage_db = "none"``) keeps them as files in its state folder
(``FolderDocuments``), as before the database held them; readers that find no row fall
back to that folder's file, so a usage service beside such a hub still draws its map.

Every method blocks (a file or the database): call it from a thread.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Protocol


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
