"""The notebook pods on this Kubernetes node, as the watchdog needs them.

The same ``Server`` records as ``containers.py`` gives on Docker, so the rules,
the ledger's samples, the gauges and the messages are unchanged: who, which
role and image (the ``quota-spawner.*`` annotations QuotaKubeSpawner writes,
read with ``contract_labels``), the limits (the notebook container's
resources), the GPU memory cap (its environment). What the API does not say
comes from the node, as on Docker: the container's main PID from ``/proc``
(``host.MainPids``) and the GPUs the device plugin gave it from that
process (``host.visible_gpus``).

OOM kills: KubeSpawner's pods restart a container that failed
(``restartPolicy: OnFailure``), so a notebook killed for memory comes back
in place, with a new container id, its kernels gone; the pod shows the kill
as the container's ``lastState`` (or, before the restart, its ``state``)
``terminated`` with reason ``OOMKilled``. ``take`` gives the servers killed
since the last call, as ``OomEvents`` does from Docker's events.

Blocking: the watchdog calls these in threads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spawner.contract import (
    HUB_LABEL,
    USER_LABEL,
    gpu_memory_limit,
    reserved_cpus,
)
from spawner.kube.pod import contract_labels
from spawner.kube.quantities import parse_quantity
from spawner.quota.units import rfc3339_time as docker_time
from spawner.watchdog.host import PROC, MainPids, visible_gpus
from spawner.watchdog.model import Server

CONTAINER = "notebook"  # KubeSpawner's name for the notebook's container
API_TIMEOUT = 10.0  # seconds one list may take: a hung API server must not stop the cycles


def _notebook(pod: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """The notebook container's entry in ``pod[where][key]``; {} when there is none."""
    for entry in (pod.get(where) or {}).get(key) or []:
        if entry.get("name") == CONTAINER:
            return entry
    return {}


def container_id(status: Mapping[str, Any]) -> str:
    """The runtime's id from a container status ("containerd://<id>"); "" before it runs."""
    return str(status.get("containerID") or "").partition("://")[2]


def running_id(pod: Mapping[str, Any]) -> str:
    """The id of the pod's notebook container while it runs; "" otherwise."""
    status = _notebook(pod, "containerStatuses", "status")
    return container_id(status) if "running" in (status.get("state") or {}) else ""


def server_from_pod(pod: Mapping[str, Any], pid: int = 0,
                    gpus: tuple[str, ...] = ()) -> Server | None:
    """A ``Server`` from a pod as the API gives it (camelCase JSON); None for a pod
    without the user annotation or a notebook container that runs. ``gpus``: what the
    node says it holds, where the annotation names none (the device plugin chose)."""
    metadata = pod.get("metadata") or {}
    labels = contract_labels(metadata)
    cid = running_id(pod)
    if USER_LABEL not in labels or not cid:
        return None
    running = _notebook(pod, "containerStatuses", "status")["state"]["running"]
    spec = _notebook(pod, "containers", "spec")
    limits = (spec.get("resources") or {}).get("limits") or {}
    env = {e.get("name", ""): str(e.get("value", "")) for e in spec.get("env") or []
           if "value" in e}
    cpus = _quantity(limits.get("cpu"))
    return Server.from_labels(
        labels,
        container_id=cid,
        name=str(metadata.get("name") or ""),
        gpus=gpus,
        memory_limit=_quantity(limits.get("memory"), whole=True),
        cpus=cpus,
        cpus_reserved=reserved_cpus(env, cpus),
        gpu_memory_limit=gpu_memory_limit(env),
        pid=pid,
        started=docker_time(running.get("startedAt")),
    )


def _quantity(value: Any, whole: bool = False) -> Any:
    if value is None:
        return None
    try:
        amount = parse_quantity(value)
    except ValueError:
        return None
    return int(amount) if whole else float(amount)


def oom_killed(pod: Mapping[str, Any]) -> str:
    """The id of the notebook container that was killed for memory, now or before its
    restart; "" for any other pod."""
    status = _notebook(pod, "containerStatuses", "status")
    for key in ("state", "lastState"):
        terminated = (status.get(key) or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return container_id(terminated)
    return ""


class Pods:
    """The notebook pods of one node, for one hub (``hub_id``) or for all; also the
    source of their OOM kills (``take``)."""

    def __init__(self, api: Any, node: str, namespace: str = "", hub_id: str = "",
                 proc: Path = PROC, log: logging.Logger | logging.LoggerAdapter | None = None):
        self.api = api  # a kubernetes.client.CoreV1Api
        self.node, self.namespace, self.hub_id = node, namespace, hub_id
        self.proc = Path(proc)
        self.log = log or logging.getLogger(__name__)
        self.pids = MainPids(self.proc)
        self._gpus: dict[str, tuple[str, ...]] = {}  # container id -> what it was given
        self._seen: dict[str, Server] = {}  # container id -> the server, while it runs
        self._ooms: list[Server] = []

    def _pods(self) -> list[dict[str, Any]]:
        """This node's pods with the user label, as JSON (one API call)."""
        selector = {"label_selector": USER_LABEL, "field_selector": f"spec.nodeName={self.node}",
                    "_request_timeout": API_TIMEOUT}
        listed = (self.api.list_namespaced_pod(self.namespace, **selector) if self.namespace
                  else self.api.list_pod_for_all_namespaces(**selector))
        return self.api.api_client.sanitize_for_serialization(listed).get("items") or []

    def servers(self, now: float | None = None) -> list[Server]:
        pods = [p for p in self._pods()
                if not self.hub_id or contract_labels(p.get("metadata") or {}).get(HUB_LABEL)
                == self.hub_id]
        ids = [running_id(p) for p in pods]
        pids = self.pids.find(i for i in ids if i)  # /proc is scanned for running ones only
        servers: dict[str, Server] = {}
        for pod, cid in zip(pods, ids, strict=True):
            killed = oom_killed(pod)
            if killed and killed in self._seen:
                self._ooms.append(self._seen[killed])
            pid = pids.get(cid, 0)
            if not pid:
                continue
            if cid not in self._gpus:
                self._gpus[cid] = visible_gpus(pid, self.proc)
            server = server_from_pod(pod, pid, self._gpus[cid])
            if server is not None:
                servers[cid] = server
        self._gpus = {cid: gpus for cid, gpus in self._gpus.items() if cid in servers}
        # a pod deleted between two lists shows no OOM: the hub's session records it
        self._seen = servers
        return list(servers.values())

    def engine_size(self, now: float | None = None) -> tuple[float, int] | None:
        """The node's size is the scheduler's business, not read here: unknown."""
        return None

    # --- OomEvents' interface ---------------------------------------------------------

    def start(self) -> None:
        """Nothing to start: the kills are seen in ``servers``' list."""

    def take(self) -> list[Server]:
        """The OOM-killed servers since the last call."""
        ooms, self._ooms = self._ooms, []
        return ooms


def kube_api(log: logging.Logger | logging.LoggerAdapter) -> Any:
    """The Kubernetes API: in-cluster (the DaemonSet's service account), else
    $KUBECONFIG. Needs the ``kubernetes`` extra."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
        log.info("Using the Kubernetes API of the kubeconfig (not in a cluster)")
    return client.CoreV1Api()

