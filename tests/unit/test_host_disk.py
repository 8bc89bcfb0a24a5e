"""The homes' filesystem as a resource (spawner/host/disk.py): the share, and which home
may be made or grown beside the others."""

from __future__ import annotations

import pytest

from spawner.host.disk import DiskCapacity, DiskShortfall, default_reserve, disk_shortfall

GiB = 2**30


def test_the_share_is_the_filesystem_less_the_reserve_times_the_ratio():
    # the documented defaults: a tenth kept free, at most 100 GiB; no overcommit
    assert DiskCapacity(400 * GiB).share == 360 * GiB
    assert DiskCapacity(10_000 * GiB).kept == 100 * GiB == default_reserve(10**16)
    assert DiskCapacity(400 * GiB, reserve=0, ratio=1.5).share == 600 * GiB
    assert DiskCapacity(GiB, reserve=2 * GiB).share == 0  # never below nothing
    assert DiskCapacity(400 * GiB).describe() == (
        "400 GiB; 40 GiB kept free; homes may be promised 360 GiB (1x)")
    for bad in (dict(ratio=0.5), dict(ratio=float("inf")), dict(reserve=-1)):
        with pytest.raises(ValueError):
            DiskCapacity(GiB, **bad)


def test_a_home_that_does_not_fit_is_refused_with_what_is_full():
    capacity = DiskCapacity(400 * GiB, reserve=0)
    promised = {f"u{i}": 20 * GiB for i in range(19)}  # 380 GiB
    short = disk_shortfall(capacity, promised, "alice", 21 * GiB)
    assert short == DiskShortfall(380 * GiB, 19, 400 * GiB, 21 * GiB)
    assert short.sentence() == (
        "The homes' disk is fully reserved: 380 GiB of 400 GiB are promised to 19 homes; "
        "this role's home needs 21 GiB.")
    assert disk_shortfall(capacity, promised, "alice", 20 * GiB) is None  # exactly full fits
    one = disk_shortfall(capacity, {"bob": 390 * GiB}, "alice", 20 * GiB)
    assert one is not None and "390 GiB of 400 GiB is promised to 1 home;" in one.sentence()


def test_a_home_is_counted_once_and_keeping_or_shrinking_it_always_fits():
    capacity = DiskCapacity(100 * GiB, reserve=0)
    promised = {"alice": 30 * GiB, "bob": 60 * GiB}
    # alice's own 30 GiB are hers to grow into: 60 + 40 fits, 60 + 41 does not
    assert disk_shortfall(capacity, promised, "alice", 40 * GiB) is None
    assert disk_shortfall(capacity, promised, "alice", 41 * GiB) is not None
    # a full filesystem (an admin lowered the ratio) never stops a home that takes no more
    tight = DiskCapacity(50 * GiB, reserve=0)
    assert disk_shortfall(tight, promised, "alice", 30 * GiB) is None
    assert disk_shortfall(tight, promised, "alice", 10 * GiB) is None
    assert disk_shortfall(tight, promised, "carol", GiB) is not None
