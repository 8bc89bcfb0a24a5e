"""The last check's rules, for every backend, and its one error.

Each backend writes the policy on top of what its configuration built
(Docker's create body, Kubernetes' pod dict) and then checks the result just
before the engine or the API gets it. Every way it breaks the quota is one
sentence naming the field, and a start with any is refused with all of them
(``refuse_any``, ``PolicyError``); nothing is created.

What the configuration may never set, on any backend, is named here too: the
contract's variables (``owned_variable``) and the ``quota-spawner.*`` labels
(``owned_label``), and a root user or group (``is_root``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spawner.contract import CONTRACT_ENV, LABEL_PREFIX


class PolicyError(Exception):
    """A server that must not be created; ``problems`` name each setting and why."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def refuse_any(problems: list[str]) -> None:
    """Raise PolicyError when there is any problem."""
    if problems:
        raise PolicyError(problems)


# --- what only the spawner sets ------------------------------------------------------


def owned_variable(name: object) -> bool:
    """Whether only the spawner sets this environment variable (the contract's)."""
    return name in CONTRACT_ENV


def owned_label(key: object) -> bool:
    """Whether only the spawner writes this label or annotation (``quota-spawner.*``)."""
    return str(key).startswith(LABEL_PREFIX)


def is_root(uid: int | None, gid: int | None = None) -> bool:
    """A notebook never runs as root nor in the root group; an unknown uid counts as root."""
    return uid is None or uid < 1 or (gid is not None and gid < 1)


# --- the sentences of the last check -------------------------------------------------


def differs(where: str, found: Any, wanted: Any, why: str = "") -> str:
    """The sentence for a field the quota sets that holds another value."""
    return f"{where} is {found!r}, not {wanted!r}" + (f": {why}" if why else "")


def mismatches(where: str, found: Mapping[Any, Any], wanted: Mapping[str, Any]) -> list[str]:
    """``differs`` for each key of ``wanted`` that ``found`` lacks or holds another value
    of; ``where`` is the keys' prefix, separator included."""
    return [differs(f"{where}{key}", found.get(key), value) for key, value in wanted.items()
            if found.get(key) != value]


def label_problems(what: str, found: Mapping[Any, Any], ours: Mapping[str, str]) -> list[str]:
    """Each of ``ours`` that ``found`` (labels or annotations) lacks or holds another value
    of, then each ``quota-spawner.*`` key in it that the spawner does not write."""
    return mismatches(f"{what} ", found, ours) + [
        f"{what} {key} is not one the spawner writes" for key in found
        if owned_label(key) and key not in ours]


def environment_problems(entries: Iterable[tuple[Any, Any]], wanted: Mapping[str, str],
                         names: Iterable[str] = CONTRACT_ENV, where: str = "") -> list[str]:
    """Each variable of ``names`` that ``entries`` (name, value) do not set exactly once to
    its value in ``wanted``, or set at all where ``wanted`` has none."""
    found: dict[Any, list[Any]] = {}
    for name, value in entries:
        found.setdefault(name, []).append(value)
    problems = []
    for name in names:
        expected = [wanted[name]] if name in wanted else []
        if found.get(name, []) != expected:
            problems.append(differs(f"{where}environment {name}", found.get(name, []), expected))
    return problems
