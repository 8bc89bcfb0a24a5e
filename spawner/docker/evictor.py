"""Carrying out a preemption: tell the victim, let it save, stop it, hand over.

The queue (gpu/queue.py) decides, with the victims chosen in
gpu/preemption.py; this module acts, on the hub's event loop with Docker
calls in threads, and is the only one that does:

1. The victim is told: a notice file is written into its container and its
   kernels (and every process that called ``spawner.checkpoint.on_preempt``)
   get SIGTERM, as the notebook user, so a checkpoint handler runs. The GPU
   page and JupyterLab show a banner from the notice; the event log gets a
   ``preemption`` event, which the watchdog sends to the victim's channels.
2. After the victim role's ``grace_period`` the server is stopped the way the
   hub stops any server (``stop_server``: proxy route, then the spawner), so
   the hub's record and the user's page agree; its home volume is kept. Its
   GPUs, reserved for the preempting request since step 1, go to that request.
3. If the request is served otherwise or leaves, the victim is called off:
   the notice is removed and the server keeps running.

The preemptions in their grace are kept in the hub's ``PREEMPTIONS`` document
(spawner/usage/documents.py: the ledger's database, or a file in the state folder of a hub
without a ledger), so a hub restart (which ends the waiting start they
were for) calls them off instead of leaving a notice that nothing will carry
out. The start that waits for a preemption (spawner/docker/gpus.py) only reads
``waiting_on`` and ``stops_by``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import weakref
from collections.abc import Mapping
from typing import Any

from spawner.contract import PREEMPT_DIR, PREEMPT_NOTICE, PREEMPT_PIDS_DIR
from spawner.gpu.pool import GpuPool
from spawner.gpu.queue import Ticket
from spawner.host.admission import Reservation
from spawner.policy.stopping import stop_through_hub
from spawner.quota.model import DEFAULT_GRACE_PERIOD, Role
from spawner.quota.units import format_human, human_duration
from spawner.usage.documents import PREEMPTIONS, Documents, Preemptions
from spawner.usage.events import Preempted, Preemption, PreemptionWithdrawn
from spawner.usage.ledger import PREEMPTED, LedgerWriter

# How long a stop may take before the server is taken down by removing its container.
STOP_TIMEOUT = 60.0

# Runs in the victim's container as its (non-root) user: $1 the notice's JSON,
# $2 the directory, $3 the notice path, $4 the PIDs directory. The kernel
# pattern is put together at run time, so this shell's own command line (which
# holds the script) never matches it.
NOTIFY_SCRIPT = r"""
umask 077
mkdir -p "$2" "$4" 2>/dev/null
printf '%s' "$1" > "$3.tmp" && mv -f "$3.tmp" "$3" || echo "notice:failed"
k=ipy; k="${k}kernel"
sent=""
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = "$$" ] && continue
  cmd=$(cat "$p/cmdline" 2>/dev/null) || continue
  case "$cmd" in *"$k"*) kill -TERM "$pid" 2>/dev/null && sent="$sent $pid";; esac
done
for f in "$4"/*; do
  [ -e "$f" ] || continue
  pid=${f##*/}
  case " $sent " in *" $pid "*) continue;; esac
  if kill -TERM "$pid" 2>/dev/null; then sent="$sent $pid"; else rm -f "$f"; fi
done
echo "signalled:$sent"
"""
WITHDRAW_SCRIPT = 'rm -f "$1"'


def preemption_time(roles: Mapping[str, Role]) -> float:
    """The longest a preemption may take, from its plan to its victim gone: the
    table's longest grace period and the stop."""
    return max((r.grace_period for r in roles.values()), default=0) + STOP_TIMEOUT


def needs(ticket: Ticket) -> str:
    """What a preempting request needs, for its victims: '1 GPU', or '8 GiB of memory and
    2 CPUs on the host' when it preempts for host room."""
    if ticket.plan is not None and ticket.plan.uuids and ticket.request is not None:
        gpus = ticket.request.count
        return f"{gpus} GPU{'s' if gpus != 1 else ''}"
    room = ticket.host or Reservation()
    return (f"{format_human(room.memory)} of memory and {room.cpus:g} "
            f"CPU{'s' if room.cpus != 1 else ''} on the host")


def reason(by_user: str, by_role: str, by_priority: int, role: str, priority: int,
           wanted: str) -> str:
    """The one sentence a victim (and its channels) is told; ``wanted``: ``needs``."""
    return (f"{by_user} needs {wanted} for the role '{by_role}' "
            f"(priority {by_priority}), which outranks this server's role '{role}' "
            f"(priority {priority}).")


class Evictor:
    """One per GPU pool: carries out the preemptions its queue plans, and stops
    servers the hub's way. ``client``: the docker APIClient (its methods block);
    ``spawners``: container name -> its spawner, for the servers this hub runs;
    ``usage``: the usage ledger's writer, told why a preempted server ended."""

    def __init__(self, pool: GpuPool, client: Any, documents: Documents | None,
                 log: logging.Logger | logging.LoggerAdapter, *,
                 spawners: Mapping[str, Any] | None = None,
                 usage: LedgerWriter | None = None):
        self.pool = pool
        self.client = client
        self.events = pool.events
        self.documents = documents  # where the preemptions in their grace are kept
        self.log = log
        self.spawners: Mapping[str, Any] = (spawners if spawners is not None
                                            else weakref.WeakValueDictionary())
        self.usage = usage
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._why: dict[str, str] = {}  # victim -> why it is called off
        self._pending: dict[str, dict[str, Any]] = {}  # victim -> its preemption event
        self._withdrawals: set[asyncio.Task[None]] = set()  # held: the loop's refs are weak

    # --- the queue's side ----------------------------------------------------------

    def start(self, ticket: Ticket) -> None:
        assert ticket.plan is not None
        for victim in ticket.plan.victims:
            record = self._announce(victim, ticket)
            task = self._tasks[victim] = asyncio.ensure_future(self._evict(victim, record))
            task.add_done_callback(functools.partial(self._cancelled_early, victim, record))

    def call_off(self, ticket: Ticket, victims: tuple[str, ...], why: str) -> None:
        for victim in victims:
            task = self._tasks.get(victim)
            if task is not None and not task.done():
                self._why[victim] = why
                task.cancel()

    def waiting_on(self, owner: str) -> list[dict[str, Any]]:
        """The preemptions in their grace for ``owner``'s request."""
        return [r for r in self._pending.values() if r.get("for_container") == owner]

    def stops_by(self, owner: str) -> float | None:
        """When (epoch) the last victim preempted for ``owner``'s request is gone at the
        latest: its grace's end and the stop; None when no preemption is under way."""
        ends = [r["deadline"] for r in self.waiting_on(owner)]
        return max(ends) + STOP_TIMEOUT if ends else None

    async def stop_server(self, name: str, why: str) -> bool:
        """Stop ``name`` the way the hub stops any server (its proxy route, then its
        spawner), so the hub's record and the user's page agree; if that fails or no
        spawner holds it, remove its container. False when neither worked. For
        preemption, and for spent GPU-hour budgets (usage/duties.py)."""
        spawner = self.spawners.get(name)
        if spawner is not None and not spawner.pending and spawner.server is not None:
            try:
                await asyncio.wait_for(stop_through_hub(spawner), STOP_TIMEOUT)
                return True
            except Exception as e:
                self.log.error("Could not stop %s (%s) through the hub (%s); removing its "
                               "container", name, why, e)
        try:
            await asyncio.to_thread(self.client.remove_container, name, force=True)
        except Exception as e:
            if getattr(getattr(e, "response", None), "status_code", None) != 404:
                self.log.error("Could not remove container %s (%s): %s", name, why, e)
                return False
        return True

    # --- one victim ------------------------------------------------------------------

    def _announce(self, victim: str, ticket: Ticket) -> dict[str, Any]:
        """Record and log the preemption of ``victim`` (its grace starts now)."""
        server = self.pool.servers.get(victim)
        role = self.pool.roles.get(server.role) if server else None
        grace = role.grace_period if role else DEFAULT_GRACE_PERIOD
        holding = self.pool.allocator.holding(victim)
        now = time.time()
        event = Preemption(
            hub=self.pool.hub_id, by=ticket.user, by_role=ticket.role,
            by_priority=ticket.priority, user=server.user if server else "",
            role=server.role if server else "", priority=role.priority if role else 0,
            container=victim, for_container=ticket.owner,
            gpus=tuple(holding.uuids) if holding else (),
            for_gpus=tuple(ticket.plan.uuids) if ticket.plan else (),
            grace_period=grace, deadline=round(now + grace, 3),
            ran_for=round(now - server.started, 1) if server else None,
            reason=reason(ticket.user, ticket.role, ticket.priority,
                          server.role if server else "?", role.priority if role else 0,
                          needs(ticket)),
            server_url=self._server_url(victim),
        )
        written = self.events.append(event)
        self._pending[victim] = written
        self._save()
        self.log.warning(
            "Preempting %s (user %s, role %s, priority %s, running for %s, GPUs %s) for %s "
            "(role %s, priority %s): it is stopped in %s unless called off",
            victim, event.user, event.role, event.priority,
            human_duration(event.ran_for or 0), ",".join(event.gpus) or "none",
            ticket.user, ticket.role, ticket.priority, human_duration(grace))
        return written

    async def _evict(self, victim: str, record: dict[str, Any]) -> None:
        """Tell the victim, wait out its grace, stop it; or withdraw if called off."""
        try:
            await self._notify(victim, record)
            await asyncio.sleep(max(0.0, record["deadline"] - time.time()))
        except asyncio.CancelledError:
            # without a reason from call_off, the hub itself is shutting down
            why = self._why.pop(victim, "the hub is shutting down, which ends the start it "
                                        "was for; the server keeps running")
            self._forget(victim)
            await asyncio.shield(self._withdraw(victim, record, why))
            return
        self._forget(victim)
        await self._stop(victim, record)

    def _cancelled_early(self, victim: str, record: dict[str, Any],
                         task: asyncio.Task[None]) -> None:
        # Called off in the very dispatch that planned it: cancelled before its first
        # step, so _evict never ran to withdraw it; its announcement is withdrawn here.
        if not task.cancelled() or self._pending.get(victim) is not record:
            return
        why = self._why.pop(victim, "called off before it began")
        self._forget(victim)
        withdrawal = asyncio.ensure_future(self._withdraw(victim, record, why))
        self._withdrawals.add(withdrawal)
        withdrawal.add_done_callback(self._withdrawals.discard)

    def _forget(self, victim: str) -> None:
        self._tasks.pop(victim, None)
        if self._pending.pop(victim, None) is not None:
            self._save()

    async def _exec(self, container: str, script: str, *args: str) -> str:
        """Run ``script`` with sh in ``container`` as its own user; its output."""
        def run() -> str:
            client = self.client
            created = client.exec_create(container, ["/bin/sh", "-c", script, "sh", *args])
            output = client.exec_start(created["Id"])
            code = client.exec_inspect(created["Id"]).get("ExitCode")
            text = output.decode(errors="replace").strip() if output else ""
            if code:
                raise RuntimeError(f"exit status {code}: {text[-300:]}")
            return text
        return await asyncio.to_thread(run)

    async def _notify(self, victim: str, record: dict[str, Any]) -> None:
        notice = {"version": 1, "by": record["by"], "by_role": record["by_role"],
                  "role": record["role"], "gpus": record["gpus"], "reason": record["reason"],
                  "signalled_at": record["time"], "deadline": record["deadline"],
                  "grace_period": record["grace_period"]}
        try:
            out = await self._exec(victim, NOTIFY_SCRIPT, json.dumps(notice), PREEMPT_DIR,
                                   PREEMPT_NOTICE, PREEMPT_PIDS_DIR)
        except Exception as e:  # the stop still comes at the deadline
            self.log.error("Could not tell %s of its preemption (no notice, no SIGTERM): %s",
                           victim, e)
            return
        pids = out.rpartition("signalled:")[2].split()
        if "notice:failed" in out:
            self.log.error("Could not write the preemption notice in %s", victim)
        self.log.info("%s: preemption notice written; SIGTERM sent to %s", victim,
                      f"processes {', '.join(pids)}" if pids else "no process (no kernel runs)")

    async def _withdraw(self, victim: str, record: dict[str, Any], why: str) -> None:
        self.log.info("Preemption of %s for %s called off: %s", victim, record["by"], why)
        self.events.append(PreemptionWithdrawn(
            hub=self.pool.hub_id, user=record["user"], role=record["role"], container=victim,
            by=record["by"], why=why))
        try:
            await self._exec(victim, WITHDRAW_SCRIPT, PREEMPT_NOTICE)
        except Exception as e:
            self.log.warning("Could not remove the preemption notice in %s: %s", victim, e)

    async def _stop(self, victim: str, record: dict[str, Any]) -> None:
        self.log.warning("Stopping %s (user %s): preempted for %s after a grace of %s",
                         victim, record["user"], record["by"],
                         human_duration(record["grace_period"]))
        if self.usage is not None:
            await self.usage.hint(self.pool.hub_id, victim, PREEMPTED)
        if not await self.stop_server(victim, PREEMPTED):
            return
        if self.usage is not None:  # removed without its spawner: nothing else records it
            await self.usage.close(self.pool.hub_id, victim, PREEMPTED)
        self.pool.release(victim, f"preempted for {record['by']}")
        self.events.append(Preempted(
            hub=self.pool.hub_id, user=record["user"], role=record["role"],
            container=victim, gpus=tuple(record["gpus"]), by=record["by"],
            by_role=record["by_role"],
            ran_for=round(record["ran_for"] + record["grace_period"], 1)
            if record["ran_for"] is not None else None))

    def _server_url(self, victim: str) -> str:
        spawner = self.spawners.get(victim)
        try:
            return spawner.user.url + (f"{spawner.name}/" if spawner.name else "")
        except Exception:
            return ""

    # --- restarts ----------------------------------------------------------------------

    def _save(self) -> None:
        if self.documents is not None:  # on the event log's thread, after the events before
            self.events.save(self.documents, PREEMPTIONS,
                             Preemptions(tuple(self._pending.values())).to_text())

    async def recover(self) -> None:
        """After a hub restart: call off the preemptions that were in their grace.

        The starts they were for ended with the old hub, so nobody waits for
        these GPUs; the victims keep running and their notices are removed."""
        if self.documents is None:
            return
        try:
            found = await asyncio.to_thread(self.documents.read, PREEMPTIONS)
        except Exception as e:  # a database that fails: nothing to call off
            self.log.error("Could not read the preemptions in their grace: %s", e)
            found = None
        left = Preemptions.from_text(found.text) if found is not None else Preemptions()
        if left is None:  # a damaged document: nothing to call off
            self.log.error("Could not read the preemptions in their grace: the document "
                           "is damaged or of another version")
            left = Preemptions()
        why = ("the hub restarted during the grace period, which ended the start it was for; "
               "the server keeps running")
        for record in left.records:
            await self._withdraw(record["container"], record, why)
        self._save()
