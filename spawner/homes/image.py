"""Homes as ext4 filesystem images on loop devices, for hosts whose filesystem has no
quota the kernel can enforce (docs/disk.md#filesystem-images).

A home's image is a sparse file ``IMAGES/NAME.img`` holding an ext4 filesystem, mounted
on a loop device at ``ROOT/NAME``. The filesystem's root belongs to root and holds the
home itself, ``ROOT/NAME/home`` (the containers' user's, bind-mounted as the home), and
the reserve, ``ROOT/NAME/.reserve``: root's file, allocated but never written. A user
can write what the filesystem holds less the reserve; a write past it fails with ENOSPC
("No space left on device"), for root as well (``mkfs.ext4 -m 0``: no blocks kept for
root). The image takes on the host only the blocks written in it: the reserve's blocks
are allocated inside the filesystem, not written to the file, and ``discard`` gives
deleted files' blocks back to the host's filesystem.

The size is what the user can write. ext4 keeps part of a filesystem for itself (the
journal, the inode tables, a small reserve), so a home's filesystem is made larger than
its size, and the reserve takes what is over: the limit is then exact within a few KiB.

- Growing past what the filesystem holds unmounts the home, checks it (``e2fsck -f
  -p``), grows the file and the filesystem (``resize2fs``) and mounts it again. A home
  in use (another of its user's servers runs, in this mount namespace or its own) is
  never checked or resized offline: it grows online instead (``truncate``, ``losetup
  -c``, ``resize2fs`` on the mounted device), which needs CAP_SYS_RESOURCE. In use
  elsewhere shows as a loop device that keeps its image after the unmount.
- Shrinking only enlarges the reserve, at once, mounted or not: the limit becomes the
  new size, or what the home holds if that is more (a reserve cannot take blocks in
  use), so writes are refused and nothing is deleted. The file keeps its length.

``release`` (at the hub's stop) unmounts every home, which detaches its loop device
(``mount -o loop`` sets autoclear); an image is never deleted here.

Every mount needs root (CAP_SYS_ADMIN and the loop devices), and a hub in a container
must share its mounts with the engine (docs/disk.md#filesystem-images).
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import time
from pathlib import Path

from spawner.homes.base import HOME_MODE, Home, HomeStore, HomeUse, Space, statvfs_space
from spawner.homes.commands import CommandError
from spawner.homes.errors import HomeError, HomesUnavailable
from spawner.homes.mounts import Mount

BLOCK = 4096
HOME = "home"  # the home, in the filesystem's root
RESERVE = ".reserve"  # root's allocated, unwritten blocks, in the filesystem's root
MOUNT_OPTIONS = "loop,nosuid,nodev,discard"
LONG = 600.0  # mkfs, e2fsck and resize2fs of a big, full home take a while
NOISE = 2**20  # a limit that moved less than this has not changed (the reserve's extents)
PASSES = 3  # resizes at most, in one prepare (the overhead is measured, then aimed at)
TOOLS = ("mkfs.ext4", "e2fsck", "resize2fs", "mount", "umount", "losetup")


def _blocks(size: int) -> int:
    return math.ceil(size / BLOCK) * BLOCK


def _writable(path: Path) -> int:
    """What users may write in all in the filesystem mounted at ``path``, reserve included."""
    found = os.statvfs(path)
    return (found.f_blocks - found.f_bfree + found.f_bavail) * found.f_frsize


def _estimate(points: list[tuple[int, int]], want: int) -> int:
    """The image bytes that should give ``want`` writable bytes, from the (image,
    writable) pairs seen: scaled by the last one's overhead, then along the line through
    the last two (the journal does not grow with the image)."""
    image, writable = points[-1]
    estimate = want * image / max(writable, 1)
    if len(points) > 1 and points[-2][1] != writable:
        image0, writable0 = points[-2]
        estimate = image + (want - writable) * (image - image0) / (writable - writable0)
    return max(_blocks(math.ceil(estimate)), image + BLOCK)


def _backing_file(source: str) -> str | None:
    if not source.startswith("/dev/loop"):
        return None
    try:
        text = Path(f"/sys/block/{os.path.basename(source)}/loop/backing_file").read_text()
    except OSError:
        return None
    return text.strip()


def _allocated(path: Path) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


class ImageHomes(HomeStore):
    mechanism = "image"
    detach_wait = 10.0  # seconds a loop device may take to let go of its image after umount

    def __init__(self, root: str | Path, *, image_dir: str | Path | None = None, **kwargs):
        super().__init__(root, **kwargs)
        self.image_dir = Path(os.path.realpath(image_dir)) if image_dir else self.root / ".images"

    def describe(self) -> str:
        return (f"Homes are ext4 images in {self.image_dir}, each mounted on a loop device "
                f"under {self.root} and limited by its size")

    def check(self) -> None:
        super().check()
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise HomesUnavailable(f"the image mechanism needs {', '.join(missing)} "
                                   "(e2fsprogs, util-linux)")
        if os.geteuid() != 0:
            raise HomesUnavailable("the image mechanism mounts the homes, which needs root")
        self.image_dir.mkdir(mode=0o700, exist_ok=True)

    def image_of(self, name: str) -> Path:
        return self.image_dir / f"{name}.img"

    def home_path(self, user: str) -> Path:
        return self.root / self.home_name(user) / HOME

    # --- mounts -----------------------------------------------------------------

    def _homes_mounted(self) -> dict[str, Mount]:
        """Home name -> its mount, for every loop mount right under the root."""
        root = str(self.root)
        found = {}
        for mount in self._mounts():
            parent, name = os.path.split(mount.mount_point)
            if parent == root and mount.source.startswith("/dev/loop"):
                found[name] = mount  # a later mount on the same point hides the earlier
        return found

    def _ours(self, mount: Mount, image: Path) -> bool:
        return _backing_file(mount.source) == os.path.realpath(image)

    def _mount(self, image: Path, point: Path) -> None:
        self.run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(point)])

    def _unmount(self, point: Path) -> bool:
        """Unmount ``point``; False if it is busy (a server still has it open)."""
        try:
            self.run(["umount", str(point)])
        except CommandError as e:
            if "busy" in e.stderr:
                return False
            raise
        return True

    def _detach(self, device: str, image: Path) -> None:
        """Detach ``device`` if it still holds ``image`` (autoclear does it, maybe later)."""
        if _backing_file(device) != os.path.realpath(image):
            return
        try:
            self.run(["losetup", "-d", device])
        except CommandError:
            if _backing_file(device) == os.path.realpath(image):
                raise  # still attached: a real failure

    # --- making and sizing ------------------------------------------------------

    def _make(self, image: Path, point: Path, size: int) -> None:
        fd = os.open(image, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, _blocks(size))  # sparse: no block written
        finally:
            os.close(fd)
        try:
            self.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", str(BLOCK), str(image)],
                     timeout=LONG)
        except HomeError:
            image.unlink()  # nothing was in it; a half-made image would be mounted later
            raise
        if self._existing(point) is None:
            os.mkdir(point, 0o755)  # the mount point; root's, like the filesystem's root

    def _let_go(self, device: str, image: Path) -> bool:
        """Whether ``device`` let ``image`` go after its unmount. A loop device with
        autoclear detaches when nothing holds it any more; one still attached is mounted
        elsewhere (a running server's own mount namespace keeps its home mounted), and
        then the file must not be checked or resized behind the kernel's back."""
        deadline = time.monotonic() + self.detach_wait
        while _backing_file(device) == os.path.realpath(image):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _grow(self, image: Path, point: Path, want: int) -> None:
        """Make the home's image ``want`` bytes and its filesystem fill it."""
        device = self._homes_mounted()[point.name].source
        offline = self._unmount(point)
        if offline and not self._let_go(device, image):
            self._mount(image, point)  # mount reuses the loop device: the same filesystem
            offline = False
        if not offline:  # in use: grown online, while mounted
            device = self._homes_mounted()[point.name].source
            os.truncate(image, want)
            self.run(["losetup", "-c", device])
            self.run(["resize2fs", device], timeout=LONG)
            return
        try:
            self.run(["e2fsck", "-f", "-p", str(image)], ok=(0, 1), timeout=LONG)
            os.truncate(image, want)
            self.run(["resize2fs", str(image)], timeout=LONG)
        finally:
            self._mount(image, point)

    def _fit(self, image: Path, point: Path, want: int) -> None:
        """Grow the home's filesystem until users may write ``want`` bytes in it."""
        points: list[tuple[int, int]] = []
        for _ in range(PASSES):
            writable = _writable(point)
            if writable >= want:
                return
            points.append((image.stat().st_size, writable))
            self._grow(image, point, _estimate(points, want))
        if _writable(point) < want:
            raise HomeError(f"the image {image} did not grow to hold {want} bytes")

    def _reserve(self, point: Path, limit: int) -> None:
        """Hold back from the home's users all the filesystem takes beyond ``limit``."""
        fd = os.open(point / RESERVE, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        try:
            for _ in range(2):
                size = max(0, _writable(point) - limit)
                # the reserve's extent blocks count against the home too: room for them,
                # a few blocks and one per 16 GiB, is left out of it (the user's gain)
                size = max(0, size - BLOCK * (4 + size // 2**34)) // BLOCK * BLOCK
                now = os.fstat(fd).st_size
                if size < now:
                    os.ftruncate(fd, size)
                elif size > now:
                    try:
                        os.posix_fallocate(fd, 0, size)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        # a running server of the user wrote meanwhile: measure again; a
                        # second miss leaves the home a little larger until its next start
                        continue
                return
        finally:
            os.close(fd)

    def _prepare(self, user: str, name: str, size: int) -> Home:
        point, image = self.root / name, self.image_of(name)
        found = self._existing(point)
        mounted = self._homes_mounted().get(name)
        if mounted is not None and not self._ours(mounted, image):
            raise HomeError(f"{point} is a mount of {mounted.source}, not of the home's image "
                            f"{image}; unmount it first")
        created = not image.exists()
        if created:
            if found is not None and any(os.scandir(point)):
                raise HomeError(f"{point} holds files but has no image {image}; move them out "
                                "before it becomes an image home (docs/disk.md)")
            self._make(image, point, size)
        elif found is None:
            os.mkdir(point, 0o755)  # the mount point went; the image is still there
        if mounted is None:
            self._mount(image, point)
        home = point / HOME
        if self._existing(home) is None:
            os.mkdir(home, HOME_MODE)
            self._own(home)
        before = self._use(point)
        # Never below what the home holds: a reserve cannot take blocks in use.
        limit = max(_blocks(size), before.used)
        self._fit(image, point, limit)
        self._reserve(point, limit)
        after = self._use(point)
        if created:
            change = "created"
        elif abs((after.limit or 0) - (before.limit or 0)) <= NOISE:
            change = ""
        else:
            change = "grown" if (after.limit or 0) > (before.limit or 0) else "shrunk"
        return Home(user=user, name=name, path=home, size=size, limit=after.limit,
                    used=after.used, change=change,
                    previous_limit=before.limit if change in ("grown", "shrunk") else None)

    # --- reading and releasing --------------------------------------------------

    def _use(self, point: Path, name: str = "") -> HomeUse:
        found = os.statvfs(point)
        reserve = _allocated(point / RESERVE)
        used = (found.f_blocks - found.f_bfree) * found.f_frsize - reserve
        writable = (found.f_blocks - found.f_bfree + found.f_bavail) * found.f_frsize
        return HomeUse(name or point.name, max(used, 0), writable - reserve)

    def usage(self) -> dict[str, HomeUse]:
        found = {}
        for name, mount in self._homes_mounted().items():
            try:
                found[name] = self._use(Path(mount.mount_point), name)
            except OSError:
                continue  # unmounted since the mountinfo was read
        return found

    def promised(self) -> dict[str, int]:
        """Every image's length, mounted or not: the most it can take of the filesystem
        that holds the images (a few percent over its home's size: ext4's own part)."""
        found = {}
        with os.scandir(self.image_dir) as entries:
            for entry in entries:
                name = entry.name.removesuffix(".img")
                if name != entry.name and not name.startswith(".") and entry.is_file(
                        follow_symlinks=False):
                    found[name] = entry.stat(follow_symlinks=False).st_size
        return found

    def space(self) -> Space:
        """The filesystem that holds the images (the image folder may be elsewhere than
        the mount points)."""
        return statvfs_space(self.image_dir)

    def release(self) -> None:
        """Unmount every home whose image is in the image folder; HomeError naming those
        that could not be, after trying all."""
        failed = []
        for name, mount in self._homes_mounted().items():
            if not self._ours(mount, self.image_of(name)):
                continue
            try:
                if not self._unmount(Path(mount.mount_point)):
                    failed.append(f"{mount.mount_point} is busy")
                    continue
                self._detach(mount.source, self.image_of(name))
            except HomeError as e:
                failed.append(str(e))
        if failed:
            raise HomeError("some homes could not be released: " + "; ".join(failed))
