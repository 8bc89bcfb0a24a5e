"""Hot reload keeps the last good table when an edit is invalid."""

import logging
from pathlib import Path

import pytest

from spawner.quota import store as store_module
from spawner.quota.model import Problem, QuotaTableError
from spawner.quota.store import QuotaStore

GOOD = Path(__file__).resolve().parents[2] / "hub_config" / "quotas.yaml"


def test_reload_and_keep_last_good(tmp_path, caplog):
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD.read_text())
    store = QuotaStore(str(path))
    log = logging.getLogger("test")
    assert store.get(log).roles["pipeline"].cpus == 1

    path.write_text(GOOD.read_text().replace("cpus: 1\n    memory: 2G\n    images: [pytorch]",
                                             "cpus: 3\n    memory: 2G\n    images: [pytorch]"))
    assert store.get(log).roles["pipeline"].cpus == 3  # same size edits are seen too

    path.write_text(GOOD.read_text().replace("cpus: 8", "cpus: eight"))
    with caplog.at_level(logging.ERROR):
        table = store.get(log)
    assert table.roles["pipeline"].cpus == 3
    assert f"{path}:" in caplog.text and "cpus must be a number" in caplog.text
    assert store.problems

    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        table = store.get(log)  # the same bad content: one short line, not the problems again
    assert table.roles["pipeline"].cpus == 3
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        f"Quota table {path} still has {len(store.problems)} problem(s); using the last good "
        "table loaded at "
    )
    assert "cpus must be a number" not in caplog.text


def test_no_good_table_ever(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("images: [")
    with pytest.raises(QuotaTableError):
        QuotaStore(str(path)).get(logging.getLogger("test"))


def test_store_is_shared_per_path(tmp_path):
    a = QuotaStore.for_path(str(tmp_path / "q.yaml"))
    assert QuotaStore.for_path(str(tmp_path / "." / "q.yaml")) is a


def _line_of(path: Path, text: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if text in t)


def test_an_inf_edit_is_logged_with_its_line_and_the_last_good_table_stays(tmp_path, caplog):
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD.read_text())
    store = QuotaStore(str(path))
    log = logging.getLogger("test")
    good = store.get(log)
    path.write_text(GOOD.read_text().replace("memory: 16G", "memory: .inf", 1))
    with caplog.at_level(logging.INFO):
        assert store.get(log) is good
    line = _line_of(path, "memory: .inf")
    assert f"{path}:{line}: role 'senior-engineer': memory must be a finite size, not .inf" in (
        caplog.text
    )
    assert [str(p) for p in store.problems] == [
        f"{path}:{line}: role 'senior-engineer': memory must be a finite size, not .inf"
    ]


def test_a_loader_exception_is_a_logged_problem(tmp_path, caplog, monkeypatch):
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD.read_text())
    store = QuotaStore(str(path))
    log = logging.getLogger("test")
    good = store.get(log)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(store_module, "load_quota_table", broken)
    path.write_text(GOOD.read_text().replace("cpus: 4", "cpus: 7", 1))
    with caplog.at_level(logging.INFO):
        assert store.get(log) is good
    assert store.problems == [
        Problem(str(path), 1, "could not read the quota table: RuntimeError: boom")
    ]
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"{path}:1: could not read the quota table: RuntimeError: boom" in error.getMessage()
    assert "keeping the last good table" in error.getMessage()
    assert error.exc_info and error.exc_info[0] is RuntimeError  # the traceback is logged

    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert store.get(log) is good
    assert [r.levelno for r in caplog.records] == [logging.WARNING]

    monkeypatch.undo()
    path.write_text(GOOD.read_text().replace("cpus: 4", "cpus: 6", 1))
    assert store.get(log).roles["senior-engineer"].cpus == 6
    assert store.problems == []


def test_a_loader_exception_with_no_good_table_is_a_quota_table_error(tmp_path, monkeypatch):
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD.read_text())
    monkeypatch.setattr(store_module, "load_quota_table",
                        lambda *a, **k: 1 / 0)
    with pytest.raises(QuotaTableError) as info:
        QuotaStore(str(path)).get(logging.getLogger("test"))
    assert str(info.value) == (
        f"{path}:1: could not read the quota table: ZeroDivisionError: division by zero"
    )


def test_a_missing_file_is_logged_once_then_one_line(tmp_path, caplog):
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD.read_text())
    store = QuotaStore(str(path))
    log = logging.getLogger("test")
    good = store.get(log)
    path.unlink()
    with caplog.at_level(logging.INFO):
        assert store.get(log) is good
        assert store.get(log) is good
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING]
    assert "cannot read the file" in caplog.records[0].getMessage()
    path.write_text(GOOD.read_text())
    assert store.get(log) is not good  # back: read again
    assert store.problems == []
