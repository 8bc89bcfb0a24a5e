"""Config file for jupyterhub-idle-culler, as spawner.hubconfig.culling.culler_service runs it.

Loaded by the culler (``--config``), not imported: ``c`` is its config.
"""

import os

from spawner.hubconfig.culling import make_arbiter

c = get_config()  # noqa: F821 (provided by the culler's config loader)
c.IdleCuller.cull_arbiter_hook = make_arbiter(
    os.environ["QUOTA_SPAWNER_QUOTA_FILE"],
    default_max_age=float(os.environ.get("QUOTA_SPAWNER_MAX_AGE") or 0),
    usage_db=os.environ.get("QUOTA_SPAWNER_USAGE_DB", ""),
    quota_source=os.environ.get("QUOTA_SPAWNER_QUOTA_SOURCE", "").lower() or "file",
    quota_table_name=os.environ.get("QUOTA_SPAWNER_QUOTA_TABLE_NAME", "") or "default",
)
