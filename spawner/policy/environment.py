"""The contract variables a notebook server gets, on any backend.

The role's threads and limits (read by jupyter-resource-usage and the BLAS and
OpenMP pools), the GPU device variable and the soft cap's framework settings
(spawner/policy/gpu.py), and torch's allocator fraction. Each backend writes
them on top of whatever its configuration set, and its last check expects
exactly these values.
"""

from __future__ import annotations

from spawner.contract import CPU_LIMIT, MEM_LIMIT, QUOTA_ROLE, THREAD_ENV
from spawner.policy.gpu import gpu_environment, memory_cap_environment, torch_alloc_conf
from spawner.policy.notebook import Notebook
from spawner.quota.model import Role


def role_environment(role: Role) -> dict[str, str]:
    """The role's variables: the thread counts, and the limits for jupyter-resource-usage."""
    threads = str(max(1, int(role.cpus)))  # BLAS and OpenMP pools sized to the quota
    env = dict.fromkeys(THREAD_ENV, threads)
    env.update({QUOTA_ROLE: role.name, CPU_LIMIT: f"{role.cpus:g}", MEM_LIMIT: str(role.memory)})
    return env


def environment(notebook: Notebook) -> dict[str, str]:
    """The contract variables: the role's, then the GPUs' and the soft cap's.

    Where the device plugin picks a GPU server's devices, it sets
    NVIDIA_VISIBLE_DEVICES itself, so only the caps are here; any other server
    names its GPUs, or ``void``, which outranks the ``all`` of CUDA images.
    """
    env = role_environment(notebook.role)
    cap, device = notebook.gpu_memory_cap, notebook.gpu_device_memory
    if notebook.device_plugin and notebook.gpu_count:
        env.update(memory_cap_environment(cap, device))
    else:
        env.update(gpu_environment(notebook.gpu_uuids, cap, device))
    return env


def torch_allocator(notebook: Notebook, existing: str = "") -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF: the ``existing`` options with the cap as torch's fraction
    last; None where no fraction applies (the variable is then the configuration's)."""
    fraction = notebook.torch_fraction
    return None if fraction is None else torch_alloc_conf(existing, fraction)
