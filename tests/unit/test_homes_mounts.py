"""What is mounted where, read from mountinfo (spawner/homes/mounts.py), and the btrfs
qgroup report (spawner/homes/btrfs.py), from recorded outputs."""

from __future__ import annotations

from spawner.homes.btrfs import BtrfsHomes, parse_qgroups
from spawner.homes.commands import CommandError
from spawner.homes.detect import open_homes
from spawner.homes.errors import HomesUnavailable
from spawner.homes.mounts import mount_of, parse_mountinfo

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
40 22 8:17 / /srv rw,relatime shared:2 - xfs /dev/sdb1 rw,attr2,inode64,prjquota
41 40 0:45 /@homes /srv/my\\040homes rw,relatime shared:3 - btrfs /dev/sdc rw,space_cache=v2,subvolid=257,subvol=/@homes
42 41 7:3 / /srv/my\\040homes/alice rw,nosuid,nodev,relatime shared:4 - ext4 /dev/loop3 rw,discard
43 22 8:17 / /srv rw,relatime shared:5 - tmpfs tmpfs rw,size=1024k
"""

# btrfs-progs 6.2 (Debian bookworm), `btrfs qgroup show --raw -r -e`, recorded on a
# filesystem made by the tests: a path column, "none" where there is no limit.
QGROUPS_6 = """\
Qgroupid    Referenced    Exclusive  Max referenced  Max exclusive   Path
--------    ----------    ---------  --------------  -------------   ----
0/5              16384        16384            none           none   <toplevel>
0/256         52412416     52412416        52428800           none   u1
0/257            16384        16384            none           none   u2
"""
# btrfs-progs 5.x prints the same columns in lower case, and no path.
QGROUPS_5 = """\
qgroupid         rfer         excl     max_rfer     max_excl
--------         ----         ----     --------     --------
0/5             16384        16384         none         none
0/258       104841216    104841216    104857600         none
"""


def test_mountinfo_fields_are_unescaped_and_both_option_sets_are_kept():
    mounts = parse_mountinfo(MOUNTINFO + "a line that is not a mount\n")
    assert [m.mount_point for m in mounts] == ["/", "/srv", "/srv/my homes",
                                               "/srv/my homes/alice", "/srv"]
    btrfs = mounts[2]
    assert (btrfs.fstype, btrfs.source, btrfs.root) == ("btrfs", "/dev/sdc", "/@homes")
    assert btrfs.option("subvol=/@homes") and btrfs.option("relatime")
    assert mounts[1].option("prjquota") and not mounts[0].option("prjquota")


def test_the_mount_that_holds_a_path_is_the_longest_prefix_and_the_last_mounted(tmp_path):
    mounts = parse_mountinfo(MOUNTINFO)
    assert mount_of("/srv/my homes/bob", mounts).fstype == "btrfs"
    assert mount_of("/srv/my homes/alice/x", mounts).source == "/dev/loop3"
    assert mount_of("/srv/other", mounts).fstype == "tmpfs"  # mounted over the xfs
    assert mount_of("/srvx", mounts).mount_point == "/"
    link = tmp_path / "link"
    link.symlink_to("/srv/my homes")  # a link is followed to where it leads
    assert mount_of(link, mounts).fstype == "btrfs"


def test_qgroups_of_both_btrfs_progs_are_read_level_zero_only():
    higher = "1/100          1048576      1048576         2097152           none   <0 member qgroups>"
    assert parse_qgroups(QGROUPS_6 + higher) == {5: (16384, None), 256: (52412416, 52428800),
                                                 257: (16384, None)}
    assert parse_qgroups(QGROUPS_5) == {5: (16384, None), 258: (104841216, 104857600)}


def test_btrfs_without_quotas_says_how_to_enable_them(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(f"41 22 0:45 / {tmp_path} rw,relatime - btrfs /dev/sdc rw\n")

    def quotas_off(argv, **_):
        raise CommandError.exited(argv, 1, "ERROR: can't list qgroups: quotas not enabled\n")

    found = open_homes(tmp_path, "auto", runner=quotas_off, mountinfo=info)
    assert found.describe() == (f"Disk is not enforced: {tmp_path} is btrfs without quotas "
                                f"(run `btrfs quota enable {tmp_path}`); see docs/disk.md")
    try:
        BtrfsHomes(tmp_path, runner=quotas_off, mountinfo=info).check()
    except HomesUnavailable as e:
        assert "btrfs quota enable" in str(e)
    else:
        raise AssertionError("an explicit btrfs on a filesystem without quotas must fail")
