"""Login to a loaded JupyterLab in Chromium: a pre-warmed class against cold starts, in one run.

One real hub (the shipped config with the usage service and its class dashboard),
configurable-http-proxy, the test Docker engine and a real Chromium (Playwright):

1. N students (``--students``, default 20) in group cs101, N more "cold" students
   created outside any group, and the instructor prof-ada (cs101-staff; the class
   cs101 is hers).
2. prof-ada logs in through the hub's login form in Chromium and pre-warms the class
   through the product's own feature: ``POST /services/usage/api/classes/cs101/prewarm``
   ``{"role", "image"}`` from her browser (the ``_xsrf`` cookie's value as
   ``X-XSRFToken``, as the service's pages send it). The bench waits, with the hub's
   API, until every student's server is ready, and reports how long that took.
   Only then do the cold students join cs101, so the pre-warm never started them.
3. Then, taking turns (so drift and the growing number of running servers hit both
   kinds alike), one pre-warmed student and one cold student, each in a fresh
   browser context (no cookies, no cache), as a person does it:

   - pre-warmed: the hub's login page, fill in name and demo password, and the clock
     runs from the click on "Sign in" until JupyterLab's launcher (``.jp-Launcher``)
     is on screen, following wherever the hub sends them (a running server: the hub
     redirects to /user/<name>/, OAuth, then /lab). That end is taken in the page: the
     first animation frame in which the launcher has a size, recorded by an init script
     (bench/lab_load_trace.py's ``LAUNCHER_SCRIPT``), not when Playwright's polling
     wait sees it, which came 0.1 to 0.3 s later. The lab page's HTML arriving
     (Navigation Timing ``responseEnd`` of the lab document, on the wall clock) is
     the hub, proxy and server's share; from there to the launcher, Chromium loading
     JupyterLab (its scripts, extensions, settings and the launcher's first paint).
   - pre-warmed, cached browser (``--no-cached`` skips it): right after, the same
     student logs out (not timed) and in again in the same browser context, so
     JupyterLab's scripts come from Chromium's cache, as for a student back for the
     next lab session (pre-warmed again) in the same browser. Not part of the ratio.
   - cold: the same login, then the spawn form (the same role and image picked),
     submit, the spawn-pending page, until the launcher is on screen (the same
     in-page frame). Timed from the login submit (with the few ms the bench takes to
     pick the choice) and from the spawn-form submit.

A warm-up (an unmeasured cold login of a cs101-staff user) runs first: image layers,
page cache and Chromium's first start are not charged to anyone. Servers stay up
until the end, as in a class in session.

    .venv/bin/python bench/prewarm_bench.py                # 20 + 20 students
    .venv/bin/python bench/prewarm_bench.py --quick        # 3 + 3, a smoke run
    .venv/bin/python bench/prewarm_bench.py --students 5 --role student --image pytorch

The goal: a pre-warmed student's median under 1 s. Containers, volumes and the hub
are removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from baseline import QUOTA_CONFIG, pct  # noqa: E402
from browser import CHROMIUM, CHROMIUM_ARGS, password, usage_config  # noqa: E402
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright  # noqa: E402

from harness import ROOT, Hub, cleanup, ensure_engine, free_port  # noqa: E402
from spawner.quota.loader import load_quota_table  # noqa: E402

TARGET = 1.0  # seconds: a pre-warmed student's median, login submit to a loaded JupyterLab
CLASS, STAFF, INSTRUCTOR = "cs101", "cs101-staff", "prof-ada"
LAB_TIMEOUT_MS = 180_000  # a cold start on a busy 2-core machine can take a while
SUBMIT = "input[type=submit], button[type=submit]"
SPAWN_SUBMIT = "form#spawn_form input[type=submit], form#spawn_form button[type=submit]"


def cheapest_choice(quota_file: Path) -> tuple[str, str]:
    """The cheapest CPU-only (role, image) a member of the class may start."""
    table = load_quota_table(quota_file)
    choices = [c for c in table.choices_for("student", [CLASS]) if not c.role.gpus]
    if not choices:
        raise SystemExit(f"{CLASS} holds no CPU-only role in {quota_file}")
    best = min(choices, key=lambda c: (c.role.cpus, c.role.memory))
    return best.role.name, best.image.key


@dataclass
class Sample:
    """One student's login; seconds, None where not measured."""

    user: str
    total: float | None = None  # login submit -> the launcher's first frame on screen
    served: float | None = None  # login submit -> the lab page's HTML arrived
    loaded: float | None = None  # login submit -> the lab page's load event ended
    browser: float | None = None  # the lab page's HTML arrived -> the launcher's frame
    fetched: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, URL)
    form: float | None = None  # login submit -> spawn form shown (cold)
    after_form: float | None = None  # spawn-form submit -> the launcher's frame (cold)
    url: str = ""
    error: str = ""


@dataclass
class Results:
    warm: list[Sample] = field(default_factory=list)
    cold: list[Sample] = field(default_factory=list)
    cached: list[Sample] = field(default_factory=list)  # pre-warmed, logging in again
    prewarm_seconds: float = 0.0


def lab_clock():
    """bench/lab_load_trace.py: its init script records the launcher's first frame in
    the page. Imported on first use, since it imports this module."""
    import lab_load_trace

    return lab_load_trace


def new_context(browser: Browser) -> BrowserContext:
    """A fresh browser context (no cookies, no cache) that records the launcher's frame."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(lab_clock().LAUNCHER_SCRIPT)
    return context


def submit_login(page: Page, hub: Hub, name: str) -> tuple[float, float]:
    """The hub's login page as typed in the address bar, filled in, submitted; returns
    the perf_counter and the wall clock at the click on the submit button."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password(name))
    start, epoch = time.perf_counter(), time.time()
    page.click(SUBMIT, no_wait_after=True)
    return start, epoch


def lab_page(page: Page, epoch: float
             ) -> tuple[float | None, float | None, list[tuple[float, float, str]]]:
    """When the lab page's HTML had arrived and when its load event ended, in seconds
    after ``epoch`` (wall clock; Chromium runs on this machine), and what it fetched
    (start, end, URL) in the same terms. Absolute times, so it does not matter which navigation
    of the redirect chain the document's time origin is."""
    found = json.loads(page.evaluate("""JSON.stringify((() => {
        const n = performance.getEntriesByType('navigation')[0];
        return n ? {origin: performance.timeOrigin, html: n.responseEnd,
                    load: n.loadEventEnd || null,
                    fetched: performance.getEntriesByType('resource').map(
                        r => [r.startTime, r.responseEnd, r.name])} : null;
    })())"""))
    if not found:
        return None, None, []

    def after(ms: float | None) -> float | None:
        return (found["origin"] + ms) / 1000 - epoch if ms else None

    fetched = [(after(a) or 0.0, after(b) or 0.0, url) for a, b, url in found["fetched"]]
    return after(found["html"]), after(found["load"]), fetched


def timed_lab(sample: Sample, page: Page, epoch: float) -> Sample:
    sample.served, sample.loaded, sample.fetched = lab_page(page, epoch)
    if sample.served is not None and sample.total is not None:
        sample.browser = sample.total - sample.served
    return sample


def warm_login(context: BrowserContext, hub: Hub, name: str, again: bool = False) -> Sample:
    """A login to a running server; ``again``: log out first (not timed), so the login
    finds the browser's cache from the one before, as a returning student's does."""
    page = context.pages[0] if context.pages else context.new_page()
    if again:
        page.goto(f"{hub.url}/hub/logout")
    _, epoch = submit_login(page, hub, name)
    total = lab_clock().wait_for_launcher(page, epoch, LAB_TIMEOUT_MS)
    return timed_lab(Sample(name, total=total, url=page.url.removeprefix(hub.url)),
                     page, epoch)


def cold_login(browser: Browser, hub: Hub, name: str, role: str, image: str) -> Sample:
    context = new_context(browser)
    try:
        page = context.new_page()
        start, epoch = submit_login(page, hub, name)
        choice = page.locator(f".quota-choice[data-role='{role}'][data-image='{image}']")
        choice.wait_for(state="visible", timeout=60_000)
        form = time.perf_counter() - start
        choice.click()
        spawn = time.time() - epoch
        page.click(SPAWN_SUBMIT, no_wait_after=True)
        total = lab_clock().wait_for_launcher(page, epoch, LAB_TIMEOUT_MS)
        return timed_lab(Sample(name, total=total, form=form, after_form=total - spawn,
                                url=page.url.removeprefix(hub.url)), page, epoch)
    finally:
        context.close()


def prewarm(browser: Browser, hub: Hub, students: list[str], role: str, image: str) -> float:
    """prof-ada pre-warms the class from her browser; seconds from her POST until the
    hub reports every student's server ready."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{hub.url}/hub/login?next=/hub/home")
        page.fill("input[name=username]", INSTRUCTOR)
        page.fill("input[name=password]", password(INSTRUCTOR))
        page.click(SUBMIT)
        page.wait_for_url("**/hub/home")
        # A navigation to the service logs her in to it (the hub's OAuth); its JSON
        # names the classes she may pre-warm.
        response = page.goto(f"{hub.url}/services/usage/api/classes")
        assert response is not None and response.status == 200, (
            response and f"{response.status} {response.text()[:500]}")
        assert CLASS in response.text(), response.text()[:500]
        api = f"{hub.url}/services/usage/api/classes/{CLASS}/prewarm"
        # The service's own _xsrf cookie: the one the browser sends to its API.
        xsrf = next((c["value"] for c in context.cookies(api) if c["name"] == "_xsrf"), "")
        start = time.perf_counter()
        r = context.request.post(api, headers={"X-XSRFToken": xsrf}, fail_on_status_code=False,
                                 data={"role": role, "image": image})
        assert r.status == 200, f"pre-warm refused: {r.status} {r.text()[:1000]}"
        results = r.json()["results"]
        bad = [x for x in results if x["outcome"] not in ("started", "starting")]
        assert not bad, f"pre-warm did not start everyone: {bad}"
        assert sorted(x["user"] for x in results) == sorted(students), results
    finally:
        context.close()
    for name in students:
        hub.wait_ready(name, timeout=600)
    return time.perf_counter() - start


def measure(label: str, call: Callable[[], Sample], name: str, keep_going: bool,
            trace: int = 0) -> Sample:
    try:
        sample = call()
    except Exception as e:
        if not keep_going:
            raise
        sample = Sample(name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        print(f"  {label:<6} {name:<14} FAILED {sample.error}", flush=True)
        return sample
    extra = "".join(f"  {key} {value:6.3f}s" for key, value in (
        ("form", sample.form), ("after form", sample.after_form), ("html", sample.served),
        ("load", sample.loaded)) if value is not None) + f"  {len(sample.fetched)} fetches"
    print(f"  {label:<6} {name:<14} {sample.total:7.3f}s{extra}  -> {sample.url}", flush=True)
    if trace:
        # What the launcher waited for last: the fetches that ended last.
        for start, end, url in sorted(sample.fetched, key=lambda f: f[1])[-trace:]:
            print(f"           {start:6.3f} -> {end:6.3f}s  {url.split('/', 3)[-1][:100]}")
    return sample


def run(args: argparse.Namespace, hub: Hub) -> Results:
    n = args.students
    warm_names = [f"stu-w{i:02d}" for i in range(n)]
    cold_names = [f"stu-c{i:02d}" for i in range(n)]
    results = Results()
    hub.start()
    hub.create_user(INSTRUCTOR, [STAFF])
    hub.create_user("warmup-ta", [STAFF])  # holds the class's roles, not in the class
    for name in warm_names:
        hub.create_user(name, [CLASS])
    for name in cold_names:
        hub.create_user(name)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            print(f"Chromium {browser.version}; warm-up (unmeasured)...", flush=True)
            measure("warmup", lambda: cold_login(browser, hub, "warmup-ta", args.role,
                                                 args.image), "warmup-ta", False)
            hub.stop_server("warmup-ta")
            print(f"pre-warming {CLASS} ({n} students, {args.role} with {args.image}) "
                  f"as {INSTRUCTOR} through the class dashboard API...", flush=True)
            results.prewarm_seconds = prewarm(browser, hub, warm_names, args.role, args.image)
            print(f"  every server ready {results.prewarm_seconds:.1f}s after the POST",
                  flush=True)
            r = hub.api("POST", f"/groups/{CLASS}/users", json={"users": cold_names})
            assert r.status_code == 200, r.text
            for warm, cold in zip(warm_names, cold_names, strict=True):
                context = new_context(browser)
                try:
                    first = measure("warm", lambda w=warm, x=context: warm_login(
                        x, hub, w), warm, args.keep_going, args.trace)
                    results.warm.append(first)
                    if args.cached and not first.error:
                        results.cached.append(measure("cached", lambda w=warm, x=context:
                                                      warm_login(x, hub, w, again=True),
                                                      warm, args.keep_going, args.trace))
                finally:
                    context.close()
                results.cold.append(measure("cold", lambda c=cold: cold_login(
                    browser, hub, c, args.role, args.image), cold, args.keep_going))
        finally:
            browser.close()
    return results


def stats(values: list[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7} {'-':>7} {'-':>7}"
    return (f"{statistics.median(values):7.3f} {pct(values, 0.95):7.3f} "
            f"{min(values):7.3f} {max(values):7.3f}")


def report(args: argparse.Namespace, results: Results) -> None:
    def of(samples: list[Sample], key: str) -> list[float]:
        return [getattr(s, key) for s in samples if not s.error and getattr(s, key) is not None]

    warm, cold = of(results.warm, "total"), of(results.cold, "total")
    print(f"\n== login to a loaded JupyterLab in Chromium: {args.students} pre-warmed and "
          f"{args.students} cold students, {args.role} with {args.image}, "
          f"{os.cpu_count()} CPUs")
    print(f"  pre-warm of {args.students} servers (POST to all ready): "
          f"{results.prewarm_seconds:.1f}s")
    print(f"  {'seconds':<44} {'median':>7} {'p95':>7} {'min':>7} {'max':>7}")
    rows = [
        ("pre-warmed: login submit -> JupyterLab", warm),
        ("  login submit -> lab page HTML", of(results.warm, "served")),
        ("  login submit -> lab page load event", of(results.warm, "loaded")),
        ("  lab page HTML -> launcher (Chromium)", of(results.warm, "browser")),
        ("pre-warmed, cached browser: the same", of(results.cached, "total")),
        ("  lab page HTML -> launcher (Chromium)", of(results.cached, "browser")),
        ("cold: login submit -> JupyterLab", cold),
        ("  login submit -> spawn form", of(results.cold, "form")),
        ("  spawn-form submit -> JupyterLab", of(results.cold, "after_form")),
        ("  login submit -> lab page HTML", of(results.cold, "served")),
        ("  lab page HTML -> launcher (Chromium)", of(results.cold, "browser")),
    ]
    for label, values in rows:
        print(f"  {label:<44} {stats(values)}")
    failed = [s for s in results.warm + results.cached + results.cold if s.error]
    if failed:
        print(f"  FAILED logins ({len(failed)}, left out above): "
              + ", ".join(f"{s.user} ({s.error})" for s in failed))
    if warm and cold:
        print("\nratios (cold / pre-warmed; higher: pre-warming saves more):")
        print(f"  {'median':<28} {statistics.median(cold) / statistics.median(warm):5.2f}")
        print(f"  {'p95':<28} {pct(cold, 0.95) / pct(warm, 0.95):5.2f}")
    if warm:
        median = statistics.median(warm)
        verdict = "ok" if median < TARGET else "MISSED"
        print(f"\npre-warmed median {median:.3f}s, target under {TARGET:g}s: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=20,
                        help="pre-warmed students, and as many cold ones (default 20)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 + 3 students")
    parser.add_argument("--role", help="default: the class's cheapest CPU role")
    parser.add_argument("--image", help="default: that role's first image")
    parser.add_argument("--cached", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each pre-warmed student's second login (logged "
                             "out first), with the browser cache of the first (default on)")
    parser.add_argument("--trace", type=int, default=0, metavar="K",
                        help="after each pre-warmed login, the K fetches of the lab page "
                             "that ended last (seconds after the login submit)")
    parser.add_argument("--keep-going", action="store_true",
                        help="a failed login is reported and left out, not fatal")
    args = parser.parse_args()
    if args.quick:
        args.students = 3
    if args.students < 1:
        parser.error("--students must be at least 1")
    quota_file = ROOT / "hub_config" / "quotas.yaml"
    role, image = cheapest_choice(quota_file)
    args.role, args.image = args.role or role, args.image or image
    # SIGTERM (a CI timeout, kill) ends the run through the finally below, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    client = ensure_engine()
    prefix = f"qsprewarm{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="prewarm-bench-"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"pre-warm benchmark: {args.students} + {args.students} students, "
          f"{os.cpu_count()} CPUs, load average {load}; containers {prefix}-*", flush=True)
    hub = Hub(work / "hub", quota_file.read_text(), prefix=prefix,
              extra_config=QUOTA_CONFIG + usage_config(free_port(), {CLASS: [INSTRUCTOR]}))
    ok = False
    try:
        results = run(args, hub)
        ok = True
    except KeyboardInterrupt:
        print(f"\ninterrupted; cleaning up (hub log: {hub.log_path})", file=sys.stderr)
        raise
    except Exception:
        print(f"\nhub log: {hub.log_path}, its end:\n{hub.log()[-3000:]}", file=sys.stderr)
        raise
    finally:
        # Each step on its own: Ctrl-C also reaches the hub and Chromium, and a
        # failed step must not leave containers behind.
        for step in (hub.stop, lambda: cleanup(client, prefix)):
            try:
                step()
            except Exception as e:
                print(f"cleanup: {type(e).__name__}: {e}", file=sys.stderr)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
    report(args, results)


if __name__ == "__main__":
    main()
