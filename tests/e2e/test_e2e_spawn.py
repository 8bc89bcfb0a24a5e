"""End to end: a real hub and proxy spawning real containers on a real dockerd.

Assertions are on `docker inspect` and on the cgroup files inside the container,
which are what the kernel enforces.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from harness import container_for, containers, exec_text, run_in_kernel

pytestmark = pytest.mark.e2e
GiB = 2**30


def cgroup(container, v1: str, v2: str) -> str:
    code, out = exec_text(container, f"cat /sys/fs/cgroup/{v1} 2>/dev/null || "
                                     f"cat /sys/fs/cgroup/{v2}")
    assert code == 0, out
    return out.strip()


def cgroup_limits(container) -> dict[str, str]:
    cpu = cgroup(container, "cpu/cpu.cfs_quota_us", "cpu.max").split()[0]
    limits = {
        "memory": cgroup(container, "memory/memory.limit_in_bytes", "memory.max"),
        "cpu_quota": cpu,
        "pids": cgroup(container, "pids/pids.max", "pids.max"),
    }
    code, out = exec_text(container, "cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes "
                                     "2>/dev/null || cat /sys/fs/cgroup/memory.swap.max")
    limits["swap"] = out.strip() if code == 0 else "unsupported"
    return limits


def env_of(container) -> dict[str, str]:
    return dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])


def test_container_follows_the_role(hub, docker_client, fresh_user):
    name = fresh_user("junior")
    server = hub.start_server(name, {"profile": "junior-researcher", "image": "paddle"})
    assert server["user_options"] == {"profile": "junior-researcher", "image": "paddle"}
    c = container_for(docker_client, name)
    host = c.attrs["HostConfig"]
    assert host["Memory"] == 4 * GiB
    assert host["MemorySwap"] == 4 * GiB  # equal: no swap
    assert host["CpuQuota"] == 200_000 and host["CpuPeriod"] == 100_000
    assert host["PidsLimit"] == 2048  # the spawner's default
    assert host["ShmSize"] == 1 * GiB
    assert host["Privileged"] is False
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["CapDrop"] == ["ALL"]
    assert host["NetworkMode"] == "quota-spawner"
    assert not any("docker.sock" in m["Source"] for m in c.attrs["Mounts"])
    assert c.attrs["Config"]["Image"] == "quota-spawner/paddle:latest"
    assert c.attrs["Config"]["User"] == "1000"
    assert c.labels["quota-spawner.user"] == name
    assert c.labels["quota-spawner.role"] == "junior-researcher"
    assert c.labels["quota-spawner.image"] == "paddle"
    assert c.labels["quota-spawner.gpus"] == ""

    env = env_of(c)
    assert env["CPU_LIMIT"] == "2" and env["MEM_LIMIT"] == str(4 * GiB)
    assert env["QUOTA_ROLE"] == "junior-researcher"
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        assert env[var] == "2"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["JUPYTERHUB_SERVICE_URL"].startswith("http://0.0.0.0:")  # inside its own netns

    limits = cgroup_limits(c)
    assert limits["memory"] == str(4 * GiB)
    assert limits["cpu_quota"] == "200000"
    assert limits["pids"] == "2048"
    if limits["swap"] != "unsupported":
        assert limits["swap"] in (str(4 * GiB), "0")  # v1: memory+swap; v2: swap only
    code, out = exec_text(c, "id -u; id -un; echo $HOME")
    assert out.split() == ["1000", "jovyan", "/home/jovyan"]
    code, out = exec_text(c, "grep NoNewPrivs /proc/1/status")
    assert out.split()[-1] == "1"
    # reachable through the proxy
    r = requests.get(f"{hub.url}/user/{name}/api", timeout=10)
    assert r.status_code == 200 and "version" in r.json()


def test_each_spawn_starts_from_the_table(hub, docker_client, fresh_user):
    name = fresh_user("mover", groups=["ml-platform"])
    hub.start_server(name, {"profile": "senior-engineer"})
    big = container_for(docker_client, name)
    assert big.attrs["HostConfig"]["Memory"] == 32 * GiB
    assert big.attrs["HostConfig"]["PidsLimit"] == 4096
    hub.stop_server(name)
    assert containers(docker_client, name) == []  # removed on stop

    hub.start_server(name, {"profile": "pipeline"})
    small = container_for(docker_client, name)
    host = small.attrs["HostConfig"]
    assert (host["Memory"], host["MemorySwap"], host["CpuQuota"]) == (2 * GiB, 2 * GiB, 100_000)
    assert host["PidsLimit"] == 2048 and host["ShmSize"] == 64 * 2**20  # Docker's default
    assert env_of(small)["OMP_NUM_THREADS"] == "1"
    assert small.labels["quota-spawner.role"] == "pipeline"
    assert cgroup_limits(small)["memory"] == str(2 * GiB)


@pytest.mark.parametrize(
    "options, words",
    [
        ({"profile": "senior-engineer"}, "which you do not hold"),
        ({"profile": "junior-researcher", "image": "ubuntu:latest"}, "not offer the image"),
        ({"image": "quota-spawner/pytorch:latest"}, "not offer the image"),
        ({"profile": "junior-researcher", "mem_limit": "64G"}, "Unknown server option"),
        ({"profile": "junior-researcher", "cpu_limit": 64}, "Unknown server option"),
        ({"profile": "../../etc", "image": "pytorch"}, "which you do not hold"),
        # lone surrogates, which JSON allows and UTF-8 cannot encode: quoted escaped
        ({"profile": "\ud800"}, "the role '\\ud800', which you do not hold"),
        ({"profile": "junior-researcher", "image": "\udfff"}, "the image '\\udfff'"),
        ({"\udbff": "x"}, "Unknown server option '\\udbff'"),
    ],
)
def test_user_options_injection_is_refused(hub, docker_client, fresh_user, options, words):
    name = fresh_user("intruder")
    logged = len(hub.log())
    r = hub.spawn(name, options)
    assert r.status_code == 400, r.text
    assert words in r.json()["message"]
    assert "Traceback" not in hub.log()[logged:]
    assert hub.user(name)["servers"] == {}
    assert containers(docker_client, name) == []


def test_options_are_handled_and_a_role_beyond_the_users_is_still_refused(
        hub, docker_client, fresh_user):
    # JupyterHub 5.3+ logs "Received unhandled user_options" for every start with options
    # unless the spawner's apply_user_options hook handles them
    name = fresh_user("handled")
    logged = len(hub.log())
    r = hub.spawn(name, {"profile": "senior-engineer", "image": "pytorch"})
    assert r.status_code == 400, r.text
    assert "You asked for the role 'senior-engineer', which you do not hold" in \
        r.json()["message"]
    assert hub.user(name)["servers"] == {} and containers(docker_client, name) == []
    hub.start_server(name, {"profile": "junior-researcher", "image": "pytorch"})
    hub.stop_server(name)
    log = hub.log()[logged:]
    assert "Starting " + name in log  # the start is in the part of the log read
    assert "unhandled user_options" not in log and "Traceback" not in log


def test_user_without_role_is_told_so(hub, docker_client):
    hub.create_user("nobody-here")
    r = hub.spawn("nobody-here", {})
    assert r.status_code == 403
    assert "no role in the quota table" in r.json()["message"]
    assert containers(docker_client, "nobody-here") == []


def test_saved_options_are_checked_again(hub, docker_client, fresh_user, quotas):
    name = fresh_user("demoted", groups=["ml-platform"])
    hub.start_server(name, {"profile": "senior-engineer", "image": "pytorch"})
    hub.stop_server(name)
    # The admin takes senior-engineer away from ml-platform.
    quotas.write_text(quotas.read_text().replace(
        "ml-platform: [senior-engineer, pipeline]", "ml-platform: [pipeline]"))
    r = hub.spawn(name)  # no body: the hub reuses the saved options
    assert r.status_code == 400, r.text
    assert "senior-engineer" in r.json()["message"]
    assert containers(docker_client, name) == []
    # the refusal cleared the stale saving: the next plain start is the default
    assert hub.start_server(name)["user_options"]["profile"] == "pipeline"


def test_hot_reload_and_bad_edit(hub, docker_client, fresh_user, quotas):
    good = quotas.read_text()
    # A valid edit takes effect at the next spawn, with no restart.
    quotas.write_text(good.replace("    cpus: 2\n    memory: 4G\n", "    cpus: 1\n    memory: 3G\n"))
    first = fresh_user("reload")
    hub.start_server(first)
    running = container_for(docker_client, first)
    assert running.attrs["HostConfig"]["Memory"] == 3 * GiB
    assert running.attrs["HostConfig"]["CpuQuota"] == 100_000

    # A bad edit is refused, logged with file and line; the last good table stays.
    bad = good.replace("    cpus: 2\n", "    cpus: two\n")
    line = next(i for i, t in enumerate(bad.splitlines(), 1) if "cpus: two" in t)
    quotas.write_text(bad)
    second = fresh_user("reload")
    hub.start_server(second)
    assert container_for(docker_client, second).attrs["HostConfig"]["Memory"] == 3 * GiB
    assert f"{quotas}:{line}: role 'junior-researcher': cpus must be a number" in hub.log()
    # the running server is untouched
    running.reload()
    assert running.status == "running" and running.attrs["HostConfig"]["Memory"] == 3 * GiB
    assert hub.user(first)["servers"][""]["ready"]


def test_home_survives_stop_and_respawn(hub, docker_client, fresh_user):
    name = fresh_user("keeper")
    hub.start_server(name)
    c = container_for(docker_client, name)
    code, out = exec_text(c, "echo precious > ~/work.txt && ls -ln ~/work.txt")
    assert code == 0, out
    hub.stop_server(name)
    hub.start_server(name, {"profile": "junior-researcher", "image": "paddle"})
    code, out = exec_text(container_for(docker_client, name), "cat ~/work.txt")
    assert (code, out.strip()) == (0, "precious")


def test_names_are_safe_for_any_user_name(hub, docker_client):
    name = "o'brien{0}<b>@lab.example"
    hub.create_user(name)
    hub.start_server(name)
    c = container_for(docker_client, name)
    assert c.labels["quota-spawner.user"] == name  # exact, braces not eaten by templating
    assert all(ch.isalnum() or ch in "-_." for ch in c.name)
    volume = next(m["Name"] for m in c.attrs["Mounts"] if m["Destination"] == "/home/jovyan")
    assert all(ch.isalnum() or ch in "-_." for ch in volume)
    hub.stop_server(name)


def test_oom_kill_is_enforced_and_reported(hub, docker_client, fresh_user):
    name = fresh_user("hog", groups=["oom"])
    hub.start_server(name)
    c = container_for(docker_client, name)
    assert cgroup_limits(c)["memory"] == str(256 * 2**20)
    hog = "python3 -c 'b = bytearray(600 * 2**20); b[::4096] = b\"x\" * len(b[::4096])'"
    # A process past the limit is killed by the kernel, and only that process.
    code, _ = exec_text(c, hog)
    assert code == 137
    assert hub.user(name)["servers"][""]["ready"]

    # When the server itself is what the OOM killer picks, the container ends
    # and the hub reports the server stopped. Make it the first pick
    # (raising one's own oom_score_adj needs no privilege).
    events = docker_client.events(decode=True, filters={"container": c.id, "event": "oom"})
    seen = []
    threading.Thread(target=lambda: seen.extend(e for e in events), daemon=True).start()
    code, out = exec_text(
        c, "for p in /proc/[0-9]*; do grep -q jupyterhub-singleuser $p/cmdline 2>/dev/null "
           "&& echo 1000 > $p/oom_score_adj && echo $p; done")
    assert code == 0 and out.strip(), out
    exec_text(c, hog)
    hub.wait_stopped(name, timeout=30)
    time.sleep(0.5)
    events.close()
    assert seen, "dockerd reported no OOM event"
    assert containers(docker_client, name) == []


def test_refused_options_are_not_kept(hub, docker_client, fresh_user):
    """A refused start must not leave its options behind as the user's default."""
    name = fresh_user("onechoice", groups=["solo"])  # pipeline with pytorch, nothing else
    r = hub.spawn(name, {"profile": "tiny", "image": "paddle"})
    assert r.status_code == 400, r.text
    assert containers(docker_client, name) == []
    server = hub.start_server(name)  # no options: the user's one choice
    assert server["user_options"] == {"profile": "pipeline", "image": "pytorch"}
    hub.stop_server(name)
    # after a good start and a refusal, a plain start is the good choice again
    assert hub.spawn(name, {"profile": "pipeline", "image": "paddle"}).status_code == 400
    assert hub.start_server(name)["user_options"]["profile"] == "pipeline"


# A table with a GPU role, for the session hub, which declares no GPUs (this machine has
# no NVML either).
NO_GPU_HUB_QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  cpu: {cpus: 0.5, memory: 512M, images: [pytorch]}
  excl: {description: One whole GPU, cpus: 0.5, memory: 512M, gpus: 1, queue_timeout: 0,
         images: [pytorch]}
assignments:
  default: [cpu, excl]
"""


def test_no_inventory_refuses_gpu_roles_and_keeps_cpu_roles(hub, quotas, fresh_user,
                                                            docker_client):
    """The session hub declares no GPUs and this machine has no NVML."""
    quotas.write_text(NO_GPU_HUB_QUOTAS)
    name = fresh_user("nogpu")
    r = hub.spawn(name, {"profile": "excl"})
    assert r.status_code == 503, f"{r.status_code} {r.text}"
    message = r.json()["message"]
    assert "needs 1 GPU, but this hub has no GPUs" in message
    assert "CPU-only server now with the role 'cpu'" in message
    assert containers(docker_client, name) == []
    hub.start_server(name, {"profile": "cpu"})
    assert container_for(docker_client, name).labels["quota-spawner.gpus"] == ""


def test_a_stopped_server_shuts_down_and_exits_cleanly(hub, docker_client, fresh_user):
    """The images' jupyterhub-singleuser (spawner/notebook/launch.py) and Python kernel
    (spawner/notebook/kernel.py) shut down as JupyterHub's and ipykernel's do, then exit
    without the interpreter's teardown: the container exits 0."""
    name = fresh_user("stopper")
    hub.start_server(name)
    c = container_for(docker_client, name)
    code, out = exec_text(c, 'head -3 "$(command -v jupyterhub-singleuser)"')
    assert code == 0 and "from spawner.notebook.launch import main" in out, out
    # a kernel open, as in a class: the python3 kernelspec runs ipykernel through ours
    ran = run_in_kernel(hub, name, "import sys; print(sys.argv[0], 6 * 7)")
    assert ran.strip().endswith("spawner/notebook/kernel.py 42"), ran
    died, log = [], []
    events = docker_client.events(decode=True, filters={"container": c.id, "event": "die"})
    threading.Thread(target=lambda: died.extend(e for e in events), daemon=True).start()
    follow = threading.Thread(
        target=lambda: log.extend(c.logs(stream=True, follow=True)), daemon=True)
    follow.start()
    hub.stop_server(name)
    follow.join(timeout=30)
    deadline = time.monotonic() + 10
    while not died and time.monotonic() < deadline:
        time.sleep(0.1)
    events.close()
    text = b"".join(log).decode(errors="replace")
    assert died and died[0]["Actor"]["Attributes"]["exitCode"] == "0", (died, text[-2000:])
    assert "received signal 15, stopping" in text and "Shutting down" in text, text[-2000:]
    assert "Kernel shutdown:" in text, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
