"""QuotaKubeSpawner: KubeSpawner sized from the same role-based quota table.

The same roles, images, spawn form, ``user_options`` checks and plain-sentence
refusals as QuotaSpawner on Docker: both use ``RoleChoicesMixin``
(spawner/policy/choices.py) and ``QuotaConfig`` (spawner/policy/config.py). What differs is
the last step: KubeSpawner builds the pod from its settings (``make_pod``),
``modify_pod_hook`` may change it, and then, just before the API call
(``_make_create_pod_request``), the pod is turned into the API's dict and

1. refused if the configuration set anything the quota owns to another value
   (``checks.config_problems``: privileged, root, a bigger limit, a GPU, ...),
   as QuotaSpawner refuses the admin's settings (``container.admin_problems``);
2. given the quota (``pod.apply_quota``): the role's resources, the security
   contexts, the shm and home volumes, the contract environment, the
   ``quota-spawner.*`` labels and annotations and the role's PriorityClass;
3. refused if anything still breaks the quota or the "restricted" Pod
   Security Standard (``checks.violations``: a hostPath, a sidecar, ``envFrom``).

A refusal is a 500 with ``refusals.SETTING_REFUSED`` for the user and every
problem, by field, in the hub's log; nothing is created. The home is a
per-user claim (``quota-home-<user>``) that KubeSpawner creates
(``storage_pvc_ensure``) and never deletes on a stop or a cull. Its request is
the role's ``disk``; once the pod has passed the last step, and before it is
created, a claim smaller than that is grown (``size_home_claim``), a larger one
kept, and the user told on the progress page (``claims.ClaimSize``).

As on Docker, a refused start puts back the options that last started as the
user's default, and the running role and image are kept in the hub's state
(``quota_choice``, beside KubeSpawner's pod and claim names), so that a
restarted hub still knows them.

Each start is a session in the usage ledger, as on Docker and through the
same ``ServerSession`` (spawner/usage/sessions.py), keyed by the pod's name:
opened when the role is resolved (a spent GPU-hour budget is refused then,
403), started when the pod is created, ready when it runs, and closed with why
it ended (``pod_end.pod_end``: stopped, culled, OOM, preempted by the scheduler,
lost). The hub does not know which GPUs the device plugin gave, so
a session records the role's GPU count and mode, not UUIDs.

The hub process's ``KubeHub`` (spawner/kube/duties.py), its hub object as the Docker
hub's runtime is (spawner/policy/hub.py), holds the ledger's writer, the event log
(the ledger's events table) and the GPU-hour budget duties, which warn the users of
running GPU servers and stop those of a spent budget with ``stop: true``, as on
Docker. Each spawner claims its pod in it.

There is no GPU pool here: the scheduler and the device plugin place GPU
pods, and a pod that does not fit waits Pending (docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from kubernetes_asyncio.client.rest import ApiException
from kubespawner import KubeSpawner
from tornado import web
from traitlets import Dict, Integer, default

from spawner.kube.checks import config_problems, violations
from spawner.kube.claims import ClaimSize, api_message, home_claim
from spawner.kube.duties import KubeHub
from spawner.kube.names import home_claim_name
from spawner.kube.notebook import NotebookPod
from spawner.kube.options import KubeOptions
from spawner.kube.pod import apply_quota
from spawner.kube.pod_end import disruption, pod_end
from spawner.kube.quantities import byte_quantity
from spawner.policy import refusals
from spawner.policy.choices import RoleChoicesMixin, shown
from spawner.policy.config import QuotaConfig
from spawner.policy.rules import PolicyError, refuse_any
from spawner.quota.form import options_from_form
from spawner.quota.model import Choice
from spawner.usage.ledger import STOPPED, LedgerWriter
from spawner.usage.sessions import End, ServerSession

PRIORITY_HINT = (" (apply the roles' PriorityClasses: quota-spawner k8s priority-classes "
                 "FILE | kubectl apply -f -)")


class QuotaKubeSpawner(RoleChoicesMixin, QuotaConfig, KubeSpawner):
    """Spawns notebook pods whose size, security and priority come from the quota table.

    Every start reads the table afresh (the file, or with ``quota_source``
    "database" the ledger's newest version, which the file only seeds: the
    ConfigMap's mount need not be writable), checks ``user_options`` against the
    roles the user holds (their groups and approved role requests included),
    and writes the role onto the final pod, whatever the configuration said.
    """

    kube_options = Dict(
        config=True,
        help="""What the quota table does not say about a pod: the fields of
        spawner.kube.options.KubeOptions (request ratios, the device plugin's GPU
        resource names, MIG profiles, ephemeral storage, the home claim's size and
        class, the PriorityClass prefix, ...). docs/kubernetes.md lists them.""",
    )
    notebook_uid = Integer(1000, config=True, help="The notebook's uid; never 0.")
    notebook_gid = Integer(
        100, config=True,
        help="The notebook's gid, and the pod's fsGroup (the home claim is writable for it); "
             "never 0.")

    hub_class = KubeHub  # the hub object: the ledger, the event log, the budget duties

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.choice: Choice | None = None
        self._choices: list[Choice] | None = None  # this start's; None: not read
        self._spec: NotebookPod | None = None  # this start's, from load_user_options
        self._started_options: dict[str, str] = {}  # the last options that started
        self._restored_choice: dict[str, str] = {}  # the running server's, from load_state
        self._starting = False  # a failed start closes its own session, not stop()
        self._session: ServerSession | None = None  # this server's, in the usage ledger
        self._disrupted: End | None = None  # the pod's DisruptionTarget, once seen
        self._ending: End | None = None  # how the pod ended, for a stop() inside poll()
        self._home_sized = False  # this start's claim compared with the role's disk
        self._home_notices: list[str] = []  # this start's, for the progress page

    # --- KubeSpawner's defaults, changed ------------------------------------------

    @default("options_form")
    def _quota_options_form_default(self) -> Any:
        return type(self).render_options_form

    @default("options_from_form")
    def _quota_options_from_form_default(self) -> Any:
        return options_from_form

    @default("storage_pvc_ensure")
    def _storage_pvc_ensure_default(self) -> bool:
        return True  # the home claim, kept across stops and culls

    @default("handle_legacy_names")
    def _handle_legacy_names_default(self) -> bool:
        return False  # no server of this class predates KubeSpawner 7's names

    # --- the choices --------------------------------------------------------------

    @property
    def options(self) -> KubeOptions:
        """``kube_options`` checked; a 500 with the problems in the log when it is wrong."""
        try:
            return KubeOptions(**self.kube_options)
        except (TypeError, ValueError) as e:  # an unknown key, or option_problems
            self.log.error("QuotaKubeSpawner.kube_options is invalid: %s", e)
            raise web.HTTPError(500, refusals.SETTING_REFUSED) from None

    async def usage_ledger(self) -> LedgerWriter | None:
        """The usage ledger's writer (sessions, budgets, approved role requests), the hub
        object's; None with ``usage_db`` "none" or when it cannot be opened (logged: the
        table's roles still hold, nothing is recorded)."""
        return (await self.quota_hub()).usage

    async def kube_hub(self) -> KubeHub | None:
        """The hub object, when its GPU-hour budget duties run: None without a ledger."""
        hub = await self.quota_hub()
        return hub if hub.budgets is not None else None

    async def _claim_pod(self) -> None:
        """Tell the hub object that this spawner runs its pod."""
        (await self.quota_hub()).claim(self.pod_name, self)

    async def quota_hub(self) -> KubeHub:
        """This hub process's hub object (spawner/kube/duties.py), built (at the first
        spawner's call) and ready."""
        return await KubeHub.of(self).ready(self)

    async def choices(self) -> list[Choice]:
        """What this user may start, from the table as it is now."""
        table = await self.table_now()  # no GPU capacity: the cluster's GPUs are the scheduler's
        return await self.choices_in(table, await self.usage_ledger())

    async def render_options_form(self) -> str:
        # no free-GPU figures: the scheduler knows, the hub does not
        return await self.form_for(await self.choices())

    def pod_spec(self, choice: Choice) -> NotebookPod:
        """What the quota decides about this start's pod."""
        return NotebookPod(
            role=choice.role, image_key=choice.image.key, image=choice.image.image,
            user_name=self.user.name, hub_id=self.hub_id, uid=self.notebook_uid,
            gid=self.notebook_gid, options=self.options, home_claim=self.home_claim_name())

    def home_claim_name(self) -> str:
        """The user's home claim: the one KubeSpawner remembers from an earlier start
        (``remember_pvc_name``; kept when the user's name or the naming changed since,
        as KubeSpawner keeps it), else ``quota-home-<user>``."""
        # KubeSpawner saves the claim's name in its state once it knows the claim exists
        if self.remember_pvc_name and "pvc_name" in super().get_state() and self.pvc_name:
            return self.pvc_name
        return home_claim_name(self.user.name, self.options.home_claim_prefix)

    async def load_user_options(self) -> None:
        """The first step of every start (KubeSpawner's ``start``): the options checked
        against the user's roles and budgets; a 4xx with a plain sentence before anything
        is created. Then the start's session is opened in the usage ledger."""
        self._spec, self.choice, self._choices = None, None, None
        table = await self.table_now()  # no GPU capacity: the cluster's are the scheduler's
        usage = await self.usage_ledger()
        self._choices = await self.choices_in(table, usage)
        choice = await self.resolve(self._choices)
        refusal = await self.budget_refusal_in(table, usage, choice.role)
        if refusal:
            self.log.warning("Refused %s: %s", self.log_name, refusal)
            raise web.HTTPError(403, refusal)
        self._apply_choice(choice)
        session = self._session = ServerSession(usage, self.hub_id, self.pod_name)
        await session.open(choice, self.user.name, self.name,
                           [g.name for g in self.user.groups])
        await session.gpus(choice.role)  # the count and mode: the device plugin picks them

    def _apply_choice(self, choice: Choice) -> None:
        spec = self._spec = self.pod_spec(choice)
        self.choice = choice
        options = spec.options
        # KubeSpawner's own fields where it reads them; the pod gets the quota again
        # at the last step, whatever these become
        self.image = spec.image
        self.priority_class_name = spec.priority_class
        self.pvc_name = spec.claim_name
        self.storage_capacity = byte_quantity(spec.home_size)  # the role's disk
        self.storage_class = options.home_storage_class
        self.storage_access_modes = list(options.home_access_modes)
        # the resolved choice, for the REST API's server model (the culler reads the role)
        self.user_options = {**(self.user_options or {}), "profile": choice.role.name,
                             "image": choice.image.key}
        self.log.info("Starting %s as role %s with image %s (%g CPUs, %d bytes memory, "
                      "%d GPUs, a %d-byte home claim)", self.log_name, choice.role.name,
                      choice.image.key, choice.role.cpus, choice.role.memory,
                      choice.role.gpus, spec.home_size)

    def start(self) -> asyncio.Future[Any]:
        """KubeSpawner's start, with this start's session, and the options put back when
        it is refused. KubeSpawner's own future is made at once (its progress events
        follow it), then awaited by this one."""
        self._starting, self._session, self._disrupted = True, None, None
        self._home_sized, self._home_notices = False, []
        return asyncio.ensure_future(self._started(super().start()))

    async def _started(self, starting: Awaitable[Any]) -> Any:
        try:
            started = await starting
        except BaseException as e:
            # as on Docker: a table that cannot be read leaves the saved options alone
            if self._choices is not None:
                self._forget_refused_options(self._choices)
            if self._session is not None:  # a refusal before it leaves older sessions alone
                await self._session.failed(e)
            shown(e)
            raise
        finally:
            self._starting = False
        if self.choice is not None:
            self._started_options = {"profile": self.choice.role.name,
                                     "image": self.choice.image.key}
            await (await self.session()).ready()
        await self._claim_pod()
        return started

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """KubeSpawner's steps (the pod's events), with what this start did to the home
        claim told before the next of them."""
        told = 0
        async for event in super().progress():
            for message in self._home_notices[told:]:
                yield {"message": message}
            told = len(self._home_notices)
            yield event
        for message in self._home_notices[told:]:
            yield {"message": message}

    # --- the session's end ----------------------------------------------------------

    async def session(self) -> ServerSession:
        """This server's session in the usage ledger: the one this start opened, else
        (a restarted hub, a stop before any start) whatever the ledger holds open."""
        if self._session is None or self._session.container != self.pod_name:
            self._session = ServerSession(await self.usage_ledger(), self.hub_id,
                                          self.pod_name)
        return self._session

    async def _close_session(self, end: End) -> None:
        """Close this server's open session, if it has one, with why it ended (a hint
        told earlier, e.g. by the culler, wins over a plain stop)."""
        self._disrupted = None
        await (await self.session()).close(end)

    async def poll(self) -> int | None:
        """KubeSpawner's, and the session closed with how the pod ended. Read before
        KubeSpawner's poll, which deletes a pod whose notebook has exited."""
        await self._start_watching_pods()
        reflector = self.pod_reflector
        pod = reflector.pods.get(f"{self.namespace}/{self.pod_name}") if reflector else None
        if pod is not None:
            self._disrupted = disruption(pod) or self._disrupted
        self._ending = pod_end(pod, self._disrupted) if pod is not None else None
        try:
            status = await super().poll()
        finally:
            ending, self._ending = self._ending, None
        if status is not None and not self._starting:
            await self._close_session(ending or pod_end(None, self._disrupted))
        elif status is None:  # a restarted hub's servers too: JupyterHub polls them first
            await self._claim_pod()
        return status

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        if not self._starting:  # a failed start closes its session as failed
            await self._close_session(self._ending or (STOPPED, None, None))

    # --- across a hub restart ------------------------------------------------------

    def _running_choice(self) -> dict[str, str]:
        """The role and image the server runs as: this start's, or the one ``load_state``
        read back (a restarted hub has not resolved a choice)."""
        if self.choice is not None:
            return {"profile": self.choice.role.name, "image": self.choice.image.key}
        return dict(self._restored_choice)

    def get_state(self) -> dict[str, Any]:
        """KubeSpawner's (pod, namespace, claim names) and the running role and image,
        as QuotaSpawner keeps them on Docker."""
        state = super().get_state()
        choice = self._running_choice()
        if choice:
            state["quota_choice"] = choice
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """After a hub restart: the server runs as the role it was started with, whatever
        the saved default options say (the REST API's server model and the culler read
        the role in ``user_options``), and a refused start later falls back to it."""
        super().load_state(state)
        saved = state.get("quota_choice")
        choice = ({k: v for k, v in saved.items()
                   if k in ("profile", "image") and isinstance(v, str)}
                  if isinstance(saved, dict) else {})
        if choice:
            self._restored_choice = choice
            self.user_options = {**(self.user_options or {}), **choice}
            self._started_options = dict(choice)

    def clear_state(self) -> None:
        """A stopped server (and the start of a new one) runs as no role; the last choice
        that started stays for ``_forget_refused_options``."""
        super().clear_state()
        self.choice, self._spec, self._restored_choice = None, None, {}

    # --- the home claim and the pod ---------------------------------------------

    async def delete_forever(self) -> None:
        """The home claim is the user's, shared by all their servers: deleting a named
        server keeps it; deleting the user (their default server) deletes it, with
        ``delete_pvc``."""
        if self.name:
            self.log.info("Not deleting the home claim %s with the named server %s: it is "
                          "the user's", self.pvc_name, self.log_name)
            return
        try:
            self.pvc_name = self.home_claim_name()
        except web.HTTPError:  # kube_options is broken (logged): KubeSpawner's name
            pass
        await super().delete_forever()

    def get_pvc_manifest(self) -> Any:
        """KubeSpawner's claim, with the user and hub labels of ``pod.home_claim``."""
        pvc = super().get_pvc_manifest()
        if self._spec is not None:
            ours = home_claim(self._spec)["metadata"]
            pvc.metadata.labels = {**(pvc.metadata.labels or {}), **ours["labels"]}
            pvc.metadata.annotations = {**(pvc.metadata.annotations or {}),
                                        **ours["annotations"]}
        return pvc

    async def size_home_claim(self) -> None:
        """The claim as the API holds it, against this start's size (the role's disk): a
        smaller claim's request is patched up to it (the storage class must allow
        volume expansion), a larger one is kept, since a claim never shrinks. The start
        goes on whatever happens: the home is there, only its size differs, and the log
        and the progress page say so."""
        spec = self._spec
        if spec is None:
            return
        name = self.pvc_name
        try:
            found = await asyncio.wait_for(self.api.read_namespaced_persistent_volume_claim(
                name=name, namespace=self.namespace), self.k8s_api_request_timeout)
        except Exception as e:  # never the start's end: the claim is there, as it is
            self.log.warning("Could not read the home claim %s of %s to compare it with "
                             "role %s's disk; it is used as it is: %s", name, self.log_name,
                             spec.role.name, self._api_why(e))
            return
        size = ClaimSize.of(self.api.api_client.sanitize_for_serialization(found), spec)
        if size.larger:
            log, notice = size.kept_larger()
            self.log.info("%s", log)
        elif size.grows:
            try:
                await asyncio.wait_for(self.api.patch_namespaced_persistent_volume_claim(
                    name=size.name, namespace=self.namespace, body=size.patch()),
                    self.k8s_api_request_timeout)
            except Exception as e:  # the refusal, told; the start goes on
                log, notice = size.refused(self._api_why(e))
                self.log.warning("%s", log)
            else:
                log, notice = size.growing()
                self.log.info("%s", log)
        else:
            return
        self._home_notices.append(notice)

    def _api_why(self, error: Exception) -> str:
        """The API's own sentence for a failed call, or what happened instead."""
        if isinstance(error, ApiException):
            return api_message(error.body) if error.body else f"{error.status} {error.reason}"
        if isinstance(error, asyncio.TimeoutError):
            return f"no answer in {self.k8s_api_request_timeout:g}s"
        return f"{type(error).__name__}: {error}"

    def quota_pod(self, pod: Any) -> dict[str, Any]:
        """The pod as the API will get it, with the quota on it; a 500 with a plain
        sentence (and every problem by name in the log) when it must not be created."""
        spec = self._spec
        try:
            if spec is None:  # load_user_options did not run: nothing to size it by
                raise PolicyError(["the start has no resolved role"])
            # a model, or a dict from modify_pod_hook that may still hold models
            body = self.api.api_client.sanitize_for_serialization(pod)
            if not isinstance(body, dict):
                raise PolicyError([f"the pod is a {type(pod).__name__}, not a pod"])
            refuse_any(config_problems(body, spec))
            apply_quota(body, spec)
            refuse_any(violations(body, spec))
        except (PolicyError, ValueError, TypeError, AttributeError, KeyError) as e:
            # anything else the configuration made unreadable is refused, never created
            problems = (e.problems if isinstance(e, PolicyError)
                        else [f"the pod cannot be read: {type(e).__name__}: {e}"])
            self.log.error("Refused to create a pod for %s; each setting below is not "
                           "allowed (docs/kubernetes.md#security-context):\n  %s",
                           self.log_name, "\n  ".join(problems))
            raise web.HTTPError(500, refusals.SETTING_REFUSED) from None
        return body

    async def _make_create_pod_request(self, pod: Any, request_timeout: float) -> bool:
        """KubeSpawner's last step before the API, after ``get_pod_manifest`` and
        ``modify_pod_hook``: the quota is written and checked here, then the pod is
        created from the checked dict (as KubeSpawner does: False asks its backoff
        to try again). The home claim is sized once per start, after the pod passed
        the last step and before it exists, so that a grown claim's file system is
        grown as the pod mounts it."""
        body = self.quota_pod(pod)
        if not self._home_sized:
            self._home_sized = True
            await self.size_home_claim()
        name = body["metadata"]["name"]
        self.log.info("Attempting to create pod %s, with timeout %s", name, request_timeout)
        try:
            created = await asyncio.wait_for(
                self.api.create_namespaced_pod(self.namespace, body), request_timeout)
        except asyncio.TimeoutError:
            return False
        except ApiException as e:
            if e.status != 409:
                # the cluster's reason (a missing PriorityClass, Pod Security Admission,
                # a namespace's ResourceQuota) is in the body, for the admin
                self.log.error("The cluster refused to create pod %s: %s %s: %s%s", name,
                               e.status, e.reason, e.body,
                               PRIORITY_HINT if "PriorityClass" in str(e.body) else "")
                raise web.HTTPError(500, refusals.CLUSTER_REFUSED) from None
            self.log.info("Found existing pod %s, attempting to kill", name)
            await self.stop(True)
            self.log.info("Killed pod %s, will try starting singleuser pod again", name)
            return False
        uid = getattr(getattr(created, "metadata", None), "uid", None) or name
        await (await self.session()).started(  # the claim's request
            uid, self._spec.home_size if self._spec else None)
        return True
