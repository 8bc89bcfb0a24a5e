"""The ledger's tables (SQLAlchemy Core). Changes go with a migration in migrations/versions.

Times are epoch seconds (floats), so that durations are plain subtraction in
SQL on SQLite and PostgreSQL alike. Sizes are bytes, CPUs are cores.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

# Its own version table: the ledger may share a database with JupyterHub's.
VERSION_TABLE = "quota_spawner_alembic_version"

metadata = MetaData()

sessions = Table(
    "sessions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hub", String(64), nullable=False, server_default=""),
    Column("user_name", String(255), nullable=False),
    Column("server_name", String(255), nullable=False, server_default=""),
    Column("container", String(255), nullable=False),  # the container's name
    Column("container_id", String(64)),
    Column("role", String(255), nullable=False),
    Column("image", String(255), nullable=False, server_default=""),  # the table's image key
    Column("gpus", Text, nullable=False, server_default=""),  # UUIDs, comma-separated
    Column("gpu_count", Integer, nullable=False, server_default="0"),
    Column("gpu_mode", String(32), nullable=False, server_default=""),  # exclusive, shared:N
    # GPUs reserved: the count, or count/N for a GPU shared N ways
    Column("gpu_reserved", Float, nullable=False, server_default="0"),
    Column("cpu_limit", Float, nullable=False),
    Column("mem_limit", BigInteger, nullable=False),
    Column("gpu_mem_limit", BigInteger),  # per user on a shared GPU; else the GPU's memory
    Column("requested", Float, nullable=False),  # the start began
    Column("started", Float),  # the container started: resources reserved from here
    Column("ready", Float),  # the notebook server answered
    Column("stopped", Float),  # None while it runs
    Column("reason", String(32)),  # why it stopped (REASONS)
    Column("hint", String(32)),  # why it is being stopped, told before the stop
    Column("detail", Text),  # e.g. the error of a failed start
    Column("last_seen", Float),  # the last sample
    # folded from the watchdog's samples: sums (for averages) and peaks
    Column("cpu_samples", Integer, nullable=False, server_default="0"),
    Column("cpu_sum", Float, nullable=False, server_default="0"),
    Column("cpu_peak", Float),
    Column("mem_samples", Integer, nullable=False, server_default="0"),
    Column("mem_sum", Float, nullable=False, server_default="0"),
    Column("mem_peak", BigInteger),
    Column("gpu_samples", Integer, nullable=False, server_default="0"),
    Column("gpu_util_sum", Float, nullable=False, server_default="0"),
    Column("gpu_util_peak", Float),
    Column("gpu_mem_sum", Float, nullable=False, server_default="0"),
    Column("gpu_mem_peak", BigInteger),
    Column("oom_kills", Integer, nullable=False, server_default="0"),
    # the home: the size it started with (NULL: no size limit), and the most it held in
    # the watchdog's samples (NULL: never sampled)
    Column("home_size", BigInteger),
    Column("home_peak", BigInteger),
)
Index("ix_sessions_started", sessions.c.started)
Index("ix_sessions_stopped", sessions.c.stopped)
Index("ix_sessions_user_started", sessions.c.user_name, sessions.c.started)
Index("ix_sessions_container", sessions.c.hub, sessions.c.container, sessions.c.stopped)

session_groups = Table(
    "session_groups",
    metadata,
    Column("session_id", Integer, ForeignKey("sessions.id", ondelete="CASCADE"),
           primary_key=True),
    Column("group_name", String(255), primary_key=True),
)
Index("ix_session_groups_group", session_groups.c.group_name)

# The quota table's audit trail: every version the editor saved, with who, why and the
# diff from the version before; ``restored_from`` is the row a restore brought back.
table_versions = Table(
    "table_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("path", String(1024), nullable=False),  # the table's absolute path
    Column("at", Float, nullable=False),
    Column("who", String(255), nullable=False),
    Column("comment", Text, nullable=False),
    Column("sha256", String(64), nullable=False),  # of the file's bytes
    Column("text", Text, nullable=False),
    Column("diff", Text, nullable=False, server_default=""),  # unified, from the version before
    Column("restored_from", Integer, ForeignKey("table_versions.id")),
)
Index("ix_table_versions_path", table_versions.c.path, table_versions.c.id)

# Requests for a bigger role, and their decisions: an approved one is a grant that holds
# from ``starts`` to ``ends``; the rows are the grants' audit trail, never deleted.
role_requests = Table(
    "role_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(255), nullable=False),
    Column("groups", Text, nullable=False, server_default=""),  # when asked, comma-separated
    Column("role", String(255), nullable=False),
    Column("starts", Float, nullable=False),
    Column("ends", Float, nullable=False),
    Column("reason", Text, nullable=False),
    Column("state", String(16), nullable=False),  # pending, approved, refused, withdrawn
    Column("asked_at", Float, nullable=False),
    Column("decided_by", String(255)),  # the admin or instructor; the user for a withdrawal
    Column("decided_at", Float),
    Column("decision_comment", Text, nullable=False, server_default=""),
)
Index("ix_role_requests_user", role_requests.c.user_name, role_requests.c.state)
Index("ix_role_requests_state", role_requests.c.state, role_requests.c.ends)
# At most one open (pending) request per user and role, whatever several writers do at
# once (usage/grants.py asks under a lock; this holds for any writer)
OPEN_REQUEST_INDEX = "uq_role_requests_open"
Index(OPEN_REQUEST_INDEX, role_requests.c.user_name, role_requests.c.role, unique=True,
      sqlite_where=role_requests.c.state == "pending",
      postgresql_where=role_requests.c.state == "pending")

# Class pre-warms an instructor scheduled: at ``at`` the usage service starts every
# member's server of ``group_name`` with ``role`` and ``image``, with its own token;
# ``result`` says what happened to each member. Rows are kept as the trail.
prewarm_schedules = Table(
    "prewarm_schedules",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("group_name", String(255), nullable=False),
    Column("role", String(255), nullable=False),
    Column("image", String(255), nullable=False),
    Column("at", Float, nullable=False),
    Column("created_by", String(255), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("state", String(16), nullable=False),  # pending, done, cancelled, failed
    Column("result", Text, nullable=False, server_default=""),
)
Index("ix_prewarm_schedules_state", prewarm_schedules.c.state, prewarm_schedules.c.at)
Index("ix_prewarm_schedules_group", prewarm_schedules.c.group_name, prewarm_schedules.c.at)

# The hub's event log (spawner/usage/event_log.py) for processes that share no folder with the hub:
# one row per event in the order written (usage/event_store.py serialises the writers on
# a server), read by id. ``body`` is the whole record as JSON.
events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("hub", String(64), nullable=False, server_default=""),
    Column("event", String(64), nullable=False),
    Column("body", Text, nullable=False),
)
Index("ix_events_hub", events.c.hub, events.c.id)

# The small documents the hub and each watchdog publish for the other processes
# (spawner/usage/documents.py's kinds): one row per hub, kind and node, replaced whole.
state_documents = Table(
    "state_documents",
    metadata,
    Column("hub", String(64), primary_key=True),
    Column("kind", String(32), primary_key=True),
    Column("node", String(253), primary_key=True),  # "" for the hub's own; a DNS name
    Column("time", Float, nullable=False),
    Column("body", Text, nullable=False),
)

# Which watchdog tells each event (event_store.claim_after): the first to read it, so
# that with a watchdog per node every event is told once.
event_claims = Table(
    "event_claims",
    metadata,
    Column("event_id", Integer, primary_key=True, autoincrement=False),
    Column("node", String(253), nullable=False),
    Column("time", Float, nullable=False),
)
