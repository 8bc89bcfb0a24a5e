"""Editing the quota table safely: checks, a preview of who gains and loses what, saves
that never write a bad table nor overwrite another admin's edit, and the audit trail.

``check`` and ``preview`` are pure. ``TableFile`` blocks (files, and the trail it records
each save in): call it from a thread. The trail is a ``Trail``: the ledger's
``table_versions`` (spawner/usage/table_versions.py's ``Audit``), which this module
does not import, so the quota table stays below the ledger.

A save is refused, with nothing written, when its comment is empty, when the text has
problems (the same ``FILE:LINE`` messages as ``quota-spawner validate``, against the hub's
GPUs and, through ``fits``, its host, as ``--gpus`` and ``--engine``), or when the file
changed since the admin read it (the refusal carries the diff). Otherwise the file
is replaced atomically, keeping its mode, so the hub's ``QuotaStore`` sees either the
old table or the new one, and the change is recorded in the ledger's ``table_versions``.

With ``quota_source = "database"`` the table is ``TableVersions``: its newest version in
``table_versions`` under the key ``database:<quota_table_name>`` (the same on every
machine, whatever path the file has there) is the table, and a save adds a version, with
the same checks and the same refusal when the table changed since the admin's version.
The file only seeds the first version; nothing writes it.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from spawner.quota.fields import table_fields
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import GpuCapacity, Problem, QuotaTable, QuotaTableError, Role

# Who the audit trail names for versions the editor did not write.
BEFORE_EDITOR = "(before the editor)"
OUTSIDE_EDITOR = "(outside the editor)"
FROM_FILE = "(from the file)"  # a database table's first version, seeded from the file

# Where the table the hub reads lives: the setting quota_source.
FILE_SOURCE = "file"
DATABASE_SOURCE = "database"
SOURCES = (FILE_SOURCE, DATABASE_SOURCE)
DEFAULT_TABLE_NAME = "default"  # quota_table_name
DATABASE_KEY_PREFIX = "database:"  # never an absolute path, a file table's key
TABLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

# Why a save ended as it did (SaveResult.outcome).
SAVED = "saved"
NO_COMMENT = "no-comment"
INVALID = "invalid"
CONFLICT = "conflict"
UNCHANGED = "unchanged"
NOT_FOUND = "not-found"


def version_of(data: bytes) -> str:
    """A file's version: the sha256 of its bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def database_key(name: str) -> str:
    """The key of the versions of the database table ``name`` (quota_table_name) in
    ``table_versions``: ``database:<name>``, the same for every process on every machine.
    ValueError for a name that is not letters, digits, ``.``, ``_`` and ``-``."""
    if not TABLE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a quota table name: letters, digits, '.', '_' and "
                         "'-', at most 100, starting with a letter or digit")
    return DATABASE_KEY_PREFIX + name


def trail_key(table: str) -> str:
    """The key a table's versions have in the trail: a database table's key as it is, a
    file's absolute path (as before there were database tables)."""
    return table if table.startswith(DATABASE_KEY_PREFIX) else os.path.abspath(table)


def version_name(version_id: int) -> str:
    """How a database version is named where its problems are told: as a file's path."""
    return f"quota table (database, version {version_id})"


# The problems of a good table on the hub's host: spawner/host/fit.py's never_fit, bound
# to the host by the caller (this layer knows no host).
Fits = Callable[[QuotaTable], Sequence[Problem]]


def checked_table(text: str, path: str, gpus: GpuCapacity | None = None,
                  fits: Fits | None = None) -> tuple[QuotaTable | None, list[Problem]]:
    """The edited table, or None and its problems, as ``quota-spawner validate`` prints
    them. ``gpus`` checks roles against the hub's GPUs, like ``--gpus``; ``fits``, once
    the table is good, against its host, like ``--engine``."""
    try:
        table = parse_quota_table(text, path, gpus)
    except QuotaTableError as e:
        return None, list(e.problems)
    problems = list(fits(table)) if fits is not None else []
    return (None, problems) if problems else (table, [])


def check(text: str, path: str, gpus: GpuCapacity | None = None,
          fits: Fits | None = None) -> list[Problem]:
    """The problems of an edited table (``checked_table``); empty when it is valid."""
    return checked_table(text, path, gpus, fits)[1]


def unified_diff(old: str, new: str, old_label: str, new_label: str) -> str:
    """A unified diff of two texts, marking a last line without a newline as git does."""
    out = []
    for line in difflib.unified_diff(old.splitlines(keepends=True),
                                     new.splitlines(keepends=True), old_label, new_label):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


# --- the preview ------------------------------------------------------------------------

@dataclass(frozen=True)
class FieldChange:
    field: str
    old: Any
    new: Any

    def __str__(self) -> str:
        spell = next(f for f in table_fields(Role) if f.name == self.field).spell
        return f"{self.field} {spell(self.old)} → {spell(self.new)}"


@dataclass(frozen=True)
class RoleChange:
    role: str
    changes: tuple[FieldChange, ...]


@dataclass(frozen=True)
class RunningServer:
    """A running server the edit concerns: it keeps its limits until it stops."""

    user: str
    role: str
    lost: bool  # the user no longer holds the role, or the role is gone
    changes: tuple[FieldChange, ...] = ()  # the role's fields that change, when it is kept


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass(frozen=True)
class Preview:
    """What an edit changes for whom. Every list and mapping is in name order."""

    losses: dict[str, tuple[str, ...]] = field(default_factory=dict)  # role -> users
    gains: dict[str, tuple[str, ...]] = field(default_factory=dict)  # role -> users
    running: tuple[RunningServer, ...] = ()
    roles_added: tuple[str, ...] = ()
    roles_removed: tuple[str, ...] = ()
    roles_changed: tuple[RoleChange, ...] = ()
    images_added: tuple[str, ...] = ()
    images_removed: tuple[str, ...] = ()
    images_changed: tuple[str, ...] = ()
    budgets_added: tuple[str, ...] = ()  # owners: "the group cs101"
    budgets_removed: tuple[str, ...] = ()
    budgets_changed: tuple[str, ...] = ()
    budget_timezone: tuple[str, str] | None = None  # (old, new) when it changes

    def sentences(self) -> list[str]:
        """Plain sentences, people first: who loses and gains what, the running servers,
        then the roles, images and budgets themselves."""
        out = [f"{_count(len(users), 'user loses', 'users lose')} {role}."
               for role, users in self.losses.items()]
        out += [f"{_count(len(users), 'user gains', 'users gain')} {role}."
                for role, users in self.gains.items()]
        if self.running:
            n = len(self.running)
            out.append(f"{_count(n, 'running server keeps its', 'running servers keep their')}"
                       f" limits until {'it stops' if n == 1 else 'they stop'}.")
        if self.roles_removed:
            out.append(f"Removed {_count(len(self.roles_removed), 'role', 'roles')}: "
                       f"{', '.join(self.roles_removed)}.")
        if self.roles_added:
            out.append(f"Added {_count(len(self.roles_added), 'role', 'roles')}: "
                       f"{', '.join(self.roles_added)}.")
        out += [f"{c.role} changes: {', '.join(str(f) for f in c.changes)}."
                for c in self.roles_changed]
        for verb, names in (("Removed", self.images_removed), ("Added", self.images_added),
                            ("Changed", self.images_changed)):
            if names:
                out.append(f"{verb} {_count(len(names), 'image', 'images')}: "
                           f"{', '.join(names)}.")
        for verb, owners in (("Removed", self.budgets_removed), ("Added", self.budgets_added),
                             ("Changed", self.budgets_changed)):
            if owners:
                out.append(f"{verb} the GPU-hour budget of {', '.join(owners)}.")
        if self.budget_timezone:
            old, new = self.budget_timezone
            out.append(f"Budget periods start at midnight in {new}, not {old}.")
        return out or ["Nothing changes for anyone."]

    def summary(self) -> str:
        return " ".join(self.sentences())


def _role_changes(old: Role, new: Role) -> tuple[FieldChange, ...]:
    """The fields that differ, in the order the table documents them."""
    return tuple(FieldChange(f.name, getattr(old, f.name), getattr(new, f.name))
                 for f in table_fields(Role) if getattr(old, f.name) != getattr(new, f.name))


def preview(old: QuotaTable, new: QuotaTable, users: Mapping[str, Sequence[str]],
            running: Mapping[str, str] | None = None) -> Preview:
    """What replacing ``old`` by ``new`` changes for ``users`` (user -> their groups) and
    for the ``running`` servers (user -> the role their server runs with).

    A user of ``running`` missing from ``users`` is taken to be in no group.
    """
    running = running or {}
    everyone = {name: tuple(groups) for name, groups in users.items()}
    for name in running:
        everyone.setdefault(name, ())
    losses: dict[str, list[str]] = {}
    gains: dict[str, list[str]] = {}
    held_after: dict[str, set[str]] = {}
    for name in sorted(everyone):
        before = set(old.role_names_for(name, everyone[name]))
        after = held_after[name] = set(new.role_names_for(name, everyone[name]))
        for role in before - after:
            losses.setdefault(role, []).append(name)
        for role in after - before:
            gains.setdefault(role, []).append(name)
    changed = {name: _role_changes(old.roles[name], new.roles[name])
               for name in sorted(old.roles.keys() & new.roles.keys())}
    changed = {name: c for name, c in changed.items() if c}
    servers = []
    for name in sorted(running):
        role = running[name]
        if role not in held_after[name]:
            servers.append(RunningServer(name, role, lost=True))
        elif role in changed:
            servers.append(RunningServer(name, role, lost=False, changes=changed[role]))
    old_budgets = {b.key: b for b in old.budgets}
    new_budgets = {b.key: b for b in new.budgets}

    def owners(keys: Any) -> tuple[str, ...]:
        found = {**old_budgets, **new_budgets}
        return tuple(found[k].owner for k in sorted(keys))

    return Preview(
        losses={role: tuple(losses[role]) for role in sorted(losses)},
        gains={role: tuple(gains[role]) for role in sorted(gains)},
        running=tuple(servers),
        roles_added=tuple(sorted(new.roles.keys() - old.roles.keys())),
        roles_removed=tuple(sorted(old.roles.keys() - new.roles.keys())),
        roles_changed=tuple(RoleChange(name, c) for name, c in changed.items()),
        images_added=tuple(sorted(new.images.keys() - old.images.keys())),
        images_removed=tuple(sorted(old.images.keys() - new.images.keys())),
        images_changed=tuple(sorted(k for k in old.images.keys() & new.images.keys()
                                    if old.images[k] != new.images[k])),
        budgets_added=owners(new_budgets.keys() - old_budgets.keys()),
        budgets_removed=owners(old_budgets.keys() - new_budgets.keys()),
        budgets_changed=owners(k for k in old_budgets.keys() & new_budgets.keys()
                               if old_budgets[k] != new_budgets[k]),
        budget_timezone=((old.budget_timezone, new.budget_timezone)
                         if old.budget_timezone != new.budget_timezone else None),
    )


# --- the audit trail --------------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    """One row of the audit trail: a version of the table and why it was made."""

    id: int
    path: str
    at: float  # epoch seconds
    who: str
    comment: str
    sha256: str
    text: str
    diff: str  # unified, from the version before; empty for the first
    restored_from: int | None


@dataclass(frozen=True)
class SaveResult:
    """How a save ended. Refused saves wrote nothing."""

    outcome: str  # SAVED, NO_COMMENT, INVALID, CONFLICT, UNCHANGED or NOT_FOUND
    message: str  # one sentence for the admin
    version: str  # the file's version now
    problems: tuple[Problem, ...] = ()  # INVALID: every problem, FILE:LINE
    # SAVED: the change made. CONFLICT: what changed between the version this admin
    # started from and the current file (empty when that version is unknown).
    diff: str = ""
    yours: str = ""  # CONFLICT: what this admin's text would change in the current file
    current_text: str | None = None  # CONFLICT: the file as it is now
    base_text: str | None = None  # CONFLICT: the version this admin started from, if known
    audit_id: int | None = None  # SAVED: the new audit row

    @property
    def saved(self) -> bool:
        return self.outcome == SAVED


class Trail(Protocol):
    """Where saves are recorded, in the same transaction as the write (blocking)."""

    def transaction(self) -> AbstractContextManager[Any]:
        """A transaction that no other save enters until it ends, from any process; what
        it yields is passed back as ``connection``."""

    def record(self, *, path: str, who: str, comment: str, text: str,
               previous: str | None, at: float | None = None, sha256: str | None = None,
               restored_from: int | None = None, connection: Any = None) -> int:
        """Add a version; its id."""

    def latest(self, path: str, connection: Any = None) -> Version | None: ...

    def by_sha(self, path: str, sha256: str) -> Version | None:
        """The newest version of the table with these bytes."""


def _saved(table: str, before: str, text: str, version: str, audit_id: int) -> SaveResult:
    name = os.path.basename(table)
    return SaveResult(SAVED, "Saved; the hub uses it from the next spawn.", version,
                      audit_id=audit_id,
                      diff=unified_diff(before, text, f"a/{name}", f"b/{name}"))


def _conflict(table: str, text: str, base_version: str, base_text: str | None, current: str,
              current_text: str, audit: Trail) -> SaveResult:
    """The refusal of a save whose base version is no longer the table's (``current``)."""
    if base_text is None or version_of(base_text.encode("utf-8")) != base_version:
        found = audit.by_sha(table, base_version)
        base_text = found.text if found else None
    name = os.path.basename(table)
    latest = audit.latest(table)
    by = (f" by {latest.who} at {time.strftime('%Y-%m-%d %H:%M', time.localtime(latest.at))}"
          if latest is not None and latest.sha256 == current else "")
    since = ("" if base_text is None else
             unified_diff(base_text, current_text, f"a/{name} (yours)",
                          f"b/{name} (current)"))
    return SaveResult(
        CONFLICT, f"The table was changed{by} since you opened it; nothing was written. "
        "Apply your edit to the current version.", current, diff=since,
        yours=unified_diff(current_text, text, f"a/{name} (current)", f"b/{name} (yours)"),
        current_text=current_text, base_text=base_text)


def _refused_early(table: EditableTable, text: str, who: str,
                   comment: str) -> SaveResult | None:
    """The refusals every save checks before it takes its lock: no comment, problems."""
    if not who:
        raise ValueError("a save needs the name of who makes it")
    if not comment:
        return SaveResult(NO_COMMENT, "Say why you change the table: the comment is "
                          "required; nothing was written.", table.read()[1])
    problems = table.check(text)
    if problems:
        return SaveResult(
            INVALID, f"The table has {_count(len(problems), 'problem', 'problems')}; "
            "nothing was written.", table.read()[1], problems=tuple(problems))
    return None


class EditableTable(Protocol):
    """What the editor edits: the file (``TableFile``) or the database's versions
    (``TableVersions``). Blocking."""

    @property
    def path(self) -> str:
        """The file's path, or the database table's key: the trail's key for it."""

    def read(self) -> tuple[str, str]:
        """The text and its version (sha256)."""

    def check(self, text: str) -> list[Problem]: ...

    def save(self, text: str, base_version: str, who: str, comment: str, audit: Trail, *,
             base_text: str | None = None, restored_from: int | None = None) -> SaveResult:
        ...


# --- the file ---------------------------------------------------------------------------

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_lock = threading.Lock()


class TableFile:
    """The quota table file the hub reloads (blocking: it reads and writes files)."""

    def __init__(self, path: str | Path, gpus: GpuCapacity | None = None,
                 fits: Fits | None = None):
        self.path = str(path)
        self.gpus = gpus
        self.fits = fits

    @property
    def _real(self) -> str:
        # A symlinked table (a ConfigMap, /etc) is replaced where it lives, link kept.
        return os.path.realpath(self.path)

    def read(self) -> tuple[str, str]:
        """The text and its version (sha256 of the bytes); OSError when unreadable."""
        data = Path(self.path).read_bytes()
        return data.decode("utf-8", errors="replace"), version_of(data)

    def check(self, text: str) -> list[Problem]:
        return check(text, self.path, self.gpus, self.fits)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One save at a time: a thread lock within this process, and a lock file beside
        the table (flock) across processes."""
        real = self._real
        with _thread_locks_lock:
            lock = _thread_locks.setdefault(real, threading.Lock())
        folder, name = os.path.split(real)
        with lock, open(os.path.join(folder, f".{name}.lock"), "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def save(self, text: str, base_version: str, who: str, comment: str, audit: Trail, *,
             base_text: str | None = None, restored_from: int | None = None) -> SaveResult:
        """Write ``text`` if it is valid, ``comment`` says why, and the file is still at
        ``base_version``; record it in ``audit``. ``base_text``, the text this admin
        started from, makes the diff of a refusal when the audit trail lacks it."""
        comment = comment.strip()
        refused = _refused_early(self, text, who, comment)
        if refused is not None:
            return refused
        data = text.encode("utf-8")
        with self._locked():
            raw = Path(self._real).read_bytes()
            current = version_of(raw)
            current_text = raw.decode("utf-8", errors="replace")
            if current != base_version:
                return _conflict(self.path, text, base_version, base_text, current,
                                 current_text, audit)
            if data == raw:
                return SaveResult(UNCHANGED, "The text is the table as it is; nothing was "
                                  "written.", current)
            with audit.transaction() as connection:
                previous = audit.latest(self.path, connection)
                if previous is None or previous.sha256 != current:
                    # The trail must hold the version being replaced, so it can be restored.
                    first = previous is None
                    audit.record(
                        path=self.path, who=BEFORE_EDITOR if first else OUTSIDE_EDITOR,
                        comment=("the table as it was before the editor's first save" if first
                                 else "the table as changed outside the editor"),
                        text=current_text, previous=None if first else previous.text,
                        at=os.stat(self._real).st_mtime, sha256=current,
                        connection=connection)
                audit_id = audit.record(
                    path=self.path, who=who, comment=comment, text=text,
                    previous=current_text, restored_from=restored_from,
                    connection=connection)
                # Written inside the transaction: a failed write records nothing.
                self._write(data)
            return _saved(self.path, current_text, text, version_of(data), audit_id)

    def _write(self, data: bytes) -> None:
        """Replace the file atomically (temp file, fsync, rename), keeping its mode."""
        real = self._real
        before = os.stat(real)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".quota-spawner.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, stat.S_IMODE(before.st_mode))
            if (before.st_uid, before.st_gid) != (os.getuid(), os.getgid()):
                try:
                    os.chown(tmp, before.st_uid, before.st_gid)
                except OSError:
                    pass  # only root may give a file away; the mode is kept regardless
            os.replace(tmp, real)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


# --- the database -----------------------------------------------------------------------


class TableVersions:
    """The table kept in the ledger's database (``quota_source = "database"``): its newest
    version under ``database:<name>`` in the trail is the table, and a save adds one.
    While there is none, the table is ``seed``'s text (the quota file, or the ConfigMap's
    on Kubernetes; empty without one), recorded as the first version by the first save.
    Nothing here writes a file. Blocking: the trail is the ledger's."""

    def __init__(self, name: str, trail: Trail, seed: str = "",
                 gpus: GpuCapacity | None = None, fits: Fits | None = None):
        self.key = database_key(name)
        self.trail = trail
        self.seed = seed
        self.gpus = gpus
        self.fits = fits

    @property
    def path(self) -> str:
        return self.key

    def seed_text(self) -> str:
        """The seed file's text; empty when there is none or it cannot be read."""
        try:
            return Path(self.seed).read_bytes().decode("utf-8", errors="replace") \
                if self.seed else ""
        except OSError:
            return ""

    def _current(self, trail: Trail, connection: Any = None
                 ) -> tuple[Version | None, str, str]:
        """The newest version (None: there is none yet), and the table's text and version."""
        latest = trail.latest(self.key, connection)
        if latest is not None:
            return latest, latest.text, latest.sha256
        text = self.seed_text()
        return None, text, version_of(text.encode("utf-8"))

    def read(self) -> tuple[str, str]:
        _, text, version = self._current(self.trail)
        return text, version

    def check(self, text: str) -> list[Problem]:
        return check(text, self.key, self.gpus, self.fits)

    def save(self, text: str, base_version: str, who: str, comment: str, audit: Trail, *,
             base_text: str | None = None, restored_from: int | None = None) -> SaveResult:
        """Add ``text`` as the newest version if it is valid, ``comment`` says why, and the
        table is still at ``base_version``; as ``TableFile.save``, in ``audit``'s
        transaction, which lets one save at a time through on every machine."""
        comment = comment.strip()
        refused = _refused_early(self, text, who, comment)
        if refused is not None:
            return refused
        with audit.transaction() as connection:
            latest, current_text, current = self._current(audit, connection)
            if current != base_version:
                conflict = True
            elif text == current_text:
                return SaveResult(UNCHANGED, "The text is the table as it is; nothing was "
                                  "written.", current)
            else:
                conflict = False
                if latest is None and current_text:
                    # The trail must hold the version being replaced, so it can be restored.
                    audit.record(path=self.key, who=FROM_FILE,
                                 comment=f"the table as it was in {self.seed}, before the "
                                 "first version saved in the database", text=current_text,
                                 previous=None, connection=connection)
                audit_id = audit.record(
                    path=self.key, who=who, comment=comment, text=text,
                    previous=current_text if latest is not None or current_text else None,
                    restored_from=restored_from, connection=connection)
        if conflict:  # told after the transaction: its diffs read the trail again
            return _conflict(self.key, text, base_version, base_text, current, current_text,
                             audit)
        return _saved(self.key, current_text, text, version_of(text.encode("utf-8")),
                      audit_id)
