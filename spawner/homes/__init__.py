"""Users' homes of a given size on this host (docs/disk.md).

One interface, ``HomeStore`` (base.py), for "a user's home of a given size on this host",
and the mechanisms that implement it: a btrfs subvolume with a qgroup limit (btrfs.py),
XFS and ext4 project quotas (xfs.py, ext4.py, with projects.py), a filesystem image on
a loop device (image.py), and none (unenforced.py). ``open_homes`` (detect.py) picks
one and says which, in one sentence. Everything here blocks (commands, mounts,
statvfs): callers run it in a thread.
"""
