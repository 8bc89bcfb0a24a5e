"""A hub whose homes have a size, on a real filesystem made for the test (docs/disk.md):
btrfs on a loop device (tests/loopfs.py), or the image mechanism in a scratch folder,
for the modules that need a real hub with homes (tests/e2e/test_e2e_disk.py,
tests/browser/test_browser_disk.py); and what they do to a running server's home.

Needs root (loop devices, mounts): ``need_root`` skips without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from hubs import own_hub
from loopfs import WRITER, btrfs_filesystem, scratch_folder

from harness import Hub

MiB = 2**20


def homes_table(users: str = "") -> str:
    """The modules' quota table: roles of a 64, 128 and 256 MiB home on the pytorch image,
    ``small`` for everyone, ``users`` (lines of ``    name: [role]``) for some."""
    return f"""\
images:
  pytorch: {{image: "quota-spawner/pytorch:latest"}}
roles:
  small: {{cpus: 0.5, memory: 512M, disk: 64M, images: [pytorch]}}
  big: {{cpus: 0.5, memory: 512M, disk: 128M, images: [pytorch]}}
  huge: {{cpus: 0.5, memory: 512M, disk: 256M, images: [pytorch]}}
assignments:
  default: [small]
  users:
{users or "    nobody: [small]"}
"""


def homes_settings(root: Path, mechanism: str, reserve: int | None = None) -> str:
    """The hub's disk settings: the homes' root and mechanism, and the admission's reserve."""
    lines = [f"c.QuotaSpawner.home_root = {str(root)!r}",
             f"c.QuotaSpawner.home_mechanism = {mechanism!r}"]
    if reserve is not None:
        lines.append(f"c.QuotaSpawner.disk_reserve = '{reserve}'")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def homes_hub(workdir: Path, docker_client, mechanism: str, *, name: str, quota_text: str,
              prefix: str, users: tuple[str, ...],
              extra_config: str = "") -> Iterator[tuple[Hub, Path]]:
    """(the hub, the homes' root) with homes kept by ``mechanism`` ("btrfs": a 400 MiB
    filesystem, whose default reserve leaves 360 MiB to promise; "image": the machine's
    filesystem, of which 400 MiB may be promised). Afterwards as ``own_hub``, then the
    filesystem is gone."""
    context = btrfs_filesystem("400M") if mechanism == "btrfs" else scratch_folder(
        "quota-images-")
    with context as root:
        reserve = None
        if mechanism == "image":
            found = os.statvfs(root)
            reserve = found.f_blocks * found.f_frsize - 400 * MiB
        running = own_hub(workdir, docker_client, name, quota_text=quota_text, prefix=prefix,
                          extra_config=homes_settings(root, mechanism, reserve) + extra_config,
                          users=users)
        hub = next(running)
        try:
            yield hub, root
        finally:
            next(running, None)  # its servers stopped, its log kept, its containers removed


def home_of(root: Path, mechanism: str, user: str) -> Path:
    """``user``'s home on the host (an image's is the folder inside its filesystem)."""
    return root / user / "home" if mechanism == "image" else root / user


def write_in(container, path: str, total: int) -> tuple[int, str]:
    """Append ``total`` bytes to ``path`` in the container as its user: (written, errno)."""
    code, out = container.exec_run(["python3", "-c", WRITER, path, str(total), str(MiB)],
                                   user="1000")
    assert code == 0, out
    written, _, failure = out.decode().strip().partition(" ")
    return int(written), failure


def env_of(container) -> dict[str, str]:
    """The container's environment as the hub created it."""
    return dict(e.partition("=")[::2] for e in container.attrs["Config"]["Env"])
