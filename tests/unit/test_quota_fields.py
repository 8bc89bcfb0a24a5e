"""One source for the quota table's fields: each is one ``table_field`` in its dataclass,
from which the loader's reading and checks, the required fields, the defaults, the JSON
Schema and the editor's preview come; the schema is shipped once, and that copy is the
generated one."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
import tomllib
import yaml

from harness import gpu_table, line_of
from spawner.quota import editing, loader, schema
from spawner.quota.editing import FieldChange
from spawner.quota.fields import REQUIRED, Size, Text, table_field, table_fields
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import Budget, QuotaTableError, RequestRules, Role

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "docs" / "quota-table.schema.json"
G = 2**30


def problems(text: str) -> list[str]:
    with pytest.raises(QuotaTableError) as info:
        parse_quota_table(text, "q.yaml")
    return [str(p) for p in info.value.problems]


def test_the_committed_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema.schema_text(), (
        "docs/quota-table.schema.json differs from the field declarations; write it again "
        "with: python -m spawner.quota.schema docs/quota-table.schema.json")


def test_every_reference_in_the_schema_has_its_definition():
    made = schema.quota_table_schema()
    jsonschema.Draft202012Validator.check_schema(made)
    refs = re.findall(r'"\$ref": "#/\$defs/(\w+)"', json.dumps(made))
    assert refs and set(refs) <= set(made["$defs"])


def test_the_schema_is_shipped_once():
    """docs/ has the one copy; the package makes the schema when asked."""
    assert not files("spawner.quota").joinpath("quota-table.schema.json").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert not [p for p in data["tool"]["setuptools"]["package-data"]["spawner"]
                if p.startswith("quota/") and p.endswith(".json")]


def test_the_module_writes_the_file(tmp_path, capsys):
    schema.main([str(tmp_path / "s.json")])
    assert (tmp_path / "s.json").read_text() == schema.schema_text()
    schema.main([])
    assert json.loads(capsys.readouterr().out) == schema.quota_table_schema()


@pytest.mark.parametrize("cls, keys, at", [
    (Role, {"name"}, ("$defs", "role")),
    (Budget, {"kind", "name"}, ("$defs", "budget")),
    (RequestRules, set(), ("properties", "requests")),
])
def test_each_section_is_its_declared_fields(cls, keys, at):
    """A role, a budget and the request rules hold nothing but their declared fields and
    the keys they are filed under; the schema lists those fields in the same order."""
    declared = [f.name for f in table_fields(cls)]
    assert {f.name for f in dataclasses.fields(cls)} - set(declared) == keys
    assert list(schema.quota_table_schema()[at[0]][at[1]]["properties"]) == declared


def test_every_role_field_has_its_row_in_the_docs():
    docs = (ROOT / "docs" / "quota-table.md").read_text()
    roles = docs[docs.index("## `roles`"):docs.index("## `assignments`")]
    rows = re.findall(r"^\| `(\w+)` \|", roles, re.MULTILINE)
    assert sorted(rows) == sorted(f.name for f in table_fields(Role))


# --- a new field: the definition docs/quota-table.md#adding-a-role-field shows ----------

@dataclass(frozen=True, kw_only=True)
class RoleWithScratch(Role):
    scratch: int | None = table_field(
        Size(), None, "Size of the server's /scratch (default: none, no /scratch).")


@pytest.fixture
def scratch(monkeypatch):
    """The table's code with a role that declares one more field, ``scratch``."""
    for module in (loader, schema, editing):
        monkeypatch.setattr(module, "Role", RoleWithScratch)


def test_a_new_role_field_is_read_and_defaults(scratch):
    table = parse_quota_table(gpu_table("scratch: 20G"), "q.yaml")
    assert isinstance(table.roles["r"], RoleWithScratch)
    assert table.roles["r"].scratch == 20 * G
    assert table.roles["cpu"].scratch is None  # its default, for the role that leaves it out


def test_a_new_role_field_refuses_a_bad_value_at_its_line(scratch):
    text = gpu_table("scratch: lots")
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'scratch')}: role 'r': scratch: cannot read 'lots' as a size "
        "(sizes look like 512M, 4G or 4GiB)"]
    text = gpu_table("scratch: 65T")
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'scratch')}: role 'r': scratch must be at most 64T, not 65T"]


def test_a_new_role_field_is_a_known_key(scratch):
    text = gpu_table("scrach: 1G")
    assert problems(text)[0].endswith(", reclaim_after, queue_timeout, scratch")


def test_a_new_role_field_is_in_the_schema(scratch):
    made = schema.quota_table_schema()
    assert made["$defs"]["role"]["properties"]["scratch"] == {
        "$ref": "#/$defs/size",
        "description": "Size of the server's /scratch (default: none, no /scratch)."}
    assert "scratch" not in made["$defs"]["role"]["required"]
    jsonschema.validate(yaml.safe_load(gpu_table("scratch: 20G")), made)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(gpu_table("scratch: lots")), made)
    assert '"scratch": {"$ref": "#/$defs/size", ' in schema.schema_text(made)


def test_a_new_role_field_is_in_the_editors_preview(scratch):
    old = parse_quota_table(gpu_table("scratch: 10G"), "q.yaml")
    new = parse_quota_table(gpu_table("scratch: 20G"), "q.yaml")
    assert editing.preview(old, new, {"ann": []}).summary() == "r changes: scratch 10G → 20G."
    assert str(FieldChange("scratch", None, 2 * G)) == "scratch unset → 2G"


def test_a_new_required_field_is_positional_and_reported_missing(monkeypatch):
    @dataclass(frozen=True, kw_only=True)
    class RoleWithTeam(Role):
        team: str = table_field(Text(), REQUIRED, "The team that pays for it.")

    for module in (loader, schema):
        monkeypatch.setattr(module, "Role", RoleWithTeam)
    assert RoleWithTeam("r", 1, G, ("p",), "ml").team == "ml"
    text = gpu_table("gpus: 1")
    assert problems(text) == [f"q.yaml:{line_of(text, 'cpu:')}: role 'cpu' needs team",
                              f"q.yaml:{line_of(text, '  r:')}: role 'r' needs team"]
    assert schema.quota_table_schema()["$defs"]["role"]["required"] == [
        "cpus", "memory", "images", "team"]
