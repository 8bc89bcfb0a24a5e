"""The quota table loader: valid tables, and every kind of error with its line."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.quota.loader import load_quota_table, parse_quota_table
from spawner.quota.model import QuotaTableError
from spawner.quota.units import format_size, parse_duration, parse_size

ROOT = Path(__file__).resolve().parents[2]
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
    assert table.roles["senior-engineer"].memory == 16 * 2**30
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


# --- bounds: non-finite and absurd numbers --------------------------------

# Where each numeric field goes in GOOD's role 'senior' (line 12), and the line
# the field under test ends up on. GPU fields bring the fields they depend on.
_FIELD_AT = {
    "cpus": ("    cpus: 8\n", "    cpus: {}\n", 13),
    "memory": ("    memory: 32G\n", "    memory: {}\n", 14),
    "shm": ("    shm: 8G\n", "    shm: {}\n", 15),
    "pids": ("    pids: 4096\n", "    pids: {}\n", 16),
    "gpus": ("    pids: 4096\n", "    pids: 4096\n    gpus: {}\n", 17),
    "gpu_share": ("    pids: 4096\n",
                  "    pids: 4096\n    gpus: 1\n    gpu_mode: shared\n    gpu_share: {}\n", 19),
    "gpu_memory": ("    pids: 4096\n", "    pids: 4096\n    gpus: 1\n    gpu_mode: shared\n"
                                      "    gpu_share: 2\n    gpu_memory: {}\n", 20),
    "idle_timeout": ("    pids: 4096\n", "    pids: 4096\n    idle_timeout: {}\n", 17),
    "max_age": ("    pids: 4096\n", "    pids: 4096\n    max_age: {}\n", 17),
}


def senior_with(field: str, value: str) -> tuple[str, int]:
    old, new, line = _FIELD_AT[field]
    assert old in GOOD
    return GOOD.replace(old, new.format(value), 1), line


_NOT_WHOLE = {"pids": "a whole number of at least 1", "gpus": "a whole number, 0 or more",
              "gpu_share": "a whole number of at least 1"}
_KIND = {"cpus": "number", "memory": "size", "shm": "size", "gpu_memory": "size",
         "idle_timeout": "duration", "max_age": "duration"}
_TOO_BIG = {
    "cpus": ("1025", "at most 1024"),
    "memory": ("65T", "at most 64T"),
    "shm": ("70368744177665", "at most 64T"),  # 64 TiB and one byte
    "gpu_memory": ("65537G", "at most 64T"),
    "pids": ("4194305", "at most 4194304"),
    "gpus": ("65", "at most 64"),
    "gpu_share": ("65", "at most 64"),
    "idle_timeout": ("8761h", "at most 8760h (365 days)"),
    "max_age": ("31536001", "at most 8760h (365 days)"),
}


def _bound_cases():
    for field in _FIELD_AT:
        big, at_most = _TOO_BIG[field]
        yield field, big, f"{at_most}, not {big}"
        for value in (".inf", "-.inf", ".nan", ".INF", "1.0e+300"):
            if field in _NOT_WHOLE:
                shown = {".inf": "inf", "-.inf": "-inf", ".nan": "nan", ".INF": "inf",
                         "1.0e+300": "1e+300"}[value]
                yield field, value, f"must be {_NOT_WHOLE[field]}, not {shown}"
            elif value == "1.0e+300":
                yield field, value, f"{at_most}, not 1.0e+300"
            else:
                yield field, value, f"must be a finite {_KIND[field]}, not {value}"


@pytest.mark.parametrize("field, value, expected", list(_bound_cases()))
def test_numbers_are_finite_and_bounded(field, value, expected):
    text, line = senior_with(field, value)
    found = problems(text)
    assert any(p.startswith(f"q.yaml:{line}: role 'senior': {field} ") and p.endswith(expected)
               for p in found), found


@pytest.mark.parametrize("field", list(_FIELD_AT))
def test_1e300_is_text_in_yaml_and_refused(field):
    # YAML 1.1 needs a dot and a signed exponent for a float: 1e300 is a string.
    text, line = senior_with(field, "1e300")
    assert any(p.startswith(f"q.yaml:{line}: role 'senior': {field}") for p in problems(text))


@pytest.mark.parametrize(
    "field, value",
    [("cpus", "1024"), ("memory", "64T"), ("shm", "64TiB"), ("gpu_memory", "65536G"),
     ("pids", "4194304"), ("gpus", "64"), ("gpu_share", "64"), ("idle_timeout", "8760h"),
     ("max_age", "31536000")],
)
def test_the_bounds_themselves_are_allowed(field, value):
    text, _ = senior_with(field, value)
    parse_quota_table(text, "q.yaml")


def test_bounds_are_named_constants():
    from spawner.quota import model as quota

    assert (quota.MAX_CPUS, quota.MAX_SIZE, quota.MAX_PIDS) == (1024, 64 * 2**40, 4194304)
    assert (quota.MAX_GPUS, quota.MAX_GPU_SHARE, quota.MAX_DURATION) == (64, 64, 365 * 86400)


@pytest.mark.parametrize(
    "value", [float("inf"), float("-inf"), float("nan"), "inf", "nan", ".inf", "1e400G",
              "1e300", "9" * 400, "9" * 400 + "T"],
)
def test_units_refuse_non_finite_with_value_error(value):
    # ValueError, never OverflowError: callers catch ValueError only.
    with pytest.raises(ValueError):
        parse_size(value)
    with pytest.raises(ValueError):
        parse_duration(value if not isinstance(value, str) else value.rstrip("T"))


# --- names are taken as written --------------------------------------------

_READ_AS = {
    "0123": "the number 83",
    "yes": "true (a true/false value)",
    "no": "false (a true/false value)",
    "on": "true (a true/false value)",
    "12:30": "the number 750",
    "~": "nothing (null)",
    "null": "nothing (null)",
    "1.5": "the number 1.5",
    "2024-01-01": "a date",
}

# (old, new with {} for the name, line, message prefix)
_NAME_PLACES = {
    "user name": ("    lead: [senior]\n", "    {}: [senior]\n", 28, "the user name"),
    "group name": ("    ops: [pipeline]\n", "    {}: [pipeline]\n", 26, "the group name"),
    "role name": ("  pipeline:\n", "  {}:\n", 18, "the role name"),
    "image key": ("  paddle:\n", "  {}:\n", 5, "the image key"),
    "default list": ("  default: [junior]\n", "  default: [junior, {}]\n", 23,
                     "assignments: default: the role name"),
    "user's roles": ("    lead: [senior]\n", "    lead:\n      - {}\n", 29,
                     "assignments: user 'lead': the role name"),
    "group's roles": ("    ml: [senior, pipeline]\n", "    ml: [{}, senior]\n", 25,
                      "assignments: group 'ml': the role name"),
    "role's images": ("    images: [pytorch]\n", "    images: [pytorch, {}]\n", 17,
                      "role 'senior': images: the image key"),
}


@pytest.mark.parametrize("place", list(_NAME_PLACES))
@pytest.mark.parametrize("written", list(_READ_AS))
def test_names_yaml_would_misread_are_refused(place, written):
    old, new, line, prefix = _NAME_PLACES[place]
    assert old in GOOD
    found = problems(GOOD.replace(old, new.format(written), 1))
    expected = (f"q.yaml:{line}: {prefix} {written} is read by YAML as {_READ_AS[written]}; "
                f"write it in quotes: '{written}'")
    assert expected in found, found


def test_other_keys_say_where_they_are():
    found = problems(GOOD.replace("    cpus: 8\n", "    cpus: 8\n    yes: 1\n"))
    assert ("q.yaml:14: in role 'senior', the key yes is read by YAML as true "
            "(a true/false value); write it in quotes: 'yes'") in found


QUOTED = """\
images:
  '0123': {image: a}
  "yes": {image: b}
roles:
  '2024-01-01': {cpus: 1, memory: 1G, images: ['0123', "yes"]}
  "1.5": {cpus: 1, memory: 1G, images: ["yes"]}
  'no': {cpus: 1, memory: 1G, images: ['0123']}
assignments:
  default: ['2024-01-01']
  groups: {'no': ["1.5"], '~': ['no'], "12:30": []}
  users: {'0123': ['1.5', 'no'], "null": [], 'on': ['2024-01-01'], 'o''brien': ["1.5"]}
"""


def test_quoted_names_are_kept_exactly():
    table = parse_quota_table(QUOTED, "q.yaml")
    assert list(table.images) == ["0123", "yes"]
    assert list(table.roles) == ["2024-01-01", "1.5", "no"]
    assert table.roles["2024-01-01"].images == ("0123", "yes")
    assert table.default == ("2024-01-01",)
    assert table.groups == {"no": ("1.5",), "~": ("no",), "12:30": ()}
    assert set(table.users) == {"0123", "null", "on", "o'brien"}
    assert table.role_names_for("0123") == ["1.5", "no"]
    assert table.role_names_for("83") == ["2024-01-01"]  # the default, not 0123's roles
    assert table.role_names_for("x", ["~"]) == ["no"]
    jsonschema.validate(yaml.safe_load(QUOTED), SCHEMA)


def test_quote_hint_escapes_a_quote():
    found = problems(GOOD.replace("    lead: [senior]\n", "    !who o'brien: [senior]\n"))
    assert found == ["q.yaml:28: the user name o'brien is read by YAML as something other than "
                     "text (!who); write it in quotes: 'o''brien'"]


# --- anything else is a problem, never an exception -------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a: 1\nb: \x07\n", "q.yaml:2: YAML syntax error: special characters are not allowed"),
        ("[" * 5000, "q.yaml:1: could not read the quota table: RecursionError"),
        (GOOD.replace("    display_name: PyTorch\n", "    display_name: 2024-13-45\n"),
         "q.yaml:3: YAML cannot read '2024-13-45': month must be in 1..12"),
        (GOOD.replace("    cpus: 8\n", "    cpus: =\n"),
         "q.yaml:13: YAML cannot read '=': could not determine a constructor"),
        (GOOD.replace("    cpus: 8\n", "    cpus: !!python/name:os.system\n"),
         "q.yaml:13: YAML cannot read this value: could not determine a constructor for the "
         "tag 'tag:yaml.org,2002:python/name:os.system'"),
        (GOOD.replace("    cpus: 8\n", "    cpus: " + "1" * 5000 + "\n"),
         "q.yaml:13: YAML cannot read"),
        (GOOD.replace("  paddle:\n", "  <<:\n"),
         "q.yaml:5: the image key << is read by YAML as something other than text"),
        (GOOD.replace("    lead: [senior]\n", "    lead: [!!binary aGk=]\n"),
         "q.yaml:28: assignments: user 'lead': the role name aGk= is read by YAML as "
         "something other than text"),
    ],
)
def test_odd_yaml_is_a_problem_not_a_crash(text, expected):
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found
    line = expected.split(":")[1]
    assert len([p for p in found if p.startswith(f"q.yaml:{line}:")]) == 1, found


def test_a_bug_in_the_walk_is_a_problem(monkeypatch):
    from spawner.quota import loader

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(loader, "_read_roles", broken)
    assert problems(GOOD) == ["q.yaml:1: could not read the quota table: RuntimeError: boom"]


_SCALARS = st.sampled_from(
    [".inf", "-.inf", ".nan", "1.0e+300", "1e300", "0123", "yes", "~", "", "12:30",
     "2024-01-01", "2024-13-45", "=", "<<", "!!binary aGk=", "[]", "{}", "[a, [b]]",
     "'x'", "*a", "&a 1", "!foo 1", "0x1F", "-1", "4G", "1" * 30, "9" * 400, "-" + "9" * 400,
     "1" * 5000, "- a"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, GOOD.count("\n") - 1), st.booleans(), _SCALARS),
                max_size=4))
def test_any_key_or_value_anywhere_is_a_problem_or_a_table(edits):
    lines = GOOD.splitlines()
    for index, as_key, value in edits:
        line = lines[index]
        indent = line[: len(line) - len(line.lstrip())]
        key, sep, rest = line.strip().partition(":")
        lines[index] = f"{indent}{value}{sep}{rest}" if as_key else f"{indent}{key}: {value}"
    try:
        parse_quota_table("\n".join(lines) + "\n", "q.yaml")
    except QuotaTableError as e:
        assert e.problems and all(p.line >= 1 for p in e.problems)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_problem_or_a_table(text):
    try:
        parse_quota_table(text, "q.yaml")
    except QuotaTableError as e:
        assert e.problems


@pytest.mark.parametrize(
    "field, value",
    [("cpus", "1025"), ("shm", "70368744177665"), ("pids", "4194305"), ("gpus", "65"),
     ("gpu_share", "65"), ("idle_timeout", "31536001"), ("max_age", "31536001")],
)
def test_schema_has_the_same_upper_bounds(field, value):
    text, _ = senior_with(field, value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(text), SCHEMA)
    text, _ = senior_with(field, str(int(value) - 1))
    jsonschema.validate(yaml.safe_load(text), SCHEMA)


def test_a_refused_name_is_not_reported_again_where_it_is_used_quoted():
    text = GOOD.replace("  paddle:\n", "  0123:\n").replace("[pytorch, paddle]", "[pytorch, '0123']")
    text = text.replace("  pipeline:\n", "  2024-01-01:\n").replace("[paddle]", "['0123']")
    text = text.replace("[senior, pipeline]", "[senior, '2024-01-01']")
    text = text.replace("[pipeline]", "['2024-01-01']")
    assert problems(text) == [
        "q.yaml:5: the image key 0123 is read by YAML as the number 83; write it in quotes: '0123'",
        "q.yaml:18: the role name 2024-01-01 is read by YAML as a date; "
        "write it in quotes: '2024-01-01'",
    ]


def test_huge_whole_numbers_are_refused_not_overflowed():
    assert parse_size(10**400) == 10**400  # exact; the quota table bounds it
    with pytest.raises(ValueError):
        parse_duration(10**400)
    for field in ("cpus", "memory", "pids", "idle_timeout"):
        text, line = senior_with(field, "9" * 400)
        found = problems(text)
        assert len(found) == 1 and found[0].startswith(f"q.yaml:{line}: role 'senior': {field}")
        assert "could not read" not in found[0], found
