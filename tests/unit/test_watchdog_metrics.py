"""The watchdog's Prometheus side: gauges, /metrics, dcgm-exporter's job map, deploy/ files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from harness import free_port
from spawner.gpu.nvml import HostProcess
from spawner.watchdog import metrics as m
from spawner.watchdog.metrics import WatchdogMetrics, serve_metrics, write_dcgm_mapping
from spawner.watchdog.model import GpuSample, Server, ServerSample, Snapshot

ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "deploy" / "prometheus" / "quota-spawner-watchdog.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "quota-spawner-watchdog.json"
RULES_TEST = ROOT / "deploy" / "prometheus" / "quota-spawner-watchdog.rules.test.yml"
SCRAPE = ROOT / "deploy" / "prometheus" / "scrape.yml"
GiB = 1 << 30
HOSTILE = 'a"b\n{x}\\'  # a quote, a newline, braces and a backslash in a user name

EXCLUSIVE, SHARED, LOST, FREE = "GPU-excl", "GPU-shared", "GPU-lost", "GPU-free"


def server(name: str, user: str, gpus: tuple[str, ...] = (), mode: str = "",
           gpu_limit: int | None = None, role: str = "researcher") -> Server:
    return Server(container_id=f"id-{name}", name=name, user=user, role=role, image="pytorch",
                  hub_id="hub", gpus=gpus, gpu_mode=mode, memory_limit=8 * GiB, cpus=2.0,
                  cpus_reserved=2.0, gpu_memory_limit=gpu_limit)


ALICE = server("quota-alice", "alice", (EXCLUSIVE,), "exclusive")
BOB = server("quota-bob", "bob", (SHARED,), "shared:2", gpu_limit=6 * GiB)
EVE = server("quota-eve", HOSTILE, (SHARED,), "shared:2")  # shared, no GPU_MEMORY_LIMIT
CAROL = server("quota-carol", "carol", (LOST,), "exclusive")
DAVE = server("quota-dave", "dave", role="cpu-only")
ZOMBIE = server("quota-zed", "zed", (FREE,), "exclusive")


def snapshot(*samples: ServerSample, time: float = 1000.0, xids: list[int] | None = None,
             gpus: tuple[str, ...] = (EXCLUSIVE, SHARED, LOST, FREE)) -> Snapshot:
    all_gpus = {
        EXCLUSIVE: GpuSample(EXCLUSIVE, 0, memory_used=60 * GiB, memory_total=80 * GiB,
                             utilization=0.5, processes=[HostProcess(11, 60 * GiB)],
                             xids=xids or []),
        SHARED: GpuSample(SHARED, 1, memory_used=10 * GiB, memory_total=24 * GiB,
                          utilization=0.0),
        LOST: GpuSample(LOST, 2, lost="GPU is lost"),
        FREE: GpuSample(FREE, 3, memory_used=0, memory_total=16 * GiB, utilization=0.0),
    }
    return Snapshot(time=time, host="gpu-host-1", gpus={u: all_gpus[u] for u in gpus},
                    servers={s.server.container_id: s for s in samples}, zombies=[ZOMBIE])


def full_snapshot(**kwargs) -> Snapshot:
    return snapshot(
        ServerSample(ALICE, {EXCLUSIVE: 60 * GiB}, memory_working_set=3 * GiB, cpu_used=1.5,
                     oom_kills=2),
        ServerSample(BOB, {SHARED: 4 * GiB}, memory_working_set=7 * GiB, cpu_used=0.25),
        ServerSample(EVE, {SHARED: 5 * GiB}, memory_working_set=GiB, cpu_used=0.0),
        ServerSample(CAROL, {}, memory_working_set=None, cpu_used=None),
        ServerSample(DAVE, {}, memory_working_set=GiB, cpu_used=0.5), **kwargs)


def labels(srv: Server, gpu: str | None = None, index: int | None = None) -> dict[str, str]:
    out = {"user": srv.user, "role": srv.role, "image": srv.image, "server": srv.name}
    if gpu is not None:
        out |= {"gpu_uuid": gpu, "gpu_index": str(index)}
    return out


def value(metrics: WatchdogMetrics, name: str, lbls: dict[str, str] | None = None):
    return metrics.registry.get_sample_value(m.PREFIX + name, lbls or {})


# --- the gauges ---------------------------------------------------------------------------


def test_update_sets_per_server_gauges():
    metrics = WatchdogMetrics()
    metrics.update(full_snapshot())
    a, b, e = labels(ALICE, EXCLUSIVE, 0), labels(BOB, SHARED, 1), labels(EVE, SHARED, 1)
    # GPU memory: each server's own processes, against its own limit
    assert value(metrics, "server_gpu_memory_used_bytes", a) == 60 * GiB
    assert value(metrics, "server_gpu_memory_limit_bytes", a) == 80 * GiB  # exclusive: the card
    assert value(metrics, "server_gpu_memory_used_bytes", b) == 4 * GiB
    assert value(metrics, "server_gpu_memory_limit_bytes", b) == 6 * GiB  # GPU_MEMORY_LIMIT
    assert value(metrics, "server_gpu_memory_used_bytes", e) == 5 * GiB
    assert value(metrics, "server_gpu_memory_limit_bytes", e) == 24 * GiB  # no cap: the card
    assert value(metrics, "server_gpu_utilization_ratio", a) == 0.5
    assert value(metrics, "server_gpu_utilization_ratio", b) == 0.0
    # a lost GPU: the limit is unknown too, and nothing is read
    c = labels(CAROL, LOST, 2)
    for name in ("server_gpu_memory_used_bytes", "server_gpu_utilization_ratio",
                 "server_gpu_memory_limit_bytes"):
        assert value(metrics, name, c) is None, name
    # container memory and CPU
    assert value(metrics, "server_memory_working_set_bytes", labels(ALICE)) == 3 * GiB
    assert value(metrics, "server_memory_limit_bytes", labels(ALICE)) == 8 * GiB
    assert value(metrics, "server_cpu_used_cpus", labels(BOB)) == 0.25
    assert value(metrics, "server_cpu_quota_cpus", labels(BOB)) == 2.0
    assert value(metrics, "server_memory_working_set_bytes", labels(CAROL)) is None
    assert value(metrics, "server_memory_limit_bytes", labels(CAROL)) == 8 * GiB
    assert value(metrics, "server_oom_kills_total", labels(ALICE)) == 2
    assert value(metrics, "server_oom_kills_total", labels(BOB)) == 0
    # a server without GPUs has no GPU series
    assert value(metrics, "server_memory_limit_bytes", labels(DAVE)) == 8 * GiB
    text = generate_latest(metrics.registry).decode()
    assert not re.search(r'server_gpu_\w+\{[^}]*server="quota-dave"', text)


def test_update_sets_per_gpu_and_watchdog_gauges():
    metrics = WatchdogMetrics()
    metrics.update(full_snapshot(xids=[79]), {"gpu_memory": 1, "memory": 0})
    metrics.cycle_done(0.125)
    gpu = {u: {"gpu_uuid": u, "gpu_index": str(i)}
           for i, u in enumerate((EXCLUSIVE, SHARED, LOST, FREE))}
    assert value(metrics, "gpu_holders", gpu[EXCLUSIVE]) == 1
    assert value(metrics, "gpu_holders", gpu[SHARED]) == 2
    assert value(metrics, "gpu_holders", gpu[LOST]) == 1
    assert value(metrics, "gpu_holders", gpu[FREE]) == 0  # the zombie's hold is not a server's
    assert value(metrics, "gpu_memory_used_bytes", gpu[EXCLUSIVE]) == 60 * GiB
    assert value(metrics, "gpu_memory_total_bytes", gpu[SHARED]) == 24 * GiB
    assert value(metrics, "gpu_utilization_ratio", gpu[EXCLUSIVE]) == 0.5
    assert value(metrics, "gpu_lost", gpu[LOST]) == 1
    assert value(metrics, "gpu_lost", gpu[EXCLUSIVE]) == 0
    assert value(metrics, "gpu_memory_total_bytes", gpu[LOST]) is None
    assert value(metrics, "gpu_xid_errors_total", gpu[EXCLUSIVE]) == 1
    assert value(metrics, "gpu_xid_errors_total", gpu[SHARED]) == 0
    assert value(metrics, "zombie_server", labels(ZOMBIE)) == 1
    assert value(metrics, "watchdog_servers") == 5
    assert value(metrics, "watchdog_last_cycle_timestamp_seconds") == 1000.0
    assert value(metrics, "watchdog_cycle_duration_seconds") == 0.125
    assert value(metrics, "watchdog_open_incidents", {"rule": "gpu_memory"}) == 1
    assert value(metrics, "watchdog_open_incidents", {"rule": "memory"}) == 0
    # XIDs add up over cycles; a rule left out drops its series
    metrics.update(full_snapshot(xids=[13, 13], time=1005.0), {"memory": 2})
    assert value(metrics, "gpu_xid_errors_total", gpu[EXCLUSIVE]) == 3
    assert value(metrics, "watchdog_open_incidents", {"rule": "gpu_memory"}) is None
    assert value(metrics, "watchdog_open_incidents", {"rule": "memory"}) == 2
    assert value(metrics, "watchdog_last_cycle_timestamp_seconds") == 1005.0
    # notifications, by channel
    metrics.notification_sent("email")
    metrics.notification_sent("email")
    metrics.notification_failed("feishu")
    assert value(metrics, "watchdog_notifications_sent_total", {"channel": "email"}) == 2
    assert value(metrics, "watchdog_notifications_failed_total", {"channel": "feishu"}) == 1
    assert value(metrics, "watchdog_notifications_sent_total", {"channel": "feishu"}) is None


def test_series_of_gone_servers_and_gpus_are_removed():
    metrics = WatchdogMetrics()
    metrics.update(full_snapshot())
    assert value(metrics, "server_memory_limit_bytes", labels(BOB)) == 8 * GiB
    # bob's server stops, the free GPU leaves NVML's list, the zombie is removed
    later = snapshot(ServerSample(ALICE, {EXCLUSIVE: GiB}), ServerSample(EVE, {SHARED: GiB}),
                     gpus=(EXCLUSIVE, SHARED, LOST))
    later.zombies = []
    metrics.update(later)
    text = generate_latest(metrics.registry).decode()
    for gone in ('"quota-bob"', '"bob"', FREE, '"quota-carol"', '"quota-zed"'):
        assert gone not in text, gone
    assert value(metrics, "gpu_holders", {"gpu_uuid": SHARED, "gpu_index": "1"}) == 1
    assert value(metrics, "gpu_holders", {"gpu_uuid": LOST, "gpu_index": "2"}) == 0
    assert value(metrics, "server_gpu_memory_used_bytes", labels(ALICE, EXCLUSIVE, 0)) == GiB
    # and an empty host: only the watchdog's own series and the host's zeros stay
    metrics.update(Snapshot(time=2000.0, host="gpu-host-1"))
    samples = [s for f in text_string_to_metric_families(generate_latest(metrics.registry)
                                                         .decode()) for s in f.samples]
    host = {"host_cpu_reserved_cpus", "host_memory_reserved_bytes", "host_cpu_used_cpus",
            "host_memory_working_set_bytes"}
    assert {s.name for s in samples} <= {
        m.PREFIX + "watchdog_last_cycle_timestamp_seconds",
        m.PREFIX + "watchdog_cycle_duration_seconds", m.PREFIX + "watchdog_servers",
        *(m.PREFIX + name for name in host)}
    assert all(s.value == 0 for s in samples if s.name.removeprefix(m.PREFIX) in host)


def test_the_host_gauges_sum_the_servers_and_give_the_engine():
    metrics = WatchdogMetrics()
    metrics.update(full_snapshot())
    # five servers of 2 CPUs and 8 GiB each; carol's use is not measured yet
    assert value(metrics, "host_cpu_reserved_cpus") == 10.0
    assert value(metrics, "host_memory_reserved_bytes") == 40 * GiB
    assert value(metrics, "host_cpu_used_cpus") == 2.25
    assert value(metrics, "host_memory_working_set_bytes") == 12 * GiB
    assert value(metrics, "host_cpu_capacity_cpus") is None  # the engine was not read
    # a server in its start boost reserves its role's CPUs, not the boost's
    boosted = Server(container_id="id-f", name="quota-fay", user="fay", role="r",
                     image="pytorch", hub_id="hub", memory_limit=GiB, cpus=16.0,
                     cpus_reserved=0.5)
    first = Snapshot(time=1.0, host="h", engine_cpus=16.0, engine_memory=64 * GiB,
                     servers={"id-f": ServerSample(boosted)})  # nothing measured yet
    metrics.update(first)
    assert value(metrics, "host_cpu_reserved_cpus") == 0.5
    assert value(metrics, "host_memory_reserved_bytes") == GiB
    assert value(metrics, "host_cpu_used_cpus") is None
    assert value(metrics, "host_memory_working_set_bytes") is None
    assert value(metrics, "host_cpu_capacity_cpus") == 16.0
    assert value(metrics, "host_memory_capacity_bytes") == 64 * GiB


def test_hostile_user_names_are_escaped_and_parse_back():
    metrics = WatchdogMetrics()
    metrics.update(full_snapshot())
    text = generate_latest(metrics.registry).decode()
    assert 'user="a\\"b\\n{x}\\\\"' in text  # escaped as the exposition format says
    assert HOSTILE not in text
    parsed = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.labels.get("server") == EVE.name]
    assert parsed and all(s.labels["user"] == HOSTILE for s in parsed)
    assert {s.name for s in parsed} >= {m.PREFIX + "server_gpu_memory_used_bytes",
                                        m.PREFIX + "server_memory_working_set_bytes"}
    # every line is a comment or one sample: nothing broke a line
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{.*\})? \S+", line), line


def test_metric_names_follow_the_conventions():
    names = WatchdogMetrics().metric_names()
    for name in names:
        assert name.startswith(m.PREFIX), name
    units = ("_bytes", "_ratio", "_seconds", "_cpus", "_total")
    unitless = {"gpu_holders", "gpu_lost", "zombie_server", "watchdog_servers",
                "watchdog_open_incidents"}
    for name in names:
        short = name.removeprefix(m.PREFIX)
        assert short.endswith(units) or short in unitless, name


# --- /metrics over HTTP -----------------------------------------------------------------------


async def fetch(port: int, path: str = "/metrics", **headers: str):
    client = AsyncHTTPClient()
    try:
        return await client.fetch(f"http://127.0.0.1:{port}{path}", headers=headers)
    except HTTPClientError as error:
        return error.response


async def test_metrics_endpoint_with_a_token():
    metrics = WatchdogMetrics()
    metrics.update(full_snapshot())
    port = free_port()
    server = serve_metrics(metrics, "127.0.0.1", port, token="s3cret")
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}, {"Authorization": "Bearer s3cret2"}):
            response = await fetch(port, **headers)
            assert response.code == 403, headers
            assert b"alice" not in response.body
        response = await fetch(port, Authorization="Bearer s3cret")
        assert response.code == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(response.body.decode())}
        used = families[m.PREFIX + "server_gpu_memory_used_bytes"]
        assert {s.labels["user"] for s in used.samples} == {"alice", "bob", HOSTILE}
        # OpenMetrics when the scraper asks for it
        response = await fetch(port, Authorization="Bearer s3cret",
                               Accept="application/openmetrics-text; version=1.0.0")
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert any(f.name == m.PREFIX + "gpu_holders"
                   for f in openmetrics_families(response.body.decode()))
        assert (await fetch(port, "/", Authorization="Bearer s3cret")).code == 404
    finally:
        server.stop()


async def test_metrics_endpoint_without_a_token():
    metrics = WatchdogMetrics()
    metrics.update(full_snapshot())
    port = free_port()
    server = serve_metrics(metrics.registry, "127.0.0.1", port, token="")
    try:
        response = await fetch(port)
        assert response.code == 200
        assert f'{m.PREFIX}gpu_holders{{gpu_index="1",gpu_uuid="{SHARED}"}} 2.0' \
            in response.body.decode()
        # the next update is what the next scrape sees
        metrics.update(snapshot())
        assert "quota-alice" not in (await fetch(port)).body.decode()
    finally:
        server.stop()


# --- dcgm-exporter's job map --------------------------------------------------------------------


def read_like_dcgm(directory: Path) -> dict[str, list[str]]:
    """What dcgm-exporter's hpc mapper reads: files named by a whole number, a job a line."""
    return {p.name: p.read_text().splitlines() for p in directory.iterdir()
            if p.is_file() and p.name.isdigit()}


def test_dcgm_files_name_the_users_of_each_gpu(tmp_path):
    directory = tmp_path / "dcgm-job-map"  # created when missing
    mapping = write_dcgm_mapping(directory, full_snapshot())
    # a newline would split a user in two jobs, so control characters become "_"
    eve = 'a"b_{x}\\'
    assert mapping == {0: ["alice"], 1: [eve, "bob"], 2: ["carol"]}
    assert read_like_dcgm(directory) == {"0": ["alice"], "1": [eve, "bob"], "2": ["carol"]}
    assert sorted(p.name for p in directory.iterdir()) == ["0", "1", "2"]  # no temporary files
    assert (directory / "1").read_text() == f"{eve}\nbob\n"
    assert (directory / "0").stat().st_mode & 0o777 == 0o644
    # a user with two servers on one GPU is one job
    two = server("quota-alice-2", "alice", (EXCLUSIVE,), "exclusive")
    both = snapshot(ServerSample(ALICE), ServerSample(two))
    assert write_dcgm_mapping(directory, both) == {0: ["alice"]}


def test_dcgm_files_are_replaced_atomically_and_removed(tmp_path):
    write_dcgm_mapping(tmp_path, full_snapshot())
    shared = tmp_path / "1"
    before = shared.stat()
    with open(shared) as reader:  # a reader that has the old file open
        # bob leaves the shared GPU, carol's lost GPU is released
        later = snapshot(ServerSample(ALICE), ServerSample(EVE))
        (tmp_path / "README").write_text("not ours\n")
        (tmp_path / "7").write_text("stale\n")  # an index no server holds
        (tmp_path / ".quota-spawner-crash.tmp").write_text("left by a crash\n")
        write_dcgm_mapping(tmp_path, later)
        assert reader.read() == 'a"b_{x}\\\nbob\n'  # it reads the old file whole
    assert shared.read_text() == 'a"b_{x}\\\n'
    assert shared.stat().st_ino != before.st_ino  # a new file renamed over, never rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "README"]
    # unchanged content: the file is left alone
    kept = shared.stat()
    write_dcgm_mapping(tmp_path, later)
    assert (shared.stat().st_ino, shared.stat().st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)
    # nobody holds a GPU: no index file at all
    write_dcgm_mapping(tmp_path, snapshot())
    assert read_like_dcgm(tmp_path) == {}


def test_dcgm_leaves_out_gpus_that_nvml_does_not_list(tmp_path):
    assert write_dcgm_mapping(tmp_path, snapshot(ServerSample(ALICE), gpus=(SHARED,))) == {}


def test_dcgm_leaves_out_a_gpu_nvml_never_saw(tmp_path):
    """NVML down from the start: the GPU a server holds has no index (-1), no file "-1"."""
    unseen = snapshot(ServerSample(ALICE), gpus=())
    unseen.gpus[EXCLUSIVE] = GpuSample(EXCLUSIVE, -1, lost="NVML Shared Library Not Found")
    assert write_dcgm_mapping(tmp_path, unseen) == {}
    assert list(tmp_path.iterdir()) == []


def test_dcgm_a_directory_that_cannot_be_made_raises(tmp_path):
    (tmp_path / "taken").write_text("a file where the directory should be\n")
    with pytest.raises(OSError):
        write_dcgm_mapping(tmp_path / "taken", full_snapshot())


# --- deploy/: alert rules, dashboard, scrape config -------------------------------------------

PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                   "group_left", "group_right", "inf", "nan"}
PROMETHEUS_OWN = {"up", "ALERTS"}


def promql_names(expr: str) -> set[str]:
    """The metric names an expression selects (not its functions, labels or keywords)."""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr, re.S)
    if label_values:
        expr = label_values.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?", " ", expr)  # numbers
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if re.match(r"\s*\(", expr[match.end():]) or match.group() in PROMQL_KEYWORDS:
            continue  # a function, or a keyword
        names.add(match.group())
    return names


def test_promql_names_finds_what_is_selected():
    expr = ('sum by (rule) (rate(foo_total{a="x{y}", b=~"$i"}[5m])) / on (i) bar > 0.9 '
            'and ALERTS{alertname="z"} or vector(0)')
    assert promql_names(expr) == {"foo_total", "bar", "ALERTS"}
    assert promql_names('label_values(baz{instance=~"$instance"}, user)') == {"baz"}


def alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def test_alert_rules_reference_only_defined_metrics():
    defined = WatchdogMetrics().metric_names() | PROMETHEUS_OWN
    rules = alert_rules()
    assert len(rules) >= 8
    for name, rule in rules.items():
        used = promql_names(rule["expr"])
        assert used and used <= defined, (name, used - defined)
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert {"summary", "description"} <= set(rule["annotations"])
    # the down alert matches the job name the scrape config gives
    jobs = [job["job_name"] for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]]
    assert 'job="quota-spawner-watchdog"' in rules["QuotaSpawnerWatchdogDown"]["expr"]
    assert "quota-spawner-watchdog" in jobs


def seconds(duration: str | None) -> float:
    if not duration:
        return 0.0
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhd])", duration))


def thresholds(expr: str) -> list[float]:
    return [float(n) for n in re.findall(r"(?:>=|<=|>|<|==)\s*(\d+(?:\.\d+)?)", expr)]


def test_alert_rules_mirror_the_watchdog_defaults():
    from spawner.watchdog import rules as wd

    defaults = wd.WatchdogRules()
    rules = alert_rules()
    gpu = rules["QuotaSpawnerGpuMemoryHigh"]
    assert thresholds(gpu["expr"]) == [defaults.gpu_memory_high, defaults.gpu_memory_clear]
    assert seconds(gpu.get("for")) == defaults.gpu_memory_hold
    assert "ALERTS" in gpu["expr"] and 'alertname="QuotaSpawnerGpuMemoryHigh"' in gpu["expr"]
    memory = rules["QuotaSpawnerContainerMemoryHigh"]
    assert thresholds(memory["expr"]) == [defaults.memory_high, defaults.memory_clear]
    assert seconds(memory.get("for")) == defaults.memory_hold
    idle = rules["QuotaSpawnerGpuIdle"]
    assert thresholds(idle["expr"]) == [defaults.idle_gpu_utilization]
    assert seconds(idle.get("for")) == defaults.idle_gpu_hold
    assert seconds(rules["QuotaSpawnerZombieHoldsGpus"].get("for")) == defaults.zombie_hold
    home = rules["QuotaSpawnerHomeNearlyFull"]
    assert thresholds(home["expr"]) == [defaults.home_disk_high, defaults.home_disk_clear]
    assert seconds(home.get("for")) == defaults.home_disk_hold
    homes = rules["QuotaSpawnerHomesFilesystemNearlyFull"]
    assert thresholds(homes["expr"]) == [defaults.homes_filesystem_high,
                                         defaults.homes_filesystem_clear]
    assert seconds(homes.get("for")) == defaults.homes_filesystem_hold
    for instant in ("QuotaSpawnerGpuLost", "QuotaSpawnerOomKill", "QuotaSpawnerGpuXid"):
        assert seconds(rules[instant].get("for")) == 0, instant
    # every rule of the watchdog has its alert, under the same name
    assert set(wd.RULES) <= {rule["labels"]["rule"] for rule in rules.values()}


def dashboard_exprs(dashboard: dict) -> list[str]:
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for key, item in node.items():
                if key in ("expr", "definition") and isinstance(item, str):
                    exprs.append(item)
                elif key == "query" and isinstance(item, dict) and "query" in item:
                    exprs.append(item["query"])
                else:
                    walk(item)
        elif isinstance(node, list):
            for item in node:
                walk(item)
    walk(dashboard)
    return exprs


def test_dashboard_references_only_defined_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    defined = WatchdogMetrics().metric_names() | PROMETHEUS_OWN
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 15
    used: set[str] = set()
    for expr in exprs:
        names = promql_names(expr)
        assert names and names <= defined, (expr, names - defined)
        used |= names
    # what the issue asks the dashboard to show
    for short in ("server_gpu_memory_used_bytes", "server_gpu_memory_limit_bytes",
                  "server_gpu_utilization_ratio", "server_memory_working_set_bytes",
                  "server_memory_limit_bytes", "server_cpu_used_cpus", "server_cpu_quota_cpus",
                  "gpu_holders", "watchdog_open_incidents", "home_used_bytes",
                  "home_limit_bytes", "homes_filesystem_size_bytes",
                  "homes_filesystem_free_bytes", "homes_reserved_bytes"):
        assert m.PREFIX + short in used, short
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "user"} <= variables
    for expr in exprs:  # every panel filters by the chosen hosts
        if "quota_spawner_" in expr and "label_values" not in expr \
                and "$instance" not in expr:
            pytest.fail(f"no host filter: {expr}")


def test_alert_rules_pass_their_promtool_tests(tmp_path):
    """The thresholds, hold times and hysteresis in action, by Prometheus's own rule engine."""
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed")
    rules = yaml.safe_load(RULES_FILE.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / RULES_FILE.name).write_text(yaml.safe_dump(rules))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    check = subprocess.run([tool, "check", "rules", str(RULES_FILE)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([tool, "test", "rules", RULES_TEST.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0, test.stdout + test.stderr
