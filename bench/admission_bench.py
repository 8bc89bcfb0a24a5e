"""Host admission: what one check of a start's CPUs and memory costs.

spawner.host.admission.HostBook alone, in this process: a 160-CPU, 2.25 TiB host with
200 running servers of mixed sizes (0.5 to 8 CPUs, 1 to 32 GiB; fixed seed). Each
round checks a start against the book (``shortfall``), then a server stops and
another starts (``release``, ``hold``), so the sums move all the time. Reports
p50/p99/max per call; the target is under 1 ms per check with 200 servers.

For scale, the same checks made the plain way, adding up all 200 reservations at
each check (what a spawner with no book would do), and the ratio of the two.
There is no DockerSpawner figure to compare with: plain DockerSpawner admits
every start and counts nothing.

    .venv/bin/python bench/admission_bench.py [--servers 200] [--rounds 20000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spawner.host.admission import HostBook, HostCapacity, Reservation  # noqa: E402

GiB = 2**30
SIZES = [Reservation(c, m * GiB) for c, m in
         ((0.5, 1), (1, 2), (2, 4), (2, 8), (4, 16), (8, 32))]


def percentiles(samples: list[float]) -> str:
    samples = sorted(samples)
    p = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return (f"p50 {p(0.50) * 1e6:7.2f} µs  p99 {p(0.99) * 1e6:7.2f} µs  "
            f"max {samples[-1] * 1e6:8.2f} µs")


def plain_shortfall(held: dict[str, Reservation], want: Reservation,
                    share: Reservation) -> bool:
    cpus = sum(r.cpus for r in held.values()) + want.cpus
    memory = sum(r.memory for r in held.values()) + want.memory
    return memory > share.memory or cpus > share.cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    rng = random.Random(28)
    book = HostBook(HostCapacity(cpus=160, memory=2304 * GiB))
    for n in range(args.servers):
        book.hold(f"s{n}", rng.choice(SIZES))
    share = book.capacity.share
    held = {o: book.holding(o) for o in book.owners()}

    checks, changes, plain = [], [], []
    fits = 0
    for i in range(args.rounds):
        want = rng.choice(SIZES)
        t0 = time.perf_counter()
        short = book.shortfall(want)
        checks.append(time.perf_counter() - t0)
        fits += short is None
        t0 = time.perf_counter()
        plain_answer = plain_shortfall(held, want, share)
        plain.append(time.perf_counter() - t0)
        assert plain_answer == (short is not None), "the book and the plain sum disagree"
        gone = f"s{rng.randrange(args.servers)}"
        size = rng.choice(SIZES)
        t0 = time.perf_counter()
        book.release(gone)
        book.hold(gone, size)
        changes.append(time.perf_counter() - t0)
        held[gone] = size
        if i % 1000 == 0:  # the running sums stay the sums
            assert abs(book.reserved.cpus - sum(r.cpus for r in held.values())) < 1e-6
            assert book.reserved.memory == sum(r.memory for r in held.values())

    print(f"host admission, {args.servers} running servers, {args.rounds} rounds, "
          f"{fits / args.rounds:.0%} of starts fit")
    print(f"  check (HostBook.shortfall)    {percentiles(checks)}")
    print(f"  stop + start (release, hold)  {percentiles(changes)}")
    print(f"  plain sum over all servers    {percentiles(plain)}")
    ratio = statistics.median(plain) / statistics.median(checks)
    print(f"  plain sum / book, median: {ratio:.1f}x; target: a check under 1 ms: "
          f"{'met' if sorted(checks)[int(0.99 * len(checks))] < 1e-3 else 'MISSED'}")


if __name__ == "__main__":
    main()
