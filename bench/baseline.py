"""The baseline for bench/: plain DockerSpawner, plus only what host network mode needs.

Stock DockerSpawner cannot run with network_mode "host" at all, so the
baseline gets the same minimal host-network support as QuotaSpawner
(spawner.network.HostNetworkMixin) and nothing else: no readiness wait, no
quota table.
"""

from dockerspawner import DockerSpawner

from spawner.network import HostNetworkMixin


class PlainDockerSpawner(HostNetworkMixin, DockerSpawner):
    pass
