"""What the hub reads from the Docker engine: the checks the quotas depend on
(docker info), what each image holds (its label), the engine's own view
of volumes and of paths inside a created container (the socket rule), and
whether it can give GPUs to containers at all (the NVIDIA runtime probe).

The engine calls go through ``docker``, DockerSpawner's ``self.docker``,
which runs each call in a thread; ``stat_in_container`` blocks, and is
called in a thread too.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from docker.errors import APIError, NotFound
from docker.types import DeviceRequest
from docker.utils import decode_json_header

from spawner.contract import FRAMEWORKS_LABEL, HUB_LABEL
from spawner.docker.mounts import BindSource, is_socket, named_volumes, probe_paths
from spawner.quota.model import QuotaTable
from spawner.quota.units import format_human, rfc3339_time
from spawner.usage.duties import container_end  # noqa: F401 (see below)

Docker = Callable[..., Awaitable[Any]]  # DockerSpawner.docker: (method, *args, **kwargs)
# container_end (how a gone container ended, from the engine's events) lives beside its one
# user, usage/duties.py, which may not import Docker; it is still importable from here,
# where tests/unit/test_usage_ends.py looks for it.

SWAP_WARNING = (
    "The Docker engine cannot limit swap (docker info: SwapLimit false). "
    "Memory quotas are NOT fully enforced: containers can use swap beyond their "
    "memory limit. Enable swap accounting on the host (swapaccount=1 on the kernel "
    "command line for cgroup v1, or use cgroup v2)."
)


def check_engine_info(info: Mapping[str, Any], log: logging.Logger | logging.LoggerAdapter) -> bool:
    """Warn loudly about engine settings that weaken quotas; True when all is well."""
    ok = True
    if not info.get("SwapLimit", False):
        log.warning("!" * 20 + " %s " + "!" * 20, SWAP_WARNING)
        ok = False
    if not info.get("MemoryLimit", True):
        log.warning("The Docker engine cannot enforce memory limits (docker info: MemoryLimit "
                    "false): memory quotas will not be applied.")
        ok = False
    return ok


def check_engine(
    log: logging.Logger | logging.LoggerAdapter, client: Any = None
) -> dict[str, Any] | None:
    """Ask the engine for ``docker info`` and check it; blocking, for hub start.

    Returns the info, or None, after logging why, when the engine cannot be reached.
    """
    try:
        if client is None:
            import docker

            client = docker.from_env()
        info = client.info()
    except Exception as e:  # the hub must still start; spawns will say what is wrong
        log.warning("Cannot reach the Docker engine to check its limits: %s", e)
        return None
    check_engine_info(info, log)
    return info


def oversized_roles(table: QuotaTable, info: Mapping[str, Any] | None) -> list[str]:
    """A warning per role that asks for more CPUs or memory than the engine has.

    Warnings, not errors: overcommitting can be deliberate, but an admin
    should know that such a role can never get what it promises.
    """
    if not info:
        return []
    cpus, memory = info.get("NCPU"), info.get("MemTotal")
    warnings = []
    for role in table.roles.values():
        if cpus and role.cpus > cpus:
            warnings.append(f"Role '{role.name}' in {table.path} asks for {role.cpus:g} CPUs, "
                            f"but the Docker engine has {cpus}.")
        if memory and role.memory > memory:
            warnings.append(f"Role '{role.name}' in {table.path} asks for "
                            f"{format_human(role.memory)} of memory, but the Docker engine "
                            f"has {format_human(memory)}.")
    return warnings


_warned: set[str] = set()


def warn_oversized_roles(
    table: QuotaTable, info: Mapping[str, Any] | None, log: logging.Logger | logging.LoggerAdapter
) -> None:
    """Log each oversized role once per hub process (at hub start and after each edit)."""
    for warning in oversized_roles(table, info):
        if warning not in _warned:
            _warned.add(warning)
            log.warning("%s", warning)


class FrameworkLabels:
    """What each image holds, from its quota-spawner.frameworks label, read at most
    once a ``ttl``: the spawn form shows it, and the torch cap depends on it."""

    def __init__(self, ttl: float = 60.0):
        self.ttl = ttl
        self._read: dict[str, tuple[float, str]] = {}  # image -> (when read, label)

    async def get(self, images: Iterable[str], docker: Docker,
                  log: logging.Logger | logging.LoggerAdapter) -> dict[str, str]:
        """The label of each image that has one."""
        now = time.monotonic()
        found = {}
        for image in sorted(set(images)):
            cached = self._read.get(image)
            if cached is None or now - cached[0] > self.ttl:
                try:
                    info = await docker("inspect_image", image)
                    text = ((info.get("Config") or {}).get("Labels") or {}).get(FRAMEWORKS_LABEL)
                except Exception as e:  # a missing image is reported when it is started
                    log.debug("No contents label for %s: %s", image, e)
                    text = None
                cached = self._read[image] = (now, text or "")
            if cached[1]:
                found[image] = cached[1]
        return found


async def volume_info(docker: Docker, host: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The engine's view of the named volumes: a local volume may bind a host folder."""
    info = {}
    for name in named_volumes(host):
        try:
            info[name] = await docker("inspect_volume", name)
        except APIError as e:
            if e.status_code != 404:  # a missing volume is created empty
                raise
    return info


async def set_cpu_quota(docker: Docker, container_id: str, quota: int, period: int) -> None:
    """Set a running container's CPU quota, and read it back: raises when the engine
    reports anything else (a quota that did not take is never trusted)."""
    await docker("update_container", container_id, cpu_period=period, cpu_quota=quota)
    info = await docker("inspect_container", container_id)
    got = (info.get("HostConfig") or {}).get("CpuQuota")
    if got != quota:
        raise RuntimeError(f"the engine reports CpuQuota {got!r} after the update")


def stat_in_container(client: Any, container_id: str, path: str) -> dict[str, Any] | None:
    """The engine's stat of a path inside a created container (HEAD .../archive); blocks."""
    response = client.head(client._url("/containers/{0}/archive", container_id),
                           params={"path": path})
    if response.status_code == 404:
        return None
    client._raise_for_status(response)
    header = response.headers.get("X-Docker-Container-Path-Stat")
    return decode_json_header(header) if header else None


def engine_pool(threads: int) -> ThreadPoolExecutor:
    """The hub process's threads for engine calls, ``threads`` of them
    (QuotaSpawner.engine_threads): one pool per size, shared by every spawner of the
    process, as DockerSpawner shares its single thread; so the calls of many servers
    (a class's stops) run side by side, never more than ``threads`` at once."""
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = ThreadPoolExecutor(threads,
                                                        thread_name_prefix="quota-engine")
        return pool


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


async def socket_probe_problems(client: Any, container_id: str, binds: Iterable[BindSource],
                                pool: Executor | None = None) -> list[str]:
    """Ask the engine what each bind of a created container really is: it sees
    through symlinks. One sentence per bind that reaches a socket. The target first (a
    socket there ends the look, as the paths inside it cannot be asked about), then the
    paths inside it at once, in ``pool`` (the engine's threads; None: asyncio's), read
    in order as if asked one by one: the first socket wins over a later path's error."""
    loop = asyncio.get_running_loop()

    def stat(path: str) -> asyncio.Future[dict[str, Any] | None]:
        return loop.run_in_executor(pool, stat_in_container, client, container_id, path)

    problems = []
    for bind in binds:
        target, *inside = probe_paths(bind.target)
        found = [await stat(target)]
        if not (found[0] and is_socket(found[0])):
            found += await asyncio.gather(*(stat(path) for path in inside),
                                          return_exceptions=True)
        for path, answer in zip([target, *inside], found, strict=False):
            if isinstance(answer, BaseException):
                raise answer
            if answer and is_socket(answer):
                problems.append(f"{bind.setting} mounts {bind.source!r} at {bind.target!r}, "
                                f"and the engine finds a socket at {path!r} in it; an "
                                "engine socket must never reach a notebook")
                break
    return problems


class RunningContainers:
    """Whether containers run, for the polls of one moment in one engine call: the hub
    polls every server that is asked to start (its "already running" answer for a
    pre-warmed class) and every server on its timer, and one inspect each would queue a
    class's worth of engine calls. A poll joins the listing that has not been sent yet,
    so its answer is never older than the poll; a container the listing does not show
    running is the caller's to inspect, as before."""

    def __init__(self) -> None:
        self._asked: set[str] = set()
        self._listing: asyncio.Future[set[str]] | None = None

    async def running(self, container_id: str, docker: Docker) -> bool:
        """Whether ``container_id`` runs now (``docker``: DockerSpawner's engine call);
        raises what the listing raises."""
        if self._listing is None:
            self._listing = asyncio.ensure_future(self._list(docker))
        self._asked.add(container_id)
        return container_id in await asyncio.shield(self._listing)

    async def _list(self, docker: Docker) -> set[str]:
        await asyncio.sleep(0)  # the polls of this moment join this listing
        asked, self._asked, self._listing = self._asked, set(), None
        found = await docker("containers", filters={"id": sorted(asked), "status": "running"})
        return {c["Id"] for c in found or []}


# the engine's times are RFC 3339, as the Kubernetes API's: one reader for both
docker_time = rfc3339_time


# --- the NVIDIA runtime (docs/gpus.md#an-engine-without-the-nvidia-runtime) -----------

# dockerd registers its `nvidia` device driver at start only when it finds
# nvidia-container-runtime-hook on its PATH; without it, it answers a GPU
# DeviceRequest with this, at container start.
NO_NVIDIA_DRIVER = 'could not select device driver "nvidia"'
PROBE_LABEL = "quota-spawner.probe"  # never quota-spawner.user: not a notebook, not a zombie
PROBE_PREFIX = "quota-spawner-nvidia-probe-"
NVIDIA_RUNTIME_WARNING = (
    "The Docker engine has no NVIDIA runtime, so it cannot give GPUs to containers: {how} "
    "was answered with '{said}'. Every start of a role with GPUs is refused until an admin "
    "installs the NVIDIA Container Toolkit on the engine's host, so that "
    "nvidia-container-runtime-hook is on dockerd's PATH (nvidia-ctk runtime configure "
    "--runtime=docker), and restarts dockerd "
    "(docs/gpus.md#an-engine-without-the-nvidia-runtime). Roles without GPUs start as usual."
)


def no_nvidia_runtime(error: BaseException) -> str | None:
    """The engine's own words when ``error`` is its answer that it has no NVIDIA
    runtime (no `nvidia` device driver); None for any other error."""
    text = getattr(error, "explanation", None) or str(error)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return str(text) if NO_NVIDIA_DRIVER in str(text) else None


@dataclass(frozen=True)
class NvidiaProbe:
    """What one probe found."""

    image: str  # the image the probe container was made from
    missing: str | None  # the engine's words when it has no NVIDIA runtime
    start_error: str = ""  # the start's error, when it failed after the driver was found
    seconds: float = 0.0  # how long the probe took, create to removal


def probe_nvidia_runtime(client: Any, images: Iterable[str], uuid: str,
                         hub_id: str = "") -> NvidiaProbe | None:
    """Ask the engine whether it can give GPU ``uuid`` to a container. Blocks: call it
    in a thread. ``client`` is a docker APIClient.

    Creates (never pulls) a short-lived container from the first of ``images`` the
    engine has, asking for the GPU through the `nvidia` driver, and starts it: the
    engine selects the device driver then. Its "could not select device driver"
    means no NVIDIA runtime; anything else (``true`` ran, or the start failed later,
    say on a tiny image without ``true``) means the driver is there. The container
    is always removed. None when the engine has none of the images.
    """
    image = next((i for i in dict.fromkeys(images) if _has_image(client, i)), None)
    if image is None:
        return None
    began = time.monotonic()
    host = client.create_host_config(
        network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
        mem_limit=128 * 2**20, pids_limit=64,
        device_requests=[DeviceRequest(driver="nvidia", device_ids=[uuid],
                                       capabilities=[["gpu"]])])
    labels = {PROBE_LABEL: "nvidia-runtime", **({HUB_LABEL: hub_id} if hub_id else {})}
    name = PROBE_PREFIX + secrets.token_hex(6)
    missing, start_error = None, ""
    try:
        try:
            client.create_container(image, entrypoint=["true"], user="65534:65534", name=name,
                                    labels=labels, host_config=host)
        except APIError as e:  # an engine may check the driver at create already
            missing = no_nvidia_runtime(e)
            if missing is None:
                raise
        else:
            try:
                client.start(name)
            except APIError as e:
                missing = no_nvidia_runtime(e)
                start_error = "" if missing else str(e.explanation or e)
    finally:
        try:
            client.remove_container(name, force=True)
        except NotFound:
            pass
    return NvidiaProbe(image, missing, start_error, time.monotonic() - began)


def _has_image(client: Any, image: str) -> bool:
    try:
        client.inspect_image(image)
    except NotFound:
        return False
    return True


class NvidiaRuntime:
    """Whether the engine can give GPUs to containers: what the probe found, kept
    up to date by the GPU starts. One per hub runtime (spawner/docker/runtime.py).

    The first probe runs in a thread when the hub's runtime is built (``start``),
    at hub start, so the hub's log says at once when GPU starts cannot work. A start that finds the
    runtime missing is refused before it joins the GPU queue; that finding is
    probed again once it is ``recheck`` seconds old, so an engine fixed and
    restarted is noticed without a hub restart.
    """

    def __init__(self, client: Any, log: logging.Logger | logging.LoggerAdapter, uuid: str,
                 images: Callable[[], Awaitable[list[str]]], hub_id: str = "",
                 recheck: float = 60.0):
        self._client = client  # a docker APIClient (its methods block)
        self.log = log
        self.uuid = uuid  # the GPU the probe asks for
        self._images = images
        self.hub_id = hub_id
        self.recheck = recheck
        self.missing: str | None = None  # the engine's words, while it has no runtime
        self._found_at = 0.0  # when ``missing`` was last found (monotonic)
        self._task: asyncio.Task[None] | None = None
        self.last: NvidiaProbe | None = None  # the last probe that ran

    def start(self) -> None:
        """Probe in the background (the hub's start is not held up by it)."""
        self._probe_soon()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _probe_soon(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._probe())
        return self._task

    async def missing_now(self) -> str | None:
        """The engine's words if it has no NVIDIA runtime, as last found: after the
        probe under way, if any, and probed again first when the finding is old."""
        if self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        elif self.missing is not None and time.monotonic() - self._found_at >= self.recheck:
            await asyncio.shield(self._probe_soon())
        return self.missing

    async def _probe(self) -> None:
        try:
            images = await self._images()
            found = await asyncio.to_thread(probe_nvidia_runtime, self._client, images,
                                            self.uuid, self.hub_id)
        except Exception as e:  # the GPU starts will tell
            self.log.warning("Could not check whether the Docker engine has an NVIDIA "
                             "runtime: %s", e)
            return
        if found is None:
            self.log.warning("Could not check whether the Docker engine has an NVIDIA "
                             "runtime: it has none of the quota table's images")
            return
        self.last = found
        if found.missing is not None:
            self.saw(found.missing, f"a test container from {found.image} asking for GPU "
                                    f"{self.uuid}")
            return
        if self.missing is not None:
            self.log.info("The Docker engine has an NVIDIA runtime now: GPU starts are "
                          "served again")
        else:
            self.log.info("The Docker engine has an NVIDIA runtime (probe with %s and GPU "
                          "%s, %.2f s)", found.image, self.uuid, found.seconds)
        if found.start_error:  # the driver is there; a wrong UUID shows here, say
            self.log.warning("The NVIDIA runtime probe's test container (%s, GPU %s) "
                             "failed to start: %s", found.image, self.uuid, found.start_error)
        self.missing = None

    def saw(self, said: str, how: str) -> None:
        """The engine said it has no NVIDIA runtime, answering ``how``; logged as a
        warning when it is news."""
        if self.missing is None:
            self.log.warning("%s", NVIDIA_RUNTIME_WARNING.format(how=how, said=said))
        self.missing, self._found_at = said, time.monotonic()

    def worked(self) -> None:
        """A GPU container started: the runtime is there."""
        if self.missing is not None:
            self.log.info("The Docker engine has an NVIDIA runtime now: GPU starts are "
                          "served again")
        self.missing = None
