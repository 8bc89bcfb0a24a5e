"""The environment a container gets for its GPUs and its soft GPU memory cap.

The caps are per process and cooperative: each framework limits its own
allocator. They are not hardware isolation; MIG is (docs/gpus.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from spawner.contract import (
    GPU_MEMORY_LIMIT,
    JAX_MEMORY_FRACTION,
    JAX_PREALLOCATE,
    NO_GPU,
    NVIDIA_VISIBLE_DEVICES,
    PADDLE_ALLOCATOR,
    PADDLE_MEMORY_LIMIT_MB,
    TF_ALLOW_GROWTH,
    TORCH_FRACTION_KEY,
)
from spawner.notebook.torch_cap import reads_alloc_conf, release, without_fraction

# PyTorch's allocator settings (TORCH_ALLOC_CONF). Torch 2.10 and newer take
# the cap there as TORCH_FRACTION_KEY; the image's startup hook covers older
# torch (spawner/notebook/torch_cap.py). Admins may set other options in it,
# which are kept.
_TORCH_IN_LABEL = re.compile(r"\bPyTorch (\d+\.\d+)")


def torch_reads_fraction(frameworks: str) -> bool:
    """Whether an image's quota-spawner.frameworks label names a torch that reads
    TORCH_FRACTION_KEY. An older torch refuses the option when CUDA starts, in
    any Python of the image (the startup hook covers only the notebook venv),
    so it is set only where the image says so."""
    found = _TORCH_IN_LABEL.search(frameworks or "")
    return bool(found) and reads_alloc_conf(release(found.group(1)))


def torch_alloc_conf(existing: str, fraction: float) -> str:
    """``existing`` allocator options with the cap's fraction in place of any other."""
    return ",".join([*without_fraction(existing), f"{TORCH_FRACTION_KEY}:{fraction:.3f}"])


def memory_fraction(cap: int, device_memory: int) -> float:
    """The cap as a fraction of the card, rounded down to 3 places (never above it)."""
    return max(0.001, min(1.0, math.floor(cap / device_memory * 1000) / 1000))


def gpu_environment(
    uuids: Sequence[str], memory_cap: int | None = None, device_memory: int | None = None
) -> dict[str, str]:
    """NVIDIA_VISIBLE_DEVICES, plus the framework settings for a soft memory cap.

    ``device_memory`` is the smallest assigned GPU's memory, when known; JAX
    takes its cap as a fraction of it.
    """
    env = {NVIDIA_VISIBLE_DEVICES: ",".join(uuids) if uuids else NO_GPU}
    if uuids:
        env.update(memory_cap_environment(memory_cap, device_memory))
    return env


def memory_cap_environment(
    memory_cap: int | None, device_memory: int | None = None
) -> dict[str, str]:
    """The framework settings for a soft GPU memory cap; empty without a cap.

    Apart from the device variable, so that an engine whose GPUs are chosen by
    someone else (Kubernetes' device plugin) sets the same caps.
    """
    if not memory_cap:
        return {}
    env = {
        # Read by the monitor, and by the image's torch startup hook
        # (spawner/notebook/torch_cap.py) where torch predates the allocator setting.
        GPU_MEMORY_LIMIT: str(memory_cap),
        # PaddlePaddle
        PADDLE_MEMORY_LIMIT_MB: str(memory_cap // 2**20),
        PADDLE_ALLOCATOR: "auto_growth",
        # JAX: never grab most of the card up front
        JAX_PREALLOCATE: "false",
        # TensorFlow has no cap by environment; growth at least leaves room for others
        TF_ALLOW_GROWTH: "true",
    }
    if device_memory:
        env[JAX_MEMORY_FRACTION] = f"{memory_fraction(memory_cap, device_memory):.3f}"
    return env
