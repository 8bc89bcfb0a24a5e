"""Run a real JupyterHub (with configurable-http-proxy) against a real dockerd.

Used by the end-to-end tests and by bench/. Nothing here is faked: the hub is
started from hub_config/jupyterhub_config.py with a few test overrides.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import requests
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from spawner.usage import event_store
from spawner.usage.event_log import EVENTS_FILE, read_events
from spawner.usage.ledger import LEDGER_FILE
from spawner.usage.schema import events as events_table

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
IMAGES = ("quota-spawner/pytorch:latest", "quota-spawner/paddle:latest")

# Tests and benchmarks use the private test engine, which carries the fake
# NVIDIA hook (scripts/test-dockerd.sh), never the machine's own engine. The
# hubs they start inherit this.
TEST_DOCKER_HOST = os.environ.get(
    "QUOTA_SPAWNER_TEST_DOCKER_HOST", "unix:///run/quota-spawner-test/docker.sock"
)
os.environ["DOCKER_HOST"] = TEST_DOCKER_HOST


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_engine() -> docker.DockerClient:
    """The test engine; started when it does not answer."""
    try:
        client = docker.from_env()
        client.ping()
    except Exception:
        subprocess.run(["bash", str(ROOT / "scripts" / "test-dockerd.sh")], check=True)
        client = docker.from_env()
        client.ping()
    missing = [image for image in IMAGES if not client.images.list(name=image)]
    if missing:
        raise RuntimeError(f"images {missing} are missing from the test engine: run "
                           "DOCKER_HOST=$(scripts/test-dockerd.sh --host) scripts/build-images.sh")
    return client


def default_signals() -> None:
    # A hub started from a non-interactive shell inherits SIGINT ignored,
    # and its shutdown then hangs.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


# The name prefixes of the hubs this process made: make test runs the end-to-end layer on
# several pytest-xdist workers against one engine, and each looks only at its own containers.
HUB_PREFIXES: set[str] = set()


class Hub:
    """One JupyterHub process with its own state dir, ports and name prefix."""

    def __init__(self, workdir: Path, quota_text: str | None = None, prefix: str = "qstest",
                 extra_config: str = "", spawner_class: str = "quota",
                 pythonpath: str = "", network: str = "", env: dict[str, str] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        HUB_PREFIXES.add(prefix)
        self.pythonpath = pythonpath
        # The shipped config's network (a bridge with inter-container traffic
        # off) unless a test asks for another, such as "host".
        self.env = {"QUOTA_SPAWNER_DEMO": "1", **(env or {})}
        if network:
            self.env["QUOTA_SPAWNER_NETWORK"] = network
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.quota_file = self.workdir / "quotas.yaml"
        self.quota_file.write_text(
            quota_text or (ROOT / "hub_config" / "quotas.yaml").read_text()
        )
        self.log_path = self.workdir / "hub.log"
        self.config = self.workdir / "jupyterhub_config.py"
        self.config.write_text(f"""
c = get_config()
load_subconfig({str(ROOT / "hub_config" / "jupyterhub_config.py")!r})
c.JupyterHub.bind_url = {self.url!r}
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.JupyterHub.spawner_class = {spawner_class!r}
c.JupyterHub.load_groups = {{}}
c.JupyterHub.services = [{{"name": "test-admin", "api_token": {self.token!r}}}]
c.JupyterHub.load_roles = [{{
    "name": "test-admin",
    "scopes": ["admin:users", "admin:servers", "admin:groups", "tokens", "access:servers",
               "list:users", "read:users"],
    "services": ["test-admin"],
}}]
# a container that died is noticed within a second (the shipped config's 10 s is
# c.QuotaSpawner's, which a c.Spawner setting does not override)
c.Spawner.poll_interval = 1
c.QuotaSpawner.poll_interval = 1
c.DockerSpawner.prefix = {prefix!r}
c.DockerSpawner.volumes = {{"{prefix}-home-{{username}}": "/home/jovyan"}}
c.DockerSpawner.remove = True
c.QuotaSpawner.quota_file = {str(self.quota_file)!r}
{extra_config}
""")
        self.proc: subprocess.Popen | None = None
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {self.token}"

    # --- process ------------------------------------------------------

    def start(self, timeout: float = 60) -> Hub:
        env = dict(os.environ, QUOTA_SPAWNER_STATE_DIR=str(self.workdir), **self.env)
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        self.log_file = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config), "--debug"],
            cwd=self.workdir, env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
            preexec_fn=default_signals,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited:\n{self.log()[-3000:]}")
            try:
                if self.session.get(f"{self.url}/hub/api/", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"hub did not come up:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # --- REST API ---------------------------------------------------------

    def api(self, method: str, path: str, token: str | None = None, **kwargs: Any):
        headers = {"Authorization": f"token {token}"} if token else {}
        return self.session.request(method, f"{self.url}/hub/api{path}", headers=headers,
                                    timeout=120, **kwargs)

    def create_user(self, name: str, groups: list[str] = ()) -> None:
        r = self.api("POST", f"/users/{requests.utils.quote(name)}")
        assert r.status_code in (201, 409), r.text
        for group in groups:
            r = self.api("POST", f"/groups/{group}")
            assert r.status_code in (201, 409), r.text
            r = self.api("POST", f"/groups/{group}/users", json={"users": [name]})
            assert r.status_code == 200, r.text

    def user(self, name: str) -> dict:
        r = self.api("GET", f"/users/{requests.utils.quote(name)}")
        r.raise_for_status()
        return r.json()

    def spawn(self, name: str, options: dict | None = None, token: str | None = None):
        """POST the server start; returns the response (201 ready, 202 pending)."""
        body = {"user_options": options} if options is not None else None
        return self.api("POST", f"/users/{requests.utils.quote(name)}/server", json=body,
                        token=token)

    def wait_ready(self, name: str, timeout: float = 120) -> dict:
        """The server once ready. A start asked for in another thread (spawn_in_background)
        may not have reached the hub yet: no server is "gone" until it was seen, or until
        10 s have passed without it."""
        started = time.monotonic()
        deadline, seen = started + timeout, False
        while time.monotonic() < deadline:
            server = self.user(name)["servers"].get("")
            if server and server["ready"]:
                return server
            if server:
                seen = True
            elif seen or time.monotonic() - started > 10:
                raise AssertionError(f"{name}'s server went away:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{name}'s server not ready in {timeout}s")

    def start_server(self, name: str, options: dict | None = None) -> dict:
        r = self.spawn(name, options)
        assert r.status_code in (201, 202), f"{r.status_code} {r.text}"
        return self.wait_ready(name)

    def start_servers(self, options: dict[str, dict | None]) -> None:
        """Each user's server started with its options, side by side (the hub starts each
        in its own task), where the order does not matter; ready when this returns."""
        with ThreadPoolExecutor(len(options)) as pool:
            list(pool.map(self.start_server, options, options.values()))

    def stop_server(self, name: str, timeout: float = 60) -> None:
        r = self.api("DELETE", f"/users/{requests.utils.quote(name)}/server")
        assert r.status_code in (202, 204), r.text
        deadline = time.monotonic() + timeout
        while self.user(name)["servers"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.user(name)["servers"], f"{name}'s server did not stop"

    def stop_servers(self, names: list[str], timeout: float = 60) -> None:
        """The running or starting servers of ``names`` stopped side by side (the hub
        stops each in its own task), and waited for."""
        asked = []
        for name in names:
            user = self.user(name)
            if user["servers"] or user.get("pending"):
                self.api("DELETE", f"/users/{requests.utils.quote(name)}/server")
                asked.append(name)
        for name in asked:
            self.wait_stopped(name, timeout)

    def wait_stopped(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.user(name)["servers"]:
                return
            time.sleep(0.2)
        raise AssertionError(f"hub still reports {name}'s server after {timeout}s")

    def login(self, name: str, password: str = "quota-demo") -> requests.Session:
        """A browser-like session logged in through the login form."""
        browser = requests.Session()
        browser.get(f"{self.url}/hub/login", timeout=30)
        r = browser.post(f"{self.url}/hub/login", timeout=30, allow_redirects=False, data={
            "username": name, "password": password, "_xsrf": browser.cookies.get("_xsrf")})
        assert r.status_code == 302, r.text
        return browser

    def user_token(self, name: str) -> str:
        r = self.api("POST", f"/users/{requests.utils.quote(name)}/tokens",
                     json={"expires_in": 3600})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    @property
    def usage_db(self) -> str:
        """The hub's ledger, as the shipped config finds it: $QUOTA_SPAWNER_USAGE_DB (the
        hub's own, else this process's), else SQLite in its state folder."""
        url = {**os.environ, **self.env}.get("QUOTA_SPAWNER_USAGE_DB", "")
        return url or f"sqlite:///{self.workdir.resolve() / LEDGER_FILE}"

    def events(self) -> list[dict[str, Any]]:
        """The hub's event log, oldest first: its ledger's ``events`` table, read as the
        watchdog reads it (each record's body); with usage_db "none", the state folder's
        file."""
        url = self.usage_db
        if url == "none":
            path = self.workdir / EVENTS_FILE
            return read_events(str(path))[0] if path.exists() else []
        database = make_url(url).database
        if url.startswith("sqlite") and not (database and Path(database).exists()):
            return []  # not made yet; connecting would make an empty file in its place
        engine = create_engine(url)
        try:
            if not inspect(engine).has_table(events_table.name):
                return []
            found, after = [], 0
            while True:
                more, after = event_store.read_after(engine, after)
                if not more:
                    return found
                found += more
        finally:
            engine.dispose()


def spawn_in_background(hub: Hub, name: str, options: dict) -> dict[str, Any]:
    """POST the start in a thread (a queued start answers only when it is served); the
    dict gets the answer's "status" and "text" (None and the error when the hub went away
    under it), "at" (monotonic) when it came, and "thread"."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            r = hub.spawn(name, options)
        except requests.RequestException as e:  # the hub restarted under it
            result["status"], result["text"] = None, str(e)
        else:
            result["status"], result["text"] = r.status_code, r.text
        result["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    result["thread"] = thread
    return result


def progress_messages(hub: Hub, name: str, until: str, timeout: float = 5) -> list[str]:
    """The spawn page's messages (the event stream the page reads), up to one
    that holds ``until``, or for ``timeout`` seconds."""
    found: list[str] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end and not any(until in m for m in found):
        found = []
        try:
            with hub.session.get(f"{hub.url}/hub/api/users/{name}/server/progress",
                                 stream=True, timeout=timeout) as r:
                if r.status_code != 200:  # not pending yet
                    time.sleep(0.2)
                    continue
                for line in r.iter_lines(decode_unicode=True):
                    if line and line.startswith("data:"):
                        found.append(json.loads(line[5:]).get("message", ""))
                    if time.monotonic() > end or any(until in m for m in found):
                        break
        except requests.RequestException:
            pass
    return found


def run_in_kernel(hub: Hub, name: str, code: str, timeout: float = 60) -> str:
    """Start a real kernel in NAME's server and run CODE in it; its stdout."""
    token = hub.user_token(name)
    base = f"{hub.url}/user/{name}/api/kernels"
    r = requests.post(base, json={"name": "python3"},
                      headers={"Authorization": f"token {token}"}, timeout=60)
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    ws_url = base.replace("http://", "ws://") + f"/{kernel}/channels"

    async def run() -> str:
        conn = await websocket_connect(
            HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
        msg_id = uuid.uuid4().hex
        await conn.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": name, "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False,
                        "stop_on_error": True}}))
        out = []
        replied = idle = False  # the reply (shell) may come before the output (iopub)
        while not (replied and idle):
            text = await asyncio.wait_for(conn.read_message(), timeout)
            assert text is not None, "the kernel's websocket closed"
            msg = json.loads(text)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            replied = replied or msg["msg_type"] == "execute_reply"
            idle = idle or (msg["msg_type"] == "status"
                            and msg["content"].get("execution_state") == "idle")
        conn.close()
        return "".join(out)

    return asyncio.run(run())


def spawn_outcome(hub: Hub, name: str, timeout: float) -> str:
    """'ready', or the message of a failed start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = hub.user(name)["servers"].get("")
        if server and server["ready"]:
            return "ready"
        if not server and not hub.user(name).get("pending"):
            r = hub.session.get(f"{hub.url}/hub/api/users/{name}/server/progress", timeout=10)
            return r.text if r.status_code == 200 else f"stopped ({r.status_code})"
        time.sleep(0.2)
    raise AssertionError(f"{name}'s start had no answer in {timeout}s")


def wait_for(check: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    """``check()``'s first true value, asked every ``interval`` s up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def running_gpus(client: docker.DockerClient, prefix: str) -> dict[str, str]:
    """Running container -> its GPUs label, for the containers named PREFIX-…. One list
    call (the SDK's containers.list inspects each, and fails on one removed meanwhile)."""
    found = client.api.containers(filters={"label": "quota-spawner.gpus"})
    held = {}
    for c in found:
        name, label = c["Names"][0].lstrip("/"), (c.get("Labels") or {}).get("quota-spawner.gpus")
        if name.startswith(f"{prefix}-") and label:
            held[name] = label
    return held


def containers(client: docker.DockerClient, user: str, all: bool = True) -> list:
    """The user's containers made by this process's hubs (another worker's hubs may have a
    user of the same name)."""
    found = client.containers.list(all=all, filters={"label": f"quota-spawner.user={user}"})
    mine = tuple(f"{prefix}-" for prefix in HUB_PREFIXES)
    return [c for c in found if c.name.startswith(mine)]


def container_for(client: docker.DockerClient, user: str):
    found = containers(client, user, all=False)
    assert len(found) == 1, f"expected one running container for {user}, found {len(found)}"
    return found[0]


def exec_text(container, cmd: str, user: str = "1000") -> tuple[int, str]:
    code, out = container.exec_run(["sh", "-c", cmd], user=user)
    return code, out.decode(errors="replace")


def cleanup(client: docker.DockerClient, prefix: str) -> None:
    for c in client.containers.list(all=True, filters={"name": f"{prefix}-"}):
        c.remove(force=True)
    for v in client.volumes.list(filters={"name": f"{prefix}-home-"}):
        try:
            v.remove(force=True)
        except docker.errors.APIError:
            pass


def teardown(hub: Hub, client: docker.DockerClient, name: str) -> None:
    """Stop a test hub, keep its log as test-artifacts/hub-NAME.log, remove its containers."""
    hub.stop()
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(hub.log_path, ARTIFACTS / f"hub-{name}.log")
    cleanup(client, hub.prefix)


def install_fake_nvml(folder: Path) -> Path:
    """A folder to mount at /opt/fake-nvml with the FAKE pynvml (tests/fake_nvml_container).

    The notebook runs as uid 1000, so everything is world-readable.
    """
    for source in (ROOT / "tests" / "fake_pynvml.py",
                   ROOT / "tests" / "fake_nvml_container" / "pynvml.py"):
        target = folder / source.name
        target.write_bytes(source.read_bytes())
        target.chmod(0o644)
    folder.chmod(0o755)
    write_fake_gpus(folder, [])
    return folder


def write_fake_gpus(folder: Path, gpus: list[dict[str, Any]]) -> None:
    """What the fake NVML reports from now on (fields of fake_pynvml.FakeGpu)."""
    write_fake_nvml_state(folder, {"gpus": gpus})


_last_stamp = 0


def write_fake_nvml_state(folder: Path, state: dict[str, Any]) -> None:
    """The whole state file: {"gpus": [...], "init_error": "NVMLError_…"}."""
    global _last_stamp
    tmp = folder / "state.json.tmp"
    tmp.write_text(json.dumps(state))
    tmp.chmod(0o644)
    # The fake re-reads on a new mtime; file times are coarse, so set one that differs.
    _last_stamp = max(time.time_ns(), _last_stamp + 1_000_000)
    os.utime(tmp, ns=(_last_stamp, _last_stamp))
    tmp.replace(folder / "state.json")  # atomic: a reader never sees half a file


def gpu_inventory_config(uuids: tuple[str, ...] | list[str]) -> str:
    """The hub config line that declares ``uuids`` as the hub's GPUs, 16 GiB fakes."""
    inventory = [{"uuid": u, "name": "Fake GPU", "memory": "16G"} for u in uuids]
    return f"c.QuotaSpawner.gpu_inventory = {inventory!r}\n"


def fake_nvml_config(folder: Path, prefix: str, activity_interval: int = 2,
                     monitor_args: tuple[str, ...] = (), gpus: tuple[str, ...] = ()) -> str:
    """Hub config lines that mount the fake NVML into every notebook container,
    and declare ``gpus`` (UUIDs of 16 GiB fake GPUs) as the hub's inventory."""
    return (gpu_inventory_config(gpus) if gpus else "") + f"""
c.QuotaSpawner.volumes = {{
    "{prefix}-home-{{username}}": "/home/jovyan",
    {str(folder)!r}: {{"bind": "/opt/fake-nvml", "mode": "ro"}},
}}
c.QuotaSpawner.environment = {{
    "PYTHONPATH": "/opt/fake-nvml",  # the FAKE pynvml shadows the real binding
    "FAKE_NVML_STATE": "/opt/fake-nvml/state.json",
    "JUPYTERHUB_ACTIVITY_INTERVAL": "{activity_interval}",
}}
c.QuotaSpawner.args = {list(monitor_args)!r}
"""


# --- quota-table text for the unit tests (test_quota_gpu_fields.py, test_cli.py) ------


def shipped_table_without_requests() -> str:
    """hub_config/quotas.yaml without its ``requests:`` section, for tests that write
    their own (or need requests off)."""
    text = (ROOT / "hub_config" / "quotas.yaml").read_text()
    return text.split("\nrequests:", 1)[0].rstrip("\n") + "\n"


def line_of(text: str, needle: str, after: str | None = None) -> int:
    """The 1-based line of the first line holding ``needle`` (after the line holding ``after``)."""
    lines = text.splitlines()
    start = next(i for i, t in enumerate(lines) if after in t) if after else 0
    return next(i for i, t in enumerate(lines[start:], start + 1) if needle in t)


def gpu_table(fields: str) -> str:
    """A table whose role 'r' has the given extra lines (one field a line)."""
    extra = "".join(f"    {line}\n" for line in fields.splitlines())
    return (
        "images:\n"
        "  pytorch:\n"
        "    image: quota-spawner/pytorch:latest\n"
        "roles:\n"
        "  cpu:\n"
        "    cpus: 1\n"
        "    memory: 1G\n"
        "    images: [pytorch]\n"
        "  r:\n"
        "    cpus: 1\n"
        "    memory: 1G\n"
        f"{extra}"
        "    images: [pytorch]\n"
        "assignments:\n"
        "  default: [cpu, r]\n"
    )


# --- the watchdog as a process ----------------------------------------------------


class WatchdogProcess:
    """``python -m spawner.watchdog`` with the FAKE pynvml of ``fake`` first on its path
    (its state file is ``fake/state.json``), a config file, and its log in ``work``.
    ``env`` adds to its environment: the hub's API URL and token, the hub id."""

    def __init__(self, work: Path, fake: Path, config: str, interval: float = 0.5,
                 env: dict[str, str] | None = None):
        self.work, self.fake, self.interval = work, fake, interval
        self.config = work / "watchdog_config.py"
        self.config.write_text(config)
        self.log_path = work / "watchdog.log"
        self.env = {"JUPYTERHUB_API_URL": "", "JUPYTERHUB_API_TOKEN": "", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> WatchdogProcess:
        env = dict(os.environ, PYTHONPATH=str(self.fake),
                   FAKE_NVML_STATE=str(self.fake / "state.json"),
                   QUOTA_SPAWNER_STATE_DIR=str(self.work), **self.env)
        env.pop("QUOTA_SPAWNER_WATCHDOG_CONFIG", None)
        env.setdefault("DOCKER_HOST", TEST_DOCKER_HOST)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spawner.watchdog", f"--config-file={self.config}",
                 f"--QuotaWatchdog.interval={self.interval}", "--QuotaWatchdog.metrics_port=0"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while "Watching" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"The watchdog did not start:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
