"""The quota table's loader: reads YAML and validates every field.

Every problem is reported with the file and line it comes from, so that an
admin can go straight to it. The loader never stops at the first problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from spawner.quota.fields import Names, field_names, table_fields
from spawner.quota.model import (
    DEFAULT_BUDGET_TIMEZONE,
    MAX_DURATION,
    MAX_SIZE,
    NAME_PATTERN,
    NAME_RULE,
    Budget,
    GpuCapacity,
    ImageSpec,
    Problem,
    QuotaTable,
    QuotaTableError,
    RequestRules,
    Role,
    time_zone,
)
from spawner.quota.units import (
    format_human,
    format_size,
    parse_duration,
    parse_size,
    table_duration,
)

_STR_TAG = "tag:yaml.org,2002:str"


class _Reader:
    """Walks the YAML node tree, turning nodes into values and noting problems."""

    def __init__(self, path: str, loader: yaml.SafeLoader, gpus: GpuCapacity | None = None):
        self.path = path
        self.loader = loader
        self.gpus = gpus
        self.problems: list[Problem] = []
        self._unreadable: set[int] = set()  # ids of nodes YAML could not construct
        self.role_lines: dict[str, int] = {}  # where each role is declared
        # "image" and "role": every name declared (valid or not), for the lists naming them
        self.declared: dict[str, set[str]] = {}

    def problem(self, node: Node, message: str) -> None:
        if id(node) in self._unreadable:
            return  # already reported as unreadable; a second message would only confuse
        self.problems.append(Problem(self.path, node.start_mark.line + 1, message))

    def scalar(self, node: Node) -> Any:
        """The node's value, or _UNREADABLE (reported) when YAML cannot construct it.

        Constructing can fail on valid YAML: a date like 2024-13-45, a tag with no
        safe constructor (``=``, ``<<``, ``!!python/...``), an int too long to convert.
        """
        try:
            return self.loader.construct_object(node, deep=True)
        except Exception as e:
            reason = e.problem if isinstance(e, yaml.MarkedYAMLError) and e.problem else str(e)
            what = repr(_written(node)) if _written(node) else "this value"
            self.problem(node, f"YAML cannot read {what}: {reason}; "
                               "write it in quotes if it is text")
            self._unreadable.add(id(node))
            return _UNREADABLE

    def not_text(self, node: Node, label: str) -> bool:
        """Report a name that YAML resolves to something other than text.

        Names are taken as written, so `0123` must not quietly become the user 83.
        """
        if not isinstance(node, ScalarNode) or node.tag == _STR_TAG:
            return False
        written = _written(node)
        if not written:
            self.problem(node, f"{label} is empty (YAML reads it as nothing)")
            return True
        tag = node.tag.rsplit(":", 1)[-1] if node.tag.startswith("tag:yaml.org,2002:") else ""
        if tag in ("int", "float"):
            value = self.scalar(node)
            if value is _UNREADABLE:
                return True
            read_as = f"the number {value!r}"
        elif tag == "bool":
            read_as = "true" if self.scalar(node) else "false"
            read_as += " (a true/false value)"
        elif tag == "null":
            read_as = "nothing (null)"
        elif tag == "timestamp":
            read_as = "a date"
        else:
            read_as = f"something other than text ({node.tag})"
        quoted = "'" + written.replace("'", "''") + "'"
        self.problem(node, f"{label} {written} is read by YAML as {read_as}; "
                           f"write it in quotes: {quoted}")
        return True

    def mapping(
        self, node: Node, where: str, allowed: Iterable[str] | None = None,
        kind: str | None = None, refused: set[str] | None = None,
    ) -> dict[str, tuple[Node, Node]]:
        """Key -> (key node, value node), reporting duplicates and unknown keys.

        Keys are taken as written and must be YAML strings; ``kind`` says what
        they are in messages ("user name"), else they are "the key ... in WHERE".
        Keys refused for not being strings are added, as written, to ``refused``.
        """
        if not isinstance(node, MappingNode):
            self.problem(node, f"{where} must be a mapping of keys to values")
            return {}
        allowed = list(allowed) if allowed is not None else None
        result: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.problem(key_node, f"a key in {where} must be a plain name")
                continue
            label = f"the {kind}" if kind else f"in {where}, the key"
            if self.not_text(key_node, label):
                if refused is not None:
                    refused.add(key_node.value)
                continue
            key = key_node.value
            if key in result:
                first = result[key][0].start_mark.line + 1
                self.problem(key_node, f"duplicate key '{key}' in {where} (first at line {first})")
                continue
            if allowed is not None and key not in allowed:
                self.problem(
                    key_node,
                    f"unknown key '{key}' in {where}; expected one of: {', '.join(allowed)}",
                )
                continue
            result[key] = (key_node, value_node)
        return result

    def names(self, node: Node, where: str, kind: str) -> list[tuple[Node, str]]:
        """A list of names (``kind``: "role name"), as (node, name) pairs."""
        if not isinstance(node, SequenceNode):
            self.problem(node, f"{where} must be a list, like [a, b]")
            return []
        items = []
        for item in node.value:
            if self.not_text(item, f"{where}: the {kind}"):
                continue
            value = self.scalar(item) if isinstance(item, ScalarNode) else None
            if not isinstance(value, str) or not value:
                self.problem(item, f"each entry of {where} must be a name")
                continue
            items.append((item, value))
        return items

    def text(self, node: Node, where: str) -> str | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, str):
            self.problem(node, f"{where} must be text")
            return None
        return value

    def positive_number(self, node: Node, where: str, maximum: float) -> float | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(node, f"{where} must be a number, like 2 or 0.5, not {_show(value)}")
            return None
        if isinstance(value, float) and not math.isfinite(value):  # nan passes all below
            self.problem(node, f"{where} must be a finite number, not {_written(node)}")
            return None
        if value <= 0:
            self.problem(node, f"{where} must be greater than 0, not {value}")
            return None
        if value > maximum:
            self.problem(node, f"{where} must be at most {maximum:g}, not {_written(node)}")
            return None
        return float(value)

    def whole_number(self, node: Node, where: str, maximum: int, minimum: int = 0) -> int | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            if minimum < 0:  # a range that takes negatives: say both ends
                rule = f" from {minimum} to {maximum}"
            else:
                rule = ", 0 or more" if minimum == 0 else f" of at least {minimum}"
            self.problem(node, f"{where} must be a whole number{rule}, not {_show(value)}")
            return None
        if value > maximum:
            self.problem(node, f"{where} must be at most {maximum}, not {_written(node)}")
            return None
        return value

    def flag(self, node: Node, where: str) -> bool | None:
        """A YAML true/false. Quoted "no" is text, and text would be true to Python."""
        value = self.scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, bool):
            hint = "; write true or false without quotes" if isinstance(value, str) else ""
            self.problem(node, f"{where} must be true or false, not {_show(value)}{hint}")
            return None
        return value

    def choice(self, node: Node, where: str, allowed: tuple[str, ...]) -> str | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else None
        if value not in allowed:
            self.problem(node, f"{where} must be one of {', '.join(allowed)}, not {_show(value)}")
            return None
        return value

    def _measure(self, node: Node, where: str, parse: Callable[[Any], Any], kind: str,
                 examples: str, low: tuple[float, str], high: tuple[float, str]) -> Any:
        """``parse`` of the value, within ``low`` and ``high`` ((bound, as written in
        messages)); None after a problem."""
        value = self.scalar(node) if isinstance(node, ScalarNode) else None
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(node, f"{where} must be a finite {kind}, not {_written(node)}")
            return None
        try:
            parsed = parse(value)
        except ValueError as e:
            self.problem(node, f"{where}: {e} ({kind}s look like {examples})")
            return None
        if parsed < low[0]:
            self.problem(node, f"{where} must be at least {low[1]}, not {value}")
            return None
        if parsed > high[0]:
            self.problem(node, f"{where} must be at most {high[1]}, not {_written(node)}")
            return None
        return parsed

    def duration(self, node: Node, where: str, minimum: float = 1) -> float | None:
        """Seconds. The minimum is 1 where 0 would act at once (idle_timeout, max_age,
        reclaim_after), 0 where 0 means "none" (no grace, no protection, no queue)."""
        least = f"{minimum:g} second{'' if minimum == 1 else 's'}"
        most = f"{MAX_DURATION // 3600}h ({MAX_DURATION // 86400} days)"
        return self._measure(node, where, parse_duration, "duration", "90, 45s, 30m or 72h",
                             (minimum, least), (MAX_DURATION, most))

    def size(self, node: Node, where: str, minimum: int = 1) -> int | None:
        return self._measure(node, where, parse_size, "size", "512M, 4G or 4GiB",
                             (minimum, format_size(minimum) if minimum > 1 else "1 byte"),
                             (MAX_SIZE, format_size(MAX_SIZE)))

    def entries(
        self, node: Node, what: str, allowed: tuple[str, ...], declared: set[str]
    ) -> Iterator[tuple[str, Node, Node, str, dict[str, tuple[Node, Node]]]]:
        """(name, its node, its value, "role 'x'", its fields) for each well-named entry
        of the images or roles section. ``declared`` gets every name written, refused
        ones too, so that a quoted reference to one is not reported again as unknown."""
        refused: set[str] = set()
        kind = "image key" if what == "image" else f"{what} name"
        found = self.mapping(node, f"{what}s", kind=kind, refused=refused)
        declared.update(found, refused)
        for name, (key_node, value) in found.items():
            if self.name_key(key_node, name, what):
                where = f"{what} '{name}'"
                yield name, key_node, value, where, self.mapping(value, where, allowed)

    def references(self, node: Node, where: str, list_where: str, what: str,
                   known: set[str], needs_one: bool = False) -> list[str]:
        """The names a list gives of images or roles: each known, none twice."""
        held: list[str] = []
        kind = "image key" if what == "image" else f"{what} name"
        items = self.names(node, list_where, kind)
        if needs_one and not items and isinstance(node, SequenceNode):
            self.problem(node, f"{list_where} must name at least one {what}")
        for item, name in items:
            if name not in known:
                listed = ", ".join(sorted(known)) or "none are defined"
                self.problem(item, f"{where} names {what} '{name}', which is not under "
                                   f"{what}s (known: {listed})")
            elif name in held:
                self.problem(item, f"{where} lists {what} '{name}' twice")
            else:
                held.append(name)
        return held

    def name_key(self, key_node: Node, key: str, what: str) -> bool:
        if NAME_PATTERN.match(key):
            return True
        self.problem(key_node, f"{what} name '{key}' is not allowed: names must {NAME_RULE}")
        return False


_UNREADABLE = object()  # what _Reader.scalar returns for a value YAML cannot construct


def _written(node: Node) -> str:
    """The scalar as the admin wrote it (``.inf``, ``0123``), for messages."""
    return node.value if isinstance(node, ScalarNode) else ""


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return f"text {value!r}"
    return repr(value)


IMAGE_FIELDS = ("image", "display_name", "description")
ROLE_FIELDS = field_names(Role)  # each declared once, in Role (spawner/quota/model.py)
ASSIGNMENT_FIELDS = ("default", "groups", "users")
BUDGETS_FIELDS = ("timezone", "groups", "users")
BUDGET_FIELDS = field_names(Budget)
REQUESTS_FIELDS = field_names(RequestRules)
TOP_FIELDS = ("images", "roles", "assignments", "budgets", "requests")
REQUIRED_TOP_FIELDS = ("images", "roles", "assignments")


def _read_images(r: _Reader, node: Node) -> tuple[dict[str, ImageSpec], set[str]]:
    """The valid images, and every key declared (valid or not)."""
    images: dict[str, ImageSpec] = {}
    declared: set[str] = set()
    for key, key_node, value, where, fields in r.entries(node, "image", IMAGE_FIELDS, declared):
        if isinstance(value, MappingNode) and "image" not in fields:
            r.problem(key_node, f"{where} needs an 'image' (the Docker image to run)")
            continue
        if not fields:
            continue
        image = r.text(fields["image"][1], f"{where}: image")
        display = r.text(fields["display_name"][1], f"{where}: display_name") if (
            "display_name" in fields
        ) else key
        description = r.text(fields["description"][1], f"{where}: description") if (
            "description" in fields
        ) else ""
        if image and display is not None and description is not None:
            images[key] = ImageSpec(key, image, display, description)
    return images, declared


def _check_gpu_fields(
    r: _Reader, where: str, fields: dict[str, tuple[Node, Node]], values: dict[str, Any]
) -> None:
    """Rules that span the GPU fields, and the table against the GPU inventory."""

    def at(key: str, message: str) -> None:
        r.problem(fields[key][0], f"{where}: {message}")

    gpus = values.get("gpus") or 0
    mode = values.get("gpu_mode", "exclusive")
    if gpus == 0:
        for key in ("gpu_mode", "gpu_share", "gpu_memory"):
            if key in fields:
                at(key, f"{key} applies only to a role with gpus of 1 or more")
        return
    if mode == "exclusive":
        if "gpu_share" in fields:
            at("gpu_share", "gpu_share needs gpu_mode: shared (exclusive GPUs have one user)")
        if "gpu_memory" in fields:
            at("gpu_memory", "gpu_memory is the per-user cap on a shared GPU; it needs "
                             "gpu_mode: shared (an exclusive user has the whole GPU)")
    elif mode == "shared" and "gpu_share" not in fields:
        at("gpu_mode", "gpu_mode: shared needs gpu_share, the most users on one GPU")
    capacity = r.gpus
    if capacity is None or capacity.count == 0:
        return  # no inventory: GPU roles are refused at spawn time, with a message
    if gpus > capacity.count:
        at("gpus", f"gpus is {gpus}, but this hub has only {capacity.count} "
                   f"GPU{'s' if capacity.count != 1 else ''}")
    cap = values.get("gpu_memory")
    if cap and capacity.smallest_memory and cap > capacity.smallest_memory:
        at("gpu_memory", f"gpu_memory {format_human(cap)} is more than the smallest GPU's "
                         f"memory ({format_human(capacity.smallest_memory)})")


def _check_preemption_fields(
    r: _Reader, where: str, fields: dict[str, tuple[Node, Node]], values: dict[str, Any]
) -> None:
    """Rules that span the preemption and queue fields (docs/preemption.md)."""

    def at(key: str, message: str) -> None:
        r.problem(fields[key][0], f"{where}: {message}")

    # every field here applies to any role: a start may preempt for GPUs, or for room on
    # the host (its CPUs and memory; docs/deployment.md#host-capacity)
    reclaim = values.get("reclaim_after")
    if reclaim is None:
        return
    if values.get("preemptible", True):
        at("reclaim_after", "reclaim_after applies only to a role with preemptible: false; "
                            "a preemptible role's servers can be preempted at any age past "
                            "min_runtime")
        return
    max_age = values.get("max_age")
    if max_age is not None and reclaim >= max_age:
        at("reclaim_after", f"reclaim_after {table_duration(reclaim)} is never reached, "
                            f"because max_age stops the server at {table_duration(max_age)}")


def _read_roles(r: _Reader, node: Node, images: dict[str, ImageSpec]) -> dict[str, Role]:
    """The valid roles; ``r.declared["role"]`` gets every name declared (valid or not).

    Each field is read as ``Role`` declares it (spawner/quota/fields.py's table_field)."""
    spec = {f.name: f for f in table_fields(Role)}
    roles: dict[str, Role] = {}
    declared = r.declared.setdefault("role", set())
    for name, key_node, value, where, fields in r.entries(node, "role", tuple(spec), declared):
        if not isinstance(value, MappingNode):
            continue
        r.role_lines[name] = key_node.start_mark.line + 1
        missing = [f.name for f in spec.values() if f.required and f.name not in fields]
        if missing:
            r.problem(key_node, f"{where} needs {', '.join(missing)}")
        before = len(r.problems)
        values: dict[str, Any] = {}
        # in the order written, lists of names last: so on a line with several problems
        # (a flow mapping), theirs come after the others'
        for key in sorted(fields, key=lambda k: isinstance(spec[k].kind, Names)):
            values[key] = spec[key].read(r, fields[key][1], where)
        if len(r.problems) == before:
            _check_gpu_fields(r, where, fields, values)
            _check_preemption_fields(r, where, fields, values)
        if missing or len(r.problems) > before:
            continue
        if not all(k in images for k in values["images"]):
            continue  # the image itself had a problem, reported already
        if values.get("gpu_mode") != "shared":
            values.pop("gpu_share", None)
        roles[name] = Role(name=name, **values)
    return roles


def _read_assignments(r: _Reader, node: Node, role_names: set[str]):
    fields = r.mapping(node, "assignments", ASSIGNMENT_FIELDS)

    def role_list(value: Node, where: str) -> tuple[str, ...]:
        return tuple(r.references(value, where, where, "role", role_names))

    default = role_list(fields["default"][1], "assignments: default") if (
        "default" in fields
    ) else ()
    by_section: dict[str, dict[str, tuple[str, ...]]] = {"groups": {}, "users": {}}
    for section, what in (("groups", "group"), ("users", "user")):
        if section not in fields:
            continue
        names = r.mapping(fields[section][1], f"assignments: {section}", kind=f"{what} name")
        for name, (_, value) in names.items():
            by_section[section][name] = role_list(value, f"assignments: {what} '{name}'")
    return default, by_section["groups"], by_section["users"]


def _read_budgets(r: _Reader, node: Node) -> tuple[tuple[Budget, ...], str]:
    """The valid budgets and the time zone their periods follow.

    A budget's group or user need not appear anywhere else in the table: a
    group's roles may come from ``default``.
    """
    fields = r.mapping(node, "budgets", BUDGETS_FIELDS)
    zone = DEFAULT_BUDGET_TIMEZONE
    if "timezone" in fields:
        value_node = fields["timezone"][1]
        name = r.text(value_node, "budgets: timezone")
        if name is not None:
            try:
                time_zone(name)
            except ValueError:
                r.problem(value_node, f"budgets: timezone {name!r} is not a time zone this "
                                      "machine knows; write an IANA name such as UTC, "
                                      "Europe/Berlin or America/New_York")
            else:
                zone = name
    budgets: list[Budget] = []
    for section, kind in (("groups", "group"), ("users", "user")):
        if section not in fields:
            continue
        names = r.mapping(fields[section][1], f"budgets: {section}", kind=f"{kind} name")
        for name, (key_node, value) in names.items():
            where = f"budgets: {kind} '{name}'"
            entry = r.mapping(value, where, BUDGET_FIELDS)
            if not isinstance(value, MappingNode):
                continue
            before = len(r.problems)
            spec = table_fields(Budget)
            missing = [f.name for f in spec if f.required and f.name not in entry]
            if missing:
                r.problem(key_node, f"{where} needs {' and '.join(missing)}, like "
                                    "{gpu_hours: 200, per: month}")
            values = {f.name: f.read(r, entry[f.name][1], where)
                      for f in spec if f.name in entry}
            if len(r.problems) == before:
                budgets.append(Budget(kind=kind, name=name, **values))
    return tuple(budgets), zone


def _read_requests(r: _Reader, node: Node) -> RequestRules:
    """Which roles may be requested, for how long, whether instructors decide, and how
    many requests one user may have waiting."""
    fields = r.mapping(node, "requests", REQUESTS_FIELDS)
    values = {f.name: f.read(r, fields[f.name][1], "requests")
              for f in table_fields(RequestRules) if f.name in fields}
    return RequestRules(**{k: v for k, v in values.items() if v is not None})


def _syntax_problem(e: Exception, text: str, path: str) -> Problem:
    """The Problem for a file that YAML cannot even parse."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        reason = e.problem or str(e)
        if e.context:
            reason = f"{e.context}: {reason}" if "while" not in e.context else reason
        return Problem(path, line, f"YAML syntax error: {reason}")
    if isinstance(e, yaml.reader.ReaderError):  # a control character; it has no mark
        line = text.count("\n", 0, max(e.position, 0)) + 1
        found = f"U+{e.character:04X}" if isinstance(e.character, int) else repr(e.character)
        return Problem(path, line, f"YAML syntax error: {e.reason} (found {found})")
    if isinstance(e, yaml.YAMLError):
        return Problem(path, 1, f"YAML error: {e}")
    return _unexpected(e, path)


def _unexpected(e: Exception, path: str) -> Problem:
    # RecursionError on very deep nesting, or a bug: a problem to fix, never a traceback.
    return Problem(path, 1, f"could not read the quota table: {type(e).__name__}: {e}")


def parse_quota_table(
    text: str, path: str = "<quota table>", gpus: GpuCapacity | None = None
) -> QuotaTable:
    """Parse and validate; raise QuotaTableError listing every problem.

    With ``gpus``, roles are also checked against the hub's GPU inventory.
    Raises nothing else, whatever the text.
    """
    try:
        loader = yaml.SafeLoader(text)
    except Exception as e:
        raise QuotaTableError([_syntax_problem(e, text, path)]) from None
    try:
        root = loader.get_single_node()
    except Exception as e:
        raise QuotaTableError([_syntax_problem(e, text, path)]) from None
    finally:
        loader.dispose()
    if root is None:
        raise QuotaTableError([Problem(path, 1, "the file is empty; it needs images, roles "
                                                "and assignments")])
    r = _Reader(path, loader, gpus)
    try:
        table = _read_table(r, root, path)
    except Exception as e:
        r.problems.append(_unexpected(e, path))
        table = None
    if r.problems or table is None:
        raise QuotaTableError(sorted(r.problems, key=lambda p: p.line))
    return table


def _read_table(r: _Reader, root: Node, path: str) -> QuotaTable:
    top = r.mapping(root, "the quota table", TOP_FIELDS)
    for needed in REQUIRED_TOP_FIELDS:
        if isinstance(root, MappingNode) and needed not in top and not r.problems:
            r.problem(root, f"the quota table needs a top-level '{needed}' section")
    images, r.declared["image"] = (
        _read_images(r, top["images"][1]) if "images" in top else ({}, set())
    )
    roles = _read_roles(r, top["roles"][1], images) if "roles" in top else {}
    default, groups, users = (
        _read_assignments(r, top["assignments"][1], r.declared.get("role", set()))
        if "assignments" in top else ((), {}, {})
    )
    budgets, zone = (
        _read_budgets(r, top["budgets"][1]) if "budgets" in top
        else ((), DEFAULT_BUDGET_TIMEZONE)
    )
    requests = (
        _read_requests(r, top["requests"][1]) if "requests" in top
        else RequestRules()
    )
    return QuotaTable(path, images, roles, default, groups, users, budgets, zone, requests,
                      role_lines={n: r.role_lines[n] for n in roles})


def load_quota_table(path: str | Path, gpus: GpuCapacity | None = None) -> QuotaTable:
    """Read and validate the quota table at ``path``."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise QuotaTableError([Problem(path, 0, f"cannot read the file: {e.strerror}")]) from None
    except UnicodeDecodeError as e:
        raise QuotaTableError([Problem(path, 1, f"the file is not UTF-8 text: {e}")]) from None
    return parse_quota_table(text, path, gpus)
