# JupyterHub configuration for Quota Spawner.
#
# Runs as is for the demo (`make demo`): host network, a shared demo password.
# For production set the QUOTA_SPAWNER_* variables below (the compose file in
# this folder does) and replace the authenticator with your own.
# Docs: docs/deployment.md.
import json
import logging
import os
from pathlib import Path

from spawner.culling import culler_service
from spawner.engine import check_engine
from spawner.quota import QuotaTableError
from spawner.rbac import instructor_roles
from spawner.store import QuotaStore
from spawner.units import parse_duration

c = get_config()  # noqa: F821 (provided by JupyterHub)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STATE = Path(os.environ.get("QUOTA_SPAWNER_STATE_DIR", ROOT / ".demo"))
STATE.mkdir(parents=True, exist_ok=True)


def env(name: str, default: str) -> str:
    return os.environ.get(f"QUOTA_SPAWNER_{name}", default)


# --- the hub ---------------------------------------------------------------
c.JupyterHub.bind_url = env("BIND_URL", "http://127.0.0.1:8000")
c.JupyterHub.hub_ip = env("HUB_IP", "127.0.0.1")
c.JupyterHub.db_url = env("DB_URL", f"sqlite:///{STATE / 'jupyterhub.sqlite'}")
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
local_chp = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
if local_chp.exists():
    c.ConfigurableHTTPProxy.command = [str(local_chp)]
# The home page adds a "GPU usage" link to each running server.
c.JupyterHub.template_paths = [str(HERE / "templates")]
if env("HUB_CONNECT_IP", ""):
    c.JupyterHub.hub_connect_ip = env("HUB_CONNECT_IP", "")

# --- the spawner -----------------------------------------------------------
c.JupyterHub.spawner_class = "quota"
c.QuotaSpawner.quota_file = env("QUOTA_FILE", str(HERE / "quotas.yaml"))
# "host" keeps all traffic on 127.0.0.1 (one machine); production uses a
# user-defined bridge network shared with the hub (see compose.yaml).
c.QuotaSpawner.network_name = env("NETWORK", "host")
c.QuotaSpawner.pull_policy = env("PULL_POLICY", "ifnotpresent")
c.QuotaSpawner.start_timeout = int(env("START_TIMEOUT", "300"))  # first pull of a CUDA image
c.QuotaSpawner.http_timeout = 60
c.QuotaSpawner.poll_interval = int(env("POLL_INTERVAL", "10"))
c.Spawner.default_url = "/lab"
# GPUs: discovered with NVML on this host. A hub that cannot see them (in a
# container, say) declares them: a JSON list of {"uuid", "name", "memory"},
# or just comma-separated UUIDs. See docs/gpus.md.
if env("GPU_INVENTORY", ""):
    declared = env("GPU_INVENTORY", "")
    c.QuotaSpawner.gpu_inventory = (
        json.loads(declared) if declared.lstrip().startswith("[")
        else [{"uuid": u.strip()} for u in declared.split(",") if u.strip()]
    )

# --- people ----------------------------------------------------------------
# Demo login: any user name with the shared password. Replace in production,
# e.g. c.JupyterHub.authenticator_class = "github" (oauthenticator).
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = env("DEMO_PASSWORD", "quota-demo")
c.SharedPasswordAuthenticator.admin_password = env(
    "DEMO_ADMIN_PASSWORD", "quota-spawner-admin-demo-password"
)
c.Authenticator.admin_users = {"admin"}
c.Authenticator.allow_all = True

# JupyterHub groups; the quota table maps them to roles.
c.JupyterHub.load_groups = {
    "ml-platform": {"users": ["bob"]},
    "cs101": {"users": ["student1", "student2", "student3"]},
    "cs101-staff": {"users": ["prof-ada"]},
}
# Instructors can list, start, stop and open their class's servers (spawner/rbac.py).
c.JupyterHub.load_roles = instructor_roles({"cs101": ["prof-ada"]})

# --- culling -----------------------------------------------------------------
# jupyterhub-idle-culler stops servers idle for IDLE_TIMEOUT (a role's own
# idle_timeout and max_age win; spawner/culling.py). Activity reaches the hub
# every ACTIVITY_INTERVAL from the servers and from the proxy, so an idle
# server is culled between IDLE_TIMEOUT and IDLE_TIMEOUT + CULL_EVERY after
# its last activity, and an active one never (docs/culling.md). "0" turns it off.
IDLE_TIMEOUT = parse_duration(env("IDLE_TIMEOUT", "30m"))
CULL_EVERY = parse_duration(env("CULL_EVERY", "60"))
ACTIVITY_INTERVAL = max(1, int(parse_duration(env("ACTIVITY_INTERVAL", "60"))))
c.JupyterHub.last_activity_interval = ACTIVITY_INTERVAL
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": str(ACTIVITY_INTERVAL)}
if IDLE_TIMEOUT > 0:
    culler, culler_role = culler_service(
        c.QuotaSpawner.quota_file, timeout=IDLE_TIMEOUT, cull_every=CULL_EVERY,
        max_age=parse_duration(env("MAX_AGE", "0")),
    )
    c.JupyterHub.services = [culler]
    c.JupyterHub.load_roles.append(culler_role)

# At hub start: warn if the engine cannot enforce the memory quotas, and
# report a broken quota table now rather than at the first spawn.
log = logging.getLogger("JupyterHub")
check_engine(log)
try:
    QuotaStore.for_path(c.QuotaSpawner.quota_file).get(log)
except QuotaTableError:
    pass  # logged with file and line; spawns are refused until it is fixed
