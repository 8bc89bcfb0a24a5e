"""JupyterHub RBAC roles for instructors of lab classes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any


def instructor_scopes(group: str) -> list[str]:
    """List, start, stop and open the servers of ``group``'s members, and nobody else's."""
    only = f"!group={group}"
    return [
        "admin-ui",
        f"list:users{only}",
        f"read:users{only}",
        f"read:users:activity{only}",
        f"servers{only}",
        f"access:servers{only}",
    ]


def _role_name(group: str) -> str:
    # JupyterHub role names: lowercase letters, digits and - _ ~ . only
    safe = re.sub(r"[^a-z0-9\-_~.]", "-", group.lower()).strip("-_~.") or "group"
    return f"instructor-{safe}"


def instructor_roles(classes: Mapping[str, Iterable[str]]) -> list[dict[str, Any]]:
    """``{group: [instructor, ...]}`` to entries for ``c.JupyterHub.load_roles``."""
    return [
        {
            "name": _role_name(group),
            "description": f"Instructor of {group}: manage the servers of its members",
            "scopes": instructor_scopes(group),
            "users": sorted(instructors),
        }
        for group, instructors in classes.items()
    ]
