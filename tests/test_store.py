"""Hot reload keeps the last good table when an edit is invalid."""

import logging
from pathlib import Path

import pytest

from spawner.quota import QuotaTableError
from spawner.store import QuotaStore

GOOD = Path(__file__).resolve().parent.parent / "hub_config" / "quotas.yaml"


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
    store.get(log)  # the same bad content is not logged again
    assert caplog.text == ""


def test_no_good_table_ever(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("images: [")
    with pytest.raises(QuotaTableError):
        QuotaStore(str(path)).get(logging.getLogger("test"))


def test_store_is_shared_per_path(tmp_path):
    a = QuotaStore.for_path(str(tmp_path / "q.yaml"))
    assert QuotaStore.for_path(str(tmp_path / "." / "q.yaml")) is a
