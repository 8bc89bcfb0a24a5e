"""A quota-table field's one declaration, ``table_field``, and the kinds of value a
field holds.

A field of ``Role``, ``Budget`` or ``RequestRules`` (spawner/quota/model.py) declared
with ``table_field`` is all the code needs to know of it: the loader reads and checks it
by its kind and reports it missing when it has no default, the JSON Schema
(spawner/quota/schema.py) lists it with its description, and the table editor's preview
spells its values (docs/quota-table.md#adding-a-role-field).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from spawner.quota.units import format_size, table_duration

if TYPE_CHECKING:
    from yaml.nodes import Node

REQUIRED: Any = dataclasses.MISSING  # a field with no default: the table must give it
_KEY = "quota_table_field"  # where table_field keeps the declaration in the metadata


class FieldReader(Protocol):
    """What a kind reads with: the loader's walk over the YAML nodes, which notes every
    problem as FILE:LINE and returns None for a value it refused."""

    declared: dict[str, set[str]]  # "image" and "role": every name the table declares

    def text(self, node: Node, where: str) -> str | None: ...
    def positive_number(self, node: Node, where: str, maximum: float) -> float | None: ...
    def whole_number(self, node: Node, where: str, maximum: int,
                     minimum: int = 0) -> int | None: ...
    def flag(self, node: Node, where: str) -> bool | None: ...
    def choice(self, node: Node, where: str, allowed: tuple[str, ...]) -> str | None: ...
    def size(self, node: Node, where: str, minimum: int = 1) -> int | None: ...
    def duration(self, node: Node, where: str, minimum: float = 1) -> float | None: ...
    def references(self, node: Node, where: str, list_where: str, what: str,
                   known: set[str], needs_one: bool = False) -> list[str]: ...


class Kind(ABC):
    """What a field's value is: how the loader reads it, its JSON Schema, and how the
    table writes a value of it."""

    @abstractmethod
    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> Any:
        """The value at ``node``, or None after noting a problem. ``owner`` is what holds
        the field ("role 'gpu'"), ``where`` the field itself ("role 'gpu': memory")."""

    @abstractmethod
    def schema(self) -> dict[str, Any]:
        """The field's JSON Schema, without its description."""

    def spell(self, value: Any) -> str:
        """A value as the table would write it."""
        return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Text(Kind):
    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> str | None:
        return r.text(node, where)

    def schema(self) -> dict[str, Any]:
        return {"type": "string"}

    def spell(self, value: Any) -> str:
        return repr(value)


@dataclass(frozen=True)
class Number(Kind):
    """A number greater than 0, at most ``maximum``; read as a float."""

    maximum: float

    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> float | None:
        return r.positive_number(node, where, self.maximum)

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "exclusiveMinimum": 0, "maximum": _json_number(self.maximum)}


@dataclass(frozen=True)
class WholeNumber(Kind):
    minimum: int
    maximum: int

    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> int | None:
        return r.whole_number(node, where, self.maximum, minimum=self.minimum)

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True)
class Flag(Kind):
    """true or false, unquoted."""

    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> bool | None:
        return r.flag(node, where)

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}

    def spell(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class OneOf(Kind):
    options: tuple[str, ...]

    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> str | None:
        return r.choice(node, where, self.options)

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.options)}


@dataclass(frozen=True)
class Size(Kind):
    """Bytes, written as docs/quota-table.md#units says: 4G, 512M, 4GiB; at most 64T."""

    minimum: int = 1

    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> int | None:
        return r.size(node, where, self.minimum)

    def schema(self) -> dict[str, Any]:
        return {"$ref": "#/$defs/size"}  # the minimum is said in the field's description

    def spell(self, value: Any) -> str:
        return format_size(int(value))


@dataclass(frozen=True)
class Duration(Kind):
    """Seconds, written 90, 45s, 30m or 72h; at most 365 days. ``minimum`` is 1 where 0
    would act at once, 0 where 0 means "none" (no grace, no protection, no queue)."""

    minimum: float = 1

    def __post_init__(self) -> None:
        if self.minimum not in (0, 1):  # the schema has a definition for these two only
            raise ValueError(f"a duration's minimum is 0 or 1, not {self.minimum!r}")

    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> float | None:
        return r.duration(node, where, minimum=self.minimum)

    def schema(self) -> dict[str, Any]:
        return {"$ref": "#/$defs/duration" if self.minimum else "#/$defs/durationOrZero"}

    def spell(self, value: Any) -> str:
        return table_duration(value)


@dataclass(frozen=True)
class Names(Kind):
    """A list of names declared in another section (``of``: "image" or "role"), each
    once. ``owner_names``: problems say the owner names them ("role 'x' names image
    'y', which is not under images"), not the field."""

    of: str
    needs_one: bool = False
    owner_names: bool = False

    def read(self, r: FieldReader, node: Node, owner: str, where: str) -> tuple[str, ...]:
        return tuple(r.references(node, owner if self.owner_names else where, where,
                                  self.of, r.declared.get(self.of, set()),
                                  needs_one=self.needs_one))

    def schema(self) -> dict[str, Any]:
        if not self.needs_one:
            return {"$ref": f"#/$defs/{self.of}List"}
        return {"type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"$ref": "#/$defs/name"}}

    def spell(self, value: Any) -> str:
        return "[" + ", ".join(value) + "]"


def _json_number(value: float) -> float | int:
    """1000000.0 as 1000000: the schema file writes whole bounds without a fraction."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def table_field(kind: Kind, default: Any = REQUIRED, description: str = "", *,
                label: str = "") -> Any:
    """Declare a field of the quota table in its dataclass, e.g. in ``Role``::

        shm: int | None = table_field(Size(), None, "Size of /dev/shm ...")

    With no ``default`` the table must give the field, and it is positional in the
    dataclass. ``description`` is the JSON Schema's, shown by editors as you type;
    ``label`` is how problems name the field, when not by its name alone.
    """
    declared = {_KEY: (kind, description, label)}
    if default is REQUIRED:
        return dataclasses.field(kw_only=False, metadata=declared)
    return dataclasses.field(default=default, metadata=declared)


@dataclass(frozen=True)
class TableField:
    """One field as ``table_field`` declared it."""

    name: str
    kind: Kind
    required: bool  # no default: the table must give it
    description: str
    label: str

    def read(self, r: FieldReader, node: Node, owner: str) -> Any:
        return self.kind.read(r, node, owner, f"{owner}: {self.label or self.name}")

    def schema(self) -> dict[str, Any]:
        schema = self.kind.schema()
        return {**schema, "description": self.description} if self.description else schema

    def spell(self, value: Any) -> str:
        return "unset" if value is None else self.kind.spell(value)


@cache
def table_fields(cls: type) -> tuple[TableField, ...]:
    """The table fields of a dataclass, in the order it declares them: the order the
    table documents them, and the order messages list them in."""
    found = []
    for f in dataclasses.fields(cls):
        if _KEY in f.metadata:
            kind, description, label = f.metadata[_KEY]
            found.append(TableField(f.name, kind, f.default is dataclasses.MISSING,
                                    description, label))
    return tuple(found)


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in table_fields(cls))


def object_schema(cls: type, description: str = "") -> dict[str, Any]:
    """The JSON Schema of a mapping whose keys are the table fields of ``cls``."""
    spec = table_fields(cls)
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False}
    required = [f.name for f in spec if f.required]
    if required:
        schema["required"] = required
    if description:
        schema["description"] = description
    schema["properties"] = {f.name: f.schema() for f in spec}
    return schema
