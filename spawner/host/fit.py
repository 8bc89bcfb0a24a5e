"""How the quota table's roles fit on a host: how many servers of each fit on the host
alone, and which role can never start there, because one server of it is more than the
notebooks' share (``HostCapacity.share``; docs/deployment.md#host-capacity).

One implementation for ``quota-spawner validate --engine`` (its lines, and a problem
per such role: exit 1), the table editor (a problem, ``FILE:LINE`` at the role: a save
is refused) and the Docker hub (docker/gpus.py: the spawn form shows such a role disabled
with why). The hub alone is lenient: it loads such a table and refuses only that role's
starts (``refusals.host_never_fits``), since a table edited by hand or shared by hubs on
hosts of different sizes, or a host that shrank, must not stop the other roles; the
editor and the CLI are where an admin writes a table for this host, so they refuse it.
"""

from __future__ import annotations

from spawner.host.admission import HostCapacity
from spawner.quota.model import Problem, QuotaTable, Role
from spawner.quota.units import format_human


def size_of(role: Role) -> str:
    """'8 CPUs, 32 GiB'."""
    return f"{role.cpus:g} CPU{'s' if role.cpus != 1 else ''}, {format_human(role.memory)}"


def never_fits(role: Role, host: HostCapacity) -> str | None:
    """Why no server of ``role`` fits on ``host``, even empty: "one server's 32 GiB of
    memory is more than the notebooks' 21.2 GiB"; None when one does."""
    share = host.share
    if role.memory > share.memory:
        return (f"one server's {format_human(role.memory)} of memory is more than the "
                f"notebooks' {format_human(share.memory)}")
    if role.cpus > share.cpus + 1e-9:
        return f"one server's {role.cpus:g} CPUs are more than the notebooks' {share.cpus:g}"
    return None


def describe_fit(table: QuotaTable, host: HostCapacity) -> list[str]:
    """The host, then a line per role: how many of its servers fit on the host alone
    (``validate --engine``)."""
    lines = [f"  The host: {host.describe()}."]
    for role in table.roles.values():
        why = never_fits(role, host)
        if why is not None:
            lines.append(f"  {role.name} ({size_of(role)}): none fit: {why}")
            continue
        count, limit = host.servers_that_fit(role)
        runs_out = "the CPUs run" if limit == "CPUs" else "the memory runs"
        lines.append(f"  {role.name} ({size_of(role)}): {count} fit ({runs_out} out first)")
    return lines


def never_fit(table: QuotaTable, host: HostCapacity) -> list[Problem]:
    """A problem per role that can never start on ``host``, at the line it is declared on,
    with validate's words: "role 'senior-engineer' (8 CPUs, 32 GiB): none fit on this
    host: one server's 32 GiB of memory is more than the notebooks' 21.2 GiB"."""
    problems = []
    for role in table.roles.values():
        why = never_fits(role, host)
        if why is not None:
            problems.append(Problem(table.path, table.role_lines.get(role.name, 0),
                                    f"role '{role.name}' ({size_of(role)}): none fit on "
                                    f"this host: {why}"))
    return problems
