"""The session's shared hubs (the fixtures in tests/conftest.py) and how a module uses one.

A hub costs seconds to start and to stop, so the end-to-end and browser modules that
need the same hub config share one for the whole session, and bring their own quota
table (the hub reads it again at every spawn: spawner/quota/store.py):

- ``hub``: no GPUs; the usage service with the classes cs101 (prof-ada), cs102 (prof-bo)
  and lab1 (prof-x), the idle culler checking every second, activity every 2 s, and the
  light JupyterLab for the group LIGHT_LAB_GROUP (as docs/images.md has an admin turn it
  on for a class).
- ``gpu_hub``: 2 fake GPUs (GPU_HUB_GPUS), the FAKE NVML mounted in every notebook
  container, the GPU pool's checks every second, servers kept over a hub restart, and
  the usage service (the host map).
- ``one_gpu_hub``: 1 fake GPU (ONE_GPU), the FAKE NVML mounted, the culler checking every
  second and telling the usage ledger why, activity every 2 s, the budgets checked every
  second, and the watchdog's service token (WATCHDOG_TOKEN) for a watchdog run by a test.
- ``demo_hub``: what ``make demo`` runs: no GPUs, the shipped table, host admission on,
  counting the host as the machine the demo runs on (DEMO_HOST: 2 CPUs and 23.5 GiB).

What tells two modules apart on one hub: their user names, their table (``on_hub``
writes it for the module and puts the hub's own back after it), and, on ``hub``, a fresh
ledger for each module of the usage service (``fresh_ledger``). A module whose hub needs
its own settings (host network mode, two hubs at once, a hub config of its own such as a
form template or a failing engine call) still starts its own; ``own_hub`` is such a
fixture's body.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import docker
import requests
from browser import usage_config

from harness import Hub, fake_nvml_config, free_port, install_fake_nvml, teardown

# conftest.py imports this module for every layer: what the product gives is imported
# where it is used, so a unit test run never depends on the hubs' imports.

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_QUOTAS = (ROOT / "hub_config" / "quotas.yaml").read_text()

# The images' light JupyterLab (docs/images.md#a-lighter-jupyterlab-for-a-class), on for
# this group of ``hub`` through JupyterHub's group_overrides, as the docs tell an admin.
LIGHT_LAB_GROUP = "light-lab"
LIGHT_LAB_CONFIG = "/opt/notebook/etc/jupyter-light"
LIGHT_LAB_OVERRIDE = f"""
c.QuotaSpawner.group_overrides = {{
    "light-lab": {{
        "groups": [{LIGHT_LAB_GROUP!r}],
        "spawner_override": {{"environment": {{"JUPYTER_CONFIG_PATH": {LIGHT_LAB_CONFIG!r}}}}},
    }},
}}
"""

# Test roles: small enough for a 2-core CI machine, distinct enough to tell apart.
TEST_QUOTAS = """\
images:
  pytorch:
    display_name: PyTorch
    image: quota-spawner/pytorch:latest
  paddle:
    display_name: PaddlePaddle
    image: quota-spawner/paddle:latest
roles:
  junior-researcher:
    description: Data exploration and small models
    cpus: 2
    memory: 4G
    shm: 1G
    images: [pytorch, paddle]
  senior-engineer:
    cpus: 8
    memory: 32G
    shm: 8G
    pids: 4096
    images: [pytorch, paddle]
  pipeline:
    cpus: 1
    memory: 2G
    images: [pytorch]
  tiny:
    description: For the OOM test
    cpus: 0.5
    memory: 256M
    pids: 256
    images: [pytorch]
assignments:
  default: [junior-researcher]
  groups:
    ml-platform: [senior-engineer, pipeline]
    oom: [tiny]
    lab1: [pipeline]
    solo: [pipeline]
  users:
    research-lead: [senior-engineer]
    nobody-here: []
"""
# A table for the GPU hubs between modules: one CPU role.
GPU_BASE_QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  cpu: {cpus: 0.5, memory: 512M, images: [pytorch]}
assignments:
  default: [cpu]
"""

# The classes of ``hub``'s usage service: {group: its instructors}.
CLASSES = {"cs101": ["prof-ada"], "cs102": ["prof-bo"], "lab1": ["prof-x"]}


def observer() -> str:
    """Hub config lines: a visitor the usage service lets onto cs101's dashboard (the usage
    scope names cs101) and whose hub scopes list cs101's members and their servers but may
    not start or stop them: only the hub can refuse them
    (tests/browser/test_browser_classes.py)."""
    from spawner.hubconfig.rbac import USAGE_SCOPE

    return f"""
c.JupyterHub.load_roles.append({{
    "name": "cs101-observer",
    "scopes": ["{USAGE_SCOPE}!group=cs101", "list:users!group=cs101",
               "read:users!group=cs101", "read:servers!group=cs101",
               "access:services!service=usage"],
    "users": ["ta-kim"],
}})
"""


CULL_EVERY = 1  # seconds between the culler's checks on the hubs that run it
ACTIVITY = 2  # seconds: how often servers and the proxy report activity there


def culler(usage_db: bool = False) -> str:
    """Hub config lines: the idle culler, checking every CULL_EVERY seconds. Roles without
    an idle_timeout get an hour, longer than any module runs."""
    ledger = ", usage_db=c.QuotaSpawner.usage_db" if usage_db else ""
    return f"""
from spawner.hubconfig.culling import culler_service
culler, culler_role = culler_service(c.QuotaSpawner.quota_file, timeout=3600,
                                     cull_every={CULL_EVERY}{ledger})
c.JupyterHub.services.append(culler)
c.JupyterHub.load_roles.append(culler_role)
c.JupyterHub.last_activity_interval = {ACTIVITY}
"""


def gpu_names(prefix: str, n: int) -> list[str]:
    return [f"GPU-{prefix}-0000-0000-0000-{i:012d}" for i in range(n)]


GPU_HUB_PREFIX = f"qsgpu{os.getpid()}"
GPU_HUB_ID = f"{GPU_HUB_PREFIX}-hub"
GPU_HUB_GPUS = gpu_names("qsgpu", 2)
GPU_MONITOR = ("--GpuMonitor.interval=0.5", "--GpuMonitor.busy_window=3")

ONE_GPU_PREFIX = f"qsone{os.getpid()}"
ONE_GPU_HUB_ID = f"{ONE_GPU_PREFIX}-hub"
(ONE_GPU,) = gpu_names("qsone", 1)
ONE_GPU_MONITOR = ("--GpuMonitor.interval=0.5", "--GpuMonitor.busy_window=4")
WATCHDOG_TOKEN = secrets.token_hex(32)
# The watchdog's service and role as the shipped config makes them (external mode): a
# watchdog run by a test logs in with exactly the scopes it gets there.
WATCHDOG_SERVICE = f"""
from spawner.watchdog.service import watchdog_service
_service, _role = watchdog_service("http://127.0.0.1:8000")
c.JupyterHub.services.append({{"name": _service["name"], "api_token": {WATCHDOG_TOKEN!r}}})
c.JupyterHub.load_roles.append(_role)
"""


def start_hub(workdir: Path) -> Hub:
    """``hub``: see the module's docstring. Host admission is off on it: its table has a
    role larger than this machine on purpose (senior-engineer, 8 CPUs and 32 GiB), for
    the tests of limits and of that warning; tests/e2e/test_e2e_host_admission.py has
    its own hub."""
    return Hub(workdir, quota_text=TEST_QUOTAS, prefix=f"qstest{os.getpid()}",
               extra_config=usage_config(free_port(), CLASSES) + observer() + culler()
               + 'usage["environment"]["QUOTA_SPAWNER_PREWARM_INTERVAL"] = "1"\n'
               + "c.QuotaSpawner.host_admission = False\n" + LIGHT_LAB_OVERRIDE,
               env={"QUOTA_SPAWNER_ACTIVITY_INTERVAL": str(ACTIVITY)}).start()


def start_gpu_hub(workdir: Path) -> Hub:
    """``gpu_hub``: see the module's docstring. ``.gpus``: its GPUs' UUIDs, and
    ``.fake_nvml``: the folder of the FAKE NVML its containers read."""
    (workdir / "container-nvml").mkdir()
    fake = install_fake_nvml(workdir / "container-nvml")
    hub = Hub(workdir / "hub", quota_text=GPU_BASE_QUOTAS, prefix=GPU_HUB_PREFIX,
              extra_config=fake_nvml_config(fake, GPU_HUB_PREFIX, ACTIVITY, GPU_MONITOR,
                                            gpus=tuple(GPU_HUB_GPUS))
              + f"c.QuotaSpawner.hub_id = {GPU_HUB_ID!r}\n"
              "c.QuotaSpawner.gpu_sync_interval = 1\n"
              # the grace starts at the restarted hub's first poll, seconds before it
              # serves anyone on a loaded machine
              "c.QuotaSpawner.zombie_grace_period = 10\n"
              # servers outlive a hub restart, as in production upgrades
              "c.JupyterHub.cleanup_servers = False\n"
              + usage_config(free_port()))
    hub.gpus, hub.fake_nvml = list(GPU_HUB_GPUS), fake
    return hub.start()


def start_one_gpu_hub(workdir: Path) -> Hub:
    """``one_gpu_hub``: see the module's docstring; ``.gpus`` and ``.fake_nvml`` as
    ``gpu_hub``'s."""
    (workdir / "container-nvml").mkdir()
    fake = install_fake_nvml(workdir / "container-nvml")
    hub = Hub(workdir / "hub", quota_text=GPU_BASE_QUOTAS, prefix=ONE_GPU_PREFIX,
              extra_config=fake_nvml_config(fake, ONE_GPU_PREFIX, ACTIVITY, ONE_GPU_MONITOR,
                                            gpus=(ONE_GPU,))
              + f"c.QuotaSpawner.hub_id = {ONE_GPU_HUB_ID!r}\n"
              "c.QuotaSpawner.usage_check_interval = 1\n"
              + culler(usage_db=True) + WATCHDOG_SERVICE)
    hub.gpus, hub.fake_nvml = [ONE_GPU], fake
    return hub.start()


# The machine `make demo` runs on, as the demo hub counts it (never more than the engine
# has): its notebooks may reserve 7.2 CPUs and 21.2 GiB (docs/deployment.md#host-capacity).
DEMO_HOST = 'c.QuotaSpawner.host_cpus = 2\nc.QuotaSpawner.host_memory = "23.5G"\n'


# A table for demo_hub with a role that can never start there: workstation is the shipped
# senior-engineer as it was (32 GiB, more than the host's share), and what the spawn form
# and a refused start say of it.
TOO_BIG_QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  workstation: {cpus: 8, memory: 32G, shm: 8G, images: [pytorch]}
  pipeline: {cpus: 1, memory: 2G, images: [pytorch]}
assignments:
  default: [workstation, pipeline]
"""
TOO_BIG_MARK = ("can never start here: one server's 32 GiB of memory is more than the "
                "notebooks' 21.2 GiB")
TOO_BIG_REFUSAL = (
    "The role 'workstation' (8 CPUs, 32 GiB) is larger than what this host gives all "
    "notebook servers together (7.2 CPUs, 21.2 GiB), so it can never start here. Ask an "
    "admin to change the role or the host's settings.")


def start_demo_hub(workdir: Path) -> Hub:
    """``demo_hub``: see the module's docstring."""
    return Hub(workdir, quota_text=SHIPPED_QUOTAS, prefix=f"qsdemo{os.getpid()}",
               extra_config=DEMO_HOST).start()


def running_hub(start: Callable[[Path], Hub], workdir: Path, client: docker.DockerClient,
                name: str) -> Iterator[Hub]:
    """A session fixture's body: the hub, then its log kept as test-artifacts/hub-NAME.log
    and its containers removed."""
    hub = start(workdir)
    try:
        yield hub
    finally:
        teardown(hub, client, name)


def own_hub(workdir: Path, client: docker.DockerClient, name: str, *, quota_text: str,
            prefix: str, extra_config: str, users: tuple[str, ...]) -> Iterator[Hub]:
    """A module fixture's body for a hub of the module's own (settings no shared hub has):
    the hub with ``users`` created; afterwards their servers stopped, its log kept as
    test-artifacts/hub-NAME.log and its containers removed."""
    found = Hub(workdir, quota_text=quota_text, prefix=prefix, extra_config=extra_config).start()
    for user in users:
        found.create_user(user)
    yield found
    found.stop_servers(list(users))
    teardown(found, client, name)


def stop_every_server(hub: Hub, timeout: float = 60) -> None:
    """Every running or starting server of the hub stopped, and waited for."""
    hub.stop_servers([user["name"] for user in hub.api("GET", "/users").json()
                      if user["servers"] or user.get("pending")], timeout)


def fresh_ledger(hub: Hub) -> None:
    """The usage ledger as a new hub's: no sessions, role requests or pre-warm schedules
    of the modules before (the usage service shows them all). Only while no server runs."""
    from sqlalchemy import delete

    from spawner.usage.ledger import Ledger, default_url
    from spawner.usage.schema import prewarm_schedules, role_requests, session_groups, sessions

    ledger = Ledger(default_url(str(hub.workdir)), create=False)
    try:
        with ledger.engine.begin() as db:
            for table in (session_groups, sessions, role_requests, prewarm_schedules):
                db.execute(delete(table))
    finally:
        ledger.dispose()


@contextmanager
def on_hub(hub: Hub, table: str, users: Mapping[str, list[str]] | None = None,
           ledger: bool = False) -> Iterator[Hub]:
    """A module's time on a shared hub: its quota table, its ``users`` (name: groups)
    created and in their groups, and with ``ledger`` a fresh usage ledger. Afterwards every
    server is stopped, those users leave their groups (a class lists its members) and lose
    their tokens (a test counts the usage page's), and the hub's own table is back. The
    users stay: the roles the hub config gives them (an instructor's) would go with them.
    A hub a test left stopped is started again."""
    if hub.proc is None or hub.proc.poll() is not None:
        hub.start()
    own = hub.quota_file.read_text()
    stop_every_server(hub)
    if ledger:
        fresh_ledger(hub)
    hub.quota_file.write_text(table)
    for name, groups in (users or {}).items():
        hub.create_user(name, groups)
    try:
        yield hub
    finally:
        if hub.proc is None or hub.proc.poll() is not None:
            hub.start()
        stop_every_server(hub)
        for name, groups in (users or {}).items():
            leave(hub, name, groups)
        hub.quota_file.write_text(own)


def leave(hub: Hub, name: str, groups: list[str]) -> None:
    """``name`` out of ``groups``, and every token of theirs revoked."""
    for group in groups:
        hub.api("DELETE", f"/groups/{group}/users", json={"users": [name]})
    user = requests.utils.quote(name)
    found = hub.api("GET", f"/users/{user}/tokens").json()
    for token in (t for kind in found.values() if isinstance(kind, list) for t in kind):
        hub.api("DELETE", f"/users/{user}/tokens/{token['id']}")
