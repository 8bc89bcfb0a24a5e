"""Victim choice for a GPU request (spawner/gpu/preemption.py): hand-written cases for
each rule of the module docstring, and a property test against a brute-force model that
tries every subset of eligible servers."""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.gpu.allocator import GpuAllocator, GpuRequest, NoGpuFree, fits
from spawner.gpu.inventory import GpuDevice
from spawner.gpu.preemption import (
    NO_VICTIM,
    PRIORITY_OFFSET,
    Plan,
    Running,
    choose_victims,
    cost,
)

EX = GpuRequest(1)
OFF = PRIORITY_OFFSET  # what cost() adds to each priority in its sum
Holders = dict[str, dict[str, GpuRequest]]


def shared(share: int, count: int = 1) -> GpuRequest:
    return GpuRequest(count, "shared", share)


def run(owner: str, priority: int, age: float = 1000.0, min_runtime: float = 0.0,
        protected: bool = False) -> Running:
    return Running(owner, priority, age, min_runtime, protected)


def servers(*found: Running) -> dict[str, Running]:
    return {s.owner: s for s in found}


def exclusive_gpus(**owners: str | None) -> Holders:
    """GPU name -> its one exclusive holder (None: a free GPU)."""
    return {uuid: ({owner: EX} if owner else {}) for uuid, owner in owners.items()}


# --- the pieces ------------------------------------------------------------------


def test_eligible_only_strictly_lower_old_enough_and_unprotected():
    assert run("a", 1).eligible(2)
    assert not run("a", 2).eligible(2)  # equal priority: never
    assert not run("a", 3).eligible(2)
    assert not run("a", 1, protected=True).eligible(2)
    assert not run("a", 1, age=59.9, min_runtime=60).eligible(2)
    assert run("a", 1, age=60, min_runtime=60).eligible(2)  # min_runtime passed exactly


def test_cost_orders_as_the_scheduler_does():
    assert cost([]) == (NO_VICTIM, 0.0, 0, 0.0)
    assert cost([run("a", 3, age=10), run("b", 1, age=5)]) == (3, 2 * OFF + 4, 2, 15)
    # the lowest highest priority beats everything else
    assert cost([run("a", 1), run("b", 1), run("c", 1)]) < cost([run("d", 2)])
    assert cost([run("a", 2), run("b", 0)]) < cost([run("c", 2), run("d", 1)])  # sum
    assert cost([run("a", 2)]) < cost([run("b", 2), run("c", 0)])  # fewest
    assert cost([run("a", 2, age=5)]) < cost([run("b", 2, age=50)])  # youngest
    # negative priorities: one victim is cheaper than two of the same priority
    assert cost([run("a", -5)]) < cost([run("b", -5), run("c", -5)])
    assert cost([run("a", -5), run("b", -5)]) < cost([run("c", -5), run("d", -4)])


# --- no plan -----------------------------------------------------------------------


def test_a_request_that_fits_already_gets_no_plan():
    holders = exclusive_gpus(A="a", B=None)
    assert choose_victims(EX, 10, holders, servers(run("a", 0))) is None
    # a shared slot left on a shared GPU counts as fitting too
    holders = {"A": {"s1": shared(2)}}
    assert choose_victims(shared(2), 10, holders, servers(run("s1", 0))) is None


def test_equal_or_higher_priority_is_never_a_victim():
    holders = exclusive_gpus(A="same", B="higher")
    running = servers(run("same", 5), run("higher", 7))
    assert choose_victims(EX, 5, holders, running) is None
    assert choose_victims(EX, 6, holders, running).victims == ("same",)


def test_protected_servers_are_never_chosen():
    holders = exclusive_gpus(A="kept", B="cheap")
    running = servers(run("kept", 0, protected=True), run("cheap", 3))
    assert choose_victims(EX, 10, holders, running).victims == ("cheap",)
    assert choose_victims(EX, 10, exclusive_gpus(A="kept"), running) is None


def test_servers_younger_than_min_runtime_are_never_chosen():
    holders = exclusive_gpus(A="young", B="old")
    running = servers(run("young", 0, age=10, min_runtime=600), run("old", 3, age=700,
                                                                     min_runtime=600))
    assert choose_victims(EX, 10, holders, running).victims == ("old",)
    assert choose_victims(EX, 10, exclusive_gpus(A="young"), running) is None


def test_holders_that_running_does_not_know_are_never_chosen():
    holders = exclusive_gpus(A="unknown", B="known")
    running = servers(run("known", 3))
    assert choose_victims(EX, 10, holders, running).victims == ("known",)
    assert choose_victims(EX, 10, exclusive_gpus(A="unknown"), running) is None


def test_unavailable_gpus_are_never_used():
    holders = exclusive_gpus(A="cheap", B="dear", C=None)
    running = servers(run("cheap", 0), run("dear", 3))
    # C is free but unavailable: preempt, and on B since A is unavailable too
    plan = choose_victims(EX, 10, holders, running, unavailable={"A", "C"})
    assert (plan.victims, plan.uuids) == (("dear",), ("B",))
    assert choose_victims(EX, 10, holders, running, unavailable={"A", "B", "C"}) is None


# --- the cheapest GPU ----------------------------------------------------------------


def test_lowest_priority_first():
    holders = exclusive_gpus(A="p2", B="p1", C="p3")
    running = servers(run("p2", 2, age=1), run("p1", 1, age=9999), run("p3", 3))
    plan = choose_victims(EX, 10, holders, running)
    assert plan == Plan(("p1",), ("B",), cost([running["p1"]]))


def test_then_the_smallest_sum_of_priorities():
    # both GPUs' highest victim priority is 2; B's victims sum to 3, A's to 4
    holders = {"A": {"a1": shared(4), "a2": shared(4)}, "B": {"b1": shared(4), "b2": shared(4)}}
    running = servers(run("a1", 2), run("a2", 2), run("b1", 2), run("b2", 1))
    plan = choose_victims(EX, 10, holders, running)
    assert (plan.victims, plan.uuids) == (("b1", "b2"), ("B",))


def test_then_the_fewest_victims():
    # highest 2 and sum 2 on both: B has one victim, A two
    holders = {"A": {"a1": shared(4), "a2": shared(4)}, "B": {"b": EX}}
    running = servers(run("a1", 2), run("a2", 0), run("b", 2))
    plan = choose_victims(EX, 10, holders, running)
    assert (plan.victims, plan.uuids) == (("b",), ("B",))


def test_then_the_least_work_lost():
    holders = exclusive_gpus(A="old", B="young", C="older")
    running = servers(run("old", 1, age=5000), run("young", 1, age=1000),
                      run("older", 1, age=9000))
    plan = choose_victims(EX, 10, holders, running)
    assert (plan.victims, plan.uuids) == (("young",), ("B",))
    assert plan.key == (1, OFF + 1, 1, 1000)


def test_a_free_gpu_is_used_before_any_victim_and_freed_gpus_come_first():
    holders = exclusive_gpus(A=None, B="b", C="c")
    running = servers(run("b", 1), run("c", 2))
    plan = choose_victims(GpuRequest(2), 10, holders, running)
    assert plan.victims == ("b",)
    assert plan.uuids == ("B", "A")  # the victim's GPU first, then the free one


def test_multi_gpu_request_takes_the_cheapest_gpus():
    holders = exclusive_gpus(A="p3", B="p1", C="p2", D="p0-protected")
    running = servers(run("p3", 3), run("p1", 1), run("p2", 2),
                      run("p0-protected", 0, protected=True))
    plan = choose_victims(GpuRequest(2), 10, holders, running)
    assert (plan.victims, set(plan.uuids)) == (("p1", "p2"), {"B", "C"})
    assert plan.key == (2, 2 * OFF + 3, 2, 2000.0)
    assert choose_victims(GpuRequest(4), 10, holders, running) is None
    assert choose_victims(GpuRequest(3), 10, holders, running).victims == ("p1", "p2", "p3")


# --- shared GPUs -------------------------------------------------------------------


def test_a_shared_slot_is_freed_by_removing_one_shared_holder():
    holders = {"A": {"s1": shared(3), "s2": shared(3), "s3": shared(3)}}
    running = servers(run("s1", 1, age=50), run("s2", 1, age=10), run("s3", 2))
    plan = choose_victims(shared(3), 10, holders, running)
    # one is enough; the least important goes: lowest priority, then the youngest
    assert (plan.victims, plan.uuids) == (("s2",), ("A",))


def test_an_exclusive_holder_blocks_a_shared_request():
    holders = {"A": {"x": EX}, "B": {"s1": shared(2), "s2": shared(2)}}
    running = servers(run("x", 1), run("s1", 5), run("s2", 5))
    plan = choose_victims(shared(4), 10, holders, running)
    assert (plan.victims, plan.uuids) == (("x",), ("A",))


def test_a_small_share_is_what_has_to_go():
    # b and c could stay with each other, a (share 2) with either alone: the
    # most important is spared first, so the two cheap ones go rather than a
    holders = {"A": {"a": shared(2), "b": shared(8), "c": shared(8)}}
    running = servers(run("a", 3), run("b", 1), run("c", 1))
    plan = choose_victims(shared(8), 10, holders, running)
    assert plan.victims == ("b", "c") and plan.key[0] == 1
    # a request of equal priority to a may still remove only b and c
    assert choose_victims(shared(8), 3, holders, running).victims == ("b", "c")
    # with c protected, a must go
    running["c"] = run("c", 1, protected=True)
    assert choose_victims(shared(8), 10, holders, running).victims == ("a",)


def test_a_shared_request_never_joins_an_exclusive_holder_left_in_place():
    holders = {"A": {"x": EX, "s": shared(4)}}  # an adopted conflict
    running = servers(run("s", 0), run("x", 50))
    assert choose_victims(shared(4), 10, holders, running) is None


# --- multi-GPU victims and the last pass -------------------------------------------


def test_a_multi_gpu_victim_frees_all_its_gpus():
    holders = {"A": {"v": GpuRequest(2)}, "B": {"v": GpuRequest(2)}, "C": {"w": EX}}
    running = servers(run("v", 1), run("w", 2))
    plan = choose_victims(GpuRequest(2), 10, holders, running)
    assert (plan.victims, set(plan.uuids)) == (("v",), {"A", "B"})
    assert plan.key == cost([running["v"]])  # counted once, not once a GPU
    one = choose_victims(EX, 10, holders, running)
    assert one.victims == ("v",) and len(one.uuids) == 1


def test_the_last_pass_spares_a_victim_the_request_does_not_need():
    # per GPU, C (u, priority 0) and A (v, priority 1) are cheapest; but v holds B too,
    # so once v goes the request has A and B and u is spared
    holders = {"A": {"v": GpuRequest(2)}, "B": {"v": GpuRequest(2)}, "C": {"u": EX}}
    running = servers(run("v", 1), run("u", 0))
    plan = choose_victims(GpuRequest(2), 10, holders, running)
    assert plan == Plan(("v",), ("A", "B"), cost([running["v"]]))


def test_known_limit_a_multi_gpu_victim_is_costed_once_a_gpu():
    # docs/preemption.md#known-limits: per GPU, v (two GPUs) costs as much as b (one),
    # so the scheduler's heuristic takes a and b; {v} alone would be cheaper. The plan
    # is still minimal and has the lowest highest-priority victim possible (1).
    holders = {"G0": {"a": EX}, "G1": {"b": EX}, "G2": {"v": GpuRequest(2)},
               "G3": {"v": GpuRequest(2)}}
    running = servers(run("a", 0), run("b", 1), run("v", 1))
    plan = choose_victims(GpuRequest(2), 10, holders, running)
    assert plan.victims == ("a", "b")
    assert plan.key[0] == cost([running["v"]])[0] and cost([running["v"]]) < plan.key


# --- a property test against brute force ---------------------------------------------


@dataclass
class Instance:
    holders: Holders
    running: dict[str, Running]
    request: GpuRequest
    priority: int
    unavailable: frozenset[str]
    multi_gpu_holders: bool


def _holding(draw: st.DrawFn) -> GpuRequest:
    count = draw(st.integers(1, 2))
    if draw(st.booleans()):
        return GpuRequest(count)
    return shared(draw(st.integers(1, 4)), count)


@st.composite
def instances(draw: st.DrawFn, single_gpu: bool = False, exclusive: bool = False,
              priorities: tuple[int, int] = (-2, 4)) -> Instance:
    """A pool built through a real GpuAllocator, so every holding is one `fits` allows;
    ``exclude`` varies where holders land."""
    n = draw(st.integers(1, 5))
    uuids = [f"G{i}" for i in range(n)]
    alloc = GpuAllocator([GpuDevice(str(i), u) for i, u in enumerate(uuids)])
    running: dict[str, Running] = {}
    prio = st.integers(*priorities)
    for i in range(draw(st.integers(0, 7)) if n < 3 else draw(st.integers(n, 7))):
        want = _holding(draw)
        if single_gpu:
            want = GpuRequest(1, want.mode, want.share)
        owner = f"s{i}"
        try:
            alloc.acquire(owner, want, exclude=draw(st.sets(st.sampled_from(uuids))))
        except NoGpuFree:
            continue
        if draw(st.integers(0, 9)) == 0:
            continue  # unknown to preemption: never a victim
        # most servers are old enough and unprotected, so most cases need a plan
        running[owner] = Running(owner, draw(prio), float(draw(st.integers(0, 4))),
                                 float(draw(st.sampled_from((0, 0, 1, 3)))),
                                 draw(st.integers(0, 5)) == 0)
    request = GpuRequest(draw(st.integers(1, 3))) if exclusive else _holding(draw)
    if not exclusive:
        request = GpuRequest(draw(st.integers(1, 3)), request.mode, request.share)
    holders, _ = alloc.snapshot()
    multi = any(len(h.uuids) > 1 for h in alloc.holdings().values())
    low, high = priorities
    priority = draw(st.one_of(st.integers(low, high), st.just(high + 1)))
    unavailable = draw(st.one_of(st.just(set()), st.sets(st.sampled_from(uuids), max_size=2)))
    return Instance(holders, running, request, priority, frozenset(unavailable), multi)


def fitting(request: GpuRequest, holders: Holders, gone: Collection[str],
            unavailable: Collection[str]) -> list[str]:
    return [u for u, on in holders.items() if u not in unavailable
            and fits(request, {o: r for o, r in on.items() if o not in gone})]


def feasible(case: Instance, gone: Collection[str]) -> bool:
    return len(fitting(case.request, case.holders, gone, case.unavailable)) >= case.request.count


@dataclass
class Brute:
    fits_already: bool
    minimal: list[frozenset[str]]  # every minimal feasible set of victims
    best: tuple[float, ...] | None  # the lowest cost() among them


def brute_force(case: Instance) -> Brute:
    eligible = sorted(o for o, s in case.running.items() if s.eligible(case.priority))
    minimal = []
    for size in range(1, len(eligible) + 1):
        for subset in map(frozenset, itertools.combinations(eligible, size)):
            if feasible(case, subset) and not any(feasible(case, subset - {v}) for v in subset):
                minimal.append(subset)
    best = min((cost(case.running[o] for o in s) for s in minimal), default=None)
    return Brute(feasible(case, ()), minimal, best)


def check_plan(case: Instance, plan: Plan | None, brute: Brute) -> None:
    """(a) to (d) of the brief: a plan iff one is needed and possible; eligible, feasible,
    minimal, and with the lowest possible highest victim priority."""
    if brute.fits_already or not brute.minimal:
        assert plan is None
        return
    assert plan is not None
    victims = set(plan.victims)
    assert all(case.running[v].eligible(case.priority) for v in victims)  # (b)
    assert len(plan.uuids) == case.request.count == len(set(plan.uuids))
    assert set(plan.uuids) <= set(fitting(case.request, case.holders, victims,
                                          case.unavailable))  # (c): feasible
    assert not any(feasible(case, victims - {v}) for v in victims)  # (c): minimal
    assert frozenset(victims) in brute.minimal
    assert plan.key == cost(case.running[v] for v in victims)
    assert plan.key[0] == brute.best[0]  # (d)


def decide(case: Instance) -> Plan | None:
    return choose_victims(case.request, case.priority, case.holders, case.running,
                          case.unavailable)


PROPERTY = settings(max_examples=600, deadline=None, database=None)


@PROPERTY
@given(instances())
def test_plans_are_eligible_feasible_minimal_and_lowest_in_priority(case: Instance):
    check_plan(case, decide(case), brute_force(case))


@PROPERTY
@given(instances(single_gpu=True, exclusive=True, priorities=(0, 4)))
def test_single_gpu_exclusive_plans_cost_the_least(case: Instance):
    """(e) With one-GPU holdings and an exclusive request, each GPU's victims are all
    its holders and no two GPUs share one, so the plan must be the cheapest there is."""
    plan, brute = decide(case), brute_force(case)
    check_plan(case, plan, brute)
    if plan is not None:
        assert plan.key == brute.best


def test_negative_priorities_never_make_more_victims_look_cheaper():
    # before cost() offset each priority, C's two victims summed to less than B's one,
    # and the last pass then kept whichever its importance order reached last
    holders = {"A": {}, "B": {"b": EX}, "C": {"c1": shared(2), "c2": shared(2)}}
    running = servers(run("b", -1, age=0), run("c1", -1, age=1), run("c2", -1, age=0))
    plan = choose_victims(GpuRequest(2), 0, holders, running)
    assert (plan.victims, plan.uuids) == (("b",), ("B", "A"))
    assert choose_victims(EX, 0, holders, running) is None  # the free GPU first


@PROPERTY
@given(instances(single_gpu=True, exclusive=True, priorities=(-2, 2)))
def test_single_gpu_exclusive_plans_cost_the_least_with_negative_priorities(case: Instance):
    plan, brute = decide(case), brute_force(case)
    check_plan(case, plan, brute)
    if plan is not None:
        assert plan.key == brute.best


def test_the_brute_force_model_agrees_on_the_hand_written_cases():
    # a sanity check of the model itself, on the last-pass case
    case = Instance({"A": {"v": GpuRequest(2)}, "B": {"v": GpuRequest(2)}, "C": {"u": EX}},
                    servers(run("v", 1), run("u", 0)), GpuRequest(2), 10, frozenset(), True)
    brute = brute_force(case)
    assert not brute.fits_already
    assert brute.minimal == [frozenset({"v"})]  # {u, v} is feasible but not minimal
    assert brute.best == cost([case.running["v"]])
