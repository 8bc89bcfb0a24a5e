"""Fixtures for every layer: the usage ledger a test works on; and for the end-to-end
tests, a real dockerd and the session's shared hubs with their proxies (tests/hubs.py
says which and why)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hubs import (
    TEST_QUOTAS,
    running_hub,
    start_demo_hub,
    start_gpu_hub,
    start_hub,
    start_one_gpu_hub,
)
from ledger_sessions import LOG

from harness import ensure_engine


@pytest.fixture
def ledger_url(tmp_path) -> str:
    """Where a test's usage ledger lives: a SQLite file here; the modules that run the same
    tests on PostgreSQL (tests/service/test_*_postgres.py) give a fresh database instead
    (tests/postgres.py)."""
    return f"sqlite:///{tmp_path / 'usage.sqlite'}"


@pytest.fixture
def url(ledger_url) -> str:
    """``ledger_url``, by the name the ledger's own tests use (tests/unit/test_usage_*.py)."""
    return ledger_url


@pytest.fixture
def ledger(ledger_url):
    """A usage ledger created at ``ledger_url``, logging to ``ledger_sessions.LOG``,
    disposed of afterwards."""
    from spawner.usage.ledger import Ledger

    found = Ledger(ledger_url, LOG)
    yield found
    found.dispose()


@pytest.fixture
def quiet_alembic():
    """Alembic's own INFO lines (when another test has turned the root logger up) are not
    what a test reads in caplog; a module asks for it with ``pytestmark``."""
    alembic = logging.getLogger("alembic")
    level = alembic.level
    alembic.setLevel(logging.WARNING)
    yield
    alembic.setLevel(level)


@pytest.fixture(scope="session")
def docker_client():
    try:
        return ensure_engine()
    except Exception as e:
        pytest.fail(f"no Docker engine or images for the end-to-end tests: {e}")


@pytest.fixture(scope="session")
def hub(docker_client, tmp_path_factory):
    """No GPUs, TEST_QUOTAS, the usage service and the culler (tests/hubs.py)."""
    yield from running_hub(start_hub, tmp_path_factory.mktemp("hub"), docker_client, "e2e")


@pytest.fixture(scope="session")
def gpu_hub(docker_client, tmp_path_factory):
    """2 fake GPUs and the FAKE NVML in the containers (tests/hubs.py); a module brings its
    table with ``hubs.on_hub``."""
    yield from running_hub(start_gpu_hub, tmp_path_factory.mktemp("gpu-hub"), docker_client,
                           "gpu")


@pytest.fixture(scope="session")
def one_gpu_hub(docker_client, tmp_path_factory):
    """1 fake GPU, the culler and the watchdog's token (tests/hubs.py)."""
    yield from running_hub(start_one_gpu_hub, tmp_path_factory.mktemp("one-gpu-hub"),
                           docker_client, "one-gpu")


@pytest.fixture(scope="session")
def demo_hub(docker_client, tmp_path_factory):
    """What `make demo` runs, on a host counted as the demo's machine (tests/hubs.py)."""
    yield from running_hub(start_demo_hub, tmp_path_factory.mktemp("demo-hub"), docker_client,
                           "demo")


@pytest.fixture
def quotas(hub):
    """Edit the hub's quota table in a test; restored afterwards."""
    yield hub.quota_file
    hub.quota_file.write_text(TEST_QUOTAS)


@pytest.fixture
def fresh_user(hub, request):
    """A user name unique to this test; their server is stopped afterwards."""
    names = []

    def make(base: str, groups: list[str] = ()) -> str:
        name = f"{base}-{len(names)}-{request.node.name[:20]}".lower()
        name = "".join(ch if ch.isalnum() or ch in "-._@" else "-" for ch in name)
        hub.create_user(name, list(groups))
        names.append(name)
        return name

    yield make
    for name in names:
        if hub.user(name)["servers"]:
            hub.api("DELETE", f"/users/{name}/server")


# The end-to-end and browser modules that use a shared hub, by hub (tests/hubs.py). make test
# runs those layers on several pytest-xdist workers with --dist loadgroup: the modules of one
# hub run on one worker, in order, so that each hub is started once and no two copies of
# a hub run at once (two hubs that declare the same fake GPUs would each count the
# other's containers as holding them, as hubs that share real GPUs do). Every other
# module is a group of its own. The groups are named here, not read from the collected
# tests, because the scheduler sees only test ids; collection checks that they agree.
HUB_GROUPS: dict[str, tuple[str, ...]] = {
    "gpu_hub": ("test_e2e_gpus.py", "test_e2e_monitor.py", "test_e2e_preemption.py",
                "test_e2e_researcher.py", "test_browser_gpu_map.py"),
    "one_gpu_hub": ("test_e2e_culling.py", "test_e2e_usage.py", "test_e2e_watchdog.py"),
    "hub": ("test_e2e_guarantees.py", "test_e2e_networks.py", "test_e2e_prewarm.py",
            "test_e2e_rbac.py", "test_e2e_spawn.py", "test_browser.py",
            "test_browser_classes.py", "test_browser_lab_start.py", "test_browser_light_lab.py",
            "test_browser_requests.py", "test_browser_table.py", "test_browser_usage.py"),
    "demo_hub": ("test_e2e_never_start.py", "test_browser_demo_form.py"),
}
GROUP_OF_MODULE = {module: hub for hub, modules in HUB_GROUPS.items() for module in modules}
SLOW_LAYERS = ("e2e", "browser")


def xdist_group(nodeid: str) -> str:
    """The group of a test id: its module's hub, else its module (slow layers); else the
    test itself (the unit and service layers spread test by test)."""
    path = Path(nodeid.split("::", 1)[0])
    if path.parent.name not in SLOW_LAYERS:
        return nodeid
    return GROUP_OF_MODULE.get(path.name, str(path))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup by xdist_group(). pytest-xdist's own loadgroup reads a group from a
    suffix it writes into each test id, which pytest 9.2 no longer lets it change."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HubGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return HubGroups(config, log)


def pytest_collection_modifyitems(items):
    """The layer is the folder: tests/e2e and tests/browser need the engine, the images
    and the proxy (marked e2e), tests/browser Chromium too (marked browser). A module of
    those layers that uses a shared hub must be listed under it in HUB_GROUPS."""
    uses: dict[Path, set[str]] = {}
    for item in items:
        layer = item.path.parent.name
        if layer not in SLOW_LAYERS:
            continue
        if "e2e" not in item.keywords:
            item.add_marker(pytest.mark.e2e)
        if layer == "browser" and "browser" not in item.keywords:
            item.add_marker(pytest.mark.browser)
        uses.setdefault(item.path, set()).update(
            h for h in HUB_GROUPS if h in getattr(item, "fixturenames", ()))
    for path, hubs in uses.items():
        listed = GROUP_OF_MODULE.get(path.name)
        # a module may name "hub" for its own fixture (test_e2e_preemption's is gpu_hub)
        if listed is None and hubs or listed is not None and listed not in hubs:
            raise pytest.UsageError(
                f"{path.name} uses the shared hubs {sorted(hubs)} but tests/conftest.py's "
                f"HUB_GROUPS lists it under {listed}: list it under the hub it uses")


def pytest_make_parametrize_id(config, val, argname):
    """A parameter computed from the clock (a Unix time, now or some days from now) gets a
    stable id: pytest-xdist's workers must collect the same test ids (make test-fast)."""
    if isinstance(val, float) and 1e9 < val < 1e11:
        return f"{argname}=a-unix-time"
    return None


def pytest_sessionfinish(session):
    """Remove the empty parent cgroups the test hubs' fences left (docker/parent_cgroup.py): a hub
    keeps its own, since its servers may outlive it, but a test hub never comes back.
    Only on the controller, once every worker is done, and only the test hubs' (their
    prefixes start with "qs"; the demo hub's is "quota"); a cgroup still in use is kept."""
    if hasattr(session.config, "workerinput"):
        return
    root = Path("/sys/fs/cgroup")  # v1: one tree per controller; v2: one tree
    for folder in [*root.glob("*/quota_spawner_qs*"), *root.glob("quota_spawner_qs*")]:
        try:
            folder.rmdir()
        except OSError:
            pass
