"""The watchdog's host reads: PID to container, and the container's cgroup counters.

The unit tests build /proc and /sys/fs/cgroup trees in tmp_path in the
layouts the kernel and both Docker cgroup drivers write; the end-to-end test
reads a real container on the test engine (cgroup v1, cgroupfs driver).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
from cgroup_trees import v2_files, write_files, write_proc

from spawner.gpu.nvml import HostProcess
from spawner.watchdog import host
from spawner.watchdog.host import (
    CgroupReader,
    ContainerUsage,
    CpuMeter,
    container_id_of,
    gpu_memory_by_container,
)
from spawner.watchdog.model import GpuSample, Server

A = "a" * 63 + "1"
B = "b" * 63 + "2"
MiB = 1 << 20


def v1_lines(path: str) -> str:
    """/proc/PID/cgroup on a v1 (hybrid) host, every controller in ``path``."""
    return "".join([
        f"12:name=systemd:{path}\n", f"11:memory:{path}\n", f"10:cpu,cpuacct:{path}\n",
        f"9:pids:{path}\n", f"0::{path}\n",
    ])


def v2_lines(path: str) -> str:
    return f"0::{path}\n"


V1_CGROUPFS = v1_lines(f"/docker/{A}")
V1_SYSTEMD = v1_lines(f"/system.slice/docker-{A}.scope")
V2_SYSTEMD = v2_lines(f"/system.slice/docker-{A}.scope")
V2_CGROUPFS = v2_lines(f"/docker/{A}")


def v1_memory(usage: int, inactive_file: int, oom_kill: int | None = 0) -> dict[str, str]:
    oom = "oom_kill_disable 0\nunder_oom 0\n" + (
        f"oom_kill {oom_kill}\n" if oom_kill is not None else "")
    return {
        "memory.usage_in_bytes": f"{usage}\n",
        # The non-total line is the cgroup's own pages only: it must not be used.
        "memory.stat": f"cache 1\ninactive_file 7\ntotal_cache 9\n"
                       f"total_inactive_file {inactive_file}\ntotal_active_file 5\n",
        "memory.oom_control": oom,
    }


def server(container_id: str = A, pid: int = 100) -> Server:
    return Server(container_id=container_id, name="quota-alice", user="alice",
                  role="researcher", image="pytorch", hub_id="hub", pid=pid)


# --- container_id_of ------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    V1_CGROUPFS,
    V1_SYSTEMD,
    V2_SYSTEMD,
    V2_CGROUPFS,
    # A process in a sub-cgroup of the container's.
    v2_lines(f"/docker/{A}/foo"),
    v2_lines(f"/system.slice/docker-{A}.scope/init.scope"),
    # A hybrid host whose v2 line shows only systemd's view.
    "11:memory:/docker/" + A + "\n1:name=systemd:/docker/" + A + "\n0::/\n",
    # Docker with a --cgroup-parent.
    v2_lines(f"/quota/{A}"),
    # An engine inside a container: the inner container is the one it knows.
    v2_lines(f"/docker/{B}/docker/{A}"),
], ids=["v1-cgroupfs", "v1-systemd", "v2-systemd", "v2-cgroupfs", "v2-nested",
        "v2-systemd-nested", "hybrid-root-v2", "cgroup-parent", "docker-in-docker"])
def test_container_id_from_every_layout(tmp_path, text):
    write_proc(tmp_path, 100, text)
    assert container_id_of(100, proc=tmp_path) == A


@pytest.mark.parametrize("text", [
    v1_lines("/user.slice/user-0.slice/session-3.scope"),
    v2_lines("/system.slice/dockerd.service"),
    v2_lines("/"),
    v2_lines(f"/system.slice/containerd-{A[:12]}.scope"),
    "",
], ids=["host-session", "dockerd-itself", "root", "short-id", "empty"])
def test_a_process_outside_containers_has_none(tmp_path, text):
    write_proc(tmp_path, 100, text)
    assert container_id_of(100, proc=tmp_path) is None


def test_a_vanished_process_has_none(tmp_path):
    assert container_id_of(4242, proc=tmp_path) is None


@pytest.mark.parametrize("error", [FileNotFoundError, ProcessLookupError, PermissionError])
def test_a_process_gone_or_unreadable_mid_read_has_none(tmp_path, monkeypatch, error):
    write_proc(tmp_path, 100, V2_SYSTEMD)
    original = Path.read_text

    def read_text(self, *args, **kwargs):
        if self == tmp_path / "100" / "cgroup":
            raise error(f"{error.__name__} on {self}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert container_id_of(100, proc=tmp_path) is None


def test_the_real_proc():
    # This process exists; in a container or not, the answer is an id or None.
    found = container_id_of(os.getpid())
    assert found is None or re.fullmatch("[0-9a-f]{64}", found)
    assert container_id_of(2**22 + 12345) is None  # above any pid_max: no such process


# --- CgroupReader ---------------------------------------------------------------------


@pytest.fixture
def trees(tmp_path):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    root.mkdir()
    return proc, root


@pytest.mark.parametrize("parent", ["/docker/{id}", "/system.slice/docker-{id}.scope"],
                         ids=["cgroupfs", "systemd"])
def test_v1_reads_working_set_cpu_and_oom_kills(trees, parent):
    proc, root = trees
    path = parent.format(id=A)
    write_proc(proc, 100, v1_lines(path))
    write_files(root / "memory" / path.strip("/"), v1_memory(300 * MiB, 100 * MiB, oom_kill=2))
    # cpu and cpuacct co-mounted, with no single-name symlink: found by the joined name.
    write_files(root / "cpu,cpuacct" / path.strip("/"), {"cpuacct.usage": "2500000000\n"})
    usage = CgroupReader(root=root, proc=proc).read(server())
    assert usage == ContainerUsage(working_set=200 * MiB, cpu_seconds=2.5, oom_kills=2)


@pytest.mark.parametrize("parent", ["/docker/{id}", "/system.slice/docker-{id}.scope"],
                         ids=["cgroupfs", "systemd"])
def test_v2_reads_working_set_cpu_and_oom_kills(trees, parent):
    proc, root = trees
    path = parent.format(id=A)
    write_proc(proc, 100, v2_lines(path))
    write_files(root / path.strip("/"), v2_files(300 * MiB, 64 * MiB, 1_500_000, 3))
    usage = CgroupReader(root=root, proc=proc).read(server())
    assert usage == ContainerUsage(working_set=236 * MiB, cpu_seconds=1.5, oom_kills=3)


def test_v2_reads_the_containers_cgroup_not_the_main_pids_sub_cgroup(trees):
    proc, root = trees
    write_proc(proc, 100, v2_lines(f"/docker/{A}/init"))
    write_files(root / "docker" / A, v2_files(500 * MiB, 0, 9_000_000, 1))
    write_files(root / "docker" / A / "init", v2_files(1 * MiB, 0, 1, 0))
    usage = CgroupReader(root=root, proc=proc).read(server())
    assert usage == ContainerUsage(working_set=500 * MiB, cpu_seconds=9.0, oom_kills=1)


def test_v1_single_name_mounts_and_an_old_kernel_without_oom_kill(trees):
    proc, root = trees
    write_proc(proc, 100, f"4:memory:/docker/{A}\n3:cpuacct:/docker/{A}\n")
    write_files(root / "memory" / "docker" / A, v1_memory(10 * MiB, 0, oom_kill=None))
    write_files(root / "cpuacct" / "docker" / A, {"cpuacct.usage": "1000\n"})
    usage = CgroupReader(root=root, proc=proc).read(server())
    assert usage == ContainerUsage(working_set=10 * MiB, cpu_seconds=1e-6, oom_kills=0)


def test_the_working_set_never_goes_below_zero(trees):
    proc, root = trees
    write_proc(proc, 100, V2_CGROUPFS)
    write_files(root / "docker" / A, v2_files(10 * MiB, 12 * MiB, 0, 0))
    assert CgroupReader(root=root, proc=proc).read(server()).working_set == 0


def test_a_missing_file_leaves_only_its_field_none(trees):
    proc, root = trees
    write_proc(proc, 100, V2_CGROUPFS)
    files = v2_files(10 * MiB, 0, 2_000_000, 0)
    del files["memory.events"]
    files["cpu.stat"] = "garbage\n"
    write_files(root / "docker" / A, files)
    assert CgroupReader(root=root, proc=proc).read(server()) == ContainerUsage(
        working_set=10 * MiB, cpu_seconds=None, oom_kills=None)


def test_a_vanished_main_pid_reads_nothing(trees):
    proc, root = trees
    write_files(root / "docker" / A, v2_files(10 * MiB, 0, 0, 0))
    assert CgroupReader(root=root, proc=proc).read(server(pid=100)) == ContainerUsage()
    assert CgroupReader(root=root, proc=proc).read(server(pid=0)) == ContainerUsage()


def test_a_pid_reused_by_another_container_or_the_host_reads_nothing(trees):
    proc, root = trees
    write_proc(proc, 100, v2_lines(f"/docker/{B}"))
    write_proc(proc, 101, v2_lines("/user.slice"))
    write_files(root / "docker" / B, v2_files(10 * MiB, 0, 0, 0))
    reader = CgroupReader(root=root, proc=proc)
    assert reader.read(server(A, pid=100)) == ContainerUsage()
    assert reader.read(server(A, pid=101)) == ContainerUsage()


def test_a_container_that_ends_after_being_located_reads_nothing_then_relocates(trees):
    proc, root = trees
    write_proc(proc, 100, V1_CGROUPFS)
    memory = write_files(root / "memory" / "docker" / A, v1_memory(10 * MiB, 0))
    cpuacct = write_files(root / "cpu,cpuacct" / "docker" / A, {"cpuacct.usage": "0\n"})
    reader = CgroupReader(root=root, proc=proc)
    assert reader.read(server()).working_set == 10 * MiB
    shutil.rmtree(memory)
    shutil.rmtree(cpuacct)
    shutil.rmtree(proc / "100")
    assert reader.read(server()) == ContainerUsage()
    # The same container restarted, under the systemd driver, with a new main PID.
    write_proc(proc, 200, V1_SYSTEMD)
    write_files(root / "memory" / "system.slice" / f"docker-{A}.scope", v1_memory(20 * MiB, 0))
    assert reader.read(server(pid=200)).working_set == 20 * MiB


def test_a_location_that_reads_nothing_is_looked_up_again(trees):
    proc, root = trees
    write_proc(proc, 100, V2_CGROUPFS)
    folder = write_files(root / "docker" / A, v2_files(10 * MiB, 0, 0, 0))
    reader = CgroupReader(root=root, proc=proc)
    assert reader.read(server()).working_set == 10 * MiB
    shutil.rmtree(folder)
    assert reader.read(server()) == ContainerUsage()
    # Same PID, the container's cgroup now elsewhere: found again, not the stale folder.
    write_proc(proc, 100, V2_SYSTEMD)
    write_files(root / "system.slice" / f"docker-{A}.scope", v2_files(30 * MiB, 0, 0, 0))
    assert reader.read(server()).working_set == 30 * MiB


def test_each_v1_controller_is_checked_to_be_the_containers(trees):
    proc, root = trees
    # The memory line names A; the cpuacct line another container (a PID
    # moved by hand): memory is read, CPU is not taken from B.
    write_proc(proc, 100, f"4:memory:/docker/{A}\n2:cpu,cpuacct:/docker/{B}\n")
    write_files(root / "memory" / "docker" / A, v1_memory(10 * MiB, 0))
    write_files(root / "cpu,cpuacct" / "docker" / B, {"cpuacct.usage": "5000000000\n"})
    assert CgroupReader(root=root, proc=proc).read(server()) == ContainerUsage(
        working_set=10 * MiB, cpu_seconds=None, oom_kills=0)


def test_another_cgroup_namespaces_view_maps_the_pid_but_reads_nothing(tmp_path):
    # A watchdog in a container with its own cgroup namespace sees paths
    # relative to its own cgroup: the PID still maps to its container, but
    # the files are not where the path says (compose needs "cgroup: host").
    proc, root = tmp_path / "proc", tmp_path / "cgroup" / "system.slice" / "docker-w.scope"
    write_proc(proc, 100, v2_lines(f"/../docker-{A}.scope"))
    write_files(root.parent / f"docker-{A}.scope", v2_files(10 * MiB, 0, 0, 0))
    root.mkdir()
    assert container_id_of(100, proc=proc) == A
    assert CgroupReader(root=root, proc=proc).read(server()) == ContainerUsage()


def test_the_location_is_kept_per_pid_and_pruned(trees):
    proc, root = trees
    write_proc(proc, 100, V2_CGROUPFS)
    write_files(root / "docker" / A, v2_files(10 * MiB, 0, 0, 0))
    reader = CgroupReader(root=root, proc=proc)
    reader.read(server())
    (proc / "100" / "cgroup").unlink()  # not read again while the PID is the same
    assert reader.read(server()).working_set == 10 * MiB
    reader.prune([B])
    assert reader.read(server()) == ContainerUsage()


# --- CpuMeter -------------------------------------------------------------------------


def test_cpu_meter_gives_cores_over_the_cycle():
    meter = CpuMeter()
    assert meter.rate(A, 10.0, now=100.0) is None
    assert meter.rate(A, 20.0, now=105.0) == pytest.approx(2.0)
    assert meter.rate(B, 1.0, now=105.0) is None
    assert meter.rate(A, 20.5, now=110.0) == pytest.approx(0.1)


def test_cpu_meter_starts_over_after_a_reset_a_gap_or_pruning():
    meter = CpuMeter()
    meter.rate(A, 50.0, now=0.0)
    assert meter.rate(A, 1.0, now=5.0) is None  # restarted: the counter went back
    assert meter.rate(A, 2.0, now=10.0) == pytest.approx(0.2)
    assert meter.rate(A, 3.0, now=10.0) is None  # no time passed
    assert meter.rate(A, None, now=15.0) is None  # unreadable: the next one starts over
    assert meter.rate(A, 4.0, now=20.0) is None
    meter.prune([B])
    assert meter.rate(A, 5.0, now=25.0) is None


# --- GPU memory per container -----------------------------------------------------------


def test_gpu_memory_is_summed_per_container_and_gpu(tmp_path, monkeypatch):
    write_proc(tmp_path, 10, V2_SYSTEMD)  # container A, two processes
    write_proc(tmp_path, 11, v1_lines(f"/docker/{A}/sub"))
    write_proc(tmp_path, 20, v2_lines(f"/docker/{B}"))  # container B
    write_proc(tmp_path, 30, v2_lines("/user.slice/user-0.slice"))  # a host process
    # PID 40 ended between NVML's list and the read.
    gpus = [
        GpuSample(uuid="GPU-0", index=0, processes=[
            HostProcess(10, 1000 * MiB), HostProcess(11, 500 * MiB), HostProcess(20, 300 * MiB),
            HostProcess(30, 999 * MiB), HostProcess(40, 999 * MiB)]),
        GpuSample(uuid="GPU-1", index=1, processes=[
            HostProcess(10, 2000 * MiB), HostProcess(20, None)]),  # None: MIG, unknown
        GpuSample(uuid="GPU-2", index=2, lost="GPU is lost"),
    ]
    lookups = []
    original = host.container_id_of

    def counting(pid, proc=host.PROC):
        lookups.append(pid)
        return original(pid, proc)

    monkeypatch.setattr(host, "container_id_of", counting)
    assert gpu_memory_by_container(gpus, proc=tmp_path) == {
        A: {"GPU-0": 1500 * MiB, "GPU-1": 2000 * MiB},
        B: {"GPU-0": 300 * MiB, "GPU-1": 0},
    }
    assert sorted(lookups) == [10, 11, 20, 30, 40]  # each PID once in a call


def test_no_gpus_no_containers(tmp_path):
    assert gpu_memory_by_container([], proc=tmp_path) == {}


# --- a real container -------------------------------------------------------------------

HOLD = (
    "import subprocess, time\n"
    "child = subprocess.Popen(['sleep', '600'])\n"
    "held = bytearray(b'\\x01') * (64 << 20)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
LIMIT = 256 * MiB


def children_of(pid: int) -> list[int]:
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(child) for child in children.read_text().split()]
    return found


@pytest.mark.e2e
def test_a_real_container(docker_client):
    container = docker_client.containers.run(
        "quota-spawner/base:local", ["python3", "-c", HOLD],
        name=f"wd-host-{uuid.uuid4().hex[:8]}", detach=True,
        mem_limit=LIMIT, memswap_limit=LIMIT,  # no swap: past the limit is an OOM kill
    )
    try:
        deadline = time.monotonic() + 30
        while b"ready" not in container.logs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert b"ready" in container.logs(), container.logs()
        container.reload()
        pid = container.attrs["State"]["Pid"]
        assert container_id_of(pid) == container.id
        children = children_of(pid)
        assert children, f"the container's main process {pid} shows no child"
        assert all(container_id_of(child) == container.id for child in children)

        main = server(container.id, pid)
        reader = CgroupReader()
        first = reader.read(main)
        assert first.working_set is not None and 64 * MiB <= first.working_set < LIMIT, first
        assert first.oom_kills == 0
        assert first.cpu_seconds is not None and first.cpu_seconds > 0

        busy = container.exec_run(["python3", "-c", "sum(range(3 * 10**7))"])
        assert busy.exit_code == 0, busy.output
        second = reader.read(main)
        assert second.cpu_seconds > first.cpu_seconds
        meter = CpuMeter()
        meter.rate(container.id, first.cpu_seconds, 0.0)
        assert meter.rate(container.id, second.cpu_seconds, 1.0) > 0

        # A child process allocating past the limit is killed; the container lives on.
        hog = container.exec_run(["python3", "-c", "b = bytearray(b'\\x01') * (400 << 20)"])
        assert hog.exit_code == 137, (hog.exit_code, hog.output)
        container.reload()
        assert container.status == "running"
        third = reader.read(main)
        assert third.oom_kills is not None and third.oom_kills >= 1, third
        assert third.working_set is not None and third.working_set < LIMIT
    finally:
        container.remove(force=True)
