"""The quota table loader: valid tables, and every kind of error with its line."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from spawner.quota import QuotaTableError, load_quota_table, parse_quota_table
from spawner.units import format_size, parse_duration, parse_size

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "hub_config" / "quotas.yaml"
SCHEMA = json.loads((ROOT / "docs" / "quota-table.schema.json").read_text())

GOOD = """\
images:
  pytorch:
    display_name: PyTorch
    image: quota-spawner/pytorch:latest
  paddle:
    image: quota-spawner/paddle:latest
roles:
  junior:
    cpus: 2
    memory: 4G
    images: [pytorch, paddle]
  senior:
    cpus: 8
    memory: 32G
    shm: 8G
    pids: 4096
    images: [pytorch]
  pipeline:
    cpus: 0.5
    memory: 512MiB
    images: [paddle]
assignments:
  default: [junior]
  groups:
    ml: [senior, pipeline]
    ops: [pipeline]
  users:
    lead: [senior]
    nobody: []
"""


def problems(text: str) -> list[str]:
    with pytest.raises(QuotaTableError) as info:
        parse_quota_table(text, "q.yaml")
    return [str(p) for p in info.value.problems]


def test_example_table_is_valid_and_matches_schema():
    table = load_quota_table(EXAMPLE)
    assert {"junior-researcher", "senior-engineer", "pipeline", "student", "instructor"} <= set(
        table.roles
    )
    assert table.roles["junior-researcher"].cpus == 2
    assert table.roles["junior-researcher"].memory == 4 * 2**30
    assert table.roles["senior-engineer"].memory == 32 * 2**30
    assert table.roles["pipeline"].memory == 2 * 2**30
    jsonschema.validate(yaml.safe_load(EXAMPLE.read_text()), SCHEMA)


def test_good_table_values():
    table = parse_quota_table(GOOD, "q.yaml")
    senior = table.roles["senior"]
    assert (senior.cpus, senior.memory, senior.shm, senior.pids) == (8, 32 * 2**30, 8 * 2**30, 4096)
    assert table.roles["pipeline"].memory == 512 * 2**20
    assert table.images["paddle"].display_name == "paddle"
    jsonschema.validate(yaml.safe_load(GOOD), SCHEMA)


@pytest.mark.parametrize(
    "user, groups, expected",
    [
        ("anyone", [], ["junior"]),
        ("lead", ["ml"], ["senior"]),  # users win over groups
        ("dev", ["ml", "ops"], ["senior", "pipeline"]),  # union, in table order
        ("dev", ["ops"], ["pipeline"]),
        ("dev", ["unknown-group"], ["junior"]),
        ("nobody", [], []),  # an explicit empty list refuses
    ],
)
def test_role_resolution(user, groups, expected):
    table = parse_quota_table(GOOD, "q.yaml")
    assert table.role_names_for(user, groups) == expected


def test_choices_follow_role_and_image_order():
    table = parse_quota_table(GOOD, "q.yaml")
    keys = [c.key for c in table.choices_for("dev", ["ml", "ops"])]
    assert keys == ["senior/pytorch", "pipeline/paddle"]


def test_default_empty_refuses_everyone_unmatched():
    text = GOOD.replace("default: [junior]", "default: []")
    assert parse_quota_table(text, "q.yaml").roles_for("x") == []


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("    cpus: 2\n", "    cpus: 0\n", "q.yaml:9: role 'junior': cpus must be greater than 0"),
        ("    cpus: 2\n", "    cpus: -1\n", "q.yaml:9: role 'junior': cpus must be greater than 0"),
        ("    cpus: 2\n", "    cpus: two\n", "q.yaml:9: role 'junior': cpus must be a number"),
        ("    cpus: 2\n", "    cpus: true\n", "q.yaml:9: role 'junior': cpus must be a number"),
        ("    memory: 4G\n", "    memory: 4 gigs\n", "q.yaml:10: role 'junior': memory: unknown unit 'gigs'"),
        ("    memory: 4G\n", "    memory: 4X\n", "q.yaml:10: role 'junior': memory: unknown unit 'X'"),
        ("    memory: 4G\n", "    memory: 1K\n", "q.yaml:10: role 'junior': memory must be at least"),
        ("    shm: 8G\n", "    shm: lots\n", "q.yaml:15: role 'senior': shm: cannot read 'lots'"),
        ("    pids: 4096\n", "    pids: 0\n", "q.yaml:16: role 'senior': pids must be a whole number"),
        ("    pids: 4096\n", "    pids: 1.5\n", "q.yaml:16: role 'senior': pids must be a whole number"),
        ("    images: [pytorch]\n", "    images: [pytorch, tensorflow]\n",
         "q.yaml:17: role 'senior' names image 'tensorflow', which is not under images"),
        ("    images: [pytorch]\n", "    images: []\n", "q.yaml:17: role 'senior': images must name"),
        ("    images: [pytorch]\n", "    images: pytorch\n", "q.yaml:17: role 'senior': images must be a list"),
        ("    shm: 8G\n", "    shm: 8G\n    gpu: 1\n", "q.yaml:16: unknown key 'gpu' in role 'senior'"),
        ("    memory: 4G\n", "    memory: 4G\n    memory: 8G\n",
         "q.yaml:11: duplicate key 'memory' in role 'junior' (first at line 10)"),
        ("    image: quota-spawner/paddle:latest\n", "    img: quota-spawner/paddle:latest\n",
         "q.yaml:6: unknown key 'img' in image 'paddle'"),
        ("    lead: [senior]\n", "    lead: [boss]\n",
         "q.yaml:28: assignments: user 'lead' names role 'boss', which is not under roles"),
        ("    ml: [senior, pipeline]\n", "    ml: [senior, pipelines]\n",
         "q.yaml:25: assignments: group 'ml' names role 'pipelines', which is not under roles"),
        ("  default: [junior]\n", "  default: [juniors]\n",
         "q.yaml:23: assignments: default names role 'juniors'"),
        ("  users:\n", "  user:\n", "q.yaml:27: unknown key 'user' in assignments"),
        ("    ops: [pipeline]\n", "    ops: [pipeline, pipeline]\n",
         "q.yaml:26: assignments: group 'ops' lists role 'pipeline' twice"),
        ("  junior:\n", "  'bad name!':\n", "q.yaml:8: role name 'bad name!' is not allowed"),
        ("images:\n", "images:\n  pytorch:\n    image: again\n", "q.yaml:4: duplicate key 'pytorch' in images (first at line 2)"),
    ],
)
def test_each_mistake_is_reported_with_its_line(old, new, expected):
    assert old in GOOD
    found = problems(GOOD.replace(old, new, 1))
    assert any(p.startswith(expected) for p in found), found


def test_missing_required_role_fields():
    found = problems(GOOD.replace("    cpus: 8\n    memory: 32G\n", ""))
    assert any(p.startswith("q.yaml:12: role 'senior' needs cpus, memory") for p in found), found


def test_syntax_error_has_line():
    found = problems(GOOD.replace("    cpus: 8\n", "    cpus: [8\n"))
    assert len(found) == 1 and found[0].startswith("q.yaml:1") and "YAML syntax error" in found[0]


def test_every_problem_is_reported_not_just_the_first():
    text = GOOD.replace("cpus: 2\n", "cpus: 0\n").replace("memory: 32G", "memory: huge")
    assert len(problems(text)) == 2


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "q.yaml:1: the file is empty"),
        ("- a\n- b\n", "q.yaml:1: the quota table must be a mapping"),
        ("images: {}\nroles: {}\n", "q.yaml:1: the quota table needs a top-level 'assignments'"),
        (GOOD + "extra: 1\n", "q.yaml:30: unknown key 'extra' in the quota table"),
    ],
)
def test_structure_errors(text, expected):
    assert any(p.startswith(expected) for p in problems(text))


def test_unreadable_file(tmp_path):
    with pytest.raises(QuotaTableError) as info:
        load_quota_table(tmp_path / "missing.yaml")
    assert "cannot read the file" in str(info.value)


@pytest.mark.parametrize(
    "value, expected",
    [(4096, 4096), ("4G", 4 * 2**30), ("4GiB", 4 * 2**30), ("512M", 512 * 2**20),
     ("1.5G", 3 * 2**29), ("2T", 2 * 2**40), ("8K", 8192), (" 64 MiB ", 64 * 2**20)],
)
def test_sizes_are_binary(value, expected):
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", ["4g", "4GB", "lots", "", "-1G", True, None, [1]])
def test_bad_sizes(value):
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize(
    "value, expected", [(90, 90), ("45s", 45), ("30m", 1800), ("72h", 259200), ("1.5h", 5400)]
)
def test_durations(value, expected):
    assert parse_duration(value) == expected


def test_format_size_round_trips():
    for text in ("4G", "512M", "3K", "2T", "1000"):
        assert format_size(parse_size(text)) == text
