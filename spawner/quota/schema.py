"""The quota table's JSON Schema, made from the fields ``Role``, ``Budget`` and
``RequestRules`` declare (spawner/quota/fields.py), for completion as you type.

The table editor's page gets it from ``quota_table_schema``; editors read the one copy
in the repository, docs/quota-table.schema.json, which this module writes
(``python -m spawner.quota.schema docs/quota-table.schema.json``) and a test keeps equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spawner.quota.fields import object_schema
from spawner.quota.loader import REQUIRED_TOP_FIELDS
from spawner.quota.model import (
    MAX_DURATION,
    MAX_SIZE,
    NAME_PATTERN,
    Budget,
    RequestRules,
    Role,
)
from spawner.quota.units import DURATION_PATTERN, SIZE_PATTERN, format_size

_DAYS, _HOURS = MAX_DURATION // 86400, MAX_DURATION // 3600

# The written forms that Size and Duration fields refer to (docs/quota-table.md#units).
_UNITS: dict[str, dict[str, Any]] = {
    "size": {
        "description": "Bytes, or a number with K, M, G, T (also KiB, MiB, GiB, TiB); all "
                       f"binary. At most {format_size(MAX_SIZE)}.",
        "oneOf": [{"type": "integer", "minimum": 1, "maximum": MAX_SIZE},
                  {"type": "string", "pattern": SIZE_PATTERN}],
    },
    "duration": {
        "description": "Seconds, or a number with s, m or h: 90, 45s, 30m, 1.5h, 72h. At "
                       f"least 1 second, at most {_DAYS} days ({_HOURS}h).",
        "oneOf": [{"type": "number", "minimum": 1, "maximum": MAX_DURATION},
                  {"type": "string", "pattern": DURATION_PATTERN}],
    },
    "durationOrZero": {
        "description": "A duration where 0 is allowed and means none: seconds, or a number "
                       f"with s, m or h: 0, 90, 45s, 30m, 1.5h. At most {_DAYS} days "
                       f"({_HOURS}h).",
        "oneOf": [{"type": "number", "minimum": 0, "maximum": MAX_DURATION},
                  {"type": "string", "pattern": DURATION_PATTERN}],
    },
}

_GPUS = {"required": ["gpus"], "properties": {"gpus": {"minimum": 1}}}
_SHARED_GPUS = {"required": ["gpus", "gpu_mode"],
                "properties": {"gpus": {"minimum": 1}, "gpu_mode": {"const": "shared"}}}
# The rules between a role's fields that a schema can say; the loader's are in
# _check_gpu_fields and _check_preemption_fields (spawner/quota/loader.py).
_ROLE_RULES: dict[str, Any] = {
    "dependentSchemas": {
        "gpu_mode": _GPUS,
        "gpu_share": _SHARED_GPUS,
        "gpu_memory": _SHARED_GPUS,
        "reclaim_after": {"required": ["preemptible"],
                          "properties": {"preemptible": {"const": False}}},
    },
    "if": {"required": ["gpu_mode"], "properties": {"gpu_mode": {"const": "shared"}}},
    "then": {"required": ["gpu_share"]},
}

# Images keep their own reader (an image's display_name defaults to its key).
_IMAGE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["image"],
    "properties": {
        "image": {"type": "string", "minLength": 1, "description": "The Docker image to run."},
        "display_name": {"type": "string", "description": "Shown on the spawn form."},
        "description": {"type": "string"},
    },
}


def _named(definition: str) -> dict[str, Any]:
    """A mapping of names to ``definition``s: the images, the roles."""
    return {"type": "object", "propertyNames": {"$ref": "#/$defs/name"},
            "additionalProperties": {"$ref": f"#/$defs/{definition}"}}


def _by_name(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": schema, "description": description}


def quota_table_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a quota table."""
    role_list = {"$ref": "#/$defs/roleList"}
    budget = {"$ref": "#/$defs/budget"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://quota-spawner.example/quota-table.schema.json",
        "title": "Quota Spawner quota table",
        "description": "Role-based quotas for Quota Spawner (hub_config/quotas.yaml). Sizes "
                       "are binary: 4G = 4 GiB. Durations are seconds, or 45s, 30m, 72h.",
        "type": "object",
        "additionalProperties": False,
        "required": list(REQUIRED_TOP_FIELDS),
        "$defs": {
            "name": {"type": "string", "pattern": NAME_PATTERN.pattern},
            **_UNITS,
            "budget": object_schema(Budget),
            "roleList": {"type": "array", "items": {"$ref": "#/$defs/name"},
                         "uniqueItems": True},
            "image": _IMAGE,
            "role": {**object_schema(Role), **_ROLE_RULES},
        },
        "properties": {
            "images": _named("image"),
            "roles": _named("role"),
            "assignments": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "default": {**role_list, "description": "Roles of anyone not matched by "
                                "users or groups; [] refuses them."},
                    "groups": _by_name(role_list, "JupyterHub group -> roles; a user gets the "
                                       "union of their groups' roles."),
                    "users": _by_name(role_list, "User -> roles; wins over groups and "
                                      "default."),
                },
            },
            "budgets": {
                "type": "object",
                "additionalProperties": False,
                "description": "Optional GPU-hour budgets (docs/usage.md#gpu-hour-budgets). A "
                               "start of a GPU role is refused while a budget of its user is "
                               "spent; roles without GPUs are never refused.",
                "properties": {
                    "timezone": {"type": "string", "minLength": 1, "description": "The IANA "
                                 "time zone whose midnight starts each period, e.g. "
                                 "Europe/Berlin (default UTC)."},
                    "groups": _by_name(budget, "JupyterHub group -> its budget, shared by all "
                                       "its members."),
                    "users": _by_name(budget, "User -> their own budget; it applies besides "
                                      "their groups' budgets."),
                },
            },
            "requests": object_schema(
                RequestRules,
                "Optional requests for a bigger role (docs/role-requests.md): users ask for a "
                "role they do not hold, for a time window, and an approval grants it until "
                "the window ends. Without it, nothing can be requested."),
        },
    }


def schema_text(schema: dict[str, Any] | None = None) -> str:
    """The schema as docs/quota-table.schema.json writes it: the sections and the lists
    of fields one entry a line, each field's own schema on its line, so that a diff of
    the file shows which field changed."""
    return _write(quota_table_schema() if schema is None else schema, 0, "") + "\n"


def _write(value: Any, depth: int, key: str) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict) and (depth < 3 or key in ("$defs", "properties",
                                                         "dependentSchemas")):
        items = [f"{inner}{json.dumps(k)}: {_write(v, depth + 1, k)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        items = [f"{inner}{json.dumps(v)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value)


def main(argv: list[str] | None = None) -> int:
    """Write the schema to the file named, or to stdout."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        Path(args[0]).write_text(schema_text(), encoding="utf-8")
    else:
        sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
