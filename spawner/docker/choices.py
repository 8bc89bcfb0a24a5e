"""What a user may start on Docker: the quota's choices (spawner/policy/choices.py),
with the hub's GPUs and the host's share.

``ChoicesMixin`` is QuotaSpawner's: it reads the table against the hub's GPU
capacity, gives the pool the table's roles (preemption weighs each holder by
its role as the table says now), and shows on the spawn form how many GPUs
each role would find free. A role that can never start on this hub (more GPUs
than it has, larger than the notebooks' share of the host: gpus.py's
``never_starts``) is shown disabled with why, never preselected, and refused
when the form is sent, so the form comes back with the sentence before any
start. What every spawner of the hub process shares is the hub's runtime
(spawner/docker/runtime.py, the hub object on Docker), reached through ``quota_hub``.
The methods are typed against ``DockerQuotaSpawner``: a quota spawner
(spawner/policy/spawner.py) with DockerSpawner's engine call.
"""

from __future__ import annotations

from typing import Any, Protocol

from jupyterhub.utils import maybe_future

from spawner.docker.engine import warn_oversized_roles
from spawner.docker.gpus import GpuStart, beyond_host, never_starts
from spawner.docker.runtime import HubRuntime
from spawner.gpu.pool import GpuPool, request_for
from spawner.policy.choices import RoleChoicesMixin, shown
from spawner.policy.spawner import QuotaSpawnerProtocol
from spawner.quota.model import Choice, Role


def too_big_for_host(pool: GpuPool, choices: list[Choice]) -> dict[str, str]:
    """Role name -> why it can never start on this host, for the roles of ``choices``
    larger than the notebooks' share (``beyond_host``; none with host admission off)."""
    roles = {c.role.name: c.role for c in choices}.values()
    return {role.name: f"can never start here: {why}" for role in roles
            if (why := beyond_host(pool, role)) is not None}


class DockerQuotaSpawner(QuotaSpawnerProtocol, Protocol):
    """QuotaSpawner as its choices use it: a quota spawner with DockerSpawner's engine
    call, whose hub object is the hub's runtime."""

    async def docker(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    async def quota_hub(self) -> HubRuntime: ...

    async def choices(self, runtime: HubRuntime | None = None) -> list[Choice]: ...


class ChoicesMixin(RoleChoicesMixin):
    """QuotaSpawner's choices (``DockerQuotaSpawner``)."""

    hub_class = HubRuntime

    async def quota_hub(self: DockerQuotaSpawner) -> HubRuntime:
        """This hub's runtime (built at hub start, or now), in step with the running
        containers."""
        return await HubRuntime.of(self).ready(self, f"for {self.log_name}")

    async def choices(self: DockerQuotaSpawner, runtime: HubRuntime | None = None) -> list[Choice]:
        """What this user may start, from the table as it is now."""
        runtime = runtime or await self.quota_hub()
        table = await self.table_now(runtime.pool.capacity)
        warn_oversized_roles(table, runtime.engine_info, self.log)
        runtime.pool.roles = table.roles  # for preemption: every holder's role as it is now
        return await self.choices_in(table, runtime.usage)

    async def granted_roles(self: DockerQuotaSpawner, runtime: HubRuntime) -> set[str]:
        """The roles an approved request grants this user now (``grants_in``)."""
        return await RoleChoicesMixin.grants_in(self, runtime.usage)

    async def budget_refusal(self: DockerQuotaSpawner, runtime: HubRuntime,
                             role: Role) -> str | None:
        """``budget_refusal_in`` the table as it is now, with the runtime's ledger."""
        if not role.gpus or runtime.usage is None:
            return None
        table = await self.quota_table(runtime.pool.capacity)
        return await self.budget_refusal_in(table, runtime.usage, role)

    def startable(self: DockerQuotaSpawner, choice: Choice) -> bool:
        """Whether ``choice``'s role could ever start on this hub (``never_starts``)."""
        return never_starts(HubRuntime.of(self).pool, choice.role) is None

    async def render_options_form(self: DockerQuotaSpawner) -> str:
        runtime = await self.quota_hub()
        choices = await self.choices(runtime)
        pool = runtime.pool
        free = {c.role.name: pool.allocator.available(request)
                for c in choices if (request := request_for(c.role))}
        contents = await runtime.frameworks.get(
            (c.image.image for c in choices), self.docker, self.log)
        return await self.form_for(choices, (free, len(pool.inventory.devices)), contents,
                                   too_big_for_host(pool, choices))

    async def run_options_from_form(self: DockerQuotaSpawner,
                                    form_data: dict[str, Any]) -> dict[str, Any]:
        """The form's options, checked now: a choice the user does not hold, or one that
        can never start here, is refused before JupyterHub starts anything, so the spawn
        page shows the form again with the sentence. ``start`` checks them again."""
        options = await maybe_future(super().run_options_from_form(form_data))
        runtime = await self.quota_hub()
        choices = await self.choices(runtime)
        try:
            choice = await self.resolve(choices, options)
            GpuStart(runtime, self.user.name, self.log_name, self.log,
                     lambda message, percent: None).refuse_never(choice.role, choices)
        except BaseException as e:
            shown(e)
            raise
        return options
