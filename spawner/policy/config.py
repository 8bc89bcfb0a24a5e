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
from pathlib import Path
from typing import Any

from traitlets import Unicode, default
from traitlets.config import Configurable

from spawner.quota.form import options_from_form


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


class QuotaConfig(Configurable):
    """The settings every quota spawner has, on Docker and on Kubernetes."""

    quota_file = Unicode(
        "quotas.yaml",
        config=True,
        help="Path of the quota table (YAML). Edits take effect at the next spawn.",
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
        help="""Where the spawner keeps its files: the event log
        (quota-spawner-events.jsonl: preemptions and the GPU wait queue, read by the
        watchdog and usage reports) and the preemptions in their grace period
        (quota-spawner-preemptions.json, read back after a hub restart). Default: the
        hub's working directory, where jupyterhub.sqlite is by default.""",
    )
    usage_db = Unicode(
        "", config=True,
        help="""The usage ledger (docs/usage.md): a SQLAlchemy URL, e.g.
        postgresql://user@db/quota_usage. Default: $QUOTA_SPAWNER_USAGE_DB when set, else
        SQLite in state_dir (quota-spawner-usage.sqlite). "none": no ledger (no reports and
        no budgets).""",
    )

    @property
    def hub_id_prefix(self) -> str:
        """What starts the default hub id."""
        return "quota"

    @default("options_form")
    def _options_form_default(self) -> Any:
        return type(self).render_options_form

    @default("options_from_form")
    def _options_from_form_default(self) -> Any:
        return options_from_form

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
