"""Homes' disk use per watchdog cycle: the quota query against ``du``, in one run.

What a watchdog cycle costs to read the use of every home on the host, for each
mechanism that runs here (spawner/homes; docs/disk.md):

- btrfs, for real: one btrfs filesystem in a file on a loop device, ``--homes``
  subvolumes with qgroup limits; a cycle is ``BtrfsHomes.usage()``: one ``btrfs qgroup
  show`` and a ``scandir`` of the root.
- image, for real: ``--image-homes`` ext4 images on loop devices (each a mount); a cycle
  is ``ImageHomes.usage()``: the mountinfo read once and a ``statvfs`` per home.
- XFS and ext4 project quotas cannot run on this kernel: their line is the parse of a
  report of the same number of projects, made by the recorded fake of the tools
  (tests/fake_quota_tools.py), without the command itself.

Each home gets the same few files a user's home starts with (a notebook, a script, a
CSV, a small checkpoint, Jupyter's settings in hidden folders). Against each, ``du -s
-B1`` over the same homes, one process per cycle (what a watchdog without quotas would
run), with a warm page cache. The goal: under 50 ms per cycle at 200 homes.

Needs root (loop devices, mounts). Everything it makes is removed at the end.

    .venv/bin/python bench/disk_bench.py [--homes 200] [--image-homes 200] [--rounds 30]
                                         [--extra-files 0] [--only btrfs|image|reports]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from fake_quota_tools import FakeQuotaTools  # noqa: E402
from loopfs import MiB, btrfs_filesystem, scratch_folder  # noqa: E402

from spawner.homes.detect import open_homes  # noqa: E402
from spawner.homes.errors import HomeError  # noqa: E402
from spawner.homes.ext4 import parse_repquota  # noqa: E402
from spawner.homes.xfs import parse_xfs_report  # noqa: E402

GOAL = 0.050  # seconds per cycle at 200 homes
# (path in the home, bytes): what a user's home holds after a first session
CONTENT = [("analysis.ipynb", 48 * 1024), ("train.py", 6 * 1024), ("data/points.csv", 300 * 1024),
           ("checkpoints/epoch1.pt", 1 * MiB), (".jupyter/lab/workspaces/default.json", 2048),
           (".local/share/jupyter/runtime/kernel.json", 512)]


def fill(home: Path, uid: int, gid: int, extra: int) -> None:
    """The home's first files, and ``extra`` small ones (a package installed with pip)."""
    files = CONTENT + [(f".local/lib/python3.11/site-packages/pkg/m{n}.py", 3000)
                       for n in range(extra)]
    for name, size in files:
        path = home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        os.chown(path, uid, gid)


def timed(call: Callable[[], object], rounds: int) -> list[float]:
    call()  # warm: caches, ids, page cache
    found = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        call()
        found.append(time.perf_counter() - t0)
    return found


def du(paths: list[Path]) -> Callable[[], object]:
    argv = ["du", "-s", "-B1", *map(str, paths)]
    return lambda: subprocess.run(argv, check=True, capture_output=True)


def line(label: str, samples: list[float]) -> str:
    p95 = sorted(samples)[int(0.95 * (len(samples) - 1))]
    return (f"  {label:<38} median {statistics.median(samples) * 1e3:8.2f} ms   "
            f"p95 {p95 * 1e3:8.2f} ms")


def compare(name: str, count: int, quota: list[float], walk: list[float]) -> None:
    median = statistics.median(quota)
    print(line(f"{name}: quota query", quota))
    print(line(f"{name}: du -s over the same homes", walk))
    verdict = "met" if median < GOAL else "MISSED"
    print(f"  {name}: du / quota query, median: {statistics.median(walk) / median:.1f}x; "
          f"goal under {GOAL * 1e3:.0f} ms per cycle at 200 homes: {verdict} "
          f"(at {count} homes)")


def bench_btrfs(homes_count: int, rounds: int, extra: int) -> None:
    size = max(1024, homes_count * (8 + extra // 64))
    with btrfs_filesystem(size=f"{size}M") as mount:
        root = mount / "homes"
        root.mkdir(mode=0o711)
        homes = open_homes(root, "btrfs")
        t0 = time.perf_counter()
        paths = []
        for n in range(homes_count):
            home = homes.prepare(f"user{n:03d}", 64 * MiB)
            fill(home.path, *homes.owner, extra)
            paths.append(home.path)
        made = time.perf_counter() - t0
        subprocess.run(["btrfs", "filesystem", "sync", str(mount)], check=True)
        found = homes.usage()
        assert len(found) == homes_count, f"{len(found)} of {homes_count} homes read"
        print(f"btrfs: {homes_count} homes made in {made:.1f} s "
              f"({made / homes_count * 1e3:.0f} ms each), {len(CONTENT) + extra} files each")
        compare("btrfs", homes_count, timed(homes.usage, rounds), timed(du(paths), rounds))


def bench_image(homes_count: int, rounds: int, extra: int) -> None:
    with scratch_folder("quota-disk-bench-") as folder:
        root = folder / "homes"
        root.mkdir(mode=0o711)
        homes = open_homes(root, "image")
        t0 = time.perf_counter()
        paths = []
        try:
            for n in range(homes_count):
                try:
                    home = homes.prepare(f"user{n:03d}", 32 * MiB)
                except HomeError as e:
                    print(f"image: home {n + 1} could not be made, so {n} homes: {e}")
                    break
                fill(home.path, *homes.owner, extra)
                paths.append(home.path)
            made = time.perf_counter() - t0
            count = len(paths)
            found = homes.usage()
            assert len(found) == count, f"{len(found)} of {count} homes read"
            print(f"image: {count} homes made and mounted in {made:.1f} s "
                  f"({made / max(count, 1) * 1e3:.0f} ms each), {len(CONTENT) + extra} files each")
            compare("image", count, timed(homes.usage, rounds), timed(du(paths), rounds))
        finally:
            t0 = time.perf_counter()
            homes.release()
            print(f"  image: {len(paths)} homes released (unmounted, loops detached) in "
                  f"{time.perf_counter() - t0:.1f} s")


def bench_reports(homes_count: int, rounds: int) -> None:
    tools = FakeQuotaTools("/srv")
    for n in range(homes_count):
        tools.use(1_000_000 + n, 1400 + n, files=len(CONTENT))
        tools(["setquota", "-P", str(1_000_000 + n), "0", str(64 * 1024), "0", "0", "/srv"])
    xfs = tools(["xfs_quota", "-x", "-c", "report -p -b -n -N", "/srv"])
    ext4 = tools(["repquota", "-P", "-n", "/srv"])
    print(f"XFS and ext4 project quotas: the parse of a {homes_count}-project report only "
          "(no quota support in this kernel; the command's own time is not in it)")
    print(line("xfs_quota report, parsed", timed(lambda: parse_xfs_report(xfs), rounds)))
    print(line("repquota -P, parsed", timed(lambda: parse_repquota(ext4), rounds)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--homes", type=int, default=200)
    parser.add_argument("--image-homes", type=int, default=None,
                        help="homes for the image mechanism (a mount each); default --homes")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--extra-files", type=int, default=0,
                        help="small files more in each home (du reads them all; a quota "
                        "query does not)")
    parser.add_argument("--only", choices=["btrfs", "image", "reports"], default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("disk_bench needs root: loop devices and mounts")
    if args.only in (None, "btrfs"):
        bench_btrfs(args.homes, args.rounds, args.extra_files)
    if args.only in (None, "image"):
        bench_image(args.image_homes or args.homes, args.rounds, args.extra_files)
    if args.only in (None, "reports"):
        bench_reports(args.homes, args.rounds)


if __name__ == "__main__":
    main()
