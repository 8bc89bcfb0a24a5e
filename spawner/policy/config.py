"""The settings every quota spawner has, on Docker and on Kubernetes: ``QuotaConfig``,
and the hub id's default (from the hub's cookie secret).

A mixin, so that each spawner module holds its lifecycle only; the traits are
still set as ``c.QuotaSpawner.<name>`` or ``c.QuotaKubeSpawner.<name>``
(docs/deployment.md lists them). The Docker spawner's own settings are
``QuotaSpawnerConfig`` in spawner/docker/config.py. Nothing here is a
guarantee: a trait can be replaced by config, so every limit is enforced again
where the container or pod is made.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from traitlets import CaselessStrEnum, Float, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from spawner.policy.stopping import HubServer
from spawner.quota.editing import DEFAULT_TABLE_NAME, FILE_SOURCE, SOURCES, database_key
from spawner.quota.form import options_from_form


def valid_table_name(_owner: Any, proposal: dict[str, Any]) -> str:
    """The ``quota_table_name`` validator of every app that reads the table: a name its
    database key takes, else the key's sentence as the setting's error."""
    try:
        database_key(proposal["value"])
    except ValueError as e:
        raise TraitError(str(e)) from None
    return str(proposal["value"])


def hub_id_from_secret(prefix: str, secret: str | bytes) -> str:
    """The default hub id: stable across restarts, different per hub (its cookie secret)."""
    if isinstance(secret, str):
        secret = secret.encode()
    digest = hashlib.sha256(b"quota-spawner hub id\0" + secret).hexdigest()[:12]
    return f"{prefix}-{digest}"


def hub_id_from_secret_file(prefix: str, path: str) -> str | None:
    """The same, from JupyterHub's cookie_secret_file (hex); None when it cannot be read."""
    try:
        return hub_id_from_secret(prefix, bytes.fromhex(Path(path).read_text().strip()))
    except (OSError, ValueError):
        return None


def hub_id_environment(hub_id: str, secret_file: str, prefix: str) -> dict[str, str]:
    """The variables from which a service of the hub (the usage service, the watchdog)
    finds the hub's id as the spawner does: the id itself when the config sets it, or the
    hub takes its secret from $JUPYTERHUB_COOKIE_SECRET (the id, never the secret), else
    the secret file and prefix to derive it from. Both key the rows they share."""
    found: dict[str, str] = {}
    secret = os.environ.get("JUPYTERHUB_COOKIE_SECRET", "")
    if not hub_id and secret:
        try:
            hub_id = hub_id_from_secret(prefix, bytes.fromhex(secret))
        except ValueError:
            pass
    if hub_id:
        found["QUOTA_SPAWNER_HUB_ID"] = hub_id
    if secret_file:
        found["QUOTA_SPAWNER_HUB_SECRET_FILE"] = secret_file
        found["QUOTA_SPAWNER_PREFIX"] = prefix
    return found


def options_checked_at_start(spawner: Any, user_options: dict[str, Any]) -> None:
    """JupyterHub's ``apply_user_options`` hook of the quota spawners: the options are
    checked against the table as it is when the start reads it (``resolve``: on Docker in
    ``start``, on Kubernetes in ``load_user_options``), where a refusal is the user's 400 or
    403 sentence and nothing has been made; a check here, a moment earlier, would read the
    table twice per start and log a refusal with a traceback. This hook only tells
    JupyterHub that they are handled, so its log does not call every start's options
    unhandled."""


class QuotaConfig(Configurable):
    """The settings every quota spawner has, on Docker and on Kubernetes."""

    quota_file = Unicode(
        "quotas.yaml",
        config=True,
        help="""Path of the quota table (YAML). Edits take effect at the next spawn. With
        quota_source "database", only the first version's seed.""",
    )
    quota_source = CaselessStrEnum(
        list(SOURCES), config=True,
        help="""Where the quota table lives. "file": quota_file, read at every spawn.
        "database": the newest version in the usage ledger's database (usage_db; the
        table_versions rows of the key database:<quota_table_name>), which the usage
        service's editor saves to; quota_file then only seeds the first version while
        the database has none, and nothing writes it
        (docs/table-editor.md#the-table-in-the-database). Default:
        $QUOTA_SPAWNER_QUOTA_SOURCE, else "file".""",
    )
    quota_table_name = Unicode(
        config=True,
        help=f"""With quota_source "database": the table's name. Its versions are kept
        under the key database:<name>, the same for every hub process and usage service
        that share the ledger, whatever path quota_file has on their machine; hubs that
        share a ledger but not a table set different names. Default:
        $QUOTA_SPAWNER_QUOTA_TABLE_NAME, else {DEFAULT_TABLE_NAME!r}.""",
    )
    form_template = Unicode(
        "",
        config=True,
        help="""Jinja2 source of the spawn form, in place of the shipped
        spawner/quota/templates/form.html (docs/quota-table.md#the-spawn-form).
        Autoescape is on. Empty: the shipped form.""",
    )
    hub_id = Unicode(
        config=True,
        help="""Names this hub in the quota-spawner.hub label of its containers. Containers
        with this hub's label that no server of the hub claims are stopped after
        zombie_grace_period; other hubs' containers are never touched. The default,
        "<prefix>-<12 hex digits>", is derived from the hub's cookie secret: the same
        across restarts, different for every hub. Set it when the cookie secret is
        not kept (docs/deployment.md).""",
    )
    state_dir = Unicode(
        "", config=True,
        help="""Where the spawner keeps its files: the preemptions in their grace period
        (quota-spawner-preemptions.json, read back after a hub restart), the usage ledger
        by default, and, without a ledger, the event log (quota-spawner-events.jsonl:
        preemptions and the GPU wait queue, read by the watchdog). Default: the hub's
        working directory, where jupyterhub.sqlite is by default.""",
    )
    usage_db = Unicode(
        "", config=True,
        help="""The usage ledger (docs/usage.md): a SQLAlchemy URL, e.g.
        postgresql://user@db/quota_usage. Default: $QUOTA_SPAWNER_USAGE_DB when set, else
        SQLite in state_dir (quota-spawner-usage.sqlite). "none": no ledger (no reports and
        no budgets).""",
    )
    events_file = Unicode(
        config=True,
        help="""A file the hub's event log is appended to as JSON lines (relative: in
        state_dir), besides the usage ledger's events table. Default:
        $QUOTA_SPAWNER_EVENTS_FILE when set, else empty: the events table only, or with
        usage_db "none" quota-spawner-events.jsonl in state_dir. On Kubernetes the hub
        keeps one with a ledger only (its budget notices).""",
    )
    usage_check_interval = Float(
        60.0, config=True,
        help="""Seconds between the hub's checks of the ledger: GPU-hour budgets of running
        servers (warned, and stopped when spent with stop: true), and on Docker sessions
        whose container vanished.""",
    )

    @property
    def hub_id_prefix(self) -> str:
        """What starts the default hub id."""
        return "quota"

    @property
    def log_name(self: HubServer) -> str:
        """The server as the hub's own log lines name it: ``user``, or ``user:server``
        for a named server."""
        user = self.user.name if self.user else "(no user)"
        return f"{user}:{self.name}" if self.name else user

    # named apart from KubeSpawner's methods for the same defaults, which they replace
    @default("options_form")
    def _quota_options_form_default(self) -> Any:
        return type(self).render_options_form

    @default("options_from_form")
    def _quota_options_from_form_default(self) -> Any:
        return options_from_form

    @default("apply_user_options")
    def _quota_apply_user_options_default(self) -> Any:
        return options_checked_at_start  # an admin's own hook replaces it, as any config

    @default("quota_source")
    def _quota_source_default(self) -> str:
        # the usage service's and the culler's variable too: all read the same table
        return os.environ.get("QUOTA_SPAWNER_QUOTA_SOURCE", "").lower() or FILE_SOURCE

    @default("quota_table_name")
    def _quota_table_name_default(self) -> str:
        return os.environ.get("QUOTA_SPAWNER_QUOTA_TABLE_NAME", "") or DEFAULT_TABLE_NAME

    _valid_quota_table_name = validate("quota_table_name")(valid_table_name)

    @default("events_file")
    def _events_file_default(self) -> str:
        # the watchdog's variable too: the file one writes is the file the other reads
        return os.environ.get("QUOTA_SPAWNER_EVENTS_FILE", "")

    @default("hub_id")
    def _hub_id_default(self) -> str:
        # Stable across restarts, different per hub: two hubs on one engine or cluster
        # never take each other's servers for zombies.
        secret = (self.user.settings if self.user else {}).get("cookie_secret")
        if not secret:
            self.log.warning("No cookie secret to derive a hub id from; using the prefix %r. "
                             "Set %s.hub_id if another hub shares this engine.",
                             self.hub_id_prefix, type(self).__name__)
            return self.hub_id_prefix
        return hub_id_from_secret(self.hub_id_prefix, secret)
