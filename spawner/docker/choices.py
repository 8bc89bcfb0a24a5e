"""What a user may start on Docker: the quota's choices (spawner/policy/choices.py),
with the hub's GPUs.

``ChoicesMixin`` is QuotaSpawner's: it reads the table against the hub's GPU
capacity, gives the pool the table's roles (preemption weighs each holder by
its role as the table says now), and shows on the spawn form how many GPUs
each role would find free. What every spawner of the hub process shares is
the hub's runtime (spawner/docker/runtime.py), reached through ``hub_runtime``.
"""

from __future__ import annotations

from typing import Any

from spawner.docker.engine import warn_oversized_roles
from spawner.docker.runtime import HubRuntime
from spawner.gpu.pool import request_for
from spawner.policy.choices import RoleChoicesMixin
from spawner.quota.model import Choice, Role


class ChoicesMixin(RoleChoicesMixin):
    """Needs a DockerSpawner with QuotaSpawnerConfig's traits."""

    async def hub_runtime(self: Any) -> HubRuntime:
        """This hub's runtime (built at hub start, or now), in step with the running
        containers."""
        return await HubRuntime.of(self).ready(self, f"for {self._log_name}")

    async def choices(self: Any, runtime: HubRuntime | None = None) -> list[Choice]:
        """What this user may start, from the table as it is now."""
        runtime = runtime or await self.hub_runtime()
        table = await self.table_now(runtime.pool.capacity)
        warn_oversized_roles(table, runtime.engine_info, self.log)
        runtime.pool.roles = table.roles  # for preemption: every holder's role as it is now
        return await self.choices_in(table, runtime.usage)

    async def granted_roles(self: Any, runtime: HubRuntime) -> set[str]:
        """The roles an approved request grants this user now (``grants_in``)."""
        return await RoleChoicesMixin.grants_in(self, runtime.usage)

    async def budget_refusal(self: Any, runtime: HubRuntime, role: Role) -> str | None:
        """``budget_refusal_in`` the table as it is now, with the runtime's ledger."""
        if not role.gpus or runtime.usage is None:
            return None
        table = await self.quota_table(runtime.pool.capacity)
        return await self.budget_refusal_in(table, runtime.usage, role)

    async def render_options_form(self: Any) -> str:
        runtime = await self.hub_runtime()
        choices = await self.choices(runtime)
        pool = runtime.pool
        free = {c.role.name: pool.allocator.available(request)
                for c in choices if (request := request_for(c.role))}
        contents = await runtime.frameworks.get(
            (c.image.image for c in choices), self.docker, self.log)
        return await self.form_for(choices, (free, len(pool.inventory.devices)), contents)
