"""QuotaSpawner: DockerSpawner sized from the role-based quota table."""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any, ClassVar

from dockerspawner import DockerSpawner
from tornado import web
from traitlets import Dict, Integer, Unicode, default

from .engine import check_engine_info
from .form import options_from_form, render_form
from .network import HostNetworkMixin, wait_for_port
from .options import OptionsError, resolve_choice
from .quota import Choice, QuotaTable, QuotaTableError
from .store import QuotaStore

LABEL_PREFIX = "quota-spawner."
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def literal(text: str) -> str:
    """Protect user-named text from DockerSpawner's ``str.format`` templating."""
    return text.replace("{", "{{").replace("}", "}}")


class QuotaSpawner(HostNetworkMixin, DockerSpawner):
    """Spawns notebook containers whose size comes from the quota table.

    Every start reads the table afresh (hot reload), checks ``user_options``
    against the roles the user holds, and sets every limit from the role, so
    nothing carries over from an earlier spawn.
    """

    quota_file = Unicode(
        "quotas.yaml",
        config=True,
        help="Path of the quota table (YAML). Edits take effect at the next spawn.",
    )
    pids_limit = Integer(
        2048,
        config=True,
        help="Most processes and threads in one container, for roles that set no 'pids'.",
    )
    notebook_user = Unicode(
        "1000",
        config=True,
        help="The user (uid or uid:gid) the notebook runs as; never root.",
    )
    home_dir = Unicode("/home/jovyan", config=True, help="Where the home volume is mounted.")
    extra_labels = Dict(
        config=True, help="More container labels. The quota-spawner.* labels cannot be overridden."
    )

    _engine_checked: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.choice: Choice | None = None
        # The admin's own extra config stays; the quota settings go on top of it.
        self._admin_host_config = self.extra_host_config
        self._admin_create_kwargs = self.extra_create_kwargs
        self.extra_host_config = QuotaSpawner._quota_host_config
        self.extra_create_kwargs = QuotaSpawner._quota_create_kwargs

    # --- defaults ---------------------------------------------------------

    @default("remove")
    def _remove_default(self) -> bool:
        return True  # a fresh container per spawn; the home volume keeps the work

    @default("prefix")
    def _prefix_default(self) -> str:
        return "quota"

    @default("volumes")
    def _volumes_default(self) -> dict[str, str]:
        return {"quota-home-{username}": self.home_dir}

    @default("options_form")
    def _options_form_default(self) -> Any:
        return QuotaSpawner._render_options_form

    @default("options_from_form")
    def _options_from_form_default(self) -> Any:
        return options_from_form

    @default("cmd")
    def _cmd_default(self) -> list[str]:
        return ["jupyterhub-singleuser"]

    # --- the quota table --------------------------------------------------

    @property
    def store(self) -> QuotaStore:
        return QuotaStore.for_path(self.quota_file)

    async def load_table(self) -> QuotaTable:
        try:
            return await asyncio.to_thread(self.store.get, self.log)
        except QuotaTableError as e:
            raise web.HTTPError(
                500,
                "The quota table has errors, so no server can start. "
                "An admin must fix it: " + "; ".join(str(p) for p in e.problems[:3]),
            ) from None

    def group_names(self) -> list[str]:
        return [g.name for g in self.user.groups]

    async def choices(self) -> list[Choice]:
        table = await self.load_table()
        return table.choices_for(self.user.name, self.group_names())

    async def _render_options_form(self) -> str:
        choices = await self.choices()
        saved = self.orm_spawner.user_options if self.orm_spawner else None
        if not saved:
            return render_form(choices)
        try:
            selected = resolve_choice(choices, saved).key
        except OptionsError:
            # The saved choice is gone: show the form even for one choice,
            # or every Start would reuse it and fail.
            return render_form(choices, always=True)
        return render_form(choices, selected)

    async def resolve(self) -> Choice:
        """The user's choice for this start, checked against the table."""
        try:
            return resolve_choice(await self.choices(), self.user_options)
        except OptionsError as e:
            raise web.HTTPError(e.status, e.message) from None

    # --- the container ----------------------------------------------------

    def _apply_choice(self, choice: Choice) -> None:
        role = choice.role
        self.choice = choice
        self.image = choice.image.image
        self.cpu_limit = role.cpus
        self.mem_limit = role.memory

    async def _admin_value(self, value: Any) -> dict[str, Any]:
        value = self._eval_if_callable(value)
        if inspect.isawaitable(value):
            value = await value
        return dict(value or {})

    async def _quota_host_config(self) -> dict[str, Any]:
        assert self.choice is not None
        role = self.choice.role
        config = await self._admin_value(self._admin_host_config)
        self._check_no_docker_socket(config)
        config.update(
            memswap_limit=role.memory,  # equal to memory: no swap at all
            pids_limit=role.pids or self.pids_limit,
            privileged=False,
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
        )
        if role.shm:
            config["shm_size"] = role.shm
        return config

    def labels(self) -> dict[str, str]:
        assert self.choice is not None
        return {
            LABEL_PREFIX + "user": self.user.name,
            LABEL_PREFIX + "role": self.choice.role.name,
            LABEL_PREFIX + "image": self.choice.image.key,
            LABEL_PREFIX + "gpus": "",
        }

    async def _quota_create_kwargs(self) -> dict[str, Any]:
        kwargs = await self._admin_value(self._admin_create_kwargs)
        # Only our labels hold user-named text; the admin's may use {username}.
        ours = {literal(k): literal(v) for k, v in self.labels().items()}
        kwargs["labels"] = {**kwargs.get("labels", {}), **self.extra_labels, **ours}
        kwargs["user"] = self.notebook_user
        return kwargs

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self.choice is not None:
            role = self.choice.role
            threads = str(max(1, int(role.cpus)))
            env.update({name: threads for name in THREAD_ENV})
            env["QUOTA_ROLE"] = role.name
            env["CPU_LIMIT"] = f"{role.cpus:g}"
            env["MEM_LIMIT"] = str(role.memory)
        # CUDA images default to "all": without a GPU role, see none.
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    def _check_no_docker_socket(self, host_config: dict[str, Any] | None = None) -> None:
        host_config = host_config or {}
        binds = host_config.get("binds") or []  # a list of "src:dst[:mode]", or a dict
        sources = [
            *self.volumes,
            *(m.get("source", "") for m in self.mounts),
            *(str(b).split(":", 1)[0] for b in binds),
            *(m.get("Source", "") for m in host_config.get("mounts") or [] if isinstance(m, dict)),
        ]
        for source in sources:
            source = str(source).rstrip("/")
            if source.endswith("docker.sock") or os.path.exists(f"{source}/docker.sock"):
                raise web.HTTPError(
                    500, "Refusing to start: the Docker socket must never be mounted into a "
                         "notebook container (check DockerSpawner.volumes and mounts)."
                )

    async def check_allowed(self, image: str) -> str:
        # user_options["image"] is an image key, already checked in resolve()
        return self.image

    # --- lifecycle --------------------------------------------------------

    async def _check_engine_once(self) -> None:
        if QuotaSpawner._engine_checked:
            return
        QuotaSpawner._engine_checked = True
        try:
            check_engine_info(await self.docker("info"), self.log)
        except Exception as e:
            self.log.warning("Could not read docker info: %s", e)

    async def start(self) -> tuple[str, int]:
        await self._check_engine_once()
        choice = await self.resolve()
        self._check_no_docker_socket()
        self._apply_choice(choice)
        self.log.info(
            "Starting %s as role %s with image %s (%g CPUs, %d bytes memory)",
            self._log_name, choice.role.name, choice.image.key,
            choice.role.cpus, choice.role.memory,
        )
        ip, port = await super().start()
        try:
            # The hub's own readiness check backs off to seconds; polling here is faster.
            await wait_for_port(ip, port, self.poll)
        except BaseException:
            self.release_port()
            raise
        return ip, port

    async def stop(self, now: bool = False) -> None:
        if not self.object_id:
            # a start refused before any container was made
            await self.get_object()
            if not self.object_id:
                self.release_port()
                return
        await super().stop(now=now)
