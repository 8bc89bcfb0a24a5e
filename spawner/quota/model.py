"""The quota table's model: roles, images, assignments, budgets, role requests, and the
limits a field may take."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timezone, tzinfo
from zoneinfo import ZoneInfo

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
NAME_RULE = "start with a letter or digit and use only letters, digits, '.', '_' and '-'"
DOCKER_MIN_MEMORY = 6 * 2**20
GPU_MODES = ("exclusive", "shared")

# Upper bounds, so that a typo or .inf is refused instead of meaning "unlimited".
MAX_CPUS = 1024
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


@dataclass(frozen=True)
class Role:
    name: str
    cpus: float
    memory: int
    images: tuple[str, ...]
    description: str = ""
    display_name: str = ""
    shm: int | None = None
    pids: int | None = None
    gpus: int = 0
    gpu_mode: str = "exclusive"
    gpu_share: int = 1  # most users on one GPU; 1 unless shared
    gpu_memory: int | None = None  # soft cap per user, shared mode only
    idle_timeout: float | None = None  # seconds; None: the culler's default (30m)
    max_age: float | None = None  # seconds; None: no limit
    priority: int = 0
    preempts: str | None = None  # "lower" or "never"; None: lower when priority > 0
    preemptible: bool = True  # may this role's servers be pushed out
    grace_period: float = DEFAULT_GRACE_PERIOD  # seconds a preempted server has to save
    min_runtime: float = DEFAULT_MIN_RUNTIME  # no server is preempted younger than this
    reclaim_after: float | None = None  # a protected server is preemptible after this age
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT  # most seconds a GPU request waits; 0: none

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
    gpu_hours: float
    per: str  # "day", "week" or "month"
    stop: bool = False  # stop running GPU servers once it is spent
    warn_at: float = DEFAULT_WARN_AT  # the fraction used at which running servers are warned

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

    roles: tuple[str, ...] = ()  # none: requests are off
    max_days: float = DEFAULT_REQUEST_MAX_DAYS  # the longest window
    instructors_approve: bool = False  # a group's instructors decide for its members
    max_open: int = DEFAULT_MAX_OPEN_REQUESTS  # a user's requests waiting at once

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
