"""The host's CPUs and memory as a resource: the share, what fits, the running sums."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.host.admission import (
    HostBook,
    HostCapacity,
    Reservation,
    Shortfall,
    default_reserve_cpus,
    default_reserve_memory,
)
from spawner.quota.model import Role

GiB = 2**30


def role(cpus: float, memory: int) -> Role:
    return Role(name="r", cpus=cpus, memory=memory, images=("pytorch",))


def test_the_share_is_capacity_less_the_reserve_times_the_ratio():
    host = HostCapacity(cpus=32, memory=256 * GiB)
    # the documented defaults: a tenth kept back (at most 1 CPU, at least 1 GiB); CPUs
    # 4x, memory 1x
    assert (host.kept_cpus, host.kept_memory) == (1.0, int(25.6 * GiB))
    assert host.share == Reservation(124.0, 256 * GiB - int(25.6 * GiB))
    small = HostCapacity(cpus=2, memory=4 * GiB)
    assert (small.kept_cpus, small.kept_memory) == (0.2, 1 * GiB)
    assert small.share == Reservation(7.2, 3 * GiB)
    tiny = HostCapacity(cpus=0.5, memory=GiB // 2, reserve_cpus=1)
    assert tiny.share == Reservation(0.0, 0)  # never below nothing
    assert default_reserve_memory(GiB // 2) == GiB // 2
    assert default_reserve_cpus(1) == 0.1


def test_an_admin_sets_the_reserve_and_the_ratios():
    host = HostCapacity(cpus=16, memory=64 * GiB, reserve_cpus=2, reserve_memory=8 * GiB,
                        cpu_ratio=1, memory_ratio=1.5)
    assert host.share == Reservation(14.0, 84 * GiB)


@pytest.mark.parametrize("field, value", [
    ("cpus", math.nan), ("cpus", -1), ("reserve_cpus", math.inf), ("cpu_ratio", 0.5),
    ("memory_ratio", 0), ("memory", -1), ("reserve_memory", -GiB),
])
def test_odd_settings_are_refused_with_their_name(field, value):
    settings_ = {"cpus": 4.0, "memory": 8 * GiB, field: value}
    with pytest.raises(ValueError) as e:
        HostCapacity(**settings_)
    assert field.split("_")[-1] in str(e.value) or "ratio" in str(e.value)


def test_the_engine_gives_the_capacity_and_an_admin_may_only_lower_it():
    info = {"NCPU": 8, "MemTotal": 32 * GiB}
    assert HostCapacity.from_engine(info).cpus == 8
    lowered = HostCapacity.from_engine(info, cpus=6, memory=16 * GiB)
    assert (lowered.cpus, lowered.memory) == (6, 16 * GiB)
    raised = HostCapacity.from_engine(info, cpus=64, memory=128 * GiB)
    assert (raised.cpus, raised.memory) == (8, 32 * GiB)


def test_how_many_servers_of_a_role_fit_and_what_runs_out_first():
    host = HostCapacity(cpus=2, memory=int(23.5 * GiB), reserve_cpus=1)
    assert host.share.cpus == 4.0
    assert host.servers_that_fit(role(2, 4 * GiB)) == (2, "CPUs")
    assert host.servers_that_fit(role(0.5, 4 * GiB)) == (5, "memory")
    assert host.servers_that_fit(role(8, 32 * GiB)) == (0, "memory")
    # 0.1 CPU forty times is 4 CPUs, whatever the float sum says
    assert host.servers_that_fit(role(0.1, GiB // 4))[0] == 40


def test_the_sentence_names_what_is_full():
    assert Shortfall("memory", 30 * GiB, 22 * GiB).sentence() == (
        "the host's memory is fully reserved: 30 GiB of 22 GiB")
    assert Shortfall("CPUs", 6.5, 4).sentence() == (
        "the host's CPUs are fully reserved: 6.5 of 4")


def test_a_start_fits_while_the_sums_stay_within_the_share():
    book = HostBook(HostCapacity(cpus=3, memory=11 * GiB, reserve_cpus=1, reserve_memory=GiB))
    assert book.capacity.share == Reservation(8.0, 10 * GiB)
    for n in range(2):
        assert book.shortfall(Reservation(2, 4 * GiB)) is None
        book.hold(f"s{n}", Reservation(2, 4 * GiB))
    assert book.reserved == Reservation(4, 8 * GiB)
    short = book.shortfall(Reservation(2, 4 * GiB))
    assert short == Shortfall("memory", 12 * GiB, 10 * GiB)
    # memory is named before CPUs when both are short
    assert book.shortfall(Reservation(5, 4 * GiB)).resource == "memory"
    assert book.shortfall(Reservation(5, GiB)) == Shortfall("CPUs", 9, 8)
    # a restart of s0 replaces its own holding
    assert book.shortfall(Reservation(2, 6 * GiB), owner="s0") is None
    book.release("s0")
    assert book.shortfall(Reservation(2, 4 * GiB)) is None
    assert book.release("gone") is None


def test_a_container_found_running_is_counted_even_past_the_share():
    book = HostBook(HostCapacity(cpus=2, memory=4 * GiB))
    book.hold("adopted", Reservation(8, 32 * GiB))
    book.hold("adopted", Reservation(8, 32 * GiB))  # seen again: counted once
    assert book.reserved == Reservation(8, 32 * GiB)
    assert book.shortfall(Reservation(0.5, GiB)).resource == "memory"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.booleans(),
                          st.sampled_from([0.1, 0.25, 0.5, 1, 2, 8]),
                          st.integers(0, 64 * GiB)), max_size=60))
def test_the_running_sums_are_the_sums_of_the_holdings(steps):
    book = HostBook(HostCapacity(cpus=16, memory=64 * GiB))
    for owner, hold, cpus, memory in steps:
        if hold:
            book.hold(owner, Reservation(cpus, memory))
        else:
            book.release(owner)
    held = [book.holding(o) for o in book.owners()]
    assert book.reserved.memory == sum(r.memory for r in held)
    assert math.isclose(book.reserved.cpus, sum(r.cpus for r in held), abs_tol=1e-9)
