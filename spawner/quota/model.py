"""The quota table's model: roles, images, assignments, budgets, role requests, and the
limits a field may take."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timezone, tzinfo
from zoneinfo import ZoneInfo

from spawner.quota.fields import (
    REQUIRED,
    Duration,
    Flag,
    Names,
    Number,
    OneOf,
    Size,
    Text,
    WholeNumber,
    table_field,
)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
NAME_RULE = "start with a letter or digit and use only letters, digits, '.', '_' and '-'"
DOCKER_MIN_MEMORY = 6 * 2**20
GPU_MODES = ("exclusive", "shared")

# Upper bounds, so that a typo or .inf is refused instead of meaning "unlimited".
MAX_CPUS = 1024
MIN_DISK = 64 * 2**20  # a home Jupyter can start in: its settings, a kernel's files
MAX_SIZE = 64 * 2**40  # memory, shm, gpu_memory: 64 TiB
MAX_PIDS = 4_194_304  # the kernel's PID_MAX_LIMIT
MAX_GPUS = 64
MAX_GPU_SHARE = 64
MAX_DURATION = 365 * 24 * 3600  # idle_timeout, max_age: 365 days, in seconds
# Kubernetes' range for a user-defined PriorityClass value.
MIN_PRIORITY = -2_147_483_648
MAX_PRIORITY = 1_000_000_000
PREEMPTS = ("lower", "never")
# Defaults of the preemption and queue fields (docs/preemption.md).
DEFAULT_GRACE_PERIOD = 120.0
DEFAULT_MIN_RUNTIME = 600.0
DEFAULT_QUEUE_TIMEOUT = 600.0
# GPU-hour budgets (docs/usage.md#gpu-hour-budgets).
BUDGET_KINDS = ("group", "user")
BUDGET_PERIODS = ("day", "week", "month")
MAX_GPU_HOURS = 1_000_000.0  # 64 GPUs for a year is about 560,000
DEFAULT_WARN_AT = 0.9
DEFAULT_BUDGET_TIMEZONE = "UTC"
# Requests for a bigger role (docs/role-requests.md).
DEFAULT_REQUEST_MAX_DAYS = 14.0
MAX_REQUEST_DAYS = 366.0
# Requests one user may have waiting at once (docs/security.md#per-user-limits)
DEFAULT_MAX_OPEN_REQUESTS = 3
MAX_OPEN_REQUESTS = 100


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class QuotaTableError(Exception):
    """A quota table that cannot be used; ``problems`` lists every reason."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class ImageSpec:
    key: str
    image: str
    display_name: str
    description: str = ""


@dataclass(frozen=True, kw_only=True)
class Role:
    """A size users may start. Each field after ``name`` is one ``table_field``: the
    loader, the JSON Schema and the editor's preview take it from here, in this order
    (docs/quota-table.md#adding-a-role-field). Those with no default are positional:
    ``Role("gpu", 8, 32 * G, ("pytorch",), gpus=1)``."""

    name: str = field(kw_only=False)
    description: str = table_field(Text(), "", "Shown on the spawn form.")
    display_name: str = table_field(
        Text(), "", "Shown on the spawn form instead of the role's key.")
    cpus: float = table_field(
        Number(MAX_CPUS), REQUIRED,
        f"CPU quota, at most {MAX_CPUS}; also CPU_LIMIT and OMP/MKL/OPENBLAS_NUM_THREADS = "
        "max(1, floor(cpus)).")
    memory: int = table_field(
        Size(DOCKER_MIN_MEMORY), REQUIRED,
        "Memory limit, with swap off (at least 6M, Docker's minimum).")
    shm: int | None = table_field(Size(), None, "Size of /dev/shm (Docker's default is 64M).")
    disk: int | None = table_field(
        Size(MIN_DISK), None,
        "Size of the user's home, at least 64M (docs/disk.md); without it the home has no "
        "size limit.")
    pids: int | None = table_field(
        WholeNumber(1, MAX_PIDS), None,
        f"Most processes and threads, at most {MAX_PIDS} (the kernel's PID_MAX_LIMIT); "
        "default QuotaSpawner.pids_limit (2048).")
    images: tuple[str, ...] = table_field(
        Names("image", needs_one=True, owner_names=True), REQUIRED,
        "Image keys from 'images' this role may run.")
    gpus: int = table_field(
        WholeNumber(0, MAX_GPUS), 0,
        f"GPUs per server, at most {MAX_GPUS} (default 0: a CPU-only role). Each is an exact "
        "GPU or MIG instance, never shared by accident.")
    gpu_mode: str = table_field(
        OneOf(GPU_MODES), "exclusive",
        "exclusive (default): the GPU is this server's alone. shared: up to gpu_share "
        "servers on one GPU. Needs gpus of 1 or more.")
    gpu_share: int = table_field(  # 1 unless shared
        WholeNumber(1, MAX_GPU_SHARE), 1,
        f"Most servers on one GPU, at most {MAX_GPU_SHARE}. Required with gpu_mode: shared, "
        "and only allowed there.")
    gpu_memory: int | None = table_field(
        Size(DOCKER_MIN_MEMORY), None,
        "Soft GPU memory cap per process, per GPU (at least 6M), through framework "
        "settings; not isolation. Only with gpu_mode: shared.")
    idle_timeout: float | None = table_field(  # None: the culler's default
        Duration(), None,
        "Stop this role's servers after this long with no activity (default: the culler's "
        "timeout, QUOTA_SPAWNER_IDLE_TIMEOUT, 30m). A busy GPU counts as activity.")
    max_age: float | None = table_field(  # None: no limit
        Duration(), None,
        "Stop this role's servers this long after they started, even when active "
        "(default: QUOTA_SPAWNER_MAX_AGE, 0: no limit).")
    priority: int = table_field(
        WholeNumber(MIN_PRIORITY, MAX_PRIORITY), 0,
        "When GPUs are short, a higher priority is served first and may preempt lower ones "
        f"(default 0). A whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, Kubernetes' "
        "PriorityClass range. Any role.")
    preempts: str | None = table_field(  # None: lower when priority > 0
        OneOf(PREEMPTS), None,
        "lower: a start of this role may stop servers of lower-priority roles to free a "
        "GPU, or room on the host (CPUs and memory). never: it waits in the queue instead. "
        "Default: lower when priority is above 0, else never. Any role.")
    preemptible: bool = table_field(
        Flag(), True,
        "Whether this role's servers may be preempted by a higher priority (default true). "
        "false protects them, until reclaim_after if set. Any role.")
    # 0 is meaningful for these three: stop at once, no protection, refuse at once.
    grace_period: float = table_field(
        Duration(minimum=0), DEFAULT_GRACE_PERIOD,
        "How long a preempted server has to save its work before it is stopped (default "
        "2m; 0: stopped at once). Any role.")
    min_runtime: float = table_field(
        Duration(minimum=0), DEFAULT_MIN_RUNTIME,
        "No server of this role is preempted before it has run this long (default 10m; 0: "
        "no protection). Any role.")
    reclaim_after: float | None = table_field(
        Duration(), None,
        "With preemptible: false, the servers become preemptible at this age (default: "
        "never). Must be shorter than max_age. Any role.")
    queue_timeout: float = table_field(
        Duration(minimum=0), DEFAULT_QUEUE_TIMEOUT,
        "The longest a start waits in the queue for a GPU or for room on the host before "
        "it is refused (default 10m; 0: no queue, refused at once when no GPU is free or "
        "the host is full).")

    @property
    def title(self) -> str:
        return self.display_name or self.name

    @property
    def may_preempt(self) -> bool:
        """Whether this role's starts may push lower-priority servers out."""
        if self.preempts is None:
            return self.priority > 0
        return self.preempts == "lower"

    def protected_at(self, age: float) -> bool:
        """Whether a server of this role, ``age`` seconds old, is shielded from preemption
        by the role itself (``preemptible: false`` until ``reclaim_after``)."""
        if self.preemptible:
            return False
        return self.reclaim_after is None or age < self.reclaim_after


@dataclass(frozen=True)
class GpuCapacity:
    """What the hub's GPU inventory holds, for checking a table against it."""

    count: int
    smallest_memory: int | None = None


@dataclass(frozen=True)
class Choice:
    """One thing a user may start: a role with one of its images."""

    role: Role
    image: ImageSpec

    @property
    def key(self) -> str:
        return f"{self.role.name}/{self.image.key}"


@dataclass(frozen=True)
class Budget:
    """GPU-hours a group (shared by its members) or a user may reserve per period."""

    kind: str  # "group" or "user"
    name: str
    gpu_hours: float = table_field(
        Number(MAX_GPU_HOURS), REQUIRED,
        "GPU-hours that may be reserved per period: a server holding 2 GPUs for 3 hours "
        "reserves 6, one on a GPU shared 4 ways for 4 hours reserves 1. Reserved time "
        "counts, busy or not.")
    per: str = table_field(
        OneOf(BUDGET_PERIODS), REQUIRED,
        "The period: it starts at midnight in budgets.timezone; weeks on Monday, months on "
        "the 1st.")
    stop: bool = table_field(
        Flag(), False,
        "Stop the running GPU servers under this budget when it is spent (default false: "
        "they keep running, and only new GPU starts are refused).")
    warn_at: float = table_field(
        Number(1), DEFAULT_WARN_AT,
        "The fraction used at which users with a running GPU server are warned, once per "
        "period (default 0.9).", label="warn_at (a fraction, like 0.9)")

    @property
    def key(self) -> str:
        """'group:cs101' or 'user:alice': one budget in logs and the watch's memory."""
        return f"{self.kind}:{self.name}"

    @property
    def owner(self) -> str:
        """'the group cs101' or 'the user alice', for admins."""
        return f"the {self.kind} {self.name}"


@dataclass(frozen=True)
class RequestRules:
    """Which roles users may ask for, for how long, and who may decide."""

    roles: tuple[str, ...] = table_field(  # none: requests are off
        Names("role"), (), "The roles users may ask for (default: none).")
    max_days: float = table_field(
        Number(MAX_REQUEST_DAYS), DEFAULT_REQUEST_MAX_DAYS,
        "The longest window a request may ask for, in days (default 14).")
    instructors_approve: bool = table_field(
        Flag(), False,
        "true: an instructor of a group may decide the requests of that group's members; "
        "admins always may (default false).")
    max_open: int = table_field(
        WholeNumber(1, MAX_OPEN_REQUESTS), DEFAULT_MAX_OPEN_REQUESTS,
        "How many requests one user may have waiting for a decision at once; one more is "
        "refused until they withdraw one or it is decided (default 3).")

    @property
    def max_seconds(self) -> float:
        return self.max_days * 86400


def time_zone(name: str) -> tzinfo:
    """The zone of an IANA name; ValueError when this machine does not know it.

    UTC needs no time zone database, so a machine without one still runs budgets.
    """
    if name == DEFAULT_BUDGET_TIMEZONE:
        return timezone.utc
    try:
        return ZoneInfo(name)
    except Exception as e:  # ZoneInfoNotFoundError is a KeyError; a path is a ValueError
        raise ValueError(f"unknown time zone {name!r}") from e


@dataclass(frozen=True)
class QuotaTable:
    path: str
    images: dict[str, ImageSpec]
    roles: dict[str, Role]
    default: tuple[str, ...] = ()
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    users: dict[str, tuple[str, ...]] = field(default_factory=dict)
    budgets: tuple[Budget, ...] = ()
    budget_timezone: str = DEFAULT_BUDGET_TIMEZONE  # periods start at its midnight
    requests: RequestRules = field(default_factory=RequestRules)
    # the line each role is declared on, for checks made after loading (the host's room);
    # not part of what the table says, so two tables that say the same are equal
    role_lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def budget_zone(self) -> tzinfo:
        return time_zone(self.budget_timezone)

    def budgets_for(self, username: str, groups: Iterable[str] = ()) -> list[Budget]:
        """The user's own budget, then those of their groups: each of them applies."""
        held = set(groups)
        return ([b for b in self.budgets if b.kind == "user" and b.name == username]
                + [b for b in self.budgets if b.kind == "group" and b.name in held])

    def role_names_for(self, username: str, groups: Iterable[str] = (),
                       granted: Iterable[str] = ()) -> list[str]:
        """Users first, then the union of their groups, then ``default``; then the roles
        ``granted`` for now by an approved request (those the table still defines)."""
        if username in self.users:
            held = set(self.users[username])
        else:
            held = set()
            for group in groups:
                held.update(self.groups.get(group, ()))
            if not held:
                held = set(self.default)
        held.update(granted)
        return [name for name in self.roles if name in held]

    def roles_for(self, username: str, groups: Iterable[str] = (),
                  granted: Iterable[str] = ()) -> list[Role]:
        return [self.roles[name] for name in self.role_names_for(username, groups, granted)]

    def choices_for(self, username: str, groups: Iterable[str] = (),
                    granted: Iterable[str] = ()) -> list[Choice]:
        return [
            Choice(role, self.images[key])
            for role in self.roles_for(username, groups, granted)
            for key in role.images
        ]
