"""Usage sessions and GPU-hour budgets on Kubernetes, without a cluster.

QuotaKubeSpawner runs KubeSpawner's own ``_start``, ``poll`` and ``stop`` against
``FakeCluster``: the API calls of a start and a stop, and the pod reflector's
view of the pod, which a test moves through the states a cluster would show
(running, OOM-killed, exited, preempted by the scheduler, gone). The ledger is
a real SQLite file, and the report is the one ``quota-spawner report`` prints.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubespawner")

from kube_spawners import SHIPPED, FakeCluster, running, sessions, spawner_on  # noqa: E402
from quota_tables import budget_table  # noqa: E402
from tornado import web  # noqa: E402

from spawner.kube.pod_end import disruption, pod_end  # noqa: E402
from spawner.policy.refusals import SETTING_REFUSED  # noqa: E402
from spawner.quota.loader import load_quota_table  # noqa: E402
from spawner.usage.budgets import check_start  # noqa: E402
from spawner.usage.ledger import (  # noqa: E402
    CULLED,
    FAILED,
    LOST,
    OOM,
    PREEMPTED,
    STOPPED,
    Ledger,
)
from spawner.usage.report import build_report  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_cluster")  # tests/service/conftest.py

G = 2**30
HUB = "test-hub"
BARE = {"metadata": {"name": "p"}, "spec": {"containers": []}}
FINISHED = "2026-12-01T10:00:00+00:00"  # as the reflector holds a time (isoformat)


def terminated(pod: dict[str, Any], code: int, reason: str = "Error") -> None:
    pod["status"]["containerStatuses"][0].update(ready=False, state={"terminated": {
        "exitCode": code, "reason": reason, "finishedAt": FINISHED}})


def preempting(pod: dict[str, Any]) -> None:
    """What the scheduler leaves on a victim while it terminates (Kubernetes 1.26+)."""
    pod["metadata"]["deletionTimestamp"] = FINISHED
    pod["status"]["conditions"].append({
        "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        "message": "Preempted in order to admit critical pod", "lastTransitionTime": FINISHED})


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'usage.sqlite'}"


@pytest.fixture
def ledger(url: str):
    ledger = Ledger(url, logging.getLogger("test"))
    yield ledger
    ledger.dispose()


def the_pod(spawner: Any, cluster: FakeCluster) -> dict[str, Any]:
    return cluster.pods[f"{spawner.namespace}/{spawner.pod_name}"]


# --- a session from start to end ----------------------------------------------------------


async def test_a_start_is_a_session_with_the_role_and_its_gpus(monkeypatch, url, ledger):
    spawner, cluster = spawner_on(monkeypatch, url)
    spawner.user_options = {"profile": "gpu-training", "image": "paddle"}
    before = time.time()
    host, port = (await spawner.start()).split("//")[1].split(":")
    assert host == "10.0.0.7"
    (row,) = sessions(ledger)
    assert row["hub"] == HUB and row["user_name"] == "cy"
    assert row["container"] == spawner.pod_name == cluster.created[0]["metadata"]["name"]
    assert (row["role"], row["image"], row["cpu_limit"], row["mem_limit"]) == (
        "gpu-training", "paddle", 8.0, 32 * G)
    # the count and the mode: the device plugin, not the hub, picks the GPU
    assert (row["gpus"], row["gpu_count"], row["gpu_mode"], row["gpu_reserved"]) == (
        "", 1, "exclusive", 1.0)
    assert row["container_id"] == f"uid-{spawner.pod_name}"
    assert before <= row["requested"] <= row["started"] <= row["ready"] <= time.time()
    assert row["stopped"] is None and row["reason"] is None

    await spawner.stop()
    (row,) = sessions(ledger)
    assert row["reason"] == STOPPED and row["stopped"] >= row["ready"]
    assert cluster.deleted == [spawner.pod_name]


@pytest.mark.parametrize("role, size", [
    ("sized", 20 * G),  # its disk
    ("plain", 10 * G),  # no disk: the claim's request is kube_options' home_size
])
async def test_a_start_records_the_home_claims_size(monkeypatch, url, ledger, tmp_path, role,
                                                    size):
    quota = tmp_path / "quotas.yaml"
    quota.write_text("images:\n  pytorch: {image: quota-spawner/pytorch:latest}\nroles:\n"
                     "  sized: {cpus: 1, memory: 1G, images: [pytorch], disk: 20G}\n"
                     "  plain: {cpus: 1, memory: 1G, images: [pytorch]}\n"
                     "assignments:\n  default: [sized, plain]\n")
    spawner, _ = spawner_on(monkeypatch, url, quota=quota)
    spawner.user_options = {"profile": role}
    await spawner.start()
    (row,) = sessions(ledger)
    assert (row["role"], row["home_size"], row["home_peak"]) == (role, size, None)


async def test_a_shared_role_reserves_its_share(monkeypatch, url, ledger):
    spawner, _ = spawner_on(monkeypatch, url, user="bo", groups=("cs101",))
    spawner.user_options = {"profile": "gpu-lab"}
    await spawner.start()
    (row,) = sessions(ledger)
    assert (row["gpu_count"], row["gpu_mode"], row["gpu_reserved"]) == (1, "shared:4", 0.25)
    assert row["gpu_mem_limit"] == load_quota_table(str(SHIPPED)).roles["gpu-lab"].gpu_memory


async def test_the_culler_s_reason_is_kept(monkeypatch, url, ledger):
    spawner, _ = spawner_on(monkeypatch, url)
    spawner.user_options = {"profile": "senior-engineer"}
    await spawner.start()
    assert ledger.hint_server("cy", "", CULLED)  # what the culler's arbiter tells first
    await spawner.stop()
    (row,) = sessions(ledger)
    assert row["reason"] == CULLED and row["gpu_count"] in (0, None)


@pytest.mark.parametrize("code, why, reason, words", [
    (137, "OOMKilled", OOM, "killed for memory (exit code 137)"),
    (0, "Completed", STOPPED, "exited by itself"),
    (1, "Error", LOST, "without the hub stopping it (exit code 1)"),
])
async def test_an_ended_notebook_closes_its_session_with_how(monkeypatch, url, ledger, code,
                                                              why, reason, words):
    spawner, cluster = spawner_on(monkeypatch, url)
    spawner.user_options = {"profile": "senior-engineer"}
    await spawner.start()
    assert await spawner.poll() is None  # running: nothing recorded
    assert sessions(ledger)[0]["stopped"] is None
    terminated(the_pod(spawner, cluster), code, why)
    assert await spawner.poll() == code
    (row,) = sessions(ledger)
    assert row["reason"] == reason and words in row["detail"]
    assert row["stopped"] == datetime(2026, 12, 1, 10, tzinfo=timezone.utc).timestamp()
    assert cluster.deleted == [spawner.pod_name]  # KubeSpawner deleted the stopped pod


async def test_a_pod_the_scheduler_preempted_is_preempted(monkeypatch, url, ledger):
    spawner, cluster = spawner_on(monkeypatch, url, user="research-lead", groups=())
    spawner.user_options = {"profile": "gpu-training"}
    await spawner.start()
    preempting(the_pod(spawner, cluster))
    assert await spawner.poll() is None  # still terminating: its grace period
    cluster.pods.clear()  # gone by the next poll
    assert await spawner.poll() == 1
    (row,) = sessions(ledger)
    assert row["reason"] == PREEMPTED
    assert "PreemptionByScheduler: Preempted in order to admit" in row["detail"]


async def test_a_pod_gone_without_a_trace_is_lost(monkeypatch, url, ledger):
    spawner, cluster = spawner_on(monkeypatch, url)
    spawner.user_options = {"profile": "senior-engineer"}
    await spawner.start()
    cluster.pods.clear()
    assert await spawner.poll() == 1
    (row,) = sessions(ledger)
    assert row["reason"] == LOST and "its pod was gone" in row["detail"]


async def test_a_restarted_hub_closes_the_session_it_did_not_open(monkeypatch, url, ledger):
    spawner, cluster = spawner_on(monkeypatch, url)
    spawner.user_options = {"profile": "senior-engineer"}
    await spawner.start()
    state = spawner.get_state()
    restarted, _ = spawner_on(monkeypatch, url)
    restarted.api = cluster
    restarted.load_state(state)
    await restarted.stop()
    (row,) = sessions(ledger)
    assert row["reason"] == STOPPED and row["container"] == spawner.pod_name


# --- refused and failed starts ------------------------------------------------------------


async def test_a_refused_option_opens_no_session_and_leaves_an_old_one(monkeypatch, url,
                                                                       ledger):
    spawner, cluster = spawner_on(monkeypatch, url)
    ledger.open(hub=HUB, user="cy", container=spawner.pod_name, role="x", image="y",
                cpu_limit=1, mem_limit=G)
    spawner.user_options = {"profile": "admin"}
    with pytest.raises(web.HTTPError) as info:
        await spawner.start()
    assert info.value.status_code == 400
    (row,) = sessions(ledger)
    assert row["role"] == "x" and row["stopped"] is None  # not this start's to close
    assert cluster.created == []


async def test_a_start_refused_at_the_last_step_is_a_failed_session(monkeypatch, url, ledger):
    spawner, cluster = spawner_on(
        monkeypatch, url, extra_container_config={"securityContext": {"privileged": True}})
    spawner.user_options = {"profile": "senior-engineer"}
    with pytest.raises(web.HTTPError) as info:
        await spawner.start()
    assert info.value.status_code == 500
    (row,) = sessions(ledger)
    assert row["reason"] == FAILED and row["detail"] == SETTING_REFUSED
    assert row["started"] is None and cluster.created == []


# --- budgets -------------------------------------------------------------------------------


def spend(ledger: Ledger, user: str, hours: float) -> None:
    """A finished session of ``user`` that used ``hours`` GPU-hours, ending now, all of them
    today (UTC), where a per-day budget counts them: shortly after midnight, on as many
    GPUs as it takes (a run just after midnight once found the hours yesterday)."""
    now = time.time()
    span = min(hours * 3600, max(1.0, now % 86400 - 1))  # seconds since today began
    gpus = math.ceil(hours * 3600 / span)
    name = f"old-{user}-{hours}"
    ledger.open(hub=HUB, user=user, container=name, role="gpu", image="pytorch",
                cpu_limit=1, mem_limit=G, requested=now - span)
    ledger.set_gpus(HUB, name, [], "exclusive", None, count=gpus)
    ledger.started(HUB, name, "uid", when=now - span)
    ledger.ready(HUB, name, when=now - span)
    ledger.close(HUB, name, STOPPED, when=now)


async def test_a_spent_budget_refuses_a_gpu_start_as_on_docker(monkeypatch, url, ledger,
                                                              tmp_path):
    quota = tmp_path / "q.yaml"
    quota.write_text(budget_table("  users:\n    alice: {gpu_hours: 2, per: day}\n"))
    spend(ledger, "alice", 2.5)
    spawner, cluster = spawner_on(monkeypatch, url, quota, user="alice", groups=())
    spawner.user_options = {"profile": "gpu"}
    with pytest.raises(web.HTTPError) as info:
        await spawner.start()
    table = await spawner.quota_table()
    expected = check_start(ledger.engine, table, "alice", [], table.roles["gpu"], time.time())
    assert info.value.status_code == 403 and info.value.log_message == expected
    assert "GPU-hour" in expected or "GPU hours" in expected
    assert cluster.created == [] and len(sessions(ledger)) == 1  # only the old one

    spawner.user_options = {"profile": "cpu"}  # a CPU role is never refused
    await spawner.start()
    assert sessions(ledger)[-1]["role"] == "cpu"


async def test_the_report_counts_kubernetes_sessions(monkeypatch, url, ledger):
    spawner, _ = spawner_on(monkeypatch, url, user="bo", groups=("cs101",))
    spawner.user_options = {"profile": "gpu-lab"}
    await spawner.start()
    await spawner.stop()
    end = time.time() + 1
    report = build_report(ledger.engine, since=end - 3600, until=end, by="role")
    (row,) = report.rows
    assert row.key == "gpu-lab" and row.sessions == 1 and row.ended == {STOPPED: 1}
    assert 0 < row.gpu_hours < 0.01  # a quarter of a GPU for a few seconds


# --- the pure reading of a pod ---------------------------------------------------------


def test_pod_end_reads_what_the_reflector_holds():
    pod = running(BARE)
    assert pod_end(pod) is None and disruption(pod) is None
    pod["status"]["phase"] = "Pending"
    pod["status"]["containerStatuses"] = None
    assert pod_end(pod) is None
    pod["status"].update(phase="Failed", reason="Evicted",
                         message="The node was low on resource: memory.")
    assert pod_end(pod) == (LOST, "the pod failed (Evicted: The node was low on resource: "
                                  "memory.)", None)
    assert pod_end(None)[0] == LOST
    signalled = running(BARE)
    terminated(signalled, 143)
    preempting(signalled)
    seen = disruption(signalled)
    assert seen is not None and seen[0] == PREEMPTED
    assert pod_end(signalled, seen) == seen  # killed by the preemption, not by itself
    assert pod_end(None, seen) == seen
    evicted = running(BARE)
    evicted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                        "reason": "EvictionByEvictionAPI"}]
    assert disruption(evicted) == (LOST, "the pod was disrupted (EvictionByEvictionAPI)", None)
    evicted["status"]["conditions"][0]["status"] = "False"
    assert disruption(evicted) is None
