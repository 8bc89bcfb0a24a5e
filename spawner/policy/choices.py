"""What a user may start: the quota table as it is now, the GPU pool's free
counts, the spawn form, and the options the user chose, checked.

``RoleChoicesMixin`` is the part every quota spawner shares, on Docker and on
Kubernetes (spawner/kube/spawner.py): the table, the user's roles (the
table's assignments, their groups, approved role requests), the spawn form,
``user_options`` checked on every start. ``ChoicesMixin`` is QuotaSpawner's:
it also holds what every Docker spawner of the hub process shares: the GPU
pool (one per inventory and hub id), the engine's info, and the images'
framework labels.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import weakref
from typing import Any, ClassVar

import jinja2
from sqlalchemy.engine import make_url
from tornado import web

from spawner import refusals
from spawner.docker.engine import (
    FrameworkLabels,
    NvidiaRuntime,
    check_engine_info,
    warn_oversized_roles,
)
from spawner.docker.evictor import Evictor
from spawner.events import EventLog
from spawner.gpu.pool import GpuPool, hub_inventory, request_for
from spawner.gpu.snapshot import GPUS_FILE
from spawner.quota.form import render_form
from spawner.quota.model import Choice, GpuCapacity, QuotaTable, QuotaTableError, Role
from spawner.quota.options import OptionsError, resolve_choice
from spawner.quota.store import QuotaStore
from spawner.registry import Registry
from spawner.usage.budgets import MEMORY_FILE, check_start
from spawner.usage.duties import UsageDuties
from spawner.usage.grants import granted_roles
from spawner.usage.ledger import Ledger, LedgerWriter, default_url

EVENTS_FILE = "quota-spawner-events.jsonl"
PREEMPTIONS_FILE = "quota-spawner-preemptions.json"


def probe_images(store: QuotaStore, log: Any, capacity: GpuCapacity) -> list[str]:
    """The images the NVIDIA runtime probe may use: the quota table's, those of its GPU
    roles first (the probe never pulls: it takes the first the engine has). Blocks."""
    try:
        table = store.get(log, capacity)
    except QuotaTableError:
        return []
    keys = [k for r in table.roles.values() if r.gpus for k in r.images] + list(table.images)
    return list(dict.fromkeys(table.images[k].image for k in keys if k in table.images))


class RoleChoicesMixin:
    """The quota's choices for any spawner with QuotaConfig's traits, ``user``,
    ``orm_spawner``, ``db``, ``user_options`` and ``log``."""

    async def quota_table(self: Any, capacity: GpuCapacity | None = None) -> QuotaTable:
        """The table as it is now (the last good one while the file is broken; raises
        QuotaTableError when there never was one). ``capacity``: the GPUs the roles
        are checked against; None: not checked (a cluster's GPUs are the scheduler's)."""
        store = QuotaStore.for_path(self.quota_file)
        return await asyncio.to_thread(store.get, self.log, capacity)

    async def table_now(self: Any, capacity: GpuCapacity | None = None) -> QuotaTable:
        """The table, or the plain 500 a broken one gets."""
        try:
            return await self.quota_table(capacity)
        except QuotaTableError:  # the store has logged every problem with its file and line
            raise web.HTTPError(500, refusals.TABLE_BROKEN) from None

    async def choices_in(self: Any, table: QuotaTable,
                         usage: LedgerWriter | None) -> list[Choice]:
        """What this user may start in ``table``: the table's assignments for them and
        their groups, and the roles an approved request grants (read from ``usage``)."""
        granted = await self.grants_in(usage) if table.requests.roles else set()
        return table.choices_for(self.user.name, [g.name for g in self.user.groups], granted)

    async def grants_in(self: Any, usage: LedgerWriter | None) -> set[str]:
        """The roles an approved request grants this user now; none without a ledger, or
        when it cannot be read (logged: the user keeps the roles the table gives)."""
        if usage is None:
            return set()
        return await usage.call(granted_roles, usage.ledger.engine,
                                self.user.name, time.time()) or set()

    async def budget_refusal_in(self: Any, table: QuotaTable, usage: LedgerWriter | None,
                                role: Role) -> str | None:
        """Why this user may not start ``role`` now: a spent GPU-hour budget of
        ``table``; None if they may (or there is no ledger to tell: a broken one is
        logged, not enforced)."""
        if not role.gpus or usage is None or not table.budgets:
            return None
        return await usage.call(check_start, usage.ledger.engine, table, self.user.name,
                                [g.name for g in self.user.groups], role, time.time())

    async def form_for(self: Any, choices: list[Choice],
                       gpus: tuple[dict[str, int], int] | None = None,
                       contents: dict[str, str] | None = None) -> str:
        """The spawn form for these choices, the saved choice selected."""
        saved = self.orm_spawner.user_options if self.orm_spawner else None
        try:
            selected = resolve_choice(choices, saved).key if saved else None
        except OptionsError:  # the saved choice is gone: show the form even for one choice,
            selected = None   # or every Start would reuse it and fail
        args = dict(selected=selected, always=bool(saved) and selected is None,
                    gpus=gpus, contents=contents)
        try:
            return render_form(choices, template=self.form_template, **args)
        except jinja2.TemplateError as e:  # the admin's template: the shipped form instead
            line = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
            self.log.error("%s.form_template cannot be rendered%s: %s; showing the "
                           "shipped form instead", type(self).__name__, line, e)
            return render_form(choices, **args)

    async def resolve(self: Any, choices: list[Choice]) -> Choice:
        """The user's choice for this start, checked against the table."""
        try:
            return resolve_choice(choices, self.user_options)
        except OptionsError as e:
            raise web.HTTPError(e.status, e.message) from None

    def _forget_refused_options(self: Any, choices: list[Choice]) -> None:
        # JupyterHub saved these options as the user's default before the start; a plain
        # start after a refused or failed one gets the last choice that started, if the
        # user still holds it, else their first choice.
        if self.orm_spawner is None:
            return
        kept = dict(self._started_options)
        try:
            resolve_choice(choices, kept)
        except OptionsError:
            kept = {}
        self.orm_spawner.user_options = kept
        if self.db is not None:
            self.db.commit()


class ChoicesMixin(RoleChoicesMixin):
    """Needs a DockerSpawner with QuotaSpawnerConfig's traits."""

    _pools: ClassVar[Registry[str, GpuPool]] = Registry()
    _engine_info: ClassVar[dict[str, Any] | None] = None
    _engine_checked: ClassVar[bool] = False
    _claimed: ClassVar[set[str]] = set()  # container names this hub process's servers hold
    # the same, to their spawners: a preempted server is stopped through its own
    _spawners: ClassVar[weakref.WeakValueDictionary[str, Any]] = weakref.WeakValueDictionary()
    _frameworks: ClassVar[FrameworkLabels] = FrameworkLabels()

    async def gpu_pool(self: Any) -> GpuPool:
        """This hub's GPU pool, in step with the running containers."""
        async def make() -> GpuPool:
            inventory = await asyncio.to_thread(
                hub_inventory, self.gpu_inventory, self.gpu_discovery)
            (self.log.info if inventory.devices else self.log.warning)(
                "GPU inventory: %s", inventory.describe())
            state = self.state_dir or "."
            pool = GpuPool(inventory, self.hub_id, self.client, self.log,
                           sync_interval=self.gpu_sync_interval,
                           zombie_grace=self.zombie_grace_period, known=ChoicesMixin._claimed,
                           spawners=ChoicesMixin._spawners,
                           events=EventLog(os.path.join(state, EVENTS_FILE), self.log),
                           gpus_file=os.path.join(state, GPUS_FILE))
            evictor = Evictor(pool, os.path.join(state, PREEMPTIONS_FILE), self.log)
            pool.evictions = evictor
            await evictor.recover()
            await self._open_ledger(pool)
            if inventory.devices:  # can the engine give them? Said in the log at once
                store, log, capacity = QuotaStore.for_path(self.quota_file), self.log, \
                    pool.capacity  # not self: the pool outlives this spawner

                async def images() -> list[str]:
                    return await asyncio.to_thread(probe_images, store, log, capacity)

                pool.nvidia = NvidiaRuntime(self.client, self.log, inventory.uuids[0],
                                            images, self.hub_id)
                pool.nvidia.start()
            return pool

        key = json.dumps([self.gpu_inventory, self.gpu_discovery, self.hub_id], default=str)
        pool = await ChoicesMixin._pools.aget(key, make)
        await pool.ready()
        return pool

    async def _open_ledger(self: Any, pool: GpuPool) -> None:
        """The usage ledger, created or upgraded now, and its periodic duties."""
        url = self.usage_db or default_url(self.state_dir or ".")
        if url == "none":
            return
        try:
            ledger = await asyncio.to_thread(Ledger, url, self.log)
        except Exception as e:
            self.log.error("The usage ledger %s cannot be opened (%s): sessions are not "
                           "recorded and budgets not enforced until the hub restarts with "
                           "it fixed",
                           make_url(url).render_as_string(hide_password=True), e)
            return
        pool.usage = LedgerWriter(ledger, self.log)
        pool.usage_duties = UsageDuties(
            ledger, pool, self.usage_retention_days, self.log,
            table=lambda: self.quota_table(pool.capacity),
            budget_memory=os.path.join(self.state_dir or ".", MEMORY_FILE),
            interval=self.usage_check_interval)
        pool.usage_duties.start()

    async def _check_engine_once(self: Any) -> None:
        if ChoicesMixin._engine_checked:
            return
        ChoicesMixin._engine_checked = True
        try:
            ChoicesMixin._engine_info = await self.docker("info")
        except Exception as e:
            self.log.warning("Could not read docker info: %s", e)
        else:
            check_engine_info(ChoicesMixin._engine_info, self.log)

    async def choices(self: Any, pool: GpuPool | None = None) -> list[Choice]:
        """What this user may start, from the table as it is now."""
        pool = pool or await self.gpu_pool()
        table = await self.table_now(pool.capacity)
        warn_oversized_roles(table, ChoicesMixin._engine_info, self.log)
        pool.roles = table.roles  # for preemption: every holder's role as the table says now
        return await self.choices_in(table, pool.usage)

    async def granted_roles(self: Any, pool: GpuPool) -> set[str]:
        """The roles an approved request grants this user now (``grants_in``)."""
        return await RoleChoicesMixin.grants_in(self, pool.usage)

    async def budget_refusal(self: Any, pool: GpuPool, role: Role) -> str | None:
        """``budget_refusal_in`` the table as it is now, with the pool's ledger."""
        if not role.gpus or pool.usage is None:
            return None
        table = await self.quota_table(pool.capacity)
        return await self.budget_refusal_in(table, pool.usage, role)

    async def render_options_form(self: Any) -> str:
        pool = await self.gpu_pool()
        choices = await self.choices(pool)
        free = {c.role.name: pool.allocator.available(request)
                for c in choices if (request := request_for(c.role))}
        contents = await ChoicesMixin._frameworks.get(
            (c.image.image for c in choices), self.docker, self.log)
        return await self.form_for(choices, (free, len(pool.inventory.devices)), contents)
