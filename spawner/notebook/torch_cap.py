"""Apply GPU_MEMORY_LIMIT to PyTorch in every Python process of the image.

The spawner puts the cap in PYTORCH_CUDA_ALLOC_CONF as
``per_process_memory_fraction``, which torch 2.10 and newer read themselves
(the local pytorch image pins 2.14.1): then this module does nothing.

Older torch (the upstream 2.7 image) rejects that option when CUDA starts.
For it, the notebook images install a .pth file that imports this module at
Python startup when GPU_MEMORY_LIMIT is set (images/common/notebook-setup.sh).
It waits for ``import torch``; then, for a torch that does not read the
option, it drops the option from the environment and queues
``torch.cuda.set_per_process_memory_fraction`` for CUDA's lazy
initialisation, so importing torch stays cheap and CPU-only work never
touches CUDA. A soft, per-process cap: see docs/gpus.md.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from spawner.contract import GPU_MEMORY_LIMIT as VARIABLE
from spawner.contract import TORCH_ALLOC_CONF as ALLOC_CONF
from spawner.contract import TORCH_FRACTION_KEY as FRACTION_KEY
from spawner.contract import gpu_memory_limit

# The first release known to read FRACTION_KEY from ALLOC_CONF. Erring late is
# safe: an older one gets the option dropped and the same cap from the hook.
ALLOC_CONF_SINCE = (2, 10)


def apply_cap(torch: Any, limit: int) -> None:
    """Cap every visible device at ``limit`` bytes (run once CUDA is initialised)."""
    for device in range(torch.cuda.device_count()):
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)


def on_torch_imported(torch: ModuleType, limit: int) -> None:
    # Decided here, not at startup: the .pth line runs before the image's
    # framework folder is on sys.path. CUDA has not started yet either way.
    if FRACTION_KEY in os.environ.get(ALLOC_CONF, "") and reads_alloc_conf(
            release(str(getattr(torch, "__version__", "")))):
        return  # torch applies the cap itself
    drop_fraction_option()
    try:
        torch.cuda._lazy_call(lambda: apply_cap(torch, limit))
    except Exception as e:  # never break `import torch`
        print(f"quota-spawner: could not apply {VARIABLE}: {e}", file=sys.stderr)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps torch's own loader to run after it."""

    def __init__(self, limit: int):
        self.limit = limit

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader, limit = spec.loader, self.limit
        exec_module = loader.exec_module

        def exec_then_cap(module: ModuleType) -> None:
            exec_module(module)
            on_torch_imported(module, limit)

        loader.exec_module = exec_then_cap  # type: ignore[method-assign]
        return spec


def release(version: str) -> tuple[int, ...] | None:
    """(major, minor) of a torch version string such as "2.14.1+cu130"."""
    try:
        return tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return None


def reads_alloc_conf(torch_release: tuple[int, ...] | None) -> bool:
    return torch_release is not None and torch_release >= ALLOC_CONF_SINCE


def without_fraction(alloc_conf: str) -> list[str]:
    """The options of an ALLOC_CONF value, less any FRACTION_KEY."""
    return [o.strip() for o in alloc_conf.split(",")
            if o.strip() and o.partition(":")[0].strip() != FRACTION_KEY]


def drop_fraction_option() -> None:
    """Remove FRACTION_KEY from ALLOC_CONF: an older torch refuses to start CUDA with it."""
    options = without_fraction(os.environ.get(ALLOC_CONF, ""))
    if options:
        os.environ[ALLOC_CONF] = ",".join(options)
    else:
        os.environ.pop(ALLOC_CONF, None)


def install() -> None:
    """Called from the .pth file: arm the hook when a cap applies."""
    limit = gpu_memory_limit(os.environ)
    if limit is None:
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        on_torch_imported(torch, limit)
    elif not any(isinstance(f, _TorchImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportHook(limit))
