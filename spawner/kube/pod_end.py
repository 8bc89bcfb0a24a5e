"""Why a notebook pod ended, in the usage ledger's words (pure).

The pod is a dict as KubeSpawner's pod reflector holds it (the API's camelCase
JSON). The notebook container's ``terminated`` state says how it exited, as
``docker inspect`` does on Docker, and goes through the same
``ledger.ended``: a clean exit (the user's File > Shut Down), an OOM kill, or
another exit code. KubeSpawner's pods restart a container that failed
(``restartPolicy: OnFailure``), so an OOM kill or a crash usually shows only
for a moment before the notebook comes back in the same pod; the session
then goes on (and the watchdog tells the user of the kill). The scheduler's
preemption and an eviction show as the pod's ``DisruptionTarget`` condition
(Kubernetes 1.26 and later) while the pod is terminating; the spawner
remembers it, since the pod is usually gone by the next poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spawner.quota.units import rfc3339_time
from spawner.usage.ledger import LOST, PREEMPTED, ended
from spawner.usage.sessions import End

PREEMPTION = "PreemptionByScheduler"


def disruption(pod: Mapping[str, Any]) -> End | None:
    """The pod's ``DisruptionTarget`` condition as an end: preempted by the scheduler,
    or lost (evicted, a node's taint, the kubelet); None without one."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") != "DisruptionTarget" or condition.get("status") != "True":
            continue
        why, message = condition.get("reason") or "", condition.get("message") or ""
        detail = f"{why}: {message}" if message else why
        when = rfc3339_time(condition.get("lastTransitionTime"))
        if why == PREEMPTION:
            return PREEMPTED, f"the scheduler preempted the pod ({detail})", when
        return LOST, f"the pod was disrupted ({detail})", when
    return None


def pod_end(pod: Mapping[str, Any] | None, disrupted: End | None = None,
            container: str = "notebook") -> End | None:
    """How the pod ended; None while ``container`` has not ended. ``pod`` None: it is
    gone. A disruption seen earlier (``disrupted``) explains an end that is not the
    server's own doing: a pod that is gone, or a container stopped by a signal."""
    if pod is None:
        return disrupted or (LOST, "its pod was gone, with no record of its end", None)
    status = pod.get("status") or {}
    for entry in status.get("containerStatuses") or []:
        if entry.get("name") != container:
            continue
        terminated = (entry.get("state") or {}).get("terminated")
        if terminated is None:
            break
        end = ended(None, {"oom": terminated.get("reason") == "OOMKilled",
                           "exit_code": terminated.get("exitCode"),
                           "finished": rfc3339_time(terminated.get("finishedAt"))})
        return disrupted if disrupted and end[0] == LOST else end
    if status.get("phase") == "Failed":  # e.g. evicted for the node's memory or disk
        why = ": ".join(x for x in (status.get("reason"), status.get("message")) if x)
        return disrupted or (LOST, f"the pod failed ({why or 'no reason given'})", None)
    return None
