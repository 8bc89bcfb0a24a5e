"""QuotaSpawner's settings: its traits, and the DockerSpawner defaults it changes.

A mixin, so that spawner.py holds the lifecycle only; the traits are still
set as ``c.QuotaSpawner.<name>`` (docs/deployment.md lists them). Nothing
here is a guarantee: a trait can be replaced by config, so every limit is
enforced again when the container is created (spawner/docker/container.py).
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Float, Integer, List, Unicode, default, validate
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


class QuotaSpawnerConfig(QuotaConfig):
    pids_limit = Integer(
        2048,
        config=True,
        help="Most processes and threads in one container, for roles that set no 'pids'.",
    )
    notebook_user = Unicode(
        "1000",
        config=True,
        help="The user (uid or uid:gid) the notebook runs as; never root.",
    )
    home_dir = Unicode("/home/jovyan", config=True, help="Where the home volume is mounted.")
    extra_labels = Dict(
        config=True, help="More container labels. The quota-spawner.* labels are refused."
    )
    gpu_inventory = List(
        Dict(),
        config=True,
        help="""The GPUs this hub hands out, declared: for a hub that cannot see them
        (a hub in a container, say). A list of {"uuid": "GPU-…", "name": "…",
        "memory": "80G"}; name and memory are optional. When empty, the GPUs are
        discovered with NVML on the hub host.""",
    )
    gpu_discovery = Bool(
        True, config=True, help="Discover GPUs with NVML when no gpu_inventory is declared."
    )
    gpu_sync_interval = Float(
        30.0, config=True,
        help="Seconds between checks of the running containers against the GPU holdings.",
    )
    zombie_grace_period = Float(
        300.0, config=True,
        help="Seconds an unclaimed container of this hub may run before it is stopped.",
    )
    usage_check_interval = Float(
        60.0, config=True,
        help="""Seconds between the hub's checks of the ledger: GPU-hour budgets of running
        servers, and sessions whose container vanished.""",
    )
    usage_retention_days = Float(
        400.0, config=True,
        help="Days a finished session stays in the usage ledger; 0: kept forever.",
    )
    cpu_boost = Bool(
        True,
        config=True,
        help="""Start each server with more CPUs than its role (cpu_boost_cpus), and set
        the role's CPU quota with the engine's update call as soon as the server answers,
        before the user is handed the server. Python's imports are single-threaded, so a
        role below one CPU otherwise starts about twice as slowly. If the update fails,
        the server is stopped, never left unlimited.""",
    )
    cpu_boost_cpus = Float(
        0.0,
        config=True,
        help="CPUs a server gets while it starts (cpu_boost); 0 means all of the engine's CPUs.",
    )

    # --- DockerSpawner's defaults, changed ----------------------------------------

    @default("remove")
    def _remove_default(self) -> bool:
        return True  # a fresh container per spawn; the home volume keeps the work

    @validate("remove")
    def _always_remove(self, proposal: Any) -> bool:
        # A kept container would come back with the last role's limits and GPUs.
        if not proposal.value:
            self.log.warning("QuotaSpawner.remove=False is ignored: every start gets a fresh "
                             "container, sized from the quota table")
        return True

    @default("prefix")
    def _prefix_default(self) -> str:
        return "quota"

    @default("volumes")
    def _volumes_default(self) -> dict[str, str]:
        return {f"{self.prefix}-home-{{username}}": self.home_dir}

    @default("cmd")
    def _cmd_default(self) -> list[str]:
        return ["jupyterhub-singleuser"]

    @property
    def hub_id_prefix(self) -> str:
        return self.prefix

    async def admin_value(self, value: Any) -> dict[str, Any]:
        """An admin's dict setting as DockerSpawner reads it: called if callable,
        awaited, with {username}-style templates filled in."""
        value = self._eval_if_callable(value)
        if inspect.isawaitable(value):
            value = await value
        return self._render_templates(dict(value or {}))

    def start_cpus(self, engine_cpus: float) -> float | None:
        """CPUs for the start boost; None when it is off. ``engine_cpus``: 0 if unknown."""
        if not self.cpu_boost:
            return None
        cpus = self.cpu_boost_cpus or engine_cpus
        return min(cpus, engine_cpus) if engine_cpus else cpus or None
