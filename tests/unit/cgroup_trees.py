"""A host's /proc and cgroup files, built in a test's tmp_path in the layouts the kernel
writes, for the watchdog's host reads (tests/unit/test_watchdog_host.py, on Docker's
layouts, and test_watchdog_pods.py, on a Kubernetes node's)."""

from __future__ import annotations

from pathlib import Path


def write_proc(proc: Path, pid: int, text: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(text)


def write_files(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def v2_files(current: int, inactive_file: int, usage_usec: int, oom_kill: int) -> dict[str, str]:
    return {
        "memory.current": f"{current}\n",
        "memory.stat": f"anon 10\nfile 20\nactive_file 3\ninactive_file {inactive_file}\n",
        "cpu.stat": f"usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 2\n",
        "memory.events": f"low 0\nhigh 0\nmax 4\noom {oom_kill + 1}\noom_kill {oom_kill}\n",
    }
