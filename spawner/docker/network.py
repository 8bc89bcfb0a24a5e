"""Networks for notebook containers, and waiting for a server's port.

The safe default is a user-defined bridge with inter-container traffic off:
notebooks reach the hub on the bridge's gateway, the proxy reaches them on
their bridge addresses, and they cannot reach each other (``ensure_network``).

Host mode is possible, with known risks (``warn_host_network``). Stock
DockerSpawner cannot run with ``network_name = "host"``: it always asks for
port bindings. Here each spawn gets its own free port on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol

from jupyterhub.utils import random_port

from spawner.contract import NETWORK_LABEL

LOOPBACK = "127.0.0.1"
ICC_OPTION = "com.docker.network.bridge.enable_icc"
HOST_NETWORK_WARNING = (
    "Notebook containers use the host's network (network_name = 'host'). Code in any "
    "notebook can listen on the host's ports, reachable from outside without the proxy "
    "or a login, can take the hub's or the proxy's port after a crash, and can reach "
    "every service on the host's loopback. Use a bridge network unless you accept "
    "this (docs/deployment.md#networking)."
)
_warned_host = False


def warn_host_network(log: logging.Logger | logging.LoggerAdapter) -> None:
    """Say once per process what host mode gives notebook code."""
    global _warned_host
    if not _warned_host:
        _warned_host = True
        log.warning("%s", HOST_NETWORK_WARNING)


def ensure_network(client: Any, name: str, log: logging.Logger | logging.LoggerAdapter) -> str:
    """The gateway address of the bridge network ``name``, created when missing.

    Created with inter-container traffic off. An existing network is used as
    it is; a warning says so if its containers can reach each other. Blocking:
    call it from the hub's config or in a thread. ``client`` is a docker
    APIClient.
    """
    found = client.networks(names=[name])
    found = [n for n in found if n.get("Name") == name]
    if found:
        network = client.inspect_network(found[0]["Id"])
    else:
        client.create_network(name, driver="bridge", options={ICC_OPTION: "false"},
                              labels={NETWORK_LABEL: "notebooks"})
        network = client.inspect_network(name)
        log.info("Created the notebook network %s (inter-container traffic off)", name)
    if network.get("Driver") != "bridge":
        raise RuntimeError(f"network {name!r} is a {network.get('Driver')!r} network, "
                           "not a bridge")
    if (network.get("Options") or {}).get(ICC_OPTION, "true") != "false":
        log.warning("Notebook network %s lets containers reach each other (%s is not "
                    "false); recreate it, or let the hub create it", name, ICC_OPTION)
    for config in (network.get("IPAM") or {}).get("Config") or []:
        if config.get("Gateway"):
            return str(config["Gateway"])
    raise RuntimeError(f"network {name!r} has no gateway address")


class HostNetworkSpawner(Protocol):
    """A DockerSpawner as host mode uses it: its network and the server's address."""

    network_name: str
    use_internal_ip: bool
    ip: str
    port: int

    @property
    def host_network(self) -> bool: ...

    def reserve_port(self) -> int: ...

    def release_port(self) -> None: ...


class HostNetworkMixin:
    """Adds host network mode to a DockerSpawner subclass (``HostNetworkSpawner``)."""

    # Ports handed out but maybe not bound yet, so two concurrent spawns in
    # this hub never pick the same one.
    _reserved_ports: ClassVar[set[int]] = set()

    @property
    def host_network(self: HostNetworkSpawner) -> bool:
        return self.network_name == "host"

    def reserve_port(self: HostNetworkSpawner) -> int:
        while True:
            port = random_port()
            if port not in HostNetworkMixin._reserved_ports:
                HostNetworkMixin._reserved_ports.add(port)
                return port

    def release_port(self: HostNetworkSpawner) -> None:
        HostNetworkMixin._reserved_ports.discard(self.port)

    async def start(self: HostNetworkSpawner) -> tuple[str, int]:
        if self.host_network:
            # no port bindings in host mode; the server binds loopback only
            self.use_internal_ip = True
            self.ip = LOOPBACK
            self.port = self.reserve_port()
        try:
            return await super().start()  # type: ignore[misc]
        except BaseException:
            self.release_port()
            raise

    async def get_ip_and_port(self: HostNetworkSpawner) -> tuple[str, int]:
        if self.host_network:
            return LOOPBACK, self.port
        return await super().get_ip_and_port()  # type: ignore[misc]

    async def stop(self: HostNetworkSpawner, now: bool = False) -> None:
        try:
            await super().stop(now=now)  # type: ignore[misc]
        finally:
            if self.host_network:
                self.release_port()


async def wait_for_port(
    ip: str,
    port: int,
    still_running: Callable[[], Awaitable[str | None]],
    interval: float = 0.05,
    fast_for: float = 4.0,
    slow_interval: float = 0.25,
    check_every: float = 2.0,
) -> None:
    """Return once ``ip:port`` accepts a TCP connection.

    Polls every ``interval`` for the first ``fast_for`` seconds (a lone server
    is up by then), then every ``slow_interval``, so that a class logging in at
    once does not spend the CPU its servers need on polling.
    ``still_running`` returns None while the server lives, or why it stopped;
    it is asked every ``check_every`` seconds, and a stop raises RuntimeError.
    """
    began = last_check = time.monotonic()
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout=1)
        except (OSError, asyncio.TimeoutError):
            pass
        else:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
            return
        if time.monotonic() - last_check >= check_every:
            last_check = time.monotonic()
            stopped = await still_running()
            if stopped is not None:
                raise RuntimeError(f"the server exited before it was ready: {stopped}")
        fast = time.monotonic() - began < fast_for
        await asyncio.sleep(interval if fast else slow_interval)
