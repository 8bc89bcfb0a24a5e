"""A real ``jupyter server`` with the GPU monitor, reading FAKE GPUs from a state file.

Shared by tests/service/test_monitor.py (handler tests) and tests/browser/test_browser_monitor.py.
The server imports ``pynvml`` by name; a temporary folder holding
tests/fake_nvml_container/pynvml.py and a copy of tests/fake_pynvml.py goes
first on its PYTHONPATH, so it reads the GPUs in ``state.json`` instead (the
file is re-read whenever it changes). HOME, the runtime, config and data
folders all live in the temporary folder, so nothing leaks to or from the
machine's own Jupyter setup. So does the preemption notice: the server reads
``preemption.json`` there (``write_notice``) instead of /tmp/quota-spawner.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from harness import default_signals, free_port, install_fake_nvml, write_fake_nvml_state

TOKEN = "abc"
GiB = 2**30
# Starts jupyter_server as ``python -m jupyter_server`` does, with the notice path
# (the first argument) set first: the machine's /tmp/quota-spawner is not the test's.
BOOT = ("import sys, spawner.notebook.checkpoint as c; c.NOTICE = sys.argv.pop(1); "
        "from jupyter_server.serverapp import main; sys.exit(main())")


class MonitorServer:
    """One ``jupyter server`` process; ``url`` ends with the base_url (and a slash)."""

    def __init__(self, workdir: Path, state: dict[str, Any], env: dict[str, str],
                 args: tuple[str, ...] = (), base_url: str = "/"):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.fake = self.workdir / "fake-nvml"
        self.fake.mkdir(exist_ok=True)
        install_fake_nvml(self.fake)
        self.state_file = self.fake / "state.json"
        self.write_state(state)
        self.notice_file = self.workdir / "preemption.json"
        self.clear_notice()
        self.env = env
        self.args = args
        self.base_url = base_url
        self.port = free_port()
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = self.origin + base_url
        self.log_path = self.workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {TOKEN}"

    def write_state(self, state: dict[str, Any]) -> None:
        """Replace the fake GPUs; the fake module sees the change at its next call."""
        write_fake_nvml_state(self.fake, state)

    def write_notice(self, notice: dict[str, Any] | str) -> None:
        """The hub's preemption notice (a dict), or any text; replaced in one rename."""
        tmp = self.notice_file.with_suffix(".tmp")
        tmp.write_text(notice if isinstance(notice, str) else json.dumps(notice))
        tmp.replace(self.notice_file)

    def clear_notice(self) -> None:
        """The preemption is withdrawn: the hub deletes the notice."""
        self.notice_file.unlink(missing_ok=True)

    def start(self, timeout: float = 30) -> MonitorServer:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JUPYTER", "NVIDIA_", "GPU_", "PYTHON", "FAKE_NVML"))}
        env.update(
            HOME=str(self.workdir),
            JUPYTER_RUNTIME_DIR=str(self.workdir / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.workdir / "config"),
            JUPYTER_DATA_DIR=str(self.workdir / "data"),
            PYTHONPATH=str(self.fake),
            FAKE_NVML_STATE=str(self.state_file),
            PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        )
        env.update(self.env)
        self.log_file = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, str(self.notice_file), "--allow-root", "--no-browser",
             "--ip=127.0.0.1", f"--port={self.port}", "--ServerApp.port_retries=0",
             f"--ServerApp.base_url={self.base_url}",
             f"--IdentityProvider.token={TOKEN}",
             "--ServerApp.jpserver_extensions={'spawner.monitor': True}",
             *self.args],
            cwd=self.workdir, env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
            preexec_fn=default_signals,
        )
        return self

    def wait_ready(self, timeout: float = 30) -> MonitorServer:
        """Up, and the monitor has taken its first sample."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited:\n{self.log()[-3000:]}")
            try:
                r = self.get("api/gpu/metrics", timeout=2)
                if r.status_code == 200 and r.json()["status"] != "starting":
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"jupyter server did not come up:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.session.close()
        if getattr(self, "log_file", None):
            self.log_file.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # --- HTTP -------------------------------------------------------------

    def get(self, path: str, token: bool = True, **kwargs: Any) -> requests.Response:
        """GET a path relative to the base_url; with the token unless token=False."""
        kwargs.setdefault("timeout", 10)
        if token:
            return self.session.get(self.url + path, **kwargs)
        return requests.get(self.url + path, **kwargs)

    def metrics(self, history: bool = False) -> dict[str, Any]:
        r = self.get("api/gpu/metrics" + ("?history=1" if history else ""))
        r.raise_for_status()
        return r.json()

    def wait_for(self, check: Callable[[dict[str, Any]], bool], timeout: float = 5,
                 what: str = "") -> dict[str, Any]:
        """Poll the metrics API until check(report) holds; returns that report."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.metrics()
            if check(report):
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or check}: {report}")
            time.sleep(0.05)


def start_servers(*servers: MonitorServer) -> None:
    """Start several at once: their start-up times overlap."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise


def gpu_state(used: int, utilization: int = 0, uuid: str = "GPU-a",
              memory: int = 16 * GiB, **extra: Any) -> dict[str, Any]:
    return {"uuid": uuid, "used": used, "memory": memory, "utilization": utilization, **extra}
