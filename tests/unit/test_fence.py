"""The notebooks' parent cgroup (spawner/docker/parent_cgroup.py): what is written where, for each
cgroup driver and version. A temporary folder stands in for /sys/fs/cgroup here; the
end-to-end test (tests/e2e/test_e2e_host_fence.py) sets up the real one and OOM-kills
inside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spawner.docker import parent_cgroup as parent_cgroup_module
from spawner.docker.parent_cgroup import ParentCgroupError, is_local, parent_cgroup_name, set_up

GiB = 2**30
V1 = {"CgroupDriver": "cgroupfs", "CgroupVersion": "1"}
V2 = {"CgroupDriver": "cgroupfs", "CgroupVersion": "2"}


def v1_root(tmp_path: Path) -> Path:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    return tmp_path


class FakeCgroupV1Folder:
    """A created v1 folder holds the kernel's files (mkdir makes them in a real cgroupfs)."""

    @staticmethod
    def prepare(root: Path, name: str, swap: bool) -> Path:
        folder = root / "memory" / name
        folder.mkdir(parents=True)
        (folder / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        if swap:
            (folder / "memory.memsw.limit_in_bytes").write_text("9223372036854771712\n")
        return folder


def test_names_are_safe_for_every_driver():
    assert parent_cgroup_name("quota-spawner-1a2b3c") == "quota_spawner_quota_spawner_1a2b3c_" + \
        parent_cgroup_name("quota-spawner-1a2b3c").rsplit("_", 1)[1]
    assert parent_cgroup_name("lab_1") == "quota_spawner_lab_1"  # nothing changed: no hash
    odd = parent_cgroup_name("../../x y-" + "z" * 100)
    assert "/" not in odd and "-" not in odd and "." not in odd and len(odd) < 80
    assert parent_cgroup_name("a-b") != parent_cgroup_name("a_b")  # a changed id gets its hash


def test_only_a_local_socket_counts_as_this_machine():
    assert is_local("http+docker://localhost")
    assert not is_local("http://10.0.0.5:2375") and not is_local("https://engine:2376")
    assert not is_local("ssh://admin@engine")


def test_v1_sets_memory_then_swap_when_raising_and_reads_it_back(tmp_path):
    root = v1_root(tmp_path)
    name = parent_cgroup_name("lab")
    folder = FakeCgroupV1Folder.prepare(root, name, swap=True)
    (folder / "memory.limit_in_bytes").write_text(str(GiB))
    (folder / "memory.memsw.limit_in_bytes").write_text(str(GiB))
    found = set_up(V1, "lab", 2 * GiB, local=True, root=root)
    assert found.parent == f"/{name}" and found.limit == 2 * GiB
    assert (folder / "memory.limit_in_bytes").read_text() == str(2 * GiB)
    assert (folder / "memory.memsw.limit_in_bytes").read_text() == str(2 * GiB)
    assert "cgroup v1, cgroupfs driver" in found.describe()


def test_v1_lowering_writes_memory_before_swap(tmp_path, monkeypatch):
    root = v1_root(tmp_path)
    folder = FakeCgroupV1Folder.prepare(root, parent_cgroup_name("lab"), swap=True)
    (folder / "memory.limit_in_bytes").write_text(str(4 * GiB))
    written: list[str] = []
    real = parent_cgroup_module._write
    monkeypatch.setattr(parent_cgroup_module, "_write",
                        lambda path, value: (written.append(path.name), real(path, value)))
    set_up(V1, "lab", GiB, local=True, root=root)
    assert written == ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]


def test_v1_without_a_memory_controller_is_refused(tmp_path):
    with pytest.raises(ParentCgroupError, match="is not a cgroup v1 memory controller"):
        set_up(V1, "lab", GiB, local=True, root=tmp_path)


def test_a_folder_that_cannot_be_made_says_which(tmp_path):
    root = v1_root(tmp_path)
    (root / "memory" / parent_cgroup_name("lab")).write_text("")  # not a folder: mkdir fails, even as root
    with pytest.raises(ParentCgroupError, match="cannot create .*quota_spawner_lab"):
        set_up(V1, "lab", GiB, local=True, root=root)


def test_a_limit_the_kernel_does_not_keep_is_an_error(tmp_path, monkeypatch):
    root = v1_root(tmp_path)
    FakeCgroupV1Folder.prepare(root, parent_cgroup_name("lab"), swap=False)
    monkeypatch.setattr(parent_cgroup_module, "_write", lambda path, value: None)  # ignored writes
    with pytest.raises(ParentCgroupError, match="reads 9223372036854771712 after writing"):
        set_up(V1, "lab", GiB, local=True, root=root)


def test_v2_enables_memory_for_the_roots_children_and_turns_swap_off(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu pids\n")
    name = parent_cgroup_name("lab")
    folder = tmp_path / name
    folder.mkdir()
    (folder / "memory.swap.max").write_text("max\n")
    found = set_up(V2, "lab", 3 * GiB, local=True, root=tmp_path)
    assert found.parent == f"/{name}"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"
    assert (folder / "memory.max").read_text() == str(3 * GiB)
    assert (folder / "memory.swap.max").read_text() == "0"


def test_v2_without_the_memory_controller_is_refused(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu pids\n")
    with pytest.raises(ParentCgroupError, match="memory controller is not available"):
        set_up(V2, "lab", GiB, local=True, root=tmp_path)


@pytest.mark.parametrize("version, settings", [
    ("2", ["MemoryMax=1073741824", "MemorySwapMax=0"]),
    ("1", ["MemoryLimit=1073741824"]),
])
def test_systemd_sets_the_slice_with_systemctl(version, settings, monkeypatch):
    monkeypatch.setattr(parent_cgroup_module.shutil, "which", lambda _: "/bin/systemctl")
    calls = []

    def run(args, **_):
        calls.append(args)
        out = str(GiB) + "\n" if args[1] == "show" else ""
        return subprocess.CompletedProcess(args, 0, out, "")

    found = set_up({"CgroupDriver": "systemd", "CgroupVersion": version}, "lab", GiB,
                   local=True, run=run)
    unit = parent_cgroup_name("lab") + ".slice"
    assert found.parent == unit
    assert calls[0] == ["/bin/systemctl", "set-property", "--runtime", unit, *settings]
    assert calls[1][:3] == ["/bin/systemctl", "show", "-p"]


def test_systemd_failure_is_said(monkeypatch):
    monkeypatch.setattr(parent_cgroup_module.shutil, "which", lambda _: "/bin/systemctl")

    def run(args, **_):
        return subprocess.CompletedProcess(args, 1, "", "Access denied")

    with pytest.raises(ParentCgroupError, match="set-property .* failed: Access denied"):
        set_up({"CgroupDriver": "systemd", "CgroupVersion": "2"}, "lab", GiB, local=True,
               run=run)


def test_systemd_without_systemctl_is_said(monkeypatch):
    monkeypatch.setattr(parent_cgroup_module.shutil, "which", lambda _: None)
    with pytest.raises(ParentCgroupError, match="systemctl is not here"):
        set_up({"CgroupDriver": "systemd", "CgroupVersion": "2"}, "lab", GiB, local=True)


@pytest.mark.parametrize("info, local, words", [
    (V1, False, "on another machine"),
    ({"CgroupDriver": "none"}, True, "not cgroupfs or systemd"),
])
def test_what_cannot_be_fenced_is_said(tmp_path, info, local, words):
    with pytest.raises(ParentCgroupError, match=words):
        set_up(info, "lab", GiB, local=local, root=tmp_path)


def test_a_share_of_nothing_is_not_a_limit(tmp_path):
    with pytest.raises(ParentCgroupError, match="share of the host's memory is 0"):
        set_up(V1, "lab", 0, local=True, root=v1_root(tmp_path))
