"""spawner/usage/sessions.py: one server start's session, for both spawners.

A real SQLite ledger behind the hub's LedgerWriter: the session as Docker's
spawner records it (the pool's GPUs by UUID), as Kubernetes' does (the count
the device plugin will give), a failed start, a refusal before the session
opened, and no ledger at all. tests/service/test_kube_sessions.py runs it
inside QuotaKubeSpawner's own start, poll and stop.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import select
from tornado import web

from spawner.quota.model import Choice, ImageSpec, Role
from spawner.usage.ledger import FAILED, OOM, STOPPED, Ledger, LedgerWriter
from spawner.usage.schema import sessions
from spawner.usage.sessions import ServerSession

G = 2**30
HUB = "hub"
LOG = logging.getLogger("test-sessions")
PYTORCH = ImageSpec(key="pytorch", image="quota-spawner/pytorch:latest", display_name="PyTorch")
EXCLUSIVE = Role("gpu-training", cpus=8, memory=32 * G, images=("pytorch",), gpus=2)
SHARED = Role("gpu-lab", cpus=2, memory=8 * G, images=("pytorch",), gpus=1,
              gpu_mode="shared", gpu_share=4, gpu_memory=16 * G)
CPU = Role("student", cpus=0.5, memory=2 * G, images=("pytorch",))


@pytest.fixture
def ledger(ledger_url: str):
    ledger = Ledger(ledger_url, LOG)
    yield ledger
    ledger.dispose()


def rows(ledger: Ledger) -> list[dict[str, Any]]:
    with ledger.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(
            select(sessions).order_by(sessions.c.id))]


async def test_a_docker_start_from_request_to_stop(ledger):
    session = ServerSession(LedgerWriter(ledger, LOG), HUB, "quota-ada")
    await session.open(Choice(EXCLUSIVE, PYTORCH), "ada", "", ["ml", "ml", "cs101"],
                       requested=100.0)
    await session.gpus(EXCLUSIVE, ("GPU-a", "GPU-b"), 80 * G)  # as the pool assigned them
    await session.started("c0ffee")
    await session.ready()
    await session.close((OOM, "killed for memory", 500.0))
    (row,) = rows(ledger)
    assert (row["hub"], row["user_name"], row["container"], row["role"], row["image"]) == (
        HUB, "ada", "quota-ada", "gpu-training", "pytorch")
    assert (row["cpu_limit"], row["mem_limit"], row["requested"]) == (8.0, 32 * G, 100.0)
    # an exclusive holding's memory is the card's
    assert (row["gpus"], row["gpu_count"], row["gpu_mode"], row["gpu_reserved"],
            row["gpu_mem_limit"]) == ("GPU-a,GPU-b", 2, "exclusive", 2.0, 80 * G)
    assert row["container_id"] == "c0ffee" and row["started"] and row["ready"]
    assert (row["reason"], row["detail"], row["stopped"]) == (OOM, "killed for memory", 500.0)


async def test_the_start_records_the_homes_size(ledger):
    writer = LedgerWriter(ledger, LOG)
    sized, unlimited = (ServerSession(writer, HUB, f"quota-{u}") for u in ("ada", "bo"))
    await sized.open(Choice(CPU, PYTORCH), "ada", "", [])
    await unlimited.open(Choice(CPU, PYTORCH), "bo", "", [])
    await sized.started("c0ffee", 20 * G)
    await unlimited.started("decaf")  # a role without a disk: no limit
    assert [(r["container_id"], r["home_size"], r["home_peak"]) for r in rows(ledger)] == [
        ("c0ffee", 20 * G, None), ("decaf", None, None)]


async def test_a_kubernetes_start_records_the_count_the_device_plugin_gives(ledger):
    session = ServerSession(LedgerWriter(ledger, LOG), HUB, "jupyter-ada")
    await session.open(Choice(SHARED, PYTORCH), "ada", "train", [])
    await session.gpus(SHARED)
    (row,) = rows(ledger)
    assert row["server_name"] == "train" and row["requested"]
    # a shared holding's memory is the role's cap, a quarter of a GPU reserved
    assert (row["gpus"], row["gpu_count"], row["gpu_mode"], row["gpu_reserved"],
            row["gpu_mem_limit"]) == ("", 1, "shared:4", 0.25, 16 * G)


async def test_a_cpu_role_holds_no_gpus(ledger):
    session = ServerSession(LedgerWriter(ledger, LOG), HUB, "jupyter-bo")
    await session.open(Choice(CPU, PYTORCH), "bo", "", [])
    await session.gpus(CPU)
    (row,) = rows(ledger)
    assert (row["gpus"], row["gpu_count"], row["gpu_mode"], row["gpu_mem_limit"]) == (
        "", 0, "", None)


async def test_a_failed_start_closes_only_the_session_it_opened(ledger):
    writer = LedgerWriter(ledger, LOG)
    running = ServerSession(writer, HUB, "jupyter-cy")
    await running.open(Choice(CPU, PYTORCH), "cy", "", [])
    await running.ready()
    refused = ServerSession(writer, HUB, "jupyter-cy")  # refused before it opened one
    await refused.failed(web.HTTPError(403, "Your GPU-hour budget is spent"))
    assert rows(ledger)[0]["stopped"] is None
    retried = ServerSession(writer, HUB, "jupyter-dee")
    await retried.open(Choice(CPU, PYTORCH), "dee", "", [])
    await retried.failed(web.HTTPError(503, "No GPU is free"))
    assert (rows(ledger)[1]["reason"], rows(ledger)[1]["detail"]) == (FAILED, "No GPU is free")


async def test_without_a_ledger_nothing_is_recorded():
    session = ServerSession(None, HUB, "jupyter-ada")
    await session.open(Choice(SHARED, PYTORCH), "ada", "", [])
    await session.gpus(SHARED, ("GPU-a",), 80 * G)
    await session.started("c0ffee")
    await session.ready()
    await session.failed(RuntimeError("x"))
    await session.close((STOPPED, None, None))
    assert session.opened
