"""The quota table: its model, the validating loader, the hot-reloading store,
the user's options checked against it, and the spawn form.

Kept empty: the GPU monitor inside the images imports ``spawner.quota.units``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # a name of spawner/quota.py before it became this package (spawner/common/moved.py)
    from spawner.common.moved import moved_name

    return moved_name(__name__, name)
