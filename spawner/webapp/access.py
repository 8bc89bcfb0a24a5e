"""Who sees what in the web app, from the OAuth user model the hub hands over.

- an admin (``admin`` is true), or anyone holding the unfiltered
  ``custom:quota-spawner:usage`` scope, sees every session of the usage report;
- an instructor holds ``custom:quota-spawner:usage!group=<class>``
  (spawner/hubconfig/rbac.py): the report of those classes, their class dashboard,
  and, when the table lets instructors decide, their members' role requests;
- the quota table editor and the host map are for admins only (``admin`` true, not a
  scope), since they change or show what everyone runs;
- everyone else may ask for a bigger role; the hub itself refuses those without
  ``access:services!service=usage`` before they reach this process.

Everything here is pure: the handlers in base.py call it and turn ``Refused`` into a
page or a JSON message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tornado import web

from spawner.hubconfig.rbac import USAGE_SCOPE as SCOPE

REFUSED = ("The usage page is for admins and for the instructors of a class, and you are "
           "neither. Ask an admin if you need these figures.")
NOT_AN_INSTRUCTOR = ("The class dashboard is for admins and for the instructors of a class, "
                     "and you are neither.")


class Refused(web.HTTPError):
    """A request this visitor may not make (403), or cannot (400, 404, 503); the sentence
    says why, for them."""

    def __init__(self, sentence: str, status: int = 403):
        super().__init__(status)
        self.sentence = sentence

    def __str__(self) -> str:
        return self.sentence


@dataclass(frozen=True)
class Access:
    """What one visitor may see: everything, or the sessions of some groups."""

    name: str
    everything: bool
    groups: tuple[str, ...] = ()


def is_admin(model: dict[str, Any] | None) -> bool:
    """Only ``admin`` true counts: not a truthy string, not a scope."""
    return isinstance(model, dict) and model.get("admin") is True


def access_for(model: dict[str, Any] | None) -> Access | None:
    """The visitor's access to the usage report; None: refused."""
    if not model:
        return None
    scopes = set(model.get("scopes") or ())
    name = str(model.get("name", ""))
    if is_admin(model) or SCOPE in scopes:
        return Access(name, everything=True)
    prefix = f"{SCOPE}!group="
    groups = sorted({s[len(prefix):] for s in scopes if s.startswith(prefix)})
    if groups:
        return Access(name, everything=False, groups=tuple(groups))
    return None


def class_access(model: dict[str, Any] | None) -> Access | None:
    """The class dashboard's: admins see every class; an instructor the groups of their
    usage scope's filters; a viewer of every session is no instructor."""
    found = access_for(model)
    if found is None or not model:
        return None
    if is_admin(model):
        return Access(found.name, everything=True)
    return found if found.groups else None


def taught(model: dict[str, Any] | None) -> tuple[str, ...]:
    """The classes this visitor is an instructor of (none for admins and viewers)."""
    found = access_for(model)
    return found.groups if found is not None and not found.everything else ()


def nav_for(model: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """The service's pages this visitor may open, as (label, path), for the header.
    Only a guide: each page and API call checks the visitor again."""
    if not model:
        return []
    access = access_for(model)
    links = []
    if access is not None:
        links.append(("Usage", prefix))
    if is_admin(model):
        links += [("Quota table", prefix + "table"), ("Host map", prefix + "gpus")]
    if class_access(model) is not None:
        links.append(("Classes", prefix + "classes"))
    links.append(("Role requests", prefix + "requests"))
    return links


def names(groups: Sequence[str]) -> str:
    """'cs101', 'cs101 and cs102', 'a, b and c'."""
    groups = list(groups)
    return groups[0] if len(groups) == 1 else ", ".join(groups[:-1]) + " and " + groups[-1]


def group_filter(access: Access, asked: str | None) -> str | None:
    """The group a report is filtered to: the one asked for if allowed, else an
    instructor's first class; None (every session) only for those who see everything."""
    asked = asked or None
    if access.everything:
        return asked
    if asked is None:
        return access.groups[0]
    if asked not in access.groups:
        raise Refused(f"You can see the usage of {names(access.groups)} only.")
    return asked


def user_group(access: Access, asked: str | None, user_groups: Sequence[str]) -> str | None:
    """The group a user's page is filtered to, or Refused. ``user_groups``: the groups
    the user's sessions were ever recorded with (only read for instructors)."""
    if access.everything:
        return asked or None
    mine = [g for g in access.groups if g in set(user_groups)]
    if asked and asked in mine:
        return asked
    if asked and asked not in access.groups:
        raise Refused(f"You can see the usage of {names(access.groups)} only.")
    if not mine:
        raise Refused(f"You can see the usage of the members of {names(access.groups)} "
                      "only, and this user has no sessions there.")
    return mine[0]


def class_of(access: Access, group: str) -> Access:
    """``access``, when it covers ``group``'s servers; else Refused."""
    if not access.everything and group not in access.groups:
        raise Refused(f"You manage the servers of {names(access.groups)} only, "
                      f"not of {group}.")
    return access
