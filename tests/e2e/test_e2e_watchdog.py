"""The watchdog against a real hub, proxy, engine and containers, and real receivers.

Only NVML is FAKE, at the host's NVML boundary: the watchdog process imports
tests/fake_nvml_container/pynvml.py by name, and its process list holds the
host PIDs of real processes inside the real notebook containers, so the
PID-to-container mapping runs for real. Channels: a JSON webhook and a Feishu
bot (the receiver checks the signature) and SMTP, all local and real, and a
channel nobody listens on, which must not stop the others.
"""

from __future__ import annotations

import time

import pytest
from hubs import ONE_GPU, ONE_GPU_HUB_ID, ONE_GPU_PREFIX, WATCHDOG_TOKEN, on_hub
from receivers import HttpReceiver, SmtpReceiver, refused_url_base

from harness import (
    ARTIFACTS,
    WatchdogProcess,
    container_for,
    install_fake_nvml,
    write_fake_nvml_state,
)
from spawner.contract import (
    GPU_MODE_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    IMAGE_LABEL,
    ROLE_LABEL,
    USER_LABEL,
)
from spawner.watchdog.containers import server_from_inspect
from spawner.watchdog.host import CgroupReader

pytestmark = pytest.mark.e2e

PREFIX, HUB_ID, GPU = ONE_GPU_PREFIX, ONE_GPU_HUB_ID, ONE_GPU  # the shared hub's (tests/hubs.py)
G = 2**30
HOLD = 2.0  # the rules' hold times in this test, seconds (4 watchdog cycles)
QUOTAS = """\
images:
  base:
    image: quota-spawner/pytorch:latest
    display_name: Base
roles:
  small:
    cpus: 0.5
    memory: 768M
    images: [base]
  lab:
    cpus: 0.5
    memory: 512M
    gpus: 1
    gpu_mode: shared
    gpu_share: 2
    gpu_memory: 8G
    images: [base]
assignments:
  default: [small]
  users:
    wd-gpu: [lab]
"""


@pytest.fixture(scope="module")
def setup(one_gpu_hub, tmp_path_factory):
    """The session's one-GPU hub with this module's table, and the watchdog logged in with
    the token and the scopes the shipped config gives it (tests/hubs.py)."""
    work = tmp_path_factory.mktemp("watchdog")
    host_fake = install_fake_nvml(work)
    gpus = [{"uuid": GPU, "name": "Fake GPU", "memory": 16 * G, "utilization": 50}]
    write_fake_nvml_state(host_fake, {"gpus": gpus})
    # in its group before the watchdog first reads the hub: its directory is read at most
    # every 30 s, and a read between the user's creation and the group's would route the
    # memory alert without the group
    with on_hub(one_gpu_hub, QUOTAS, {"wd-mem": ["wdclass"]}) as hub, \
            HttpReceiver(feishu_secrets={"tok": "s3cret"}) as http, SmtpReceiver() as smtp:
        config = f"""
c.WatchdogRules.gpu_memory_hold = {HOLD}
c.WatchdogRules.memory_hold = {HOLD}
c.Notifier.retry_delay = 0.2
c.Notifier.timeout = 3
c.Notifier.channels = [
    {{"name": "broken", "url": "json://{refused_url_base()[len('http://'):]}/hook"}},
    {{"name": "webhook", "url": "json://{http.base[len('http://'):]}/hook"}},
    {{"name": "feishu", "url": "feishu://tok/s3cret?base={http.base}"}},
    {{"name": "mail", "url": "{smtp.url()}"}},
    {{"name": "class", "url": "json://{http.base[len('http://'):]}/class", "groups": ["wdclass"]}},
]
"""
        watchdog = WatchdogProcess(work, host_fake, config, env={
            "JUPYTERHUB_API_URL": f"{hub.url}/hub/api", "JUPYTERHUB_API_TOKEN": WATCHDOG_TOKEN,
            "JUPYTERHUB_PUBLIC_URL": hub.url, "QUOTA_SPAWNER_HUB_ID": HUB_ID})
        try:  # whatever fails from here on, the watchdog is stopped and its log kept
            watchdog.start()
            yield hub, watchdog, http, smtp, host_fake, gpus
        finally:
            watchdog.stop()
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "watchdog.log").write_text(watchdog.log())


def kind_of(body: dict) -> str:
    title = body.get("title", "")
    if title.startswith("[resolved]"):
        return "resolve"
    return "remind" if "] still:" in title else "open"


def hooks(http: HttpReceiver, rule: str, kind: str, user: str, count: int = 1,
          timeout: float = 30, path: str = "/hook") -> list:
    """The JSON webhook's messages (apprise's json://) of this kind about ``user``'s ``rule``."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r.body for r in list(http.requests)
                 if r.kind == "json" and isinstance(r.body, dict) and r.path == path
                 and f"Incident: {rule}:" in r.body.get("message", "")
                 and f"Who: {user} (" in r.body.get("message", "")
                 and kind_of(r.body) == kind]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_memory_alert_and_resolve_on_every_channel(setup, docker_client):
    hub, watchdog, http, smtp, *_ = setup
    hub.create_user("wd-mem", ["wdclass"])
    hub.start_server("wd-mem")
    c = container_for(docker_client, "wd-mem")
    # a process that brings the working set to 85% of the role's 768 MiB, and holds it
    server = server_from_inspect(docker_client.api.inspect_container(c.id))
    reader, used = CgroupReader(), 0
    for _ in range(20):  # the notebook server settles first: it grows while it starts
        time.sleep(0.5)
        before, used = used, reader.read(server).working_set
        if abs(used - before) < 4 * 2**20:
            break
    grow = int(0.85 * 768 * 2**20) - used
    assert grow > 64 * 2**20, used
    c.exec_run(["python3", "-c", f"import os, time; b = bytearray({grow}); "
                "b[::4096] = b'x' * len(b[::4096]); "
                "open('/tmp/alloc.pid', 'w').write(str(os.getpid())); time.sleep(600)"],
               detach=True, user="1000")
    opened = hooks(http, "memory", "open", "wd-mem")
    assert len(opened) == 1, watchdog.log()[-3000:]
    text = opened[0]["message"]
    assert "wd-mem" in text and "small" in text and f"{hub.url}/user/wd-mem/" in text
    http.wait(1, timeout=15, kind="feishu", accepted=True)
    mails = smtp.wait(1, timeout=15)
    assert any("wd-mem" in m[2].as_string() for m in mails)
    assert "broken" in watchdog.log()  # the dead channel was tried, and logged
    # the instructor's channel of wd-mem's group gets it too, and nothing of other users
    assert len(hooks(http, "memory", "open", "wd-mem", path="/class")) == 1
    code, out = c.exec_run(["sh", "-c", "kill $(cat /tmp/alloc.pid)"], user="1000")
    assert code == 0, out
    assert len(hooks(http, "memory", "resolve", "wd-mem")) == 1, watchdog.log()[-3000:]
    assert len(hooks(http, "memory", "open", "wd-mem", timeout=0)) == 1  # no second alert


def test_an_oom_kill_is_told_at_once(setup, docker_client):
    hub, watchdog, http, *_ = setup
    c = container_for(docker_client, "wd-mem")
    code, _ = c.exec_run(["python3", "-c", "b = bytearray(900 * 2**20); "
                          "b[::4096] = b'x' * len(b[::4096])"], user="1000")
    assert code == 137
    assert len(hooks(http, "oom", "open", "wd-mem")) == 1, watchdog.log()[-3000:]
    hub.stop_server("wd-mem")


def test_gpu_memory_hold_hysteresis_and_restart(setup, docker_client, tmp_path):
    hub, watchdog, http, _, host_fake, gpus = setup
    hub.create_user("wd-gpu")
    hub.start_server("wd-gpu")
    pid = container_for(docker_client, "wd-gpu").attrs["State"]["Pid"]

    def use(fraction_of_cap: float) -> None:
        used = int(fraction_of_cap * 8 * G)  # the role's gpu_memory cap is 8G
        write_fake_nvml_state(host_fake, {"gpus": [
            {**gpus[0], "used": used, "processes": [[pid, used]]}]})

    use(0.95)
    time.sleep(HOLD / 2)  # above 90% for less than the hold time: nothing
    use(0.80)
    time.sleep(HOLD + 1)  # an alert would be out a cycle after the hold
    assert hooks(http, "gpu_memory", "open", "wd-gpu", timeout=0) == []
    use(0.95)  # longer than the hold: exactly one message
    opened = hooks(http, "gpu_memory", "open", "wd-gpu")
    assert len(opened) == 1, watchdog.log()[-3000:]
    assert f"{GPU}" in opened[0]["message"]
    use(0.875)  # hovering between 85% and 90%: nothing more
    time.sleep(HOLD + 1)
    watchdog.stop()  # a restart announces nothing again
    watchdog.start()
    time.sleep(HOLD + 2)
    assert len(hooks(http, "gpu_memory", "open", "wd-gpu", timeout=0)) == 1
    assert hooks(http, "gpu_memory", "resolve", "wd-gpu", timeout=0) == []
    use(0.80)
    assert len(hooks(http, "gpu_memory", "resolve", "wd-gpu")) == 1, watchdog.log()[-3000:]
    # an XID error on the GPU: told at once, naming its holder
    used = int(0.8 * 8 * G)
    write_fake_nvml_state(host_fake, {"gpus": [{**gpus[0], "used": used,
                                                "processes": [[pid, used]]}],
                                      "xids": [{"uuid": GPU, "xid": 79, "id": 1}]})
    (xid,) = hooks(http, "xid", "open", "wd-gpu")
    assert "79" in xid["message"] and GPU in xid["message"]
    assert hooks(http, "gpu_memory", "open", "wd-gpu", path="/class", timeout=0) == []
    # starting a GPU server never looked like a zombie to the watchdog
    assert hooks(http, "zombie", "open", "wd-gpu", timeout=0) == []
    hub.stop_server("wd-gpu")


def test_a_zombie_holding_a_gpu(setup, docker_client):
    """A container of this hub that holds a GPU, with no server in the hub behind it."""
    hub, watchdog, http, *_ = setup
    zombie = docker_client.containers.run(
        "quota-spawner/base:local", ["sleep", "600"], name=f"{PREFIX}-ghost", detach=True,
        labels={USER_LABEL: "ghost", ROLE_LABEL: "lab", IMAGE_LABEL: "base", HUB_LABEL: HUB_ID,
                GPUS_LABEL: GPU, GPU_MODE_LABEL: "shared:2"})
    try:
        (opened,) = hooks(http, "zombie", "open", "ghost")
        assert f"{PREFIX}-ghost" in opened["message"]
    finally:
        zombie.remove(force=True)
    assert len(hooks(http, "zombie", "resolve", "ghost")) == 1, watchdog.log()[-3000:]
