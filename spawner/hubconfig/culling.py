"""Idle culling with per-role timeouts and lifetimes, through jupyterhub-idle-culler.

The hub runs jupyterhub-idle-culler 2.x as a managed service
(``culler_service``); its ``cull_arbiter_hook`` (``make_arbiter``) looks up
the role recorded in each server's ``user_options`` and applies that role's
``idle_timeout`` and ``max_age`` from the quota table. Culling itself (the
API calls, the schedule) stays the culler's own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from jupyterhub_idle_culler import format_td, parse_date

from spawner.quota.editing import DEFAULT_TABLE_NAME, FILE_SOURCE
from spawner.usage.ledger import default_url
from spawner.usage.table_versions import table_store

DEFAULT_IDLE_TIMEOUT = 30 * 60
# What the culler needs and nothing more (docs/culling.md).
CULLER_SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]


def culler_service(
    quota_file: str, timeout: float = DEFAULT_IDLE_TIMEOUT, cull_every: float = 60,
    max_age: float = 0, name: str = "idle-culler", usage_db: str = "",
    quota_source: str = "", quota_table_name: str = "",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The managed service and its RBAC role, for c.JupyterHub.services / load_roles.

    ``timeout`` applies to servers whose role sets no idle_timeout; ``max_age``
    (0: none) to servers whose role sets no max_age. ``usage_db``: the usage
    ledger, told why each server is culled (idle or max_age). ``quota_source`` and
    ``quota_table_name``: the spawner's, so that the culler reads the table the hub
    reads (empty: the hub's $QUOTA_SPAWNER_QUOTA_SOURCE and _TABLE_NAME, when set).
    """
    source = quota_source or os.environ.get("QUOTA_SPAWNER_QUOTA_SOURCE", "")
    table_name = quota_table_name or os.environ.get("QUOTA_SPAWNER_QUOTA_TABLE_NAME", "")
    service = {
        "name": name,
        "command": [
            sys.executable, "-m", "jupyterhub_idle_culler",
            f"--timeout={int(timeout)}", f"--cull-every={max(1, int(cull_every))}",
            f"--config={Path(__file__).with_name('culler_config.py')}",
        ],
        "environment": {
            "QUOTA_SPAWNER_QUOTA_FILE": quota_file,
            "QUOTA_SPAWNER_MAX_AGE": str(int(max_age)),
            **({"QUOTA_SPAWNER_USAGE_DB": usage_db} if usage_db else {}),
            **({"QUOTA_SPAWNER_QUOTA_SOURCE": source} if source else {}),
            **({"QUOTA_SPAWNER_QUOTA_TABLE_NAME": table_name} if table_name else {}),
        },
    }
    role = {"name": name, "scopes": list(CULLER_SCOPES), "services": [name]}
    return service, role


def _logger() -> logging.Logger:
    log = logging.getLogger("quota_spawner.culling")
    if not log.handlers:  # the culler process configures only its own logger
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(
            "[%(levelname).1s %(asctime)s quota-spawner culling] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def owner_names(server: dict[str, Any]) -> tuple[str, str] | None:
    """(user, server name) of a server model: from its ``full_name`` ("user/name"), else
    from its URL, whose path ends in user/<name>/[<server>/] after the hub's base_url."""
    if server.get("full_name"):
        user, _, name = str(server["full_name"]).partition("/")
        return user, name
    parts = [unquote(p) for p in urlparse(server.get("url") or "").path.strip("/").split("/")]
    named = 1 if server.get("name") else 0
    if len(parts) < 2 + named or parts[-2 - named] != "user":
        return None
    return parts[-1 - named], server.get("name") or ""


def owner(server: dict[str, Any]) -> str:
    """'user' or 'user/server', for the log."""
    names = owner_names(server)
    if names is None:
        return "?"
    return f"{names[0]}/{names[1]}" if names[1] else names[0]


class CullReasons:
    """Tells the usage ledger why a server is about to be culled, before the culler
    stops it; a ledger that cannot be reached never holds up a cull."""

    def __init__(self, url: str, log: logging.Logger):
        self.url, self.log = url, log
        self._ledger: Any = None

    def _tell(self, user: str, server: str, reason: str) -> None:
        from spawner.usage.ledger import Ledger

        if self._ledger is None:
            self._ledger = Ledger(self.url, self.log, create=False)
        self._ledger.hint_server(user, server, reason)

    async def tell(self, server: dict[str, Any], reason: str) -> None:
        if not self.url or self.url == "none":
            return
        names = owner_names(server)
        if names is None:
            return
        try:
            await asyncio.to_thread(self._tell, *names, reason)
        except Exception as e:
            self.log.warning("Could not tell the usage ledger why %s is culled: %s",
                             owner(server), e)


def make_arbiter(quota_file: str, default_max_age: float = 0,
                 log: logging.Logger | None = None, usage_db: str = "",
                 quota_source: str = FILE_SOURCE, quota_table_name: str = DEFAULT_TABLE_NAME):
    """A cull_arbiter_hook applying each server's role's idle_timeout and max_age, from
    the table the hub reads (``quota_source``: the file, or the ledger's newest version)."""
    log = log or _logger()
    # the culler only reads the ledger the hub made
    store = table_store(quota_source, quota_file, usage_db or default_url(), quota_table_name,
                        log, create=False)
    reasons = CullReasons(usage_db, log)

    async def arbiter(*, inactive: timedelta | None, inactive_limit: int,
                      server: dict[str, Any], **_: Any) -> bool:
        if inactive is None:
            return False
        profile = (server.get("user_options") or {}).get("profile")
        try:
            table = await asyncio.to_thread(store.get, log)
            role = table.roles.get(profile) if profile else None
        except Exception as e:  # no good table: fall back to the defaults
            log.warning("Quota table unavailable (%s); using the default timeouts", e)
            role = None
        timeout = (role.idle_timeout if role and role.idle_timeout else None) or inactive_limit
        max_age = (role.max_age if role and role.max_age else None) or default_max_age
        started = parse_date(server["started"]) if server.get("started") else None
        age = datetime.now(timezone.utc) - started if started else None
        who, role_name = owner(server), profile or "(none)"
        if max_age and age is not None and age.total_seconds() >= max_age:
            log.info("Culling %s (role %s): reached max_age %s (age %s, idle %s)",
                     who, role_name, format_td(timedelta(seconds=max_age)), format_td(age),
                     format_td(inactive))
            await reasons.tell(server, "max-age")
            return True
        if inactive.total_seconds() >= timeout:
            log.info("Culling %s (role %s): idle for %s, idle_timeout %s",
                     who, role_name, format_td(inactive), format_td(timedelta(seconds=timeout)))
            await reasons.tell(server, "culled")
            return True
        return False

    return arbiter
