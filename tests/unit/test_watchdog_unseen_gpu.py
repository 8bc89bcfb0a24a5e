"""A GPU the watchdog cannot see is named by its UUID, never as "GPU -1".

When NVML is down from the watchdog's start (no driver loaded, a watchdog
container without the GPUs), a GPU a server holds was never read: it has no
index. Its ``gpu_lost`` message names it by its UUID and says what to check.

Pure: the app's own ``read_gpus`` with an NVML that fails, the real rules and
the real messages; no engine.
"""

from __future__ import annotations

from pathlib import Path

from spawner.gpu.nvml import HostScan
from spawner.watchdog.app import QuotaWatchdog, gpu_usage_snapshot
from spawner.watchdog.model import GpuSample, Server, ServerSample, Snapshot
from spawner.watchdog.notify import format_message
from spawner.watchdog.rules import IncidentBook, WatchdogRules

T = 1_795_000_000.0
UUID = "GPU-8f3c2a4e-1b7d-4c55-9e0a-2d6f4b1c9a77"
ALICE = Server(container_id="c1", name="quota-alice", user="alice", role="gpu-training",
               image="pytorch", hub_id="hub", gpus=(UUID,), gpu_mode="exclusive")
DOWN = "NVML Shared Library Not Found"


class DeadNvml:
    def host_gpus(self, expected) -> HostScan:
        return HostScan([], DOWN)


class NoXids:
    def poll(self) -> list:
        return []


def unseen_gpus() -> dict[str, GpuSample]:
    app = QuotaWatchdog(hub_id="hub")
    app.nvml, app.xids, app._last_gpus = DeadNvml(), NoXids(), {}
    return app.read_gpus([ALICE])


def lost_message() -> tuple[str, str]:
    gpus = unseen_gpus()
    snap = Snapshot(time=T, host="gpu-host-1", gpus=gpus,
                    servers={ALICE.container_id: ServerSample(ALICE)})
    (event,) = [e for e in IncidentBook().evaluate(snap, WatchdogRules())
                if e.incident.rule == "gpu_lost"]
    message = format_message(event, "https://hub.example.org", "h", now=T + 1)
    return message.title, message.body


def test_a_gpu_nvml_never_saw_is_named_by_its_uuid():
    title, body = lost_message()
    assert title == f"[critical] {UUID} lost under alice's server"
    assert f"GPU: {UUID} (its index is unknown: NVML does not see it)" in body.splitlines()
    assert "GPU -1" not in title + body and "index -1" not in body
    assert f"What: NVML cannot read the GPU: {DOWN}. It is held by quota-alice." in body


def test_it_says_what_to_check():
    _, body = lost_message()
    (advice,) = [line for line in body.splitlines() if line.startswith("What to do:")]
    assert "NVIDIA driver is loaded" in advice
    assert "nvidia-smi" in advice and "dmesg" in advice


def test_a_gpu_nvml_saw_before_keeps_its_index():
    app = QuotaWatchdog(hub_id="hub")
    app.nvml, app.xids = DeadNvml(), NoXids()
    app._last_gpus = {UUID: GpuSample(UUID, 3, name="H200")}
    gpus = app.read_gpus([ALICE])
    snap = Snapshot(time=T, host="h", gpus=gpus, servers={"c1": ServerSample(ALICE)})
    (event,) = IncidentBook().evaluate(snap, WatchdogRules())
    message = format_message(event, "https://hub.example.org", "h", now=T)
    assert message.title == "[critical] GPU 3 lost under alice's server"
    assert f"GPU: GPU 3 ({UUID})" in message.body
    assert "What to do: Admins: drain the host, check dmesg and nvidia-smi" in message.body


def test_the_gpu_map_gets_no_index_for_it():
    snap = Snapshot(time=T, host="h", gpus=unseen_gpus(), servers={})
    assert gpu_usage_snapshot(snap, IncidentBook(), 5.0)["gpus"][UUID]["index"] is None


def test_the_documented_message_is_what_the_code_says():
    """docs/watchdog.md#nvml-missing shows its title, GPU line and advice."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "watchdog.md").read_text()
    title, body = lost_message()
    lines = body.splitlines()
    (gpu,) = [line for line in lines if line.startswith("GPU:")]
    (advice,) = [line for line in lines if line.startswith("What to do:")]
    assert f"```text\n{title}\n…\n{gpu}\n…\n{advice}\n```" in doc
