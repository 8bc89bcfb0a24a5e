"""What a user is told when their server cannot start: one plain sentence or two.

The details for the admin go to the hub's log, next to the refusal.
"""

from __future__ import annotations

from spawner.gpu.allocator import NoGpuFree, Usage
from spawner.quota.model import Choice, Role
from spawner.quota.units import format_human, human_duration

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


# --- the host's CPUs and memory (docs/deployment.md#host-capacity) -----------------------


def _size(role: Role) -> str:
    return f"{_plural_cpus(role.cpus)}, {format_human(role.memory)}"


def _plural_cpus(cpus: float) -> str:
    return f"{cpus:g} CPU{'' if cpus == 1 else 's'}"


def host_never_fits(role: Role, cpus: float, memory: int) -> str:
    """A role larger than what the host gives all notebooks together (``cpus``,
    ``memory``): no wait can serve it."""
    return (f"The role '{role.name}' ({_size(role)}) is larger than what this host gives "
            f"all notebook servers together ({_plural_cpus(cpus)}, {format_human(memory)}), "
            "so it can never start here. Ask an admin to change the role or the host's "
            "settings.")


def host_full(role: Role, full: str, waited: float | None, place: int) -> str:
    """A start that found no room on the host: at once for a role that does not queue
    (``waited`` None), else after its role's queue_timeout. ``full``: what is full, as
    'the host's memory is fully reserved: 30 GiB of 22 GiB'."""
    if waited is None:
        return (f"Your server cannot start now: {full}, and the role '{role.name}' "
                f"({_size(role)}) does not wait in the queue. Try again when a server "
                "stops.")
    return (f"No room came free on the host for the role '{role.name}' ({_size(role)}) in "
            f"the {human_duration(waited)} you waited in the queue (you were number "
            f"{place}): {full}. Try again when a server stops, or ask an admin.")


# --- the homes' disk (docs/disk.md) ------------------------------------------------------

HOMES_UNAVAILABLE = (
    "Your server cannot start: its role gives your home a size, and this hub cannot keep "
    "homes at a size now. An admin has to fix the hub's disk settings; the details are in "
    "the hub's log."
)
HOME_FAILED = (
    "Your server cannot start: your home could not be made ready. An admin has been "
    "told; please try again later."
)


def homes_full(full: str) -> str:
    """A home that cannot be made or grown: ``full`` is what is full ('The homes' disk is
    fully reserved: 380 GiB of 400 GiB are promised to 19 homes; this role's home needs
    20 GiB.'). Nothing was created."""
    return (f"{full} Your server cannot start with this role until there is room: ask an "
            "admin to free some, to give the homes more disk, or to give you a role with a "
            "smaller home.")


# --- GPU-hour budgets (docs/usage.md#gpu-hour-budgets) ------------------------------------

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
