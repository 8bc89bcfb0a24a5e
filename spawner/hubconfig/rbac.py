"""JupyterHub RBAC for lab classes: the instructors' roles, and the scopes the web app's
class dashboard asks for (its OAuth client's) and holds (its own role's, for scheduled
pre-warms)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

# The usage page's own scope (spawner/webapp/access.py): filtered to a group, it shows
# the sessions of that group; the hub config defines it in c.JupyterHub.custom_scopes.
USAGE_SCOPE = "custom:quota-spawner:usage"
# Asked for by the web app's OAuth client, for the class dashboard: the hub intersects
# them with the visitor's own scopes, so an instructor's token carries list:users!group=G,
# read:users!group=G and servers!group=G (instructor_scopes) and nothing wider.
CLASS_OAUTH_SCOPES = ("list:users", "read:users", "servers")


def instructor_scopes(group: str, usage_page: str = "usage") -> list[str]:
    """List, start, stop and open the servers of ``group``'s members, and nobody else's;
    see their usage on the usage page (the service ``usage_page``; "" leaves it out, for
    a hub that neither runs it nor defines its scope)."""
    only = f"!group={group}"
    scopes = [
        "admin-ui",
        f"list:users{only}",
        f"read:users{only}",
        f"read:users:activity{only}",
        f"servers{only}",
        f"access:servers{only}",
    ]
    if usage_page:
        scopes += [f"{USAGE_SCOPE}{only}", f"access:services!service={usage_page}"]
    return scopes


# JupyterHub role names: lowercase letters, digits and - _ ~ . (ending in a
# letter or digit). A group name that is already one, without "--", is kept;
# any other gets a readable part and a hash of the whole name after "---",
# which no kept name contains, so two groups never share a role (as in
# kubespawner's slugs).
_SAFE_NAME = re.compile(r"^[a-z0-9]([a-z0-9\-_~.]{0,38}[a-z0-9])?$")


def group_slug(group: str) -> str:
    """``group`` as a unique piece of a JupyterHub role name."""
    if _SAFE_NAME.match(group) and "--" not in group:
        return group
    readable = re.sub(r"[^a-z0-9]+", "-", group.lower()).strip("-")[:24].strip("-") or "group"
    return f"{readable}---{hashlib.sha256(group.encode()).hexdigest()[:8]}"


def role_name(group: str) -> str:
    return f"instructor-{group_slug(group)}"


def instructor_roles(classes: Mapping[str, Iterable[str]],
                     usage_page: str = "usage") -> list[dict[str, Any]]:
    """``{group: [instructor, ...]}`` to entries for ``c.JupyterHub.load_roles``."""
    return [
        {
            "name": role_name(group),
            "description": f"Instructor of {group}: manage the servers of its members "
                           "and see their usage",
            "scopes": instructor_scopes(group, usage_page),
            "users": sorted(instructors),
        }
        for group, instructors in classes.items()
    ]


def class_service_scopes(classes: Mapping[str, Iterable[str]] | Iterable[str]) -> list[str]:
    """The web app's own scopes to start (and stop) the servers of these classes'
    members when no instructor is there (scheduled pre-warms): ``{group: [instructor,
    ...]}``, as ``instructor_roles`` takes, or groups."""
    return [f"servers!group={group}" for group in sorted(set(classes))]
