# JupyterHub configuration for Quota Spawner.
#
# The demo (`make demo`) runs it with QUOTA_SPAWNER_DEMO=1: published demo
# passwords. Anywhere else it refuses to start until real passwords are set
# (or the authenticator is replaced). Notebooks run on a user-defined bridge
# network with inter-container traffic off; the hub listens on its gateway.
# For production set the QUOTA_SPAWNER_* variables below (the compose file in
# this folder does) and replace the authenticator with your own.
# Docs: docs/deployment.md.
import json
import logging
import os
import sys
from pathlib import Path

import jupyterhub
from sqlalchemy.engine import make_url

from spawner.docker.engine import check_engine, warn_oversized_roles
from spawner.docker.network import ensure_network, warn_host_network
from spawner.hubconfig.culling import culler_service
from spawner.hubconfig.passwords import DEMO_ADMIN_PASSWORD, DEMO_PASSWORD, password_problems
from spawner.hubconfig.rbac import CLASS_OAUTH_SCOPES, class_service_scopes, instructor_roles
from spawner.policy.hub import build_at_hub_start
from spawner.quota.model import QuotaTableError
from spawner.quota.store import QuotaStore
from spawner.quota.units import parse_duration
from spawner.usage.ledger import Ledger, default_url
from spawner.watchdog.service import watchdog_service
from spawner.webapp.app import CUSTOM_SCOPES, DEFAULT_URL, external_service, webapp_service
from spawner.webapp.requests import USER_SCOPES

c = get_config()  # noqa: F821 (provided by JupyterHub)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STATE = Path(os.environ.get("QUOTA_SPAWNER_STATE_DIR", ROOT / ".demo"))
STATE.mkdir(parents=True, exist_ok=True)


def env(name: str, default: str) -> str:
    return os.environ.get(f"QUOTA_SPAWNER_{name}", default)


log = logging.getLogger("JupyterHub")
DEMO = env("DEMO", "0") == "1"

# --- the hub ---------------------------------------------------------------
# Only the proxy faces people; put TLS in front of it (docs/deployment.md).
c.JupyterHub.bind_url = env("BIND_URL", "http://127.0.0.1:8000")
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
# Where the table lives: "file" (QUOTA_FILE), or "database": the usage ledger's newest
# version, which the editor saves to and every process reads; the file then only seeds
# the first version (docs/table-editor.md#the-table-in-the-database).
QUOTA_SOURCE = env("QUOTA_SOURCE", "").lower() or "file"
TABLE_NAME = env("QUOTA_TABLE_NAME", "") or "default"
c.QuotaSpawner.quota_source = QUOTA_SOURCE
c.QuotaSpawner.quota_table_name = TABLE_NAME
if env("HUB_ID", ""):
    c.QuotaSpawner.hub_id = env("HUB_ID", "")
# the id the config sets, which the services key their shared rows by (else they derive
# it from the cookie secret, as the spawner does)
HUB_ID = c.QuotaSpawner.hub_id if "hub_id" in c.QuotaSpawner else ""
# Notebooks join a user-defined bridge with inter-container traffic off; the
# hub's API listens on that bridge's gateway only, where notebooks reach it.
# "host" is possible, with the risks the warning names (docs/deployment.md).
NETWORK = env("NETWORK", "quota-spawner")
info = check_engine(log)  # warns when the engine cannot enforce the memory quotas
c.QuotaSpawner.network_name = NETWORK
if NETWORK == "host":
    warn_host_network(log)
    c.JupyterHub.hub_ip = env("HUB_IP", "127.0.0.1")
else:
    import docker

    try:
        gateway = ensure_network(docker.from_env().api, NETWORK, log)
    except Exception as e:
        sys.exit(f"Cannot set up the notebook network {NETWORK!r} on the Docker engine: {e}")
    c.JupyterHub.hub_ip = env("HUB_IP", gateway)
c.QuotaSpawner.pull_policy = env("PULL_POLICY", "ifnotpresent")
# first pull of a CUDA image; a start that may wait for a GPU gets its role's
# queue_timeout (and a grace period, if it may preempt) on top (docs/preemption.md)
c.QuotaSpawner.start_timeout = int(env("START_TIMEOUT", "300"))
# the event log (preemptions, the GPU queue) and the preemptions in their grace
c.QuotaSpawner.state_dir = str(STATE)
# The usage ledger: every session, read by reports, the usage page and budgets
# (docs/usage.md). SQLite beside the hub's database, or any SQLAlchemy URL.
USAGE_DB = env("USAGE_DB", default_url(str(STATE)))
c.QuotaSpawner.usage_db = USAGE_DB
c.QuotaSpawner.http_timeout = 60
c.QuotaSpawner.poll_interval = int(env("POLL_INTERVAL", "10"))
c.Spawner.default_url = "/lab"
# Homes of each role's size (docs/disk.md): HOME_ROOT is the folder that keeps them, on
# a filesystem the mechanism can limit (btrfs with quotas, XFS or ext4 with prjquota, or
# any with HOME_MECHANISM=image). Unset: homes are Docker volumes, without a size. The
# hub says at start which mechanism keeps them; the watchdog reads their use.
HOME_SETTINGS = {"home_root": "HOME_ROOT", "home_mechanism": "HOME_MECHANISM",
                 "home_image_dir": "HOME_IMAGE_DIR", "disk_reserve": "DISK_RESERVE"}
for setting, name in HOME_SETTINGS.items():
    if env(name, ""):
        setattr(c.QuotaSpawner, setting, env(name, ""))
if env("DISK_RATIO", ""):
    c.QuotaSpawner.disk_ratio = float(env("DISK_RATIO", ""))
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
# Login: any user name with the shared password. Replace it in production,
# e.g. c.JupyterHub.authenticator_class = "github" (oauthenticator). Outside
# the demo the hub refuses to start with the published or missing passwords.
c.JupyterHub.authenticator_class = "shared-password"
user_password = env("DEMO_PASSWORD", DEMO_PASSWORD if DEMO else "")
admin_password = env("DEMO_ADMIN_PASSWORD", DEMO_ADMIN_PASSWORD if DEMO else "")
if not DEMO and (problems := password_problems(user_password, admin_password)):
    sys.exit("Refusing to start with the shared-password login: " + "; ".join(problems) + ". "
             "Set both passwords (the admin one at least 32 characters), or replace the "
             "authenticator in jupyterhub_config.py; QUOTA_SPAWNER_DEMO=1 is for the demo only.")
c.SharedPasswordAuthenticator.user_password = user_password
c.SharedPasswordAuthenticator.admin_password = admin_password
c.Authenticator.admin_users = {"admin"}
c.Authenticator.allow_all = True

# JupyterHub groups; the quota table maps them to roles.
c.JupyterHub.load_groups = {
    "ml-platform": {"users": ["bob"]},
    "cs101": {"users": ["student1", "student2", "student3"]},
    "cs101-staff": {"users": ["prof-ada"]},
}
# Instructors can list, start, stop and open their class's servers (spawner/hubconfig/rbac.py).
CLASSES = {"cs101": ["prof-ada"]}  # group -> its instructors
c.JupyterHub.load_roles = instructor_roles(CLASSES)

# --- culling -----------------------------------------------------------------
# jupyterhub-idle-culler stops servers idle for IDLE_TIMEOUT (a role's own
# idle_timeout and max_age win; spawner/hubconfig/culling.py). Activity reaches the hub
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
        max_age=parse_duration(env("MAX_AGE", "0")), usage_db=USAGE_DB,
        quota_source=QUOTA_SOURCE, quota_table_name=TABLE_NAME,
    )
    c.JupyterHub.services = [culler]
    c.JupyterHub.load_roles.append(culler_role)

# --- the watchdog --------------------------------------------------------------
# GPU and memory alerts to admins and instructors, and per-server gauges for
# Prometheus on 127.0.0.1:9835 (spawner/watchdog; docs/watchdog.md). Its
# channels and rules are in WATCHDOG_CONFIG. WATCHDOG=1: the hub runs it;
# "external": it runs on its own (the compose service, with the host's PIDs)
# and logs in with WATCHDOG_TOKEN; "0": off.
WATCHDOG = env("WATCHDOG", "1")
if WATCHDOG != "0":
    watchdog, watchdog_role = watchdog_service(
        c.JupyterHub.bind_url, config_file=env("WATCHDOG_CONFIG", str(HERE / "watchdog_config.py")),
        state_dir=str(STATE), secret_file=c.JupyterHub.cookie_secret_file,
        prefix=c.QuotaSpawner.prefix if "prefix" in c.QuotaSpawner else "quota",
        usage_db=USAGE_DB, hub_id=HUB_ID,
        # the homes whose use it reads and warns of, as the hub keeps them
        home_root=c.QuotaSpawner.home_root if "home_root" in c.QuotaSpawner else "",
        home_mechanism=c.QuotaSpawner.home_mechanism if "home_mechanism" in c.QuotaSpawner
        else "")
    if WATCHDOG == "external":
        if len(env("WATCHDOG_TOKEN", "")) < 32:
            sys.exit("QUOTA_SPAWNER_WATCHDOG=external needs QUOTA_SPAWNER_WATCHDOG_TOKEN, "
                     "at least 32 characters (e.g. openssl rand -hex 32)")
        watchdog = {"name": watchdog["name"], "api_token": env("WATCHDOG_TOKEN", "")}
    c.JupyterHub.services = [*c.JupyterHub.services, watchdog]
    c.JupyterHub.load_roles.append(watchdog_role)

# --- the usage page ------------------------------------------------------------
# The usage service at /services/usage/, in the hub's Services menu: the usage
# report for admins (every session) and instructors (their class's sessions,
# through the scope instructor_roles gives them), the quota table editor and
# GPU map for admins, the class dashboard for instructors, and requests for a
# bigger role for everyone (docs/usage.md#the-usage-page, docs/security.md). It
# reads the usage ledger and listens on USAGE_URL; "0" turns it off, as
# USAGE_DB=none does. USAGE=external: it runs on its own (another machine, a
# Kubernetes Deployment) at USAGE_URL and logs in with USAGE_TOKEN; it then needs
# only the hub's URL, that token and the ledger's URL (docs/usage.md#the-service-on-its-own).
c.JupyterHub.custom_scopes = {
    **(c.JupyterHub.custom_scopes if "custom_scopes" in c.JupyterHub else {}), **CUSTOM_SCOPES}
USAGE_URL = env("USAGE_URL", DEFAULT_URL)
if USAGE_URL != "0" and USAGE_DB != "none":
    usage, usage_role, usage_own_role = webapp_service(
        c.JupyterHub.bind_url, USAGE_DB, c.QuotaSpawner.quota_file, url=USAGE_URL,
        state_dir=str(STATE), secret_file=c.JupyterHub.cookie_secret_file,
        prefix=c.QuotaSpawner.prefix if "prefix" in c.QuotaSpawner else "quota",
        quota_source=QUOTA_SOURCE, quota_table_name=TABLE_NAME, hub_id=HUB_ID)
    if env("USAGE", "1") == "external":
        if len(env("USAGE_TOKEN", "")) < 32:
            sys.exit("QUOTA_SPAWNER_USAGE=external needs QUOTA_SPAWNER_USAGE_TOKEN, at least "
                     "32 characters (e.g. openssl rand -hex 32)")
        usage = external_service(usage, env("USAGE_TOKEN", ""))
    c.JupyterHub.services = [
        *(c.JupyterHub.services if "services" in c.JupyterHub else []), usage]
    # The class dashboard: an instructor's token acts on their class's servers (the
    # hub intersects these with the instructor's own scopes); scheduled pre-warms run
    # with the service's token, which may start the classes' servers.
    usage["oauth_client_allowed_scopes"] += CLASS_OAUTH_SCOPES
    usage_own_role["scopes"] += class_service_scopes(CLASSES)
    c.JupyterHub.load_roles += [usage_role, usage_own_role]
    # Every user may ask for a bigger role there: JupyterHub 6 adds extra_user_scopes to
    # the default "user" role (5 needs that role redefined, with "self"); the usage report
    # itself still refuses all but admins and instructors.
    if jupyterhub.version_info >= (6,):
        c.JupyterHub.extra_user_scopes = {
            *(c.JupyterHub.extra_user_scopes if "extra_user_scopes" in c.JupyterHub else ()),
            *USER_SCOPES}
    else:
        c.JupyterHub.load_roles.append({"name": "user", "scopes": ["self", *USER_SCOPES]})

# At hub start: report a broken quota table now rather than at the first
# spawn, and roles larger than this engine. Not with the database source: the
# first read seeds its first version from the file, and that must be the spawners'
# quota_file, which a config that includes this one may still change.
if QUOTA_SOURCE == "file":
    try:
        warn_oversized_roles(QuotaStore.for_path(c.QuotaSpawner.quota_file).get(log), info, log)
    except QuotaTableError:
        pass  # logged with file and line; spawns are refused until it is fixed

# The usage ledger is created or upgraded now, not at the first spawn, so that the
# watchdog and the usage page find it from the start.
if USAGE_DB != "none":
    try:
        Ledger(USAGE_DB, log).dispose()
    except Exception as e:
        log.error("The usage ledger %s cannot be created or upgraded: %s",
                  make_url(USAGE_DB).render_as_string(hide_password=True), e)

# The hub's runtime (its hub object: GPU inventory and pool, event log, ledger writer,
# usage duties, preemption's recovery, the NVIDIA runtime probe) is built as the hub
# starts, in the background, from the c.QuotaSpawner settings as the spawners read them
# (the whole config, this file's includers too), so that the log says at once which
# GPUs the hub has and whether the engine can give them (docs/gpus.md#the-inventory).
build_at_hub_start(log)
