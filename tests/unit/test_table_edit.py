"""The quota table editor's backend: checks, the preview, saves (validation, comment,
concurrency, atomic writes), the audit trail and restores, and the ledger's migration that
adds the trail. Real files and a SQLite ledger in tmp_path."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

import pytest
from alembic import command
from sqlalchemy import select

from spawner.cli import main as cli_main
from spawner.quota.editing import (
    BEFORE_EDITOR,
    CONFLICT,
    INVALID,
    NO_COMMENT,
    NOT_FOUND,
    OUTSIDE_EDITOR,
    SAVED,
    UNCHANGED,
    FieldChange,
    RunningServer,
    TableFile,
    check,
    preview,
    version_of,
)
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import GpuCapacity, Problem
from spawner.quota.store import QuotaStore
from spawner.usage.ledger import (
    Ledger,
    _alembic_config,
    current_revision,
    head_revision,
    make_engine,
)
from spawner.usage.schema import sessions, table_versions
from spawner.usage.table_versions import Audit

pytestmark = pytest.mark.usefixtures("quiet_alembic")

LOG = logging.getLogger("test-table-edit")

TABLE = """\
images:
  py:
    image: quay.io/jupyter/scipy-notebook:2024-05-06
    display_name: Python
roles:
  small:
    cpus: 1
    memory: 2G
    images: [py]
  gpu-training:
    cpus: 8
    memory: 32G
    gpus: 2
    images: [py]
assignments:
  default: [small]
  groups:
    ml: [small, gpu-training]
  users:
    ada: [gpu-training]
"""
# the same table, with gpu-training taken from the ml group and small given more memory
EDITED = TABLE.replace("    ml: [small, gpu-training]", "    ml: [small]").replace(
    "memory: 2G", "memory: 4G")



@pytest.fixture
def table_path(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text(TABLE)
    path.chmod(0o640)
    return path


@pytest.fixture
def audit(ledger_url):
    ledger = Ledger(ledger_url, LOG)
    yield Audit(ledger.engine)
    ledger.dispose()


def leftovers(folder) -> list[str]:
    """Files other than the table, the ledger and the lock file: a temp file left behind."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(
        ("quotas.yaml", "usage.sqlite", ".quotas.yaml.lock")))


# --- check ------------------------------------------------------------------------------


def test_check_gives_the_clis_messages(tmp_path, capsys):
    assert check(TABLE, "quotas.yaml") == []
    bad = TABLE.replace("cpus: 8", "cpus: eight")
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    problems = check(bad, str(path))
    assert problems == [Problem(str(path), 11,
                                "role 'gpu-training': cpus must be a number, like 2 or 0.5, "
                                "not text 'eight'")]
    assert cli_main(["validate", str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == [str(p) for p in problems]


def test_check_with_the_hubs_gpus_like_the_clis_gpus_option():
    assert check(TABLE, "q.yaml", GpuCapacity(2)) == []
    [problem] = check(TABLE, "q.yaml", GpuCapacity(1))
    assert str(problem) == "q.yaml:13: role 'gpu-training': gpus is 2, but this hub has only 1 GPU"


def test_check_reports_a_syntax_error_with_its_line():
    [problem] = check(TABLE.replace("  py:\n", "  py: [\n"), "q.yaml")
    assert problem.file == "q.yaml" and problem.message.startswith("YAML syntax error")


# --- preview ----------------------------------------------------------------------------


def test_preview_of_a_hand_made_pair_of_tables():
    old = parse_quota_table(TABLE, "q.yaml")
    new = parse_quota_table(EDITED.replace("cpus: 8", "cpus: 16") + "    bo: [small]\n",
                            "q.yaml")
    users = {"ada": [], "bo": ["ml"], "cy": ["ml"], "di": ["ml", "other"], "ed": []}
    running = {"cy": "gpu-training", "ed": "small", "ada": "gpu-training"}
    p = preview(old, new, users, running)
    assert p.losses == {"gpu-training": ("bo", "cy", "di")}
    assert p.gains == {}
    assert p.running == (
        RunningServer("ada", "gpu-training", lost=False,
                      changes=(FieldChange("cpus", 8.0, 16.0),)),
        RunningServer("cy", "gpu-training", lost=True),
        RunningServer("ed", "small", lost=False,
                      changes=(FieldChange("memory", 2 * 2**30, 4 * 2**30),)),
    )
    assert [c.role for c in p.roles_changed] == ["gpu-training", "small"]
    assert p.sentences() == [
        "3 users lose gpu-training.",
        "3 running servers keep their limits until they stop.",
        "gpu-training changes: cpus 8 → 16.",
        "small changes: memory 2G → 4G.",
    ]
    assert p.summary() == " ".join(p.sentences())


def test_preview_of_roles_images_and_budgets_added_and_removed():
    old = parse_quota_table(TABLE, "q.yaml")
    new_text = (TABLE.replace("    ada: [gpu-training]", "    ada: [big]")
                .replace("  gpu-training:\n    cpus: 8", "  big:\n    cpus: 8")
                .replace("    ml: [small, gpu-training]", "    ml: [small, big]")
                .replace("images:\n", "images:\n  r:\n    image: r-notebook:1\n"
                                      "    display_name: R\n", 1)
                .replace("display_name: Python", "display_name: Python 3")
                + "budgets:\n  timezone: Europe/Paris\n  groups:\n"
                  "    ml: {gpu_hours: 100, per: week}\n")
    new = parse_quota_table(new_text, "q.yaml")
    p = preview(old, new, {"ada": [], "bo": ["ml"], "ed": []}, {"bo": "gpu-training"})
    assert p.sentences() == [
        "2 users lose gpu-training.",
        "2 users gain big.",
        "1 running server keeps its limits until it stops.",
        "Removed 1 role: gpu-training.",
        "Added 1 role: big.",
        "Added 1 image: r.",
        "Changed 1 image: py.",
        "Added the GPU-hour budget of the group ml.",
        "Budget periods start at midnight in Europe/Paris, not UTC.",
    ]
    assert p.running == (RunningServer("bo", "gpu-training", lost=True),)


def test_a_preview_of_the_same_table_says_nothing_changes():
    table = parse_quota_table(TABLE, "q.yaml")
    assert preview(table, table, {"ada": [], "bo": ["ml"]}, {"bo": "small"}).sentences() == [
        "Nothing changes for anyone."]


def test_one_user_gains_a_role_through_a_group():
    old = parse_quota_table(TABLE, "q.yaml")
    new = parse_quota_table(TABLE.replace("  users:", "    cs: [gpu-training]\n  users:"),
                            "q.yaml")
    p = preview(old, new, {"zoe": ["cs"], "yan": []})
    assert p.gains == {"gpu-training": ("zoe",)} and p.losses == {"small": ("zoe",)}
    assert p.sentences() == ["1 user loses small.", "1 user gains gpu-training."]


# --- saves ------------------------------------------------------------------------------


def test_a_valid_save_applies_and_the_hub_sees_the_new_table(table_path, audit):
    store = QuotaStore(str(table_path))
    assert store.get(LOG).roles["small"].memory == 2 * 2**30
    file = TableFile(table_path)
    text, version = file.read()
    assert (text, version) == (TABLE, version_of(TABLE.encode()))
    result = file.save(EDITED, version, "admin-ann", "more memory for small", audit)
    assert result.saved and result.outcome == SAVED
    assert result.message == "Saved; the hub uses it from the next spawn."
    assert table_path.read_text() == EDITED
    assert result.version == version_of(EDITED.encode()) == file.read()[1]
    assert "-    memory: 2G\n+    memory: 4G\n" in result.diff
    assert (table_path.stat().st_mode & 0o777) == 0o640
    assert store.get(LOG).roles["small"].memory == 4 * 2**30
    assert store.get(LOG).groups["ml"] == ("small",)
    assert leftovers(table_path.parent) == []


def test_an_invalid_table_is_refused_with_its_line_and_nothing_is_written(table_path, audit):
    before = table_path.read_bytes()
    file = TableFile(table_path)
    result = file.save(TABLE.replace("cpus: 8", "cpus: eight"), file.read()[1], "admin-ann",
                       "a typo", audit)
    assert result.outcome == INVALID and not result.saved
    assert result.message == "The table has 1 problem; nothing was written."
    assert [str(p) for p in result.problems] == [
        f"{table_path}:11: role 'gpu-training': cpus must be a number, like 2 or 0.5, "
        "not text 'eight'"]
    assert table_path.read_bytes() == before
    assert result.version == version_of(before)
    assert audit.versions(str(table_path)) == []
    assert leftovers(table_path.parent) == []


def test_a_table_the_hubs_gpus_cannot_hold_is_refused(table_path, audit):
    file = TableFile(table_path, gpus=GpuCapacity(1))
    result = file.save(EDITED, file.read()[1], "admin-ann", "more memory", audit)
    assert result.outcome == INVALID
    assert [p.line for p in result.problems] == [13]
    assert table_path.read_text() == TABLE


@pytest.mark.parametrize("comment", ["", "   \n"])
def test_a_save_without_a_comment_is_refused(table_path, audit, comment):
    file = TableFile(table_path)
    result = file.save(EDITED, file.read()[1], "admin-ann", comment, audit)
    assert result.outcome == NO_COMMENT
    assert result.message == ("Say why you change the table: the comment is required; "
                              "nothing was written.")
    assert table_path.read_text() == TABLE
    assert audit.versions(str(table_path)) == []


def test_a_save_without_who_is_a_bug(table_path, audit):
    with pytest.raises(ValueError):
        TableFile(table_path).save(EDITED, version_of(TABLE.encode()), "", "why", audit)


def test_the_same_text_again_writes_nothing(table_path, audit):
    file = TableFile(table_path)
    result = file.save(TABLE, file.read()[1], "admin-ann", "nothing", audit)
    assert result.outcome == UNCHANGED
    assert audit.versions(str(table_path)) == []


def test_two_admins_at_once_the_second_is_refused_with_the_diff(table_path, audit):
    ann, bob = TableFile(table_path), TableFile(table_path)
    ann_text, v1 = ann.read()
    bob_text, bob_v1 = bob.read()
    assert v1 == bob_v1
    first = ann.save(EDITED, v1, "admin-ann", "small needs 4G", audit)
    assert first.saved
    bobs = TABLE.replace("cpus: 1", "cpus: 2")
    second = bob.save(bobs, bob_v1, "admin-bob", "small needs 2 cpus", audit)
    assert second.outcome == CONFLICT and not second.saved
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(audit.latest(str(table_path)).at))
    assert second.message == (f"The table was changed by admin-ann at {when} since you opened "
                              "it; nothing was written. Apply your edit to the current version.")
    assert table_path.read_text() == EDITED  # ann's save stands
    assert second.version == first.version
    assert second.current_text == EDITED and second.base_text == TABLE
    # what ann changed since bob opened it, then what bob's text would undo and do
    assert second.diff.startswith("--- a/quotas.yaml (yours)\n+++ b/quotas.yaml (current)\n")
    assert "-    memory: 2G\n+    memory: 4G\n" in second.diff
    assert "-    ml: [small, gpu-training]\n+    ml: [small]\n" in second.diff
    assert "-    cpus: 1\n-    memory: 4G\n+    cpus: 2\n+    memory: 2G\n" in second.yours
    assert [v.who for v in audit.versions(str(table_path))] == ["admin-ann", BEFORE_EDITOR]


def test_a_conflict_after_an_edit_outside_the_editor_uses_the_text_the_admin_gives(
        table_path, audit):
    file = TableFile(table_path)
    _, v1 = file.read()
    table_path.write_text(EDITED)  # over SSH: the trail has no row for either version
    result = file.save(TABLE.replace("cpus: 1", "cpus: 2"), v1, "admin-bob", "why", audit)
    assert result.outcome == CONFLICT and result.base_text is None and result.diff == ""
    assert "changed since you opened it" in result.message  # nobody known to name
    result = file.save(TABLE.replace("cpus: 1", "cpus: 2"), v1, "admin-bob", "why", audit,
                       base_text=TABLE)
    assert result.base_text == TABLE and "+    memory: 4G\n" in result.diff
    assert table_path.read_text() == EDITED


def test_concurrent_saves_from_threads_let_exactly_one_through(table_path, audit):
    _, v1 = TableFile(table_path).read()
    results = []

    def save(n: int) -> None:
        text = TABLE.replace("cpus: 1", f"cpus: {n + 2}")
        results.append(TableFile(table_path).save(text, v1, f"admin-{n}", "race", audit))

    threads = [threading.Thread(target=save, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.outcome for r in results) == [CONFLICT] * 5 + [SAVED]
    [winner] = [r for r in results if r.saved]
    assert version_of(table_path.read_bytes()) == winner.version
    assert len(audit.versions(str(table_path))) == 2  # the baseline and the one save


def test_a_save_waits_for_another_process_holding_the_lock_file(table_path, audit):
    # flock locks belong to an open file: this handle stands for another process's save
    lock_path = table_path.parent / ".quotas.yaml.lock"
    done = threading.Event()
    with open(lock_path, "a+b") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        file = TableFile(table_path)
        version = file.read()[1]
        saver = threading.Thread(target=lambda: (
            file.save(EDITED, version, "admin-ann", "why", audit), done.set()))
        saver.start()
        assert not done.wait(0.3)
        assert table_path.read_text() == TABLE
        fcntl.flock(other.fileno(), fcntl.LOCK_UN)
    saver.join(5)
    assert done.is_set() and table_path.read_text() == EDITED


def test_a_symlinked_table_is_replaced_where_it_lives(tmp_path, audit):
    real = tmp_path / "etc" / "quotas.yaml"
    real.parent.mkdir()
    real.write_text(TABLE)
    link = tmp_path / "quotas.yaml"
    link.symlink_to(real)
    file = TableFile(link)
    assert file.save(EDITED, file.read()[1], "admin-ann", "why", audit).saved
    assert link.is_symlink() and real.read_text() == EDITED


def test_a_failed_write_records_nothing(table_path, audit, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    file = TableFile(table_path)
    with pytest.raises(OSError):
        file.save(EDITED, file.read()[1], "admin-ann", "why", audit)
    assert table_path.read_text() == TABLE
    assert audit.versions(str(table_path)) == []
    assert leftovers(table_path.parent) == []


# --- the audit trail and restores -------------------------------------------------------


def test_the_audit_trail_keeps_who_when_why_the_diff_and_the_sha(table_path, audit):
    mtime = table_path.stat().st_mtime
    file = TableFile(table_path)
    start = time.time()
    saved = file.save(EDITED, file.read()[1], "admin-ann", "small needs 4G", audit)
    end = time.time()
    new, baseline = audit.versions(str(table_path))
    assert baseline.who == BEFORE_EDITOR
    assert baseline.comment == "the table as it was before the editor's first save"
    assert (baseline.text, baseline.sha256) == (TABLE, version_of(TABLE.encode()))
    assert baseline.at == mtime and baseline.diff == "" and baseline.restored_from is None
    assert new.id == saved.audit_id and new.path == str(table_path)
    assert (new.who, new.comment, new.text) == ("admin-ann", "small needs 4G", EDITED)
    assert new.sha256 == saved.version == version_of(EDITED.encode())
    assert start <= new.at <= end
    assert new.diff == saved.diff
    assert new.diff.startswith("--- a/quotas.yaml\n+++ b/quotas.yaml\n")
    assert audit.version(new.id) == new
    assert audit.versions(str(table_path), limit=1) == [new]
    assert audit.version(999) is None


def test_an_edit_outside_the_editor_is_recorded_before_the_next_save(table_path, audit):
    file = TableFile(table_path)
    assert file.save(EDITED, file.read()[1], "admin-ann", "4G", audit).saved
    over_ssh = EDITED.replace("cpus: 8", "cpus: 6")
    table_path.write_text(over_ssh)
    third = over_ssh.replace("cpus: 1", "cpus: 2")
    assert file.save(third, file.read()[1], "admin-bob", "2 cpus", audit).saved
    latest, outside, _, _ = audit.versions(str(table_path))
    assert (outside.who, outside.text) == (OUTSIDE_EDITOR, over_ssh)
    assert "-    cpus: 8\n+    cpus: 6\n" in outside.diff
    assert (latest.who, latest.text) == ("admin-bob", third)
    assert "-    cpus: 1\n+    cpus: 2\n" in latest.diff


def test_restore_of_an_old_version_goes_through_save(table_path, audit):
    file = TableFile(table_path)
    file.save(EDITED, file.read()[1], "admin-ann", "4G", audit)
    baseline = audit.versions(str(table_path))[-1]
    result = audit.restore(baseline.id, "admin-bob", "back to 2G", file)
    assert result.saved
    assert table_path.read_text() == TABLE
    restored = audit.version(result.audit_id)
    assert (restored.who, restored.comment, restored.restored_from) == (
        "admin-bob", "back to 2G", baseline.id)
    assert restored.text == TABLE and "+    memory: 2G\n" in restored.diff
    assert QuotaStore(str(table_path)).get(LOG).roles["small"].memory == 2 * 2**30


def test_restore_needs_a_comment_and_the_version_the_admin_saw(table_path, audit):
    file = TableFile(table_path)
    _, v1 = file.read()
    file.save(EDITED, v1, "admin-ann", "4G", audit)
    baseline = audit.versions(str(table_path))[-1]
    assert audit.restore(baseline.id, "admin-bob", "", file).outcome == NO_COMMENT
    refused = audit.restore(baseline.id, "admin-bob", "undo", file, base_version=v1)
    assert refused.outcome == CONFLICT
    assert table_path.read_text() == EDITED
    assert audit.restore(baseline.id, "admin-bob", "undo", file).outcome == SAVED


def test_a_version_that_no_longer_validates_is_not_restored(table_path, audit):
    # saved when the hub had 2 GPUs; it has one now, and gpu-training asks for 2
    file = TableFile(table_path)
    file.save(EDITED, file.read()[1], "admin-ann", "4G", audit)
    one_gpu = EDITED.replace("gpus: 2", "gpus: 1")
    now = TableFile(table_path, gpus=GpuCapacity(1))
    assert now.save(one_gpu, now.read()[1], "admin-ann", "one GPU left", audit).saved
    old = audit.versions(str(table_path))[1]
    assert old.text == EDITED
    result = audit.restore(old.id, "admin-bob", "undo", now)
    assert result.outcome == INVALID
    assert [str(p) for p in result.problems] == [
        f"{table_path}:13: role 'gpu-training': gpus is 2, but this hub has only 1 GPU"]
    assert table_path.read_text() == one_gpu
    assert len(audit.versions(str(table_path))) == 3


def test_restore_of_an_unknown_version_or_another_tables_is_refused(table_path, audit):
    other = table_path.parent / "other.yaml"
    other.write_text(TABLE)
    other_file = TableFile(other)
    other_file.save(EDITED, other_file.read()[1], "admin-ann", "4G", audit)
    theirs = audit.versions(str(other))[0]
    file = TableFile(table_path)
    for version_id in (theirs.id, 999):
        result = audit.restore(version_id, "admin-bob", "why", file)
        assert result.outcome == NOT_FOUND
        assert result.message == f"There is no version {version_id} of this table."
    assert table_path.read_text() == TABLE
    assert audit.versions(str(table_path)) == []


# --- the ledger's migration -------------------------------------------------------------


def test_upgrading_a_ledger_from_0001_to_0002_keeps_its_sessions(tmp_path):
    path = tmp_path / "usage.sqlite"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "0001")
    with engine.begin() as connection:
        assert current_revision(connection) == "0001"
        connection.execute(sessions.insert().values(
            hub="hub-a", user_name="ada", container="jupyter-ada", role="small",
            cpu_limit=1.0, mem_limit=2**31, requested=100.0))
    engine.dispose()
    ledger = Ledger(f"sqlite:///{path}", LOG)
    with ledger.engine.connect() as connection:
        assert current_revision(connection) == head_revision()  # 0002 or later
        assert connection.execute(select(sessions.c.user_name, sessions.c.role)).all() == [
            ("ada", "small")]
        assert connection.execute(select(table_versions)).all() == []
    assert (tmp_path / "usage.sqlite.0001.bak").exists()
    audit = Audit(ledger.engine)
    table = tmp_path / "quotas.yaml"
    table.write_text(TABLE)
    file = TableFile(table)
    assert file.save(EDITED, file.read()[1], "admin-ann", "4G", audit).saved
    assert len(audit.versions(str(table))) == 2
    ledger.dispose()
