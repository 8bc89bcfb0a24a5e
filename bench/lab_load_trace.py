"""Where the time goes between a pre-warmed student's login and a loaded JupyterLab.

One real hub (the shipped config with the usage service, as bench/prewarm_bench.py
starts it), the test Docker engine and a real Chromium. Each variant is one student
of cs101 whose server (role ``student``) is started before any login, so every login
finds it running, as after a class pre-warm. Then, taking turns across the variants
(so drift and the load of other work on the machine hit each alike), ``--logins``
times: a fresh browser context (no cookies, no cache), the hub's login form, the click
on "Sign in", and the clock runs until JupyterLab's launcher (``.jp-Launcher``) is
visible (``total``; Playwright polls for it, so it may see the launcher up to a few
hundred ms late: ``frame`` is the first animation frame with the launcher on screen,
taken in the page). With ``--cached``, the same student logs out (not timed) and in
again in the same context, as a student back for the next session in the same browser.
``--network MBPS,RTT_MS`` has Chromium emulate a real link instead of loopback.

What each login records, all in seconds after the click:

- the lab page: its HTML arrived (Navigation Timing ``responseEnd``),
  DOMContentLoaded, the load event;
- requests (Resource Timing): how many, bytes on the wire and decoded, how many
  came from the browser's cache, the server's own share (request sent to first
  byte, summed over the API calls) and the slowest calls;
- Chromium's main thread (CDP ``Performance.getMetrics``, from the click to the
  launcher): time in tasks, in scripts, in style recalculation and in layout;
- each JupyterLab plugin's activation: when it started and how long its
  ``activate`` ran (synchronous part) and until its promise settled. Taken by
  wrapping every plugin's ``activate`` as its module is evaluated (a hook on the
  bundles' chunk-loading arrays), so it needs no change to JupyterLab;
- what the page waited for: every ``setTimeout`` of 100 ms or more (who set it, when
  it fired), and every Lumino debouncer or poll scheduled (who invoked it);
- with ``--profile``: a V8 CPU profile (1 ms samples) of the renderer: the main
  thread's busy time per 100 ms, JS time by script file and function, and the
  quiet gaps: no request in flight and the main thread idle (a timer, a
  debounce, or the scheduler waiting for a CPU).

Variants (``--variant NAME=SPEC``, repeatable; default: one, ``shipped``):
SPEC is ``image=TAG`` (run that image, e.g. a build kept from before a change) and/or
``home=DIR`` (copy DIR's files into the student's home volume before the spawn: a
``.jupyter/jupyter_server_config.json`` or ``.jupyter/labconfig/page_config.json``
there overrides the image's for that student only, so a setting can be compared
against the image as built, in the same run, without a rebuild), and/or
``lab-config=DIR`` (``JUPYTER_CONFIG_PATH=DIR`` in the server's environment, set the way
an admin sets it for a class: JupyterHub's ``group_overrides`` on a group of that
variant's student; ``lab-config=/opt/notebook/etc/jupyter-light`` is the images' light
JupyterLab, docs/images.md#a-lighter-jupyterlab-for-a-class), and/or
``early-launcher`` (an experiment, in the page: the launcher opened as soon as
JupyterLab's layout is restored, instead of when the file browser sees the route
done, after the workspace's debounced save; the images' lab extension now does this
itself, its ``early-launcher`` plugin, so this is for an image built before it,
``image=TAG,early-launcher``), and/or ``bare`` (the floor: the same image's JupyterLab
run straight, ``jupyter lab`` with the role's CPUs and memory, no hub, no proxy, no login;
the clock starts when the browser is sent to its ``/lab``), and/or ``no-product`` (with
``bare``: the product's own extensions off too, the GPU monitor's server extension and
the ``@quota-spawner/gpu-status`` lab extension, so the floor is JupyterLab alone),
joined with ``,``.

    .venv/bin/python bench/lab_load_trace.py                       # 5 logins, shipped image
    .venv/bin/python bench/lab_load_trace.py --logins 9 --cached --detail 1
    .venv/bin/python bench/lab_load_trace.py --logins 7 --variant before=image=TAG \\
        --variant after=image=quota-spawner/pytorch:latest
    .venv/bin/python bench/lab_load_trace.py --logins 5 --variant stock= \\
        --variant light=lab-config=/opt/notebook/etc/jupyter-light
    .venv/bin/python bench/lab_load_trace.py --logins 5 --variant stock= \\
        --variant bare=bare --variant jupyterlab=bare,no-product

Prints one line per login, then medians per variant, each variant's medians over the
first variant's (the launcher's first frame and the total), and ``--detail K`` breakdowns
(the waterfall's slow parts, the slowest plugins, the gaps) of each variant's last K
logins. ``--chrome-trace DIR`` also writes Chromium's performance trace of each login
(open it in Perfetto or chrome://tracing); it slows the page down, so its numbers are
not the others'. Containers, volumes and the hub are removed at the end.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import signal
import statistics
import sys
import tarfile
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from baseline import QUOTA_CONFIG  # noqa: E402
from browser import CHROMIUM, CHROMIUM_ARGS, password, usage_config  # noqa: E402
from playwright.sync_api import (  # noqa: E402
    Browser,
    BrowserContext,
    CDPSession,
    Page,
    sync_playwright,  # noqa: E402
)
from prewarm_bench import CLASS, INSTRUCTOR, LAB_TIMEOUT_MS, SUBMIT  # noqa: E402

from harness import ROOT, Hub, cleanup, ensure_engine, free_port, wait_for  # noqa: E402
from spawner.quota.units import parse_size  # noqa: E402

ROLE = "student"
DEFAULT_IMAGE = "quota-spawner/pytorch:latest"
TRACE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "v8.execute",
                    "blink.user_timing", "loading", "toplevel"]

# Runs in every document before its own scripts: long tasks, and each JupyterLab
# plugin's activation. JupyterLab's bundles (rspack) and the federated extensions'
# (webpack) load their chunks by pushing [ids, modules] onto a global array whose
# push the runtime replaces; the hook wraps each module factory, and each plugin
# object ({id, activate}) a module exports gets a timed activate.
INIT_SCRIPT = r"""
(() => {
  const T = window.__qsLab = {plugins: {}, longtasks: []};
  try {
    new PerformanceObserver(list => {
      for (const e of list.getEntries()) T.longtasks.push([e.startTime, e.duration]);
    }).observe({type: 'longtask', buffered: true});
  } catch (e) {}
  // Timers of 100 ms or more: when set, for how long, by whom, and when they fired.
  T.timers = [];
  const setTimeout0 = window.setTimeout;
  window.setTimeout = function (fn, delay, ...rest) {
    if (typeof fn !== 'function' || !(delay >= 100)) {
      return setTimeout0.call(this, fn, delay, ...rest);
    }
    const rec = {set: performance.now(), delay,
                 by: (new Error().stack || '').split('\n').slice(2, 5).map(s => s.trim())};
    T.timers.push(rec);
    const fire = function () { rec.fired = performance.now(); return fn.apply(this, arguments); };
    return setTimeout0.call(this, fire, delay, ...rest);
  };
  const seen = new WeakSet();
  function wrapPlugin(p) {
    if (!p || typeof p !== 'object' || seen.has(p) || typeof p.id !== 'string'
        || typeof p.activate !== 'function') return;
    seen.add(p);
    const activate = p.activate;
    p.activate = function (...args) {
      if (!T.app && args[0] && args[0].commands && args[0].restored) {
        T.app = args[0];
        if (window.__qsEarlyLauncher) {
          // The experiment: the launcher as soon as the layout is restored.
          T.app.restored.then(() => {
            if (T.app.shell.isEmpty && T.app.shell.isEmpty('main')
                && T.app.commands.hasCommand('launcher:create')) {
              T.app.commands.execute('launcher:create');
            }
          });
        }
      }
      const rec = T.plugins[p.id] = {start: performance.now()};
      let out;
      try { out = activate.apply(this, args); }
      finally { rec.sync = performance.now() - rec.start; rec.end = rec.start + rec.sync; }
      if (out && typeof out.then === 'function') {
        out.then(() => { rec.end = performance.now(); },
                 () => { rec.end = performance.now(); rec.failed = true; });
      }
      return out;
    };
  }
  // Lumino's Poll (under every Debouncer and Throttler) sets its timer after an
  // await, where the stack is lost: record who scheduled it, synchronously.
  T.polls = [];
  function wrapPoll(Poll) {
    const schedule = Poll.prototype.schedule;
    if (schedule.__qsWrapped) return;
    Poll.prototype.schedule = function (next) {
      const interval = next && next.interval;
      if (interval >= 100 && interval < 1e9) {
        T.polls.push({set: performance.now(), delay: interval, name: this.name,
                      by: (new Error().stack || '').split('\n').slice(2, 7).map(s => s.trim())});
      }
      return schedule.apply(this, arguments);
    };
    Poll.prototype.schedule.__qsWrapped = true;
  }
  function scan(exports) {
    if (!exports || (typeof exports !== 'object' && typeof exports !== 'function')) return;
    try {
      const Poll = exports.Poll;
      if (typeof Poll === 'function' && Poll.prototype && Poll.prototype.schedule
          && typeof exports.Debouncer === 'function') wrapPoll(Poll);
    } catch (e) {}
    let found = exports.default;
    for (const v of [exports, found]) {
      if (Array.isArray(v)) v.forEach(wrapPlugin); else wrapPlugin(v);
    }
  }
  function wrapModules(modules) {
    if (!modules || typeof modules !== 'object') return;
    for (const id of Object.keys(modules)) {
      const factory = modules[id];
      if (typeof factory !== 'function' || factory.__qsWrapped) continue;
      const wrapped = function (module) {
        const result = factory.apply(this, arguments);
        try { scan(module && module.exports); } catch (e) {}
        return result;
      };
      wrapped.__qsWrapped = true;
      modules[id] = wrapped;
    }
  }
  function hook(name) {
    const chunks = [];
    let push = Array.prototype.push.bind(chunks);
    Object.defineProperty(chunks, 'push', {
      configurable: true,
      get() {
        const current = push;  // the runtime chains to the push it read: keep that one
        return function (chunk) {
          try { wrapModules(chunk && chunk[1]); } catch (e) {}
          return current.apply(this, arguments);
        };
      },
      set(fn) { push = fn; },
    });
    window[name] = chunks;
  }
  for (const name of __CHUNK_GLOBALS__) hook(name);
})();
"""
# The first animation frame with the launcher on screen, as window.__qsLab.launcher
# (performance.now()): Playwright's wait polls, so it may see it up to a few hundred ms
# later. Also bench/prewarm_bench.py's clock.
LAUNCHER_SCRIPT = r"""
(() => {
  const T = window.__qsLab = window.__qsLab || {};
  const look = () => {
    const el = document.querySelector('.jp-Launcher');
    const box = el && el.getBoundingClientRect();
    if (box && box.width > 0 && box.height > 0) T.launcher = performance.now();
    else requestAnimationFrame(look);
  };
  requestAnimationFrame(look);
})();
"""


def wait_for_launcher(page: Page, epoch: float, timeout_ms: float = LAB_TIMEOUT_MS) -> float:
    """Waits until LAUNCHER_SCRIPT (an init script of the page's context) has seen the
    launcher on screen; returns that frame's time in seconds after ``epoch`` (wall clock,
    as ``time.time()``; Chromium runs on this machine)."""
    handle = page.wait_for_function(
        "() => { const T = window.__qsLab; "
        "return T && T.launcher ? performance.timeOrigin + T.launcher : null; }",
        polling="raf", timeout=timeout_ms)
    return handle.json_value() / 1000 - epoch


# JupyterLab's own bundles, and the federated extensions in the images (webpack's
# uniqueName from the package name: every character outside [A-Za-z0-9_$] becomes _).
CHUNK_GLOBALS = ["rspackChunk_jupyterlab_application_top",
                 "webpackChunk_jupyterlab_application_top",
                 "webpackChunk_quota_spawner_gpu_status",
                 "webpackChunk_jupyter_server_resource_usage",
                 "webpackChunkjupyterlab_pygments"]

COLLECT = """JSON.stringify((() => {
    const n = performance.getEntriesByType('navigation')[0];
    const T = window.__qsLab || {plugins: {}, longtasks: []};
    return n ? {origin: performance.timeOrigin, html: n.responseEnd,
                dcl: n.domContentLoadedEventEnd || null, load: n.loadEventEnd || null,
                requests: performance.getEntriesByType('resource').map(r => ({
                    name: r.name, type: r.initiatorType, start: r.startTime,
                    sent: r.requestStart, first: r.responseStart, end: r.responseEnd,
                    transfer: r.transferSize, encoded: r.encodedBodySize,
                    decoded: r.decodedBodySize})),
                plugins: T.plugins, longtasks: T.longtasks, launcher: T.launcher || null,
                timers: T.timers || [], polls: T.polls || []} : null;
})())"""
METRICS = ("TaskDuration", "ScriptDuration", "RecalcStyleDuration", "LayoutDuration")


@dataclass
class Variant:
    name: str
    image: str = DEFAULT_IMAGE
    home: Path | None = None
    early_launcher: bool = False  # the experiment: open the launcher at app.restored
    lab_config: str = ""  # JUPYTER_CONFIG_PATH in the server's environment
    user: str = ""
    key: str = ""  # the image's key in the bench's quota table
    bare: bool = False  # the image's JupyterLab straight, no hub
    no_product: bool = False  # with bare: the product's extensions off
    url: str = ""  # a bare variant's lab


@dataclass
class Login:
    variant: str
    cached: bool = False
    total: float | None = None
    html: float | None = None
    dcl: float | None = None
    load: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    plugins: dict[str, dict[str, float]] = field(default_factory=dict)
    longtasks: list[tuple[float, float]] = field(default_factory=list)
    launcher: float | None = None  # the first frame with the launcher on screen
    timers: list[dict[str, Any]] = field(default_factory=list)
    polls: list[dict[str, Any]] = field(default_factory=list)  # Lumino debouncers and polls
    profile: dict[str, Any] | None = None
    error: str = ""

    # --- derived numbers ------------------------------------------------

    def api(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["type"] in ("fetch", "xmlhttprequest")]

    @property
    def from_cache(self) -> int:
        return sum(1 for r in self.requests if r["transfer"] == 0 and r["decoded"] > 0)

    @property
    def wire_kb(self) -> float:
        return sum(r["transfer"] for r in self.requests) / 1024

    @property
    def decoded_kb(self) -> float:
        return sum(r["decoded"] for r in self.requests) / 1024

    @property
    def server(self) -> float:
        """The server's share of the API calls: request sent to the first byte, summed."""
        return sum(max(0.0, r["first"] - r["sent"]) for r in self.api() if r["sent"])

    @property
    def last_request(self) -> float:
        return max((r["end"] for r in self.requests), default=0.0)

    @property
    def plugins_sync(self) -> float:
        return sum(p.get("sync", 0.0) for p in self.plugins.values())

    @property
    def busy(self) -> float | None:
        return self.profile["busy"] if self.profile else None

    @property
    def quiet(self) -> float | None:
        return sum(b - a for a, b in self.profile["gaps"]) if self.profile else None


# ------------------------------------------------------------------ setup ---

def parse_variant(text: str) -> Variant:
    name, _, spec = text.partition("=")
    # Letters and digits: the user's name, and so the home volume's name (which the
    # spawner escapes), is the variant's name.
    if not name.isascii() or not name.isalnum():
        raise argparse.ArgumentTypeError(f"variant name {name!r}: letters and digits only")
    variant = Variant(name)
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        if key == "image" and value:
            variant.image = value
        elif key == "home" and value:
            variant.home = Path(value)
            if not variant.home.is_dir():
                raise argparse.ArgumentTypeError(f"home={value}: not a folder")
        elif key == "lab-config" and value.startswith("/"):
            variant.lab_config = value  # a folder in the image, not here
        elif part == "early-launcher":
            variant.early_launcher = True
        elif part == "bare":
            variant.bare = True
        elif part == "no-product":
            variant.no_product = True
        else:
            raise argparse.ArgumentTypeError(
                f"{part!r}: want image=TAG, home=DIR, lab-config=/PATH, early-launcher, bare "
                "or no-product")
    if variant.no_product and not variant.bare:
        raise argparse.ArgumentTypeError(f"{text!r}: no-product goes with bare")
    if variant.bare and (variant.home or variant.lab_config):
        raise argparse.ArgumentTypeError(f"{text!r}: bare takes image= only")
    return variant


def network_spec(text: str) -> tuple[float, float]:
    try:
        mbps, rtt = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want MBPS,RTT_MS, e.g. 50,20") from None
    return mbps, rtt


def quota_text(variants: list[Variant]) -> str:
    """The shipped table, plus one image key per variant that the student role may run."""
    table = yaml.safe_load((ROOT / "hub_config" / "quotas.yaml").read_text())
    for i, variant in enumerate(variants):
        variant.key = f"trace{i}"
        table["images"][variant.key] = {"display_name": f"trace {variant.name}",
                                        "image": variant.image}
        table["roles"][ROLE]["images"].append(variant.key)
    return yaml.safe_dump(table, sort_keys=False)


def group_of(variant: Variant) -> str:
    return f"trace-{variant.name.lower()}"


def overrides_config(variants: list[Variant]) -> str:
    """The hub config that gives each lab-config variant's group its JUPYTER_CONFIG_PATH,
    as docs/images.md tells an admin to for a class."""
    overrides = {group_of(v): {"groups": [group_of(v)], "spawner_override": {
        "environment": {"JUPYTER_CONFIG_PATH": v.lab_config}}}
        for v in variants if v.lab_config}
    return f"c.QuotaSpawner.group_overrides = {overrides!r}\n" if overrides else ""


def seed_home(client, volume: str, image: str, folder: Path) -> None:
    """Copy ``folder``'s files into the (new) home volume, owned by jovyan."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            info = tar.gettarinfo(str(path), str(path.relative_to(folder)))
            info.uid, info.gid, info.uname, info.gname = 1000, 100, "", ""
            if path.is_file():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            elif path.is_dir():
                tar.addfile(info)
    data = base64.b64encode(buffer.getvalue()).decode()
    client.volumes.create(volume)
    client.containers.run(
        image, ["-c", "import base64, io, os, sys, tarfile; tarfile.open(fileobj=io.BytesIO("
                      "base64.b64decode(os.environ['TAR']))).extractall('/home/jovyan')"],
        entrypoint="python3", environment={"TAR": data}, user="1000:100",
        volumes={volume: {"bind": "/home/jovyan", "mode": "rw"}}, network_disabled=True,
        remove=True, name=f"{volume}-seed")


# The product's own extensions, turned off for a ``no-product`` floor.
PRODUCT_SERVER_EXTENSION = "spawner.monitor"
PRODUCT_LAB_EXTENSION = "@quota-spawner/gpu-status"


def start_bare(client, prefix: str, variant: Variant, cpus: float, memory: int) -> str:
    """The variant's image running ``jupyter lab`` alone, with the role's CPUs and memory,
    no token (only this machine's bridge reaches it); the URL of its lab."""
    args = ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser",
            "--IdentityProvider.token=", "--ServerApp.password="]
    environment = {}
    script = 'exec "$@"'
    if variant.no_product:
        args.append(f"--ServerApp.jpserver_extensions={PRODUCT_SERVER_EXTENSION}=False")
        # a config folder of its own, as an admin would disable a lab extension
        page_config = json.dumps({"disabledExtensions": {PRODUCT_LAB_EXTENSION: True}})
        script = (f"mkdir -p /tmp/bare/labconfig && echo '{page_config}' "
                  f"> /tmp/bare/labconfig/page_config.json && exec \"$@\"")
        environment["JUPYTER_CONFIG_PATH"] = "/tmp/bare"
    container = client.containers.run(
        variant.image, ["sh", "-c", script, "sh", *args], name=f"{prefix}-bare-{variant.name}",
        environment=environment, nano_cpus=int(cpus * 1e9), mem_limit=memory,
        detach=True, network="bridge")
    container.reload()
    url = f"http://{container.attrs['NetworkSettings']['IPAddress']}:8888/lab"

    def answers() -> bool:
        try:
            return requests.get(url.removesuffix("lab") + "api", timeout=2).ok
        except requests.RequestException:
            return False

    try:
        wait_for(answers, 120, f"the bare server of {variant.name}")
    except AssertionError as e:
        raise RuntimeError(f"{e}: {container.logs()[-2000:].decode(errors='replace')}") from None
    return url


# ---------------------------------------------------------------- a login ---

def start_profile(cdp: CDPSession) -> None:
    cdp.send("Profiler.enable")
    cdp.send("Profiler.setSamplingInterval", {"interval": 1000})
    cdp.send("Profiler.start")


def read_profile(profile: dict[str, Any], requests: list[dict[str, Any]],
                 until: float) -> dict[str, Any]:
    """Busy time per 100 ms, JS self time by file and function, and the quiet gaps
    (main thread idle, no request in flight) up to ``until``; all seconds
    after the click (``epoch``, wall clock). The profile's clock is monotonic: its
    end is taken to be ``until``, the moment it was stopped (a few ms late at most)."""
    nodes = {n["id"]: n for n in profile["nodes"]}
    samples, deltas = profile.get("samples", []), profile.get("timeDeltas", [])
    shift = until - profile["endTime"] / 1e6
    t = profile["startTime"] / 1e6 + shift
    bins: dict[int, float] = defaultdict(float)
    by_file: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    idle_at: list[tuple[float, bool]] = []
    busy = 0.0
    for i, (node_id, delta) in enumerate(zip(samples, deltas, strict=False)):
        t += delta / 1e6
        step = (deltas[i + 1] if i + 1 < len(deltas) else delta) / 1e6
        frame = nodes[node_id]["callFrame"]
        name = frame.get("functionName") or "(anonymous)"
        idle = name == "(idle)"
        idle_at.append((t, idle))
        if idle:
            continue
        busy += step
        bins[int(t * 10)] += step
        url = frame.get("url", "")
        file = url.rsplit("/", 1)[-1].split("?")[0] if url else name
        by_file[file] += step
        by_function[f"{name} ({file}:{frame.get('lineNumber', 0) + 1})"] += step
    # Quiet: idle samples with no request in flight, as runs of at least 50 ms.
    flights = [(r["start"], r["end"]) for r in requests]
    gaps: list[tuple[float, float]] = []
    run_start: float | None = None
    last = 0.0
    for t, idle in idle_at:
        quiet = idle and not any(a <= t <= b for a, b in flights)
        if quiet and run_start is None:
            run_start = t
        elif not quiet and run_start is not None:
            if t - run_start >= 0.05:
                gaps.append((run_start, t))
            run_start = None
        last = t
    if run_start is not None and last - run_start >= 0.05:
        gaps.append((run_start, last))
    return {"busy": busy, "bins": dict(bins), "by_file": by_file.most_common(12),
            "by_function": by_function.most_common(15), "gaps": gaps}


def login(context: BrowserContext, hub: Hub, variant: Variant, profile: bool,
          chrome_trace: Path | None, browser: Browser, label: str,
          again: bool = False, network: tuple[float, float] | None = None) -> Login:
    page: Page = context.pages[0] if context.pages else context.new_page()
    if again and not variant.bare:
        page.goto(f"{hub.url}/hub/logout")
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    if network:
        mbps, rtt = network
        cdp.send("Network.enable")
        cdp.send("Network.emulateNetworkConditions", {
            "offline": False, "latency": rtt, "downloadThroughput": mbps * 1e6 / 8,
            "uploadThroughput": mbps * 1e6 / 8})
    if profile:
        start_profile(cdp)
    record = Login(variant.name, cached=again)
    before: dict[str, float] = {}
    if chrome_trace:
        browser.start_tracing(page=page, categories=TRACE_CATEGORIES)

    if variant.bare:
        page.goto("about:blank")
    else:
        page.goto(f"{hub.url}/hub/login")
        page.fill("input[name=username]", variant.user)
        page.fill("input[name=password]", password(variant.user))
    before.update({m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]})
    start, epoch = time.perf_counter(), time.time()
    if variant.bare:
        page.goto(variant.url, wait_until="commit")
    else:
        page.click(SUBMIT, no_wait_after=True)
    page.wait_for_selector(".jp-Launcher", state="visible", timeout=LAB_TIMEOUT_MS)
    record.total = time.perf_counter() - start
    after = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    raw = cdp.send("Profiler.stop")["profile"] if profile else None
    if chrome_trace:
        (chrome_trace / f"{label}.json").write_bytes(browser.stop_tracing())
    for name in METRICS:
        if name in after:
            value = after[name] - before.get(name, 0.0)
            record.metrics[name] = value if value >= 0 else after[name]
    found = json.loads(page.evaluate(COLLECT))
    cdp.detach()
    if not found:
        record.error = "no navigation entry"
        return record
    origin = found["origin"] / 1000 - epoch  # the lab document's time origin, after the click

    def at(ms: float | None) -> float | None:
        return origin + ms / 1000 if ms else None

    record.html, record.dcl, record.load = at(found["html"]), at(found["dcl"]), at(found["load"])
    record.requests = [{**r, "start": at(r["start"]) or 0.0, "sent": at(r["sent"]),
                        "first": at(r["first"]), "end": at(r["end"]) or 0.0}
                       for r in found["requests"]]
    record.plugins = {pid: {k: (at(v) if k in ("start", "end") else v / 1000 if
                                isinstance(v, (int, float)) else v) for k, v in p.items()}
                      for pid, p in found["plugins"].items()}
    record.longtasks = [(at(a) or 0.0, b / 1000) for a, b in found["longtasks"]]
    record.launcher = at(found["launcher"])
    record.timers = [{**t, "set": at(t["set"]), "fired": at(t.get("fired")),
                      "delay": t["delay"] / 1000} for t in found["timers"]]
    record.polls = [{**t, "set": at(t["set"]), "delay": t["delay"] / 1000}
                    for t in found["polls"]]
    if raw:
        record.profile = read_profile(raw, record.requests, record.total)
    return record


# ----------------------------------------------------------------- report ---

def median(values: list[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def fmt(value: float | None, width: int = 6, digits: int = 3) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


COLUMNS: list[tuple[str, Any]] = [
    ("total", lambda x: x.total), ("frame", lambda x: x.launcher),
    ("html", lambda x: x.html), ("DCL", lambda x: x.dcl),
    ("load", lambda x: x.load), ("launcher-html", lambda x: x.total - x.html if x.html else None),
    ("tasks", lambda x: x.metrics.get("TaskDuration")),
    ("script", lambda x: x.metrics.get("ScriptDuration")),
    ("style", lambda x: x.metrics.get("RecalcStyleDuration")),
    ("layout", lambda x: x.metrics.get("LayoutDuration")),
    ("plugins", lambda x: x.plugins_sync), ("server", lambda x: x.server),
    ("last-req", lambda x: x.last_request), ("quiet", lambda x: x.quiet),
]


def line(x: Login) -> str:
    cells = " ".join(fmt(get(x)) for _, get in COLUMNS)
    return (f"{cells} {len(x.requests):4d} {x.from_cache:4d} {x.wire_kb:7.0f} "
            f"{x.decoded_kb:7.0f} {len(x.plugins):4d}")


def header() -> str:
    cells = " ".join(f"{name[:6]:>6}" for name, _ in COLUMNS)
    return f"{cells} {'reqs':>4} {'hit':>4} {'wireKB':>7} {'bodyKB':>7} {'plug':>4}"


def where(frame: str) -> str:
    """A stack frame as "function file:line:col", the file without its folder and query."""
    frame = frame.removeprefix("at ")
    name, _, rest = frame.rpartition(" (")
    rest = rest.rstrip(")")
    url, _, place = rest.rpartition("?") if "?" in rest else (rest, "", "")
    place = place.partition(":")[2] if place else ""
    if not place:
        url, _, place = rest.partition(".js:")
        url += ".js" if place else ""
    return f"{name + ' ' if name else ''}{url.rsplit('/', 1)[-1]}:{place}"


def detail(x: Login, top: int = 12) -> None:
    print(f"\n-- {x.variant}{' (cached)' if x.cached else ''}: total {x.total:.3f}s (launcher "
          f"drawn {fmt(x.launcher)}s), lab HTML "
          f"{fmt(x.html)}s, DOMContentLoaded {fmt(x.dcl)}s, load {fmt(x.load)}s")
    m = x.metrics
    print(f"   main thread (CDP): tasks {fmt(m.get('TaskDuration'))}s, scripts "
          f"{fmt(m.get('ScriptDuration'))}s, style {fmt(m.get('RecalcStyleDuration'))}s, "
          f"layout {fmt(m.get('LayoutDuration'))}s; long tasks (>50 ms): {len(x.longtasks)}, "
          f"{sum(d for _, d in x.longtasks):.3f}s")
    statics = [r for r in x.requests if r["type"] not in ("fetch", "xmlhttprequest")]
    print(f"   requests: {len(x.requests)} ({len(statics)} scripts, styles, images; "
          f"{len(x.api())} API calls), {x.wire_kb:.0f} KB on the wire, {x.decoded_kb:.0f} KB "
          f"decoded, {x.from_cache} from the browser cache; the server's share of the API "
          f"calls {x.server:.3f}s; last response {x.last_request:.3f}s")
    if statics:
        print(f"   scripts and styles: first sent {min(r['start'] for r in statics):.3f}s, "
              f"last in {max(r['end'] for r in statics):.3f}s")
    print("   API calls (sent -> first byte -> end; server = sent to first byte):")
    for r in sorted(x.api(), key=lambda r: r["start"]):
        server = (r["first"] - r["sent"]) if r["sent"] and r["first"] else None
        path = r["name"].split("/user/", 1)[-1].split("/", 1)[-1].split("?")[0]
        print(f"     {r['start']:6.3f} -> {fmt(r['first'])} -> {r['end']:6.3f}  server "
              f"{fmt(server)}  {r['decoded']:7d} B  {path}")
    plugins = sorted(x.plugins.items(), key=lambda kv: -kv[1].get("sync", 0))
    print(f"   plugins: {len(x.plugins)} activated, their activate() ran {x.plugins_sync:.3f}s "
          "in all; the slowest (start, activate(), settled):")
    for pid, p in plugins[:top]:
        print(f"     {fmt(p.get('start'))}  {p.get('sync', 0):6.3f}  {fmt(p.get('end'))}  {pid}")
    ordered = sorted(x.plugins.items(), key=lambda kv: kv[1].get("start") or 0)
    if ordered:
        first, last = ordered[0], ordered[-1]
        settled = max(x.plugins.items(), key=lambda kv: kv[1].get("end") or 0)
        print(f"   first activation {fmt(first[1].get('start'))}s ({first[0]}), last "
              f"{fmt(last[1].get('start'))}s ({last[0]}), last settled "
              f"{fmt(settled[1].get('end'))}s ({settled[0]})")
    timers = sorted((t for t in x.timers if t["fired"] is not None), key=lambda t: t["fired"])
    if timers:
        print("   timers of 100 ms or more that fired (set, delay, fired; set by):")
        for t in timers[:top]:
            by = " < ".join(where(f) for f in t["by"])
            print(f"     {t['set']:6.3f}  {t['delay']:5.3f}  {fmt(t['fired'])}  {by}")
    if x.polls:
        print("   Lumino debouncers and polls scheduled (set, delay; scheduled by):")
        for t in sorted(x.polls, key=lambda t: t["set"] or 0)[:top * 2]:
            by = " < ".join(where(f) for f in t["by"][:4])
            print(f"     {fmt(t['set'])}  {t['delay']:5.3f}  {by}")
    if x.profile:
        p = x.profile
        bins = p["bins"]
        print(f"   CPU profile: main thread busy {p['busy']:.3f}s; per 100 ms (ms busy):")
        top_bin = int(x.total * 10) + 1
        print("     " + " ".join(f"{int(bins.get(b, 0) * 1000):3d}" for b in range(top_bin)))
        print("   JS by file (self time):  " + ", ".join(
            f"{name} {t:.3f}" for name, t in p["by_file"][:8]))
        print("   JS by function (self time):")
        for name, t in p["by_function"][:8]:
            print(f"     {t:6.3f}  {name[:110]}")
        print(f"   quiet gaps (main thread idle, nothing in flight, >= 50 ms): "
              f"{sum(b - a for a, b in p['gaps']):.3f}s")
        for a, b in p["gaps"]:
            before = max((r for r in x.requests if r["end"] <= a), key=lambda r: r["end"],
                         default=None)
            after = min((r for r in x.requests if r["start"] >= b - 0.005),
                        key=lambda r: r["start"], default=None)

            def short(r: dict[str, Any] | None) -> str:
                return r["name"].split("/user/", 1)[-1].split("/", 1)[-1][:60] if r else "-"

            print(f"     {a:6.3f} -> {b:6.3f} ({b - a:.3f}s) after {short(before)}, "
                  f"before {short(after)}")


def ratios(logins: list[Login], variants: list[Variant]) -> None:
    """Each variant's medians over the first variant's: the launcher's first frame in the
    page, and the total (Playwright's wait)."""
    if len(variants) < 2:
        return
    def medians(name: str, cached: bool) -> tuple[float | None, float | None]:
        done = [x for x in logins if x.variant == name and x.cached == cached and not x.error]
        return median([x.launcher for x in done]), median([x.total for x in done])
    base = variants[0].name
    for cached in (False, True):
        frame0, total0 = medians(base, cached)
        for variant in variants[1:]:
            frame, total = medians(variant.name, cached)
            if None in (frame0, total0, frame, total):
                continue
            label = f"{variant.name} / {base}" + (" cached" if cached else "")
            print(f"  ratio {label}: launcher {frame:.3f} / {frame0:.3f} s = "
                  f"{frame / frame0:.2f}, total {total:.3f} / {total0:.3f} s = "
                  f"{total / total0:.2f}")


def report(logins: list[Login], variants: list[Variant], details: int) -> None:
    print(f"\n== medians per variant (seconds after the login click; "
          f"{os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())})")
    print(f"  {'variant':<18} {'n':>2} {header()}")
    for variant in variants:
        for cached in (False, True):
            done = [x for x in logins if x.variant == variant.name and x.cached == cached
                    and not x.error]
            if not done:
                continue
            cells = " ".join(fmt(median([get(x) for x in done])) for _, get in COLUMNS)
            extra = (f"{median([len(x.requests) for x in done]):4.0f} "
                     f"{median([x.from_cache for x in done]):4.0f} "
                     f"{median([x.wire_kb for x in done]):7.0f} "
                     f"{median([x.decoded_kb for x in done]):7.0f} "
                     f"{median([len(x.plugins) for x in done]):4.0f}")
            label = variant.name + (" cached" if cached else "")
            print(f"  {label:<18} {len(done):2d} {cells} {extra}")
    ratios(logins, variants)
    failed = [x for x in logins if x.error]
    if failed:
        print(f"  FAILED: {len(failed)}: " + "; ".join(f"{x.variant}: {x.error}" for x in failed))
    if details:
        for variant in variants:
            for cached in (False, True):
                done = [x for x in logins if x.variant == variant.name
                        and x.cached == cached and not x.error]
                for x in done[-details:]:
                    detail(x)


# ------------------------------------------------------------------- main ---

def init_script(variant: Variant) -> str:
    flag = "window.__qsEarlyLauncher = true;\n" if variant.early_launcher else ""
    return (flag + INIT_SCRIPT.replace("__CHUNK_GLOBALS__", json.dumps(CHUNK_GLOBALS))
            + LAUNCHER_SCRIPT)


def run(args: argparse.Namespace, hub: Hub, client, prefix: str) -> list[Login]:
    variants: list[Variant] = args.variant
    hub.start()
    hub.create_user(INSTRUCTOR, [f"{CLASS}-staff"])
    for i, variant in enumerate(variants):
        variant.user = f"trace{i}{variant.name.lower()}"[:30]
        hub.create_user(variant.user, [CLASS] + ([group_of(variant)] if variant.lab_config
                                                 else []))
        if variant.home:
            seed_home(client, f"{prefix}-home-{variant.user}", variant.image, variant.home)
    role = yaml.safe_load(hub.quota_file.read_text())["roles"][ROLE]
    for variant in variants:
        t = time.perf_counter()
        if variant.bare:
            variant.url = start_bare(client, prefix, variant, float(role["cpus"]),
                                     parse_size(role["memory"]))
            print(f"  {variant.name}: JupyterLab alone on {variant.image}"
                  f"{', the product extensions off' if variant.no_product else ''}, "
                  f"{variant.url}, ready in {time.perf_counter() - t:.1f}s", flush=True)
            continue
        hub.start_server(variant.user, {"profile": ROLE, "image": variant.key})
        print(f"  {variant.name}: {variant.user} on {variant.image}"
              f"{f' with {variant.home}' if variant.home else ''}"
              f"{f' with JUPYTER_CONFIG_PATH={variant.lab_config}' if variant.lab_config else ''}"
              ", ready in "
              f"{time.perf_counter() - t:.1f}s", flush=True)
    logins: list[Login] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            print(f"Chromium {browser.version}; a warm-up login per variant (unmeasured)",
                  flush=True)
            for variant in variants:
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                context.add_init_script(init_script(variant))
                try:
                    login(context, hub, variant, False, None, browser, "warmup")
                finally:
                    context.close()
            print(f"  {'login':<18}    {header()}", flush=True)
            for i in range(args.logins):
                # Rotate who goes first, so neither variant always follows the other.
                turn = variants[i % len(variants):] + variants[:i % len(variants)]
                for variant in turn:
                    context = browser.new_context(viewport={"width": 1280, "height": 900})
                    context.add_init_script(init_script(variant))
                    try:
                        for again in ((False, True) if args.cached else (False,)):
                            label = f"{variant.name}-{i}{'-cached' if again else ''}"
                            try:
                                x = login(context, hub, variant, args.profile,
                                          args.chrome_trace, browser, label, again,
                                          args.network)
                            except Exception as e:
                                if not args.keep_going:
                                    raise
                                x = Login(variant.name, again, error=f"{type(e).__name__}: "
                                          f"{str(e).splitlines()[0][:200]}")
                            logins.append(x)
                            shown = f"{i} {label.split('-', 1)[0]}{' cached' if again else ''}"
                            print(f"  {shown:<18} {x.error or line(x)}", flush=True)
                    finally:
                        context.close()
        finally:
            browser.close()
    return logins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logins", type=int, default=5, help="logins per variant (default 5)")
    parser.add_argument("--variant", action="append", type=parse_variant, metavar="NAME=SPEC",
                        help="NAME=image=TAG[,home=DIR]; repeatable (default: shipped)")
    parser.add_argument("--cached", action="store_true",
                        help="after each login, log out and in again in the same browser "
                             "context (its cache), timed too")
    parser.add_argument("--profile", action="store_true",
                        help="a V8 CPU profile of each login: busy time, JS by file and "
                             "function, quiet gaps (adds some overhead)")
    parser.add_argument("--chrome-trace", type=Path, metavar="DIR",
                        help="write Chromium's performance trace of each login into DIR")
    parser.add_argument("--detail", type=int, default=1, metavar="K",
                        help="breakdowns of each variant's last K logins (default 1)")
    parser.add_argument("--network", type=network_spec, metavar="MBPS,RTT_MS",
                        help="emulate a link (Chromium's throttling), e.g. 50,20: 50 Mbit/s "
                             "each way and 20 ms round trip, as a student's Wi-Fi; default: "
                             "none (loopback)")
    parser.add_argument("--keep-going", action="store_true",
                        help="a failed login is reported and left out, not fatal")
    args = parser.parse_args()
    args.variant = args.variant or [Variant("shipped")]
    if len({v.name for v in args.variant}) != len(args.variant):
        parser.error("variant names must differ")
    if args.chrome_trace:
        args.chrome_trace.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    client = ensure_engine()
    prefix = f"qslabtrace{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="lab-load-trace-"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    link = (f"emulated link {args.network[0]:g} Mbit/s, {args.network[1]:g} ms RTT"
            if args.network else "loopback")
    print(f"lab load trace: {len(args.variant)} variant(s) x {args.logins} logins, {link}, "
          f"{os.cpu_count()} CPUs, load average {load}; containers {prefix}-*", flush=True)
    hub = Hub(work / "hub", quota_text(args.variant), prefix=prefix,
              extra_config=QUOTA_CONFIG + usage_config(free_port(), {CLASS: [INSTRUCTOR]})
              + overrides_config(args.variant))
    ok = False
    try:
        logins = run(args, hub, client, prefix)
        ok = True
    except Exception:
        print(f"\nhub log: {hub.log_path}, its end:\n{hub.log()[-3000:]}", file=sys.stderr)
        raise
    finally:
        for step in (hub.stop, lambda: cleanup(client, prefix)):
            try:
                step()
            except Exception as e:
                print(f"cleanup: {type(e).__name__}: {e}", file=sys.stderr)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
    report(logins, args.variant, args.detail)


if __name__ == "__main__":
    main()
