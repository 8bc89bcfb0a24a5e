"""A server's startup does not count in its CPU peak: the samples of the first
STARTUP_WINDOW seconds after it was ready (else after its container started) keep to the
sums, so the right-sizing advice reads what the session used once it was up. Real SQLite
ledgers in tmp_path, written with the hub's and the watchdog's own calls."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from spawner.quota.model import QuotaTable, Role
from spawner.usage.ledger import STARTUP_WINDOW, Ledger, Sample
from spawner.usage.report import build_report
from spawner.usage.schema import sessions

G = 2**30
H = 3600.0
HUB = "hub-a"


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    yield ledger
    ledger.dispose()


def start(ledger: Ledger, container: str, *, user: str = "ada", started: float | None,
          ready: float | None, cpus: float = 2.0) -> int:
    session = ledger.open(hub=HUB, user=user, container=container, role="big", image="py",
                          cpu_limit=cpus, mem_limit=4 * G, groups=["cs101"],
                          requested=(started or 0.0) - 5)
    if started is not None:
        ledger.started(HUB, container, f"id-{container}", when=started)
    if ready is not None:
        ledger.ready(HUB, container, when=ready)
    return session


def cpu_of(ledger: Ledger, session: int) -> tuple[int, float, float | None, int | None]:
    with ledger.engine.connect() as connection:
        r = connection.execute(select(
            sessions.c.cpu_samples, sessions.c.cpu_sum, sessions.c.cpu_peak,
            sessions.c.mem_peak).where(sessions.c.id == session)).one()
    return r.cpu_samples, r.cpu_sum, r.cpu_peak, r.mem_peak


def test_the_window_is_a_minute():
    assert STARTUP_WINDOW == 60.0


def test_the_cpu_peak_leaves_out_the_startup_after_ready(ledger):
    session = start(ledger, "c1", started=1000.0, ready=1010.0)
    cycles = [(1005.0, 0.4), (1015.0, 0.7), (1040.0, 0.6), (1069.0, 0.5),  # starting up
              (1070.0, 0.05), (1100.0, 0.02), (1200.0, 0.03)]  # idle, from ready + 60 s
    for t, cpu in cycles:
        ledger.fold([Sample(HUB, "c1", t, cpu=cpu, memory=int(cpu * 10 * G))])
    samples, total, peak, memory_peak = cpu_of(ledger, session)
    assert (samples, peak) == (7, 0.05)
    assert total == pytest.approx(sum(cpu for _, cpu in cycles))  # the mean keeps them all
    assert memory_peak == 7 * G  # the memory peak, too, counts every sample


def test_without_ready_the_window_starts_with_the_container(ledger):
    session = start(ledger, "c1", started=1000.0, ready=None)
    ledger.fold([Sample(HUB, "c1", 1059.0, cpu=0.7)])
    assert cpu_of(ledger, session)[:3] == (1, 0.7, None)
    ledger.fold([Sample(HUB, "c1", 1060.0, cpu=0.1)])
    assert cpu_of(ledger, session)[:3] == (2, pytest.approx(0.8), 0.1)


def test_without_a_start_no_sample_counts_in_the_peak(ledger):
    session = start(ledger, "c1", started=None, ready=None)
    ledger.fold([Sample(HUB, "c1", 5000.0, cpu=1.5, memory=G)])
    assert cpu_of(ledger, session) == (1, 1.5, None, G)


TABLE = QuotaTable(
    path="quotas.yaml", images={},
    roles={r.name: r for r in (
        Role(name="tiny", cpus=0.5, memory=2 * G, images=("py",)),
        Role(name="small", cpus=1, memory=2 * G, images=("py",)),
        Role(name="big", cpus=2, memory=4 * G, images=("py",)),
    )},
    groups={"cs101": ("tiny", "small", "big")},
)


def session_of(ledger: Ledger, container: str, begin: float, cycles: list[float],
               end: float) -> None:
    """A server ready 10 s after its start, sampled every 5 s with these CPU values."""
    start(ledger, container, started=begin, ready=begin + 10)
    for i, cpu in enumerate(cycles):
        ledger.fold([Sample(HUB, container, begin + 15 + 5 * i, cpu=cpu, memory=G)])
    ledger.close(HUB, container, "stopped", when=end)


def advice(ledger: Ledger):
    report = build_report(ledger.engine, since=0, until=100 * H, table=TABLE, now=100 * H)
    (found,) = report.advice
    return found


def test_an_idle_user_is_advised_by_what_they_used_once_up(ledger):
    # JupyterLab loading takes 0.6 cores for the first samples, then the server is idle
    for i in range(6):
        startup = [0.6, 0.65, 0.5] + [0.1] * 8
        session_of(ledger, f"c{i}", i * H, startup + [0.05] * 20, i * H + 1800)
    found = advice(ledger)
    assert (found.sessions, found.cpu_peak, found.suggestion, found.served) == (
        6, 0.05, "tiny", 6)
    assert found.text == (
        "ada used at most 1 GiB of 4 GiB and 0.05 of 2 CPUs over 6 sessions as big; tiny "
        "with 2 GiB and 0.5 CPUs would have served 6 of them.")


def test_sessions_with_no_peak_yet_are_no_evidence(ledger):
    # five sessions used 1.5 cores once up; three ended within their first minute, with
    # samples in the startup window only: they show nothing of the size they needed
    for i in range(5):
        session_of(ledger, f"up{i}", i * H, [0.2] * 12 + [1.5] * 4, i * H + 600)
    for i in range(3):
        session_of(ledger, f"brief{i}", (10 + i) * H, [0.1] * 5, (10 + i) * H + 40)
    found = advice(ledger)
    assert (found.sessions, found.cpu_peak) == (5, 1.5)
    # neither tiny nor small would have served the sessions that were up
    assert (found.suggestion, found.served) == (None, 0)
    # with the brief sessions alone there is no evidence at all
    with ledger.engine.begin() as connection:
        connection.execute(sessions.delete().where(sessions.c.container.like("up%")))
    assert build_report(ledger.engine, since=0, until=100 * H, table=TABLE,
                        now=100 * H).advice == []
