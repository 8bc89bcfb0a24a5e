"""The usage ledger: one row per server session, in its own SQLAlchemy database.

Three processes write it, each its own part, so no write waits on another
process's state:

- the hub (``spawner.py``): a session opens when a start is asked for, and
  gets its GPUs, its start, its readiness and its stop, with the reason;
- the culler, the preemption and the budgets tell *why* a server is about to
  stop (``hint``) before they stop it; the hub's stop takes that reason;
- the watchdog folds its samples into the open sessions (``fold``): sums for
  the averages, and peaks (the home's use only as its peak).

A session is found by its hub and container name: a server has at most one
open session. SQLite (the default, beside the hub's database) runs in WAL
mode with a busy timeout, so the three writers take turns; any SQLAlchemy
URL works, e.g. PostgreSQL. The schema is versioned with Alembic, in its own
version table; the hub creates or upgrades it at start, the others wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.sql.expression import bindparam

from spawner.quota.units import rfc3339_time as docker_time
from spawner.usage.locks import one_at_a_time
from spawner.usage.schema import VERSION_TABLE, metadata, session_groups, sessions

LEDGER_FILE = "quota-spawner-usage.sqlite"
MIGRATIONS = Path(__file__).with_name("migrations")
T = TypeVar("T")

# Why a session ended (docs/usage.md#how-sessions-end).
STOPPED = "stopped"  # by its user, or an admin or instructor
CULLED = "culled"  # idle past its role's idle_timeout
MAX_AGE = "max-age"  # reached its role's max_age
PREEMPTED = "preempted"  # stopped for a higher-priority start
OOM = "oom"  # the container was killed for memory
FAILED = "failed"  # never became ready
ZOMBIE = "zombie"  # a container no hub server claimed, removed
BUDGET = "budget"  # its GPU-hour budget ran out, and the table says stop
LOST = "lost"  # ended without the hub: a crash, a reboot, a docker rm
REASONS = (STOPPED, CULLED, MAX_AGE, PREEMPTED, OOM, FAILED, ZOMBIE, BUDGET, LOST)
# What the server itself shows wins over what was said before the stop:
# a server killed for memory while it was being culled ended by memory.
_OWN = (OOM, FAILED, LOST)
# Seconds after a server is ready (else after its container started) whose CPU samples
# do not count in its CPU peak: the Jupyter server and JupyterLab loading take 0.4 to
# 0.7 cores even in a session that is idle, and the right-sizing advice reads the peak.
# Its sums (the averages) keep every sample (docs/usage.md#right-sizing-advice).
STARTUP_WINDOW = 60.0


def default_url(state_dir: str = "") -> str:
    """``$QUOTA_SPAWNER_USAGE_DB``, else SQLite in ``state_dir`` (or the environment's
    ``QUOTA_SPAWNER_STATE_DIR``, or the working directory, where jupyterhub.sqlite is)."""
    if os.environ.get("QUOTA_SPAWNER_USAGE_DB"):
        return os.environ["QUOTA_SPAWNER_USAGE_DB"]
    state = state_dir or os.environ.get("QUOTA_SPAWNER_STATE_DIR", "") or "."
    return f"sqlite:///{Path(state).resolve() / LEDGER_FILE}"


def gpu_reserved(count: int, mode: str) -> float:
    """GPUs a session holds: its count, or count/N of a GPU shared N ways."""
    if mode.startswith("shared:"):
        try:
            return count / max(1, int(mode.split(":", 1)[1]))
        except ValueError:
            return float(count)
    return float(count)


def ended(container: dict[str, Any] | None = None, end: dict[str, Any] | None = None,
          ) -> tuple[str, str | None, float | None]:
    """Why a server's session ended: from its container as the engine shows it, or, once
    the container is gone, from the engine's record of its end (``engine.container_end``);
    neither: lost. Returns (reason, detail, when; None for now)."""
    if container is not None:
        state = container.get("State") or {}
        if state.get("Running"):
            return STOPPED, None, None
        end = {"oom": bool(state.get("OOMKilled")), "exit_code": state.get("ExitCode"),
               "finished": docker_time(state.get("FinishedAt"))}
    if end is None:
        return LOST, "its container was gone, with no record of its end", None
    code, when = end.get("exit_code"), end.get("finished")
    if end.get("oom"):
        return OOM, f"the container was killed for memory (exit code {code})", when
    if code == 0:  # the server shut itself down, e.g. File > Shut Down in JupyterLab
        return STOPPED, "the server exited by itself", when
    return LOST, f"the server ended without the hub stopping it (exit code {code})", when


def failure(error: BaseException) -> str:
    """What a failed start is recorded with: the message its user was shown."""
    message = getattr(error, "log_message", None) or str(error)
    return message or type(error).__name__


class LedgerNotReady(Exception):
    """The ledger's tables are missing or older than this code: the hub creates them."""


@dataclass(frozen=True)
class Sample:
    """One server's usage in one watchdog cycle; None where it was not read."""

    hub: str
    container: str
    time: float
    cpu: float | None = None  # cores
    memory: int | None = None  # working set, bytes
    gpu_util: float | None = None  # 0 to 1, the mean of its GPUs
    gpu_memory: int | None = None  # its own processes, bytes
    oom_kills: int = 0  # the cgroup's counter, cumulative
    home_used: int | None = None  # bytes in its home, the quota's count


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Per connection only: nothing here changes the file, so a reader may open any file.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout=30000")  # writers of three processes take turns
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str, create: bool = True) -> Engine:
    """An engine for the ledger at ``url``. It changes nothing in the database: WAL mode,
    which a SQLite file keeps, is set by ``use_wal`` once the ledger is known to be one."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if create and parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def use_wal(engine: Engine) -> None:
    """Put a SQLite ledger in WAL mode, so readers never block the writers. The mode is
    kept in the file, so only the ledger's owner sets it (``Ledger(create=True)``), after
    creating or upgrading it: a reader that refuses a file leaves it as it found it."""
    if engine.url.get_backend_name() != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


def _alembic_config(connection: Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    config = _alembic_config(None)  # type: ignore[arg-type]
    return ScriptDirectory.from_config(config).get_current_head() or ""


def current_revision(connection: Connection) -> str | None:
    from alembic.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade(engine: Engine, log: logging.Logger | logging.LoggerAdapter) -> None:
    """Create the tables (a new ledger) or run the migrations up to this code's (an old one).

    A SQLite file is copied aside first (``<file>.<revision>.bak``), as
    JupyterHub does before it upgrades its database.
    """
    from alembic import command

    head = head_revision()
    with engine.begin() as connection:
        _one_at_a_time(connection)
        found = current_revision(connection)
        if found == head:
            return
        if found is None and not inspect(connection).has_table(sessions.name):
            metadata.create_all(connection)
            command.stamp(_alembic_config(connection), head)
            log.info("Usage ledger created at %s", engine.url.render_as_string())
            return
    database = engine.url.database
    if engine.url.get_backend_name() == "sqlite" and database and os.path.exists(database):
        backup = f"{database}.{found or 'unversioned'}.bak"
        shutil.copy2(database, backup)
        log.info("Usage ledger backed up to %s before its upgrade", backup)
    with engine.begin() as connection:
        _one_at_a_time(connection)
        if current_revision(connection) == head:
            return  # another process upgraded it meanwhile
        command.upgrade(_alembic_config(connection), head)
    log.info("Usage ledger upgraded from %s to %s", found, head)


# pg_advisory_xact_lock's key for creating or upgrading the ledger ("quota" in ASCII)
UPGRADE_LOCK = 0x71756F7461


def _one_at_a_time(connection: Connection) -> None:
    """One process at a time creates or upgrades the ledger (the hub, the usage service
    and each watchdog may start together): two CREATE TABLEs of the same table at once
    fail on a server. The lock ends with the transaction."""
    one_at_a_time(connection, UPGRADE_LOCK)


class Ledger:
    """The ledger's reads and writes (blocking: call them from a thread, see LedgerWriter)."""

    def __init__(self, url: str, log: logging.Logger | logging.LoggerAdapter | None = None,
                 create: bool = True):
        self.url = url
        self.log = log or logging.getLogger(__name__)
        self.engine = make_engine(url, create)
        if create:
            upgrade(self.engine, self.log)
            use_wal(self.engine)
        else:
            try:
                self.check_ready()
            except BaseException:
                self.engine.dispose()  # a refused file is not held open
                raise

    def check_ready(self) -> None:
        database = self.engine.url.database
        if (self.engine.url.get_backend_name() == "sqlite" and database
                and database != ":memory:" and not os.path.exists(database)):
            # not even an empty file made: only the hub creates the ledger
            raise LedgerNotReady(f"the usage ledger at {self.url_text} does not exist yet; "
                                 "the hub creates it when it starts (or run: quota-spawner "
                                 "ledger upgrade)")
        with self.engine.connect() as connection:
            found = current_revision(connection)
        if found != head_revision():
            raise LedgerNotReady(
                f"the usage ledger at {self.url_text} is at revision {found or 'none'}, "
                f"not {head_revision()}; the hub creates or upgrades it when it starts "
                "(or run: quota-spawner ledger upgrade)")

    @property
    def url_text(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def dispose(self) -> None:
        self.engine.dispose()

    # --- sessions: the hub ------------------------------------------------------------

    def open(self, *, hub: str, user: str, container: str, role: str, image: str,
             cpu_limit: float, mem_limit: int, groups: Iterable[str] = (),
             server: str = "", requested: float | None = None) -> int:
        """A new session for a start just asked for; an earlier session of the same
        container still open (its stop was never recorded) is closed as lost."""
        requested = time.time() if requested is None else requested
        with self.engine.begin() as connection:
            self._close_open(connection, hub, container, LOST, None)
            session_id = connection.execute(insert(sessions).values(
                hub=hub, user_name=user, server_name=server, container=container, role=role,
                image=image, cpu_limit=cpu_limit, mem_limit=mem_limit, requested=requested,
            )).inserted_primary_key[0]
            names = sorted(set(groups))
            if names:
                connection.execute(insert(session_groups), [
                    {"session_id": session_id, "group_name": g} for g in names])
        return int(session_id)

    def _open_session(self, hub: str, container: str) -> Any:
        return and_(sessions.c.hub == hub, sessions.c.container == container,
                    sessions.c.stopped.is_(None))

    def set_gpus(self, hub: str, container: str, uuids: Sequence[str], mode: str,
                 gpu_memory: int | None, count: int | None = None) -> None:
        """The GPUs the session holds. ``count`` where the UUIDs are not known (on
        Kubernetes the device plugin picks them): by default, one per UUID."""
        count = len(uuids) if count is None else count
        with self.engine.begin() as connection:
            connection.execute(update(sessions).where(self._open_session(hub, container)).values(
                gpus=",".join(uuids), gpu_count=count, gpu_mode=mode,
                gpu_reserved=gpu_reserved(count, mode), gpu_mem_limit=gpu_memory))

    def started(self, hub: str, container: str, container_id: str,
                when: float | None = None, home_size: int | None = None) -> None:
        """The container (pod) runs, with a home of ``home_size`` bytes (None: no limit)."""
        with self.engine.begin() as connection:
            connection.execute(update(sessions).where(self._open_session(hub, container)).values(
                started=time.time() if when is None else when, container_id=container_id,
                home_size=home_size))

    def ready(self, hub: str, container: str, when: float | None = None) -> None:
        with self.engine.begin() as connection:
            connection.execute(update(sessions).where(self._open_session(hub, container)).values(
                ready=time.time() if when is None else when))

    def hint(self, hub: str, container: str, reason: str) -> bool:
        """Say why the server is about to be stopped; its stop records that reason.
        False when it has no open session."""
        assert reason in REASONS, reason
        with self.engine.begin() as connection:
            done = connection.execute(update(sessions).where(
                self._open_session(hub, container)).values(hint=reason))
        return bool(done.rowcount)

    def hint_server(self, user: str, server: str, reason: str) -> bool:
        """``hint`` for a process that knows the server by its user and name (the culler)."""
        assert reason in REASONS, reason
        with self.engine.begin() as connection:
            done = connection.execute(update(sessions).where(and_(
                sessions.c.user_name == user, sessions.c.server_name == server,
                sessions.c.stopped.is_(None))).values(hint=reason))
        return bool(done.rowcount)

    def close(self, hub: str, container: str, reason: str, detail: str | None = None,
              when: float | None = None) -> int | None:
        """End the open session of ``container``: ``reason`` unless a hint was told before
        and ``reason`` is not one the server itself showed. Returns its id, if there was one."""
        with self.engine.begin() as connection:
            return self._close_open(connection, hub, container, reason, detail, when)

    def _close_open(self, connection: Connection, hub: str, container: str, reason: str,
                    detail: str | None, when: float | None = None) -> int | None:
        assert reason in REASONS, reason
        row = connection.execute(
            select(sessions.c.id, sessions.c.hint, sessions.c.started, sessions.c.ready,
                   sessions.c.last_seen)
            .where(self._open_session(hub, container))
            .order_by(sessions.c.id.desc())).first()
        if row is None:
            return None
        final = reason if reason in _OWN or not row.hint else row.hint
        if final == STOPPED and row.ready is None:  # stopped before it ever answered
            final, detail = FAILED, detail or "stopped before the server was ready"
        if when is None:
            # what is known: a lost server ran until its last sample, at least
            when = (max(t for t in (row.last_seen, row.ready, row.started) if t)
                    if reason == LOST and (row.last_seen or row.ready or row.started)
                    else time.time())
        connection.execute(update(sessions).where(
            and_(self._open_session(hub, container), sessions.c.id <= row.id)).values(
            stopped=when, reason=final, detail=detail))
        return int(row.id)

    def open_session(self, hub: str, container: str) -> dict[str, Any] | None:
        """The open session of ``container``: its id, container_id, started and requested."""
        with self.engine.connect() as connection:
            row = connection.execute(
                select(sessions.c.id, sessions.c.container_id, sessions.c.started,
                       sessions.c.requested)
                .where(self._open_session(hub, container)).order_by(sessions.c.id.desc())
            ).first()
        return dict(row._mapping) if row is not None else None

    def open_containers(self, hub: str) -> dict[str, int]:
        """The containers of ``hub`` with an open session, to the session's id."""
        with self.engine.connect() as connection:
            rows = connection.execute(select(sessions.c.container, sessions.c.id).where(
                and_(sessions.c.hub == hub, sessions.c.stopped.is_(None))))
            return {r.container: r.id for r in rows}

    def prune(self, before: float) -> int:
        """Forget the sessions that stopped before ``before`` (the retention)."""
        with self.engine.begin() as connection:
            done = connection.execute(delete(sessions).where(sessions.c.stopped < before))
        return int(done.rowcount or 0)

    # --- samples: the watchdog ----------------------------------------------------------

    _FOLD = None  # the statement, built once

    @classmethod
    def _fold_statement(cls) -> Any:
        if cls._FOLD is None:
            def peak(column: Any, value: str, known: str) -> Any:
                return case((and_(bindparam(known) == 1,
                                  (column.is_(None)) | (column < bindparam(value))),
                             bindparam(value)), else_=column)

            c = sessions.c
            # a sample in the startup window, or of a session with neither time known
            # (NULL), leaves the CPU peak as it is
            after_startup = (bindparam("b_time")
                             >= func.coalesce(c.ready, c.started) + STARTUP_WINDOW)
            cls._FOLD = update(sessions).where(and_(
                c.hub == bindparam("b_hub"), c.container == bindparam("b_container"),
                c.stopped.is_(None))).values(
                last_seen=bindparam("b_time"),
                cpu_samples=c.cpu_samples + bindparam("cpu_n"),
                cpu_sum=c.cpu_sum + bindparam("cpu"),
                cpu_peak=case((after_startup, peak(c.cpu_peak, "cpu", "cpu_n")),
                              else_=c.cpu_peak),
                mem_samples=c.mem_samples + bindparam("mem_n"),
                mem_sum=c.mem_sum + bindparam("mem"),
                mem_peak=peak(c.mem_peak, "mem", "mem_n"),
                gpu_samples=c.gpu_samples + bindparam("gpu_n"),
                gpu_util_sum=c.gpu_util_sum + bindparam("util"),
                gpu_util_peak=peak(c.gpu_util_peak, "util", "gpu_n"),
                gpu_mem_sum=c.gpu_mem_sum + bindparam("gmem"),
                gpu_mem_peak=peak(c.gpu_mem_peak, "gmem", "gpu_n"),
                oom_kills=case((c.oom_kills < bindparam("oom"), bindparam("oom")),
                               else_=c.oom_kills),
                home_peak=peak(c.home_peak, "home", "home_n"),
            )
        return cls._FOLD

    def fold(self, samples: Sequence[Sample]) -> int:
        """Add one cycle's samples to the open sessions, in one transaction; returns how
        many sessions took one (a server whose session is not open is left out). The CPU
        peak leaves out the samples of the first ``STARTUP_WINDOW`` seconds."""
        if not samples:
            return 0
        params = []
        for s in samples:
            gpu = s.gpu_util is not None or s.gpu_memory is not None
            params.append({
                "b_hub": s.hub, "b_container": s.container, "b_time": s.time,
                "cpu": s.cpu or 0.0, "cpu_n": int(s.cpu is not None),
                "mem": s.memory or 0, "mem_n": int(s.memory is not None),
                "util": s.gpu_util or 0.0, "gmem": s.gpu_memory or 0, "gpu_n": int(gpu),
                "oom": s.oom_kills, "home": s.home_used or 0,
                "home_n": int(s.home_used is not None),
            })
        with self.engine.begin() as connection:
            done = connection.execute(self._fold_statement(), params)
        return int(done.rowcount or 0) if done.rowcount is not None else len(params)


class LedgerWriter:
    """The hub's side: every ledger call on one thread of its own, in order, so the
    event loop never waits on the database and a stop is never recorded before its start.

    A call that fails is logged and answered with None: a broken ledger must not
    fail a spawn or a stop.
    """

    def __init__(self, ledger: Ledger, log: logging.Logger | logging.LoggerAdapter):
        self.ledger = ledger
        self.log = log
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-ledger")

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, lambda: method(*args, **kwargs))
        except Exception as e:
            self.log.error("Usage ledger: %s failed: %s", getattr(method, "__name__", method), e)
            return None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.ledger, name)

        async def bound(*args: Any, **kwargs: Any) -> Any:
            return await self.call(method, *args, **kwargs)

        return bound


class _NoLedger:
    """Stands in for a LedgerWriter where there is no ledger: every call does nothing."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        async def nothing(*args: Any, **kwargs: Any) -> None:
            return None

        return nothing


NO_LEDGER: Any = _NoLedger()
