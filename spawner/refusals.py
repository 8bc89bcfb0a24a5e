"""What a user is told when their server cannot start: one plain sentence or two.

The details for the admin go to the hub's log, next to the refusal.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING

from spawner.gpu.allocator import NoGpuFree, Usage
from spawner.quota.model import Budget, Choice, Role
from spawner.quota.units import human_duration

if TYPE_CHECKING:  # the ledger's package needs SQLAlchemy; the sentences do not
    from spawner.usage.budgets import BudgetState

SETTING_REFUSED = (
    "Your server cannot start because the hub's configuration asks for a container "
    "setting that the quota does not allow. An admin has been told; please try again later."
)
TABLE_BROKEN = (
    "The hub's quota table has a mistake, so no server can start until an admin fixes it. "
    "The details are in the hub's log."
)
CPU_LIMIT_FAILED = (
    "Your server started but could not be given its CPU limit, so it was stopped. "
    "Please try again; if this happens again, tell an admin."
)
OTHER_HUB = (
    "Your server cannot start: a container with its name belongs to another hub on this "
    "machine. An admin has to fix the hub's configuration."
)

CLUSTER_REFUSED = (
    "Your server cannot start because the cluster refused to create it. An admin has "
    "been told; please try again later."
)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def no_gpu(role: Role, error: NoGpuFree, no_gpus_reason: str, choices: list[Choice]) -> str:
    """Why no GPU was given (``no_gpus_reason``: why the inventory is empty, if it is),
    and what the user can do now."""
    usage = error.usage
    wanted = _plural(role.gpus, "GPU")
    if usage.total == 0:
        reason = no_gpus_reason or "none were found"
        text = f"The role '{role.name}' needs {wanted}, but this hub has no GPUs ({reason})."
    elif role.gpus > usage.total:
        text = (f"The role '{role.name}' needs {wanted}, but this hub has only "
                f"{usage.total}; an admin must fix the quota table.")
    else:
        held = usage.total - usage.free
        text = (
            f"No GPU is free for the role '{role.name}', which needs {wanted} "
            f"({role.gpu_mode}): this hub has {_plural(usage.total, 'GPU')} and {held} "
            f"{'is' if held == 1 else 'are'} held ({usage.exclusive} exclusively, "
            f"{usage.shared} shared)."
        )
    return text + _what_now(choices)


def queue_timeout(role: Role, waited: float, place: int, usage: Usage,
                  choices: list[Choice]) -> str:
    """A GPU request that waited its role's queue_timeout without a GPU."""
    held = usage.total - usage.free
    return (f"No GPU became free for the role '{role.name}' ({_plural(role.gpus, 'GPU')}, "
            f"{role.gpu_mode}) in the {human_duration(waited)} you waited in the queue "
            f"(you were number {place}). This hub has {_plural(usage.total, 'GPU')} and "
            f"{held} {'is' if held == 1 else 'are'} held." + _what_now(choices))


def _what_now(choices: list[Choice]) -> str:
    cpu_roles = list(dict.fromkeys(c.role.name for c in choices if not c.role.gpus))
    if cpu_roles:
        return f" You can start a CPU-only server now with the role '{cpu_roles[0]}'."
    return " You have no CPU-only role; try again when a GPU is released."


# --- GPU-hour budgets (docs/usage.md#gpu-hour-budgets) ------------------------------------

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_THIS = {"day": "today", "week": "this week", "month": "this month"}
_RESERVED = "Budgets count the time GPUs were reserved, busy or not."


HOURS_PRECISION = 0.001  # the least amount of hours written as a number


def hours_text(hours: float) -> str:
    """Hours (GPU-, CPU- or GiB-hours) for people: '0.005', '4.5', '200.4', '1,234.5',
    '200' (not '200.0'). Three significant digits below 10, so a small budget or a short
    session keeps its size; one decimal from 10 up, so large ones stay short. Never an
    exponent, and never '0' for an amount that is not 0: below 0.001 it is '<0.001'."""
    if hours < 0:
        return "-" + hours_text(-hours)
    if hours == 0:
        return "0"
    if hours < HOURS_PRECISION:
        return f"<{HOURS_PRECISION:g}"
    # from 0.001 to 10, 'g' with 3 digits writes no exponent and no trailing zeros
    text = f"{hours:.3g}" if hours < 10 else f"{hours:,.1f}"
    return text.removesuffix(".0")


def local_time(epoch: float, zone: tzinfo) -> str:
    """'1 December 2026 at 00:00 UTC', '30 March 2026 at 00:00 CEST': a date and time
    in ``zone``, named by its abbreviation, or by its offset where it has none."""
    local = datetime.fromtimestamp(epoch, zone)
    name = "UTC" if zone is timezone.utc else (local.tzname() or "")
    if not name.isalpha():  # many zones are named '+03': say 'UTC+03:00'
        offset = int((local.utcoffset() or timedelta()).total_seconds()) // 60
        sign = "-" if offset < 0 else "+"
        name = f"UTC{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
    return f"{local.day} {_MONTHS[local.month - 1]} {local.year} at {local:%H:%M} {name}"


def _whose(budget: Budget) -> str:
    if budget.kind == "group":
        return f"The GPU-hour budget of the group {budget.name}"
    return "Your GPU-hour budget"


def _used(state: BudgetState) -> str:
    budget = state.budget
    return (f"{hours_text(state.used)} of {hours_text(budget.gpu_hours)} GPU-hours "
            f"used {_THIS.get(budget.per, 'this ' + budget.per)}")


def budget_spent(state: BudgetState, zone: tzinfo) -> str:
    """A GPU start refused because a budget of the user is spent."""
    return (f"{_whose(state.budget)} is spent: {_used(state)}. {_RESERVED} It resets on "
            f"{local_time(state.resets_at, zone)}. Roles without GPUs can still be started.")


def budget_warning(state: BudgetState, zone: tzinfo) -> str:
    """A running GPU server's user, told that a budget passed its warn_at."""
    budget = state.budget
    percent = int(state.used / budget.gpu_hours * 100 + 1e-9)
    then = ("your running GPU servers are stopped and no new one can start until it resets"
            if budget.stop else
            "no new GPU server can start until it resets; running servers keep running")
    return (f"{_whose(budget)} is {percent}% used: {_used(state)}. {_RESERVED} When it is "
            f"spent, {then}. It resets on {local_time(state.resets_at, zone)}.")


def budget_spent_running(state: BudgetState, zone: tzinfo) -> str:
    """A running GPU server's user, told that a budget is spent: stopped, when the table
    says ``stop: true``, else kept running."""
    budget = state.budget
    if budget.stop:
        now = ("Your GPU servers are being stopped now, as the quota table says; "
               "the home folder is kept.")
    else:
        now = "Your running servers keep running, but no new GPU server can start."
    return (f"{_whose(budget)} is spent: {_used(state)}. {now} {_RESERVED} It resets on "
            f"{local_time(state.resets_at, zone)}. Roles without GPUs can still be started.")


# --- the engine cannot give GPUs (docs/gpus.md#an-engine-without-the-nvidia-runtime) ---

NO_NVIDIA_RUNTIME = (
    "This hub's GPUs cannot be given to containers: the container engine has no NVIDIA "
    "runtime. Ask an admin to install it."
)


def no_nvidia_runtime(choices: list[Choice]) -> str:
    """A GPU start refused because the engine has no NVIDIA runtime, and what the user
    can start meanwhile."""
    cpu_roles = list(dict.fromkeys(c.role.name for c in choices if not c.role.gpus))
    if cpu_roles:
        return (NO_NVIDIA_RUNTIME + " A role without GPUs can still be started: you can "
                f"start a CPU-only server now with the role '{cpu_roles[0]}'.")
    return NO_NVIDIA_RUNTIME + " You have no role without GPUs to start meanwhile."
