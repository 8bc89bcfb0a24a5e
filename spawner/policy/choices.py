"""What a user may start: the quota table as it is now, the spawn form, and the
options the user chose, checked.

``RoleChoicesMixin`` is the part every quota spawner shares, on Docker and on
Kubernetes (spawner/kube/spawner.py): the table, the user's roles (the
table's assignments, their groups, approved role requests), the spawn form,
``user_options`` checked on every start. Its methods are typed against
``QuotaSpawnerProtocol`` (spawner/policy/spawner.py), which both spawners satisfy.
Docker's ``ChoicesMixin`` (the GPUs free now, from the hub's runtime) is in
spawner/docker/choices.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import jinja2
from tornado import web

from spawner.policy import refusals
from spawner.policy.hub import QuotaHub
from spawner.policy.spawner import QuotaSpawnerProtocol
from spawner.quota.form import render_form
from spawner.quota.model import Choice, GpuCapacity, QuotaTable, QuotaTableError, Role
from spawner.quota.options import OptionsError, resolve_choice
from spawner.quota.store import QuotaStore
from spawner.usage.budgets import check_start
from spawner.usage.grants import granted_roles
from spawner.usage.ledger import LedgerWriter, default_url
from spawner.usage.table_versions import table_store


class RoleChoicesMixin:
    """The quota's choices for any quota spawner (``QuotaSpawnerProtocol``: JupyterHub's
    Spawner with QuotaConfig's traits and its backend's hub object)."""

    # the backend's hub object (policy/hub.py), which build_at_hub_start makes; each
    # backend's ``quota_hub`` gives it, built and ready
    hub_class: ClassVar[type[QuotaHub]]

    def table_store(self: QuotaSpawnerProtocol) -> QuotaStore:
        """The store of the table this hub reads (``quota_source``): the quota file, or the
        newest version in the ledger's database (spawner/usage/table_versions.py)."""
        return table_store(self.quota_source, self.quota_file,
                           self.usage_db or default_url(self.state_dir or "."),
                           self.quota_table_name, self.log)

    async def quota_table(self: QuotaSpawnerProtocol,
                          capacity: GpuCapacity | None = None) -> QuotaTable:
        """The table as it is now (the last good one while the file or the newest version
        is broken; raises QuotaTableError when there never was one). ``capacity``: the
        GPUs the roles are checked against; None: not checked (a cluster's GPUs are the
        scheduler's). Read in a thread: a file, or a query of the ledger."""
        store = self.table_store()
        return await asyncio.to_thread(store.get, self.log, capacity)

    async def table_now(self: QuotaSpawnerProtocol,
                        capacity: GpuCapacity | None = None) -> QuotaTable:
        """The table, or the plain 500 a broken one gets."""
        try:
            return await self.quota_table(capacity)
        except QuotaTableError:  # the store has logged every problem with its file and line
            raise web.HTTPError(500, refusals.TABLE_BROKEN) from None

    async def choices_in(self: QuotaSpawnerProtocol, table: QuotaTable,
                         usage: LedgerWriter | None) -> list[Choice]:
        """What this user may start in ``table``: the table's assignments for them and
        their groups, and the roles an approved request grants (read from ``usage``)."""
        granted = await self.grants_in(usage) if table.requests.roles else set()
        return table.choices_for(self.user.name, [g.name for g in self.user.groups], granted)

    async def grants_in(self: QuotaSpawnerProtocol, usage: LedgerWriter | None) -> set[str]:
        """The roles an approved request grants this user now; none without a ledger, or
        when it cannot be read (logged: the user keeps the roles the table gives)."""
        if usage is None:
            return set()
        return await usage.call(granted_roles, usage.ledger.engine,
                                self.user.name, time.time()) or set()

    async def budget_refusal_in(self: QuotaSpawnerProtocol, table: QuotaTable,
                                usage: LedgerWriter | None, role: Role) -> str | None:
        """Why this user may not start ``role`` now: a spent GPU-hour budget of
        ``table``; None if they may (or there is no ledger to tell: a broken one is
        logged, not enforced)."""
        if not role.gpus or usage is None or not table.budgets:
            return None
        return await usage.call(check_start, usage.ledger.engine, table, self.user.name,
                                [g.name for g in self.user.groups], role, time.time())

    async def form_for(self: QuotaSpawnerProtocol, choices: list[Choice],
                       gpus: tuple[dict[str, int], int] | None = None,
                       contents: dict[str, str] | None = None,
                       host: dict[str, str] | None = None) -> str:
        """The spawn form for these choices, the saved choice selected if it can start
        (``host``: why a role can never start on this host; form.py's ``form_rows``)."""
        saved = self.orm_spawner.user_options if self.orm_spawner else None
        try:
            selected = resolve_choice(choices, saved).key if saved else None
        except OptionsError:  # the saved choice is gone: show the form even for one choice,
            selected = None   # or every Start would reuse it and fail
        args = dict(selected=selected, always=bool(saved) and selected is None,
                    gpus=gpus, contents=contents, host=host)
        try:
            return render_form(choices, template=self.form_template, **args)
        except jinja2.TemplateError as e:  # the admin's template: the shipped form instead
            line = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
            self.log.error("%s.form_template cannot be rendered%s: %s; showing the "
                           "shipped form instead", type(self).__name__, line, e)
            return render_form(choices, **args)

    def startable(self: QuotaSpawnerProtocol, choice: Choice) -> bool:
        """Whether ``choice`` could ever start on this hub; a start that names no role
        takes the first that can. Every role can, unless a backend knows better."""
        return True

    async def resolve(self: QuotaSpawnerProtocol, choices: list[Choice],
                      options: dict[str, Any] | None = None) -> Choice:
        """The user's choice for this start (``options``, or else ``user_options``),
        checked against the table."""
        try:
            return resolve_choice(choices, self.user_options if options is None else options,
                                  self.startable)
        except OptionsError as e:
            raise web.HTTPError(e.status, e.message) from None

    def _forget_refused_options(self: QuotaSpawnerProtocol, choices: list[Choice]) -> None:
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


def shown(error: BaseException) -> None:
    """Give a refused start's sentence to the page the user lands on. JupyterHub shows an
    exception's ``jupyterhub_message`` on the spawn form it renders again, in the
    progress stream's failed event and on its "Spawn failed" page; without one, that
    page gives no reason and the others show "HTTP 503: Service Unavailable (...)"."""
    if isinstance(error, web.HTTPError) and error.log_message \
            and not hasattr(error, "jupyterhub_message"):
        message = error.log_message % error.args if error.args else error.log_message
        error.jupyterhub_message = message  # type: ignore[attr-defined]
