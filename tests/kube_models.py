"""Strict deserialisation of manifest dicts into the official Kubernetes client's models.

``ApiClient().deserialize`` drops a key it does not know (``runAsNonroot``
instead of ``runAsNonRoot`` simply vanishes), so a misspelt field would pass.
``unknown_fields`` walks the dict against each model's ``attribute_map`` and
``openapi_types`` and names every key and type the API would not take;
``strict`` fails on any, then deserialises (which checks required fields and
enums where the client does).

Import only after ``pytest.importorskip("kubernetes")``.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from kubernetes import client
from kubernetes.utils import parse_quantity

# "list[V1Container]" and "dict(str, str)" in older clients, "List[...]" and
# "Dict[str, str]" in newer ones
_LIST = re.compile(r"[Ll]ist\[(.+)\]")
_DICT = re.compile(r"(?:dict\(([^,]+), (.+)\)|Dict\[([^,]+), (.+)\])")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
    "datetime": (str,), "date": (str,),
}


def unknown_fields(data: Any, type_name: str, path: str = "") -> list[str]:
    """Every key the model does not define, and every value of the wrong JSON type."""
    where = path or type_name
    if data is None:
        return []
    if match := _LIST.fullmatch(type_name):
        if not isinstance(data, list):
            return [f"{where}: {type(data).__name__}, not a list"]
        return [p for i, item in enumerate(data)
                for p in unknown_fields(item, match.group(1), f"{where}[{i}]")]
    if match := _DICT.fullmatch(type_name):
        if not isinstance(data, dict):
            return [f"{where}: {type(data).__name__}, not an object"]
        values = match.group(2) or match.group(4)
        return [p for key, item in data.items()
                for p in unknown_fields(item, values, f"{where}.{key}")]
    if type_name == "object":  # int-or-string and the like: the API checks them
        return []
    if type_name in _PRIMITIVES:
        ok = isinstance(data, _PRIMITIVES[type_name])
        if type_name in ("int", "float") and isinstance(data, bool):
            ok = False  # True is an int to Python, not to the API
        return [] if ok else [f"{where}: {data!r} is not {type_name}"]
    model = getattr(client, type_name)
    if not isinstance(data, dict):
        return [f"{where}: {type(data).__name__}, not a {type_name} object"]
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    problems = []
    for key, value in data.items():
        if key not in by_json:
            problems.append(f"{where}.{key}: {type_name} has no such field")
        else:
            problems += unknown_fields(value, model.openapi_types[by_json[key]],
                                       f"{where}.{key}")
    return problems


def strict(data: dict[str, Any], type_name: str) -> Any:
    """The model for ``data``; AssertionError naming every unknown field first."""
    problems = unknown_fields(data, type_name)
    assert not problems, "\n".join(problems)

    api = client.ApiClient()
    if "content_type" in inspect.signature(api.deserialize).parameters:  # newer clients
        return api.deserialize(json.dumps(data), type_name, "application/json")

    class Response:  # what older clients' ApiClient.deserialize reads
        def __init__(self, text: str):
            self.data = text

    return api.deserialize(Response(json.dumps(data)), type_name)


def quantities(resources: dict[str, str]) -> dict[str, Any]:
    """Each quantity as a number, through the client's own parser (fails on a bad one)."""
    return {name: parse_quantity(value) for name, value in resources.items()}
