"""The home's use in the GPU monitor (spawner/notebook/monitor/home.py; docs/disk.md#what-a-user-sees):
the reader against hostile files, the monitor reading it on its timer and not per
request, and the API's ``home`` on a real ``jupyter server``.

The page's Home line and JupyterLab's status bar on a real hub: tests/browser/test_browser_disk.py.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from metrics_schema import validate

from fake_pynvml import FakeNvml
from monitor_server import MonitorServer
from spawner.contract import DISK_LIMIT, HOME_OVER_SIZE, HOME_USE_FILE
from spawner.notebook import checkpoint
from spawner.notebook.monitor.collector import GpuMonitor
from spawner.notebook.monitor.home import MAX_BYTES, home_report, read_home
from spawner.notebook.monitor.report import metrics_report

MiB = 2**20
SIZE = 64 * MiB
OVER = ("The home of alice holds 80 MiB, at or over its size of 64 MiB: nothing was "
        "deleted, and writes are refused until files are deleted.")


@pytest.fixture(autouse=True)
def no_preemption(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "NOTICE", str(tmp_path / "no-preemption.json"))


def facts(**changes) -> dict:
    return {"version": 1, "used": 10 * MiB, "limit": SIZE, "at": time.time(),
            "mechanism": "btrfs", "full": False, **changes}


def env_for(path, **more) -> dict[str, str]:
    return {DISK_LIMIT: str(SIZE), HOME_USE_FILE: str(path), **more}


def test_no_size_no_home(tmp_path):
    path = tmp_path / "home.json"
    path.write_text(json.dumps(facts()))
    assert read_home({HOME_USE_FILE: str(path)}) is None  # a file without DISK_LIMIT
    for limit in ("", "0", "-5", "abc", "1e9", str(MAX_BYTES + 1)):
        assert read_home(env_for(path, **{DISK_LIMIT: limit})) is None, limit


def test_a_good_file(tmp_path):
    path = tmp_path / "home.json"
    path.write_text(json.dumps(facts(used=SIZE, full=True, at=1764500000)))
    found = read_home(env_for(path, **{HOME_OVER_SIZE: OVER}))
    assert found == {"status": "ok", "message": "", "used": SIZE, "limit": SIZE,
                     "full": True, "at": 1764500000.0, "over_size": OVER}
    report = home_report(found, 180, now=1764500100)
    assert (report["fraction"], report["stale"]) == (1.0, False)
    assert home_report(found, 180, now=1764500181)["stale"] is True
    # without the file's word, the numbers say it
    path.write_text(json.dumps({k: v for k, v in facts(used=SIZE + 1).items() if k != "full"}))
    assert read_home(env_for(path))["full"] is True


@pytest.mark.parametrize("content, why", [
    (None, "cannot be read (No such file or directory)"),
    ("", "its file is not JSON"),
    ('{"version": 1, "used": 5', "its file is not JSON"),  # a partial write
    (b"\xff\xfe", "its file is not JSON"),
    ("[1, 2]", "its file is not a JSON object"),
    ("null", "its file is not a JSON object"),
    (json.dumps(facts(version=2)), "its file is not of version 1 ('2')"),
    (json.dumps(facts(version="1")), "its file is not of version 1 ('1')"),
    (json.dumps({"used": 1, "limit": 2, "at": 1}), "its file is not of version 1 ('None')"),
    (json.dumps(facts(used=-1)), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(limit=-SIZE)), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(limit=0)), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(used=10**400)), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(used=MAX_BYTES + 1)), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(used=1.5)), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(used=True)), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(used="5")), "its file's used or limit is not a size in bytes"),
    (json.dumps(facts(limit=None)), "its file's used or limit is not a size in bytes"),
    ('{"version": 1, "used": NaN, "limit": 5, "at": 1}', "its file's used or limit is not a size in bytes"),
    ('{"version": 1, "used": 1, "limit": 5, "at": Infinity}', "its file's time is not a time"),
    (json.dumps(facts(at=-1)), "its file's time is not a time"),
    (json.dumps(facts(at="now")), "its file's time is not a time"),
    (json.dumps(facts(at=1e300)), "its file's time is not a time"),
    ("x" * 5000, "is too large"),
])
def test_a_hostile_file_is_unknown_never_an_error(tmp_path, content, why):
    path = tmp_path / "home.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    found = read_home(env_for(path, **{HOME_OVER_SIZE: OVER}))
    assert found["status"] == "unknown"
    assert found["message"].startswith("The home's use is unknown: ") and why in found["message"]
    assert found["message"].endswith(".")
    assert (found["used"], found["full"], found["at"]) == (None, None, None)
    assert (found["limit"], found["over_size"]) == (SIZE, OVER)  # DISK_LIMIT's, and told
    report = home_report(found, 180)
    assert (report["fraction"], report["stale"]) == (None, False)


def test_not_a_file_and_no_variable(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # non-blocking: never hangs the sampling thread
    assert "is not a file" in read_home(env_for(fifo))["message"]
    assert "is not a file" in read_home(env_for(tmp_path))["message"]
    assert f"{HOME_USE_FILE} is not set" in read_home({DISK_LIMIT: str(SIZE)})["message"]


async def test_read_on_the_timer_not_per_request(tmp_path):
    path = tmp_path / "home.json"
    path.write_text(json.dumps(facts()))
    mon = GpuMonitor(nvml=FakeNvml([]), env={"NVIDIA_VISIBLE_DEVICES": "void", **env_for(path)})
    body = metrics_report(mon)
    validate(body)
    assert body["home"]["status"] == "unknown" and "not read yet" in body["home"]["message"]
    await mon.tick()
    assert metrics_report(mon)["home"]["used"] == 10 * MiB
    path.write_text(json.dumps(facts(used=SIZE, full=True)))
    assert metrics_report(mon)["home"]["used"] == 10 * MiB  # no read per request
    await mon.tick()
    body = metrics_report(mon)
    validate(body)
    assert (body["home"]["used"], body["home"]["full"], body["home"]["fraction"]) == \
        (SIZE, True, 1.0)


def test_no_size_reports_null():
    mon = GpuMonitor(nvml=FakeNvml([]), env={"NVIDIA_VISIBLE_DEVICES": "void"})
    body = metrics_report(mon)
    validate(body)
    assert body["home"] is None


def test_api_home_on_a_real_server(tmp_path):
    """A CPU-only server with a home of 64 MiB: full, broken, then freed; never a 500."""
    path = tmp_path / "use" / "home.json"
    path.parent.mkdir()
    path.write_text(json.dumps(facts(used=SIZE + MiB, full=True)))
    server = MonitorServer(tmp_path / "server", {"gpus": []},
                           {"NVIDIA_VISIBLE_DEVICES": "void",
                            **env_for(path, **{HOME_OVER_SIZE: OVER})},
                           ("--GpuMonitor.interval=0.2",)).start().wait_ready()
    try:
        body = server.wait_for(lambda b: b["home"]["status"] == "ok", timeout=30, what="the home read")
        validate(body)
        assert (body["home"]["used"], body["home"]["full"], body["home"]["over_size"]) == \
            (SIZE + MiB, True, OVER)
        path.write_text('{"version": 1, "used": -1')
        body = server.wait_for(lambda b: b["home"]["status"] == "unknown", what="unknown")
        validate(body)
        assert body["home"]["message"] == "The home's use is unknown: its file is not JSON."
        path.write_text(json.dumps(facts(used=MiB)))
        body = server.wait_for(lambda b: b["home"]["full"] is False, what="freed")
        validate(body)
    finally:
        server.stop()
