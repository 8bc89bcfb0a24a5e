"""The quota table's preemption and queue fields (priority, preempts, preemptible,
grace_period, min_runtime, reclaim_after, queue_timeout): their values and defaults, each
mistake with its file and line, the rules between them, the model's reading of them, what
`quota-spawner show` prints, and the JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from harness import gpu_table, line_of
from spawner.cli import main as cli_main
from spawner.quota.loader import ROLE_FIELDS, parse_quota_table, table_duration
from spawner.quota.model import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_MIN_RUNTIME,
    DEFAULT_QUEUE_TIMEOUT,
    MAX_PRIORITY,
    MIN_PRIORITY,
    QuotaTableError,
    Role,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "quota-table.schema.json").read_text())
NEW_FIELDS = ("priority", "preempts", "preemptible", "grace_period", "min_runtime",
              "reclaim_after", "queue_timeout")
WHOLE = f"a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}"


def problems(text: str) -> list[str]:
    with pytest.raises(QuotaTableError) as info:
        parse_quota_table(text, "q.yaml")
    return [str(p) for p in info.value.problems]


def role_r(fields: str) -> Role:
    return parse_quota_table(gpu_table(fields), "q.yaml").roles["r"]


def role(**fields) -> Role:
    return Role(name="r", cpus=1, memory=2**30, images=("pytorch",), **fields)


# --- valid values and defaults ----------------------------------------------------


def test_defaults_when_left_out():
    for r in (role_r("gpus: 1"), role_r("")):
        assert (r.priority, r.preempts, r.preemptible, r.reclaim_after) == (0, None, True, None)
        assert (r.grace_period, r.min_runtime, r.queue_timeout) == (
            DEFAULT_GRACE_PERIOD, DEFAULT_MIN_RUNTIME, DEFAULT_QUEUE_TIMEOUT)
        assert (r.grace_period, r.min_runtime, r.queue_timeout) == (120, 600, 600)


def test_all_fields_read():
    r = role_r("gpus: 1\npriority: 1000000\npreempts: lower\npreemptible: false\n"
               "grace_period: 30s\nmin_runtime: 5m\nreclaim_after: 12h\nqueue_timeout: 1h")
    assert (r.priority, r.preempts, r.preemptible) == (1_000_000, "lower", False)
    assert (r.grace_period, r.min_runtime, r.reclaim_after, r.queue_timeout) == (
        30, 300, 12 * 3600, 3600)
    assert all(isinstance(v, float) for v in
               (r.grace_period, r.min_runtime, r.reclaim_after, r.queue_timeout))


@pytest.mark.parametrize("written, value", [
    ("0", 0), ("1", 1), ("-1", -1), ("500000", 500_000), ("1_000_000", 1_000_000),
    (str(MAX_PRIORITY), MAX_PRIORITY), (str(MIN_PRIORITY), MIN_PRIORITY),
])
def test_priority_values(written, value):
    # a CPU-only role may have a priority too
    assert role_r(f"priority: {written}").priority == value
    assert role_r(f"gpus: 1\npriority: {written}").priority == value


@pytest.mark.parametrize("written, value", [("lower", "lower"), ("never", "never")])
def test_preempts_values(written, value):
    assert role_r(f"gpus: 1\npreempts: {written}").preempts == value


@pytest.mark.parametrize("written, value", [
    ("true", True), ("false", False), ("True", True), ("no", False), ("off", False),
])
def test_preemptible_values(written, value):
    # YAML 1.1 reads unquoted no/off as false; only quoted text is refused
    assert role_r(f"preemptible: {written}").preemptible is value
    assert role_r(f"gpus: 1\npreemptible: {written}").preemptible is value


@pytest.mark.parametrize("field", ["grace_period", "min_runtime", "queue_timeout"])
@pytest.mark.parametrize("written, seconds", [
    ("0", 0), ("0s", 0), ("0.5", 0.5), ("90", 90), ("45s", 45), ("30m", 1800), ("1.5h", 5400),
    ("8760h", 365 * 86400),
])
def test_durations_where_zero_is_allowed(field, written, seconds):
    assert getattr(role_r(f"gpus: 1\n{field}: {written}"), field) == seconds


@pytest.mark.parametrize("written, seconds", [("1", 1), ("90", 90), ("30m", 1800),
                                              ("72h", 259200)])
def test_reclaim_after_values(written, seconds):
    r = role_r(f"gpus: 1\npreemptible: false\nreclaim_after: {written}")
    assert r.reclaim_after == seconds


def test_fields_are_known_keys_in_order():
    assert ROLE_FIELDS[-len(NEW_FIELDS):] == NEW_FIELDS


def test_reclaim_after_below_max_age_and_zero_grace_parse():
    r = role_r("gpus: 1\nmax_age: 72h\npreemptible: false\nreclaim_after: 71h\n"
               "grace_period: 0\nmin_runtime: 0\nqueue_timeout: 0")
    assert (r.max_age, r.reclaim_after) == (259200, 71 * 3600)
    assert (r.grace_period, r.min_runtime, r.queue_timeout) == (0, 0, 0)


def test_preempts_lower_at_the_lowest_priority_is_allowed():
    # pointless (nothing is lower), but not a mistake
    r = role_r(f"gpus: 1\npriority: {MIN_PRIORITY}\npreempts: lower")
    assert r.may_preempt


# --- mistakes, each at its line ---------------------------------------------------


@pytest.mark.parametrize("fields, expected", [
    ("priority: high", [("priority", f"priority must be {WHOLE}, not text 'high'")]),
    ("priority: true", [("priority", f"priority must be {WHOLE}, not True")]),
    ("priority: 1.5", [("priority", f"priority must be {WHOLE}, not 1.5")]),
    ("priority: ''", [("priority", f"priority must be {WHOLE}, not text ''")]),
    ("priority:", [("priority", f"priority must be {WHOLE}, not nothing")]),
    ("priority: '100'", [("priority", f"priority must be {WHOLE}, not text '100'")]),
    (f"priority: {MIN_PRIORITY - 1}",
     [("priority", f"priority must be {WHOLE}, not {MIN_PRIORITY - 1}")]),
    (f"priority: {MAX_PRIORITY + 1}",
     [("priority", f"priority must be at most {MAX_PRIORITY}, not {MAX_PRIORITY + 1}")]),
    ("priority: 2000000000", [("priority", f"priority must be at most {MAX_PRIORITY}, "
                                           "not 2000000000")]),
    ("priority: .inf", [("priority", f"priority must be {WHOLE}, not inf")]),
    ("gpus: 1\npreempts: always",
     [("preempts", "preempts must be one of lower, never, not text 'always'")]),
    ("gpus: 1\npreempts: Lower",
     [("preempts", "preempts must be one of lower, never, not text 'Lower'")]),
    ("gpus: 1\npreempts: no",  # YAML reads it as false
     [("preempts", "preempts must be one of lower, never, not False")]),
    ("preemptible: 'no'", [("preemptible", "preemptible must be true or false, not text "
                                           "'no'; write true or false without quotes")]),
    ("preemptible: \"false\"", [("preemptible", "preemptible must be true or false, not text "
                                                "'false'; write true or false without quotes")]),
    ("preemptible: 1", [("preemptible", "preemptible must be true or false, not 1")]),
    ("preemptible:", [("preemptible", "preemptible must be true or false, not nothing")]),
    ("gpus: 1\ngrace_period: -1",
     [("grace_period", "grace_period must be at least 0 seconds, not -1")]),
    ("gpus: 1\nmin_runtime: -0.5",
     [("min_runtime", "min_runtime must be at least 0 seconds, not -0.5")]),
    ("gpus: 1\nqueue_timeout: soon",
     [("queue_timeout", "queue_timeout: cannot read 'soon' as a duration "
                        "(durations look like 90, 45s, 30m or 72h)")]),
    ("gpus: 1\nqueue_timeout: .inf",
     [("queue_timeout", "queue_timeout must be a finite duration, not .inf")]),
    ("gpus: 1\ngrace_period: 2d",
     [("grace_period", "grace_period: unknown unit 'd' in '2d'; use one of s, m, h "
                       "(durations look like 90, 45s, 30m or 72h)")]),
    ("gpus: 1\nmin_runtime: 9000h",
     [("min_runtime", "min_runtime must be at most 8760h (365 days), not 9000h")]),
    ("gpus: 1\nqueue_timeout: yes",
     [("queue_timeout", "queue_timeout: expected a duration, got a boolean "
                        "(durations look like 90, 45s, 30m or 72h)")]),
    ("gpus: 1\npreemptible: false\nreclaim_after: 0",
     [("reclaim_after", "reclaim_after must be at least 1 second, not 0")]),
    ("gpus: 1\npreemptible: false\nreclaim_after: 0.5s",
     [("reclaim_after", "reclaim_after must be at least 1 second, not 0.5s")]),
])
def test_field_problems_with_file_and_line(fields, expected):
    text = gpu_table(fields)
    want = [f"q.yaml:{line_of(text, key + ':', after='  r:')}: role 'r': {message}"
            for key, message in expected]
    assert problems(text) == want


def test_preemption_fields_apply_to_a_cpu_role():
    """A CPU-only role may preempt, and be preempted, for room on the host."""
    r = role_r("gpus: 0\npriority: 10\npreemptible: false\npreempts: lower\n"
               "grace_period: 30s\nmin_runtime: 0\nreclaim_after: 1h\nqueue_timeout: 1")
    assert (r.gpus, r.may_preempt, r.grace_period, r.min_runtime, r.reclaim_after) == \
        (0, True, 30, 0, 3600)


def test_priority_and_preemptible_are_allowed_on_a_cpu_role():
    r = role_r("priority: -100\npreemptible: false")
    assert (r.gpus, r.priority, r.preemptible) == (0, -100, False)


def test_a_cpu_role_may_set_how_long_it_waits_for_room_on_the_host():
    assert role_r("queue_timeout: 0").queue_timeout == 0
    assert role_r("queue_timeout: 2m").queue_timeout == 120
    assert role_r("").queue_timeout == 600


RECLAIM_NEEDS_PROTECTION = (
    "reclaim_after applies only to a role with preemptible: false; a preemptible role's "
    "servers can be preempted at any age past min_runtime")


@pytest.mark.parametrize("fields, message", [
    ("gpus: 1\nreclaim_after: 1h", RECLAIM_NEEDS_PROTECTION),
    ("gpus: 1\npreemptible: true\nreclaim_after: 1h", RECLAIM_NEEDS_PROTECTION),
    ("gpus: 1\nreclaim_after: 1h\npreemptible: yes", RECLAIM_NEEDS_PROTECTION),
    ("gpus: 1\nmax_age: 48h\npreemptible: false\nreclaim_after: 72h",
     "reclaim_after 72h is never reached, because max_age stops the server at 48h"),
    ("gpus: 1\nmax_age: 48h\npreemptible: false\nreclaim_after: 172800",
     "reclaim_after 48h is never reached, because max_age stops the server at 48h"),
    ("gpus: 1\nreclaim_after: 90m\npreemptible: false\nmax_age: 3601",
     "reclaim_after 90m is never reached, because max_age stops the server at 3601s"),
])
def test_reclaim_after_rules_at_its_line(fields, message):
    text = gpu_table(fields)
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'reclaim_after:')}: role 'r': {message}"]


def test_problems_in_several_roles_and_fields_all_reported_in_line_order():
    text = gpu_table("gpus: 1\npriority: high\npreempts: sometimes\npreemptible: 'no'").replace(
        "  cpu:\n    cpus: 1\n", "  cpu:\n    cpus: 1\n    grace_period: -1\n")
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'grace_period')}: role 'cpu': grace_period must be at least 0 "
        "seconds, not -1",
        f"q.yaml:{line_of(text, 'priority')}: role 'r': priority must be {WHOLE}, "
        "not text 'high'",
        f"q.yaml:{line_of(text, 'preempts')}: role 'r': preempts must be one of lower, never, "
        "not text 'sometimes'",
        f"q.yaml:{line_of(text, 'preemptible')}: role 'r': preemptible must be true or false, "
        "not text 'no'; write true or false without quotes",
    ]


def test_a_value_problem_is_not_followed_by_a_rule_problem():
    # the cross-field rules run only on a role whose values all read
    text = gpu_table("gpus: 1\nreclaim_after: 1h\npreemptible: 'no'")
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'preemptible')}: role 'r': preemptible must be true or false, "
        "not text 'no'; write true or false without quotes"]


def test_unknown_key_lists_the_new_fields():
    text = gpu_table("gpus: 1\npriorty: 5")
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'priorty')}: unknown key 'priorty' in role 'r'; expected one "
        f"of: {', '.join(ROLE_FIELDS)}"]
    assert ", max_age, priority, preempts, preemptible, grace_period, min_runtime, " \
           "reclaim_after, queue_timeout" in problems(text)[0]


# --- the model --------------------------------------------------------------------


@pytest.mark.parametrize("priority, preempts, expected", [
    (0, None, False), (1, None, True), (500_000, None, True), (-5, None, False),
    (0, "lower", True), (-5, "lower", True), (1000, "never", False), (0, "never", False),
])
def test_may_preempt(priority, preempts, expected):
    assert role(priority=priority, preempts=preempts).may_preempt is expected


@pytest.mark.parametrize("fields, age, expected", [
    ({}, 0, False), ({}, 10**6, False),
    ({"preemptible": True, "reclaim_after": 60}, 0, False),  # preemptible wins
    ({"preemptible": False}, 0, True), ({"preemptible": False}, 10**7, True),
    ({"preemptible": False, "reclaim_after": 3600}, 0, True),
    ({"preemptible": False, "reclaim_after": 3600}, 3599.9, True),
    ({"preemptible": False, "reclaim_after": 3600}, 3600, False),
    ({"preemptible": False, "reclaim_after": 3600}, 7200, False),
])
def test_protected_at(fields, age, expected):
    assert role(**fields).protected_at(age) is expected


def test_loaded_roles_resolve_as_written():
    r = role_r("gpus: 1\npriority: 1000000\npreemptible: false\nreclaim_after: 2h")
    assert r.may_preempt and r.protected_at(7199) and not r.protected_at(7200)
    never = role_r("gpus: 1\npriority: 1000000\npreempts: never")
    assert not never.may_preempt and not never.protected_at(0)


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (0.5, "0.5s"), (1, "1s"), (90, "90s"), (120, "2m"), (600, "10m"),
    (5400, "90m"), (3600, "1h"), (259200, "72h"), (3601, "3601s"),
])
def test_format_duration(seconds, text):
    assert table_duration(seconds) == text


# --- quota-spawner show -----------------------------------------------------------


def cli(capsys, *args: str) -> tuple[int, str]:
    code = cli_main(list(args))
    return code, capsys.readouterr().out


SHOW_TABLE = gpu_table(
    "gpus: 1\npriority: 1000000\npreempts: lower\npreemptible: false\nreclaim_after: 2h\n"
    "grace_period: 30s\nqueue_timeout: 0"
).replace("assignments:", (
    "  train:\n    cpus: 1\n    memory: 1G\n    images: [pytorch]\n    gpus: 1\n"
    "    priority: 300000\n    min_runtime: 0\n    grace_period: 0\n"
    "  plain:\n    cpus: 1\n    memory: 1G\n    images: [pytorch]\n    gpus: 1\n"
    "  keep:\n    cpus: 1\n    memory: 1G\n    images: [pytorch]\n    gpus: 1\n"
    "    preemptible: false\n    priority: -10\n"
    "assignments:")).replace("default: [cpu, r]", "default: [cpu, r, train, plain, keep]")


def test_show_prints_one_preemption_line_per_gpu_role(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(SHOW_TABLE)
    code, out = cli(capsys, "show", str(path), "--user", "bob")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "bob holds 5 roles:"
    assert lines[1] == "  cpu: 1 CPU · 1 GiB memory; images: pytorch"
    assert lines[2].startswith("  r: 1 CPU · 1 GiB memory · 1 GPU, exclusive; images: pytorch")
    assert lines[3] == ("    priority 1000000 · preempts lower priorities · protected for 2h, "
                        "then preemptible with 30s to save · no queue: refused when no GPU "
                        "is free")
    assert lines[4].startswith("  train: ")
    assert lines[5] == ("    priority 300000 · preempts lower priorities · preemptible at any "
                        "age, stopped at once · waits up to 10m for a GPU")
    assert lines[6].startswith("  plain: ")
    assert lines[7] == ("    priority 0 · never preempts · preemptible after 10m running, "
                        "with 2m to save · waits up to 10m for a GPU")
    assert lines[8].startswith("  keep: ")
    assert lines[9] == ("    priority -10 · never preempts · not preemptible · waits up to "
                        "10m for a GPU")
    assert len(lines) == 10  # the CPU-only role has no preemption line


def test_show_protected_line_counts_min_runtime_when_it_is_later(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(gpu_table("gpus: 1\npreemptible: false\nreclaim_after: 5m\n"
                              "min_runtime: 20m"))
    out = cli(capsys, "show", str(path), "--user", "bob")[1]
    assert "never preempts · protected for 20m, then preemptible with 2m to save" in out


def test_show_json_has_the_fields(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(SHOW_TABLE.replace("  cpu:\n    cpus: 1\n",
                                       "  cpu:\n    cpus: 1\n    priority: 7\n"))
    code, out = cli(capsys, "show", str(path), "--user", "bob", "--json")
    assert code == 0
    roles = {r["name"]: r for r in json.loads(out)["roles"]}
    pick = {name: {k: roles[name][k] for k in NEW_FIELDS} for name in roles}
    assert pick["r"] == {
        "priority": 1000000, "preempts": "lower", "preemptible": False, "grace_period": 30.0,
        "min_runtime": 600.0, "reclaim_after": 7200.0, "queue_timeout": 0.0}
    assert pick["train"] == {
        "priority": 300000, "preempts": "lower", "preemptible": True, "grace_period": 0.0,
        "min_runtime": 0.0, "reclaim_after": None, "queue_timeout": 600.0}
    assert pick["plain"] == {
        "priority": 0, "preempts": "never", "preemptible": True, "grace_period": 120.0,
        "min_runtime": 600.0, "reclaim_after": None, "queue_timeout": 600.0}
    assert pick["keep"]["preempts"] == "never" and pick["keep"]["preemptible"] is False
    # a CPU-only role: priority, preemptible and queue_timeout (it may wait for room on the
    # host) as for any role, null for the GPU-only ones
    assert pick["cpu"] == {
        "priority": 7, "preempts": None, "preemptible": True, "grace_period": None,
        "min_runtime": None, "reclaim_after": None, "queue_timeout": 600.0}


def test_validate_reports_the_rules(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    text = gpu_table("gpus: 1\nmax_age: 1h\npreemptible: false\nreclaim_after: 2h")
    path.write_text(text)
    code, out = cli(capsys, "validate", str(path))
    assert code == 1
    assert out.strip() == (f"{path}:{line_of(text, 'reclaim_after')}: role 'r': reclaim_after "
                           "2h is never reached, because max_age stops the server at 1h")


# --- the JSON Schema ----------------------------------------------------------------


FULL = gpu_table("gpus: 1\npriority: 1000000\npreempts: lower\npreemptible: false\n"
                 "grace_period: 0\nmin_runtime: 0\nreclaim_after: 12h\nqueue_timeout: 0")


def schema_check(text: str) -> None:
    jsonschema.validate(yaml.safe_load(text), SCHEMA)


def test_schema_is_valid_and_accepts_the_new_fields():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    parse_quota_table(FULL, "q.yaml")
    schema_check(FULL)
    schema_check(gpu_table("gpus: 2\npriority: -5\npreempts: never\ngrace_period: 30s\n"
                           "min_runtime: 10m\nqueue_timeout: 1.5h"))
    schema_check(gpu_table("priority: 5\npreemptible: true"))  # allowed on a CPU-only role


@pytest.mark.parametrize("fields", [
    "gpus: 1\npriority: high",
    "gpus: 1\npriority: 1.5",
    "gpus: 1\npriority: true",
    f"gpus: 1\npriority: {MAX_PRIORITY + 1}",
    f"gpus: 1\npriority: {MIN_PRIORITY - 1}",
    "gpus: 1\npreempts: always",
    "gpus: 1\npreemptible: 'no'",
    "gpus: 1\npreemptible: 1",
    "gpus: 1\ngrace_period: -1",
    "gpus: 1\nmin_runtime: 2d",
    "gpus: 1\nqueue_timeout: 31536001",
    "gpus: 1\npreemptible: false\nreclaim_after: 0",
    # the rules between fields the schema can express
    "gpus: 1\nreclaim_after: 1h",
    "gpus: 1\npreemptible: true\nreclaim_after: 1h",
    "reclaim_after: 1h",
])
def test_schema_refuses_what_the_loader_refuses(fields):
    text = gpu_table(fields)
    with pytest.raises(QuotaTableError):
        parse_quota_table(text, "q.yaml")
    with pytest.raises(jsonschema.ValidationError):
        schema_check(text)


@pytest.mark.parametrize("field, value", [
    ("priority", str(MAX_PRIORITY)), ("priority", str(MIN_PRIORITY)),
    ("grace_period", "31536000"), ("min_runtime", "0"), ("queue_timeout", "0"),
])
def test_schema_has_the_loaders_bounds(field, value):
    text = gpu_table(f"gpus: 1\n{field}: {value}")
    parse_quota_table(text, "q.yaml")
    schema_check(text)
