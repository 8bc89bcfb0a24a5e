"""The documents the processes share (spawner/usage/documents.py) as rows of the ledger's database
(spawner/usage/documents.py), and as a state folder's files without one.
tests/service/test_state_docs_postgres.py runs the same on PostgreSQL."""

from __future__ import annotations

import json
import threading

import pytest

from spawner.usage.documents import (
    BUDGET_MEMORY,
    GPU_USAGE,
    GPUS,
    PREEMPTIONS,
    DatabaseDocuments,
    FolderDocuments,
)


def test_a_document_is_replaced_whole_and_kept_per_hub_kind_and_node(ledger):
    hub = DatabaseDocuments(ledger.engine, "hub-1")
    assert hub.read(GPUS) is None and hub.read_all(GPU_USAGE) == []
    hub.write(GPUS, '{"version": 1, "n": 1}')
    hub.write(GPUS, '{"version": 1, "n": 2}')
    hub.write(PREEMPTIONS, "[]")
    hub.write(GPU_USAGE, '{"node": "b"}', node="gpu-b")
    hub.write(GPU_USAGE, '{"node": "a"}', node="gpu-a")
    assert json.loads(hub.read(GPUS).text) == {"version": 1, "n": 2}
    assert hub.read(PREEMPTIONS).text == "[]" and hub.read(BUDGET_MEMORY) is None
    assert [(d.node, d.text) for d in hub.read_all(GPU_USAGE)] == [
        ("gpu-a", '{"node": "a"}'), ("gpu-b", '{"node": "b"}')]
    assert hub.read(GPU_USAGE, node="gpu-b").text == '{"node": "b"}'
    assert hub.read(GPU_USAGE) is None  # no row of the hub's own ("" node)
    other = DatabaseDocuments(ledger.engine, "hub-2")
    assert other.read(GPUS) is None and other.read_all(GPU_USAGE) == []
    assert hub.read(GPUS).time > 0


def test_odd_names_and_text_are_kept_as_they_are(ledger):
    hub = DatabaseDocuments(ledger.engine, "hub'; DROP TABLE state_documents; --")
    text = json.dumps({"user": "o'brien <b>\u00e9\u4e2d", "big": "x" * 200_000})
    hub.write(GPU_USAGE, text, node="n" * 253)
    assert hub.read(GPU_USAGE, node="n" * 253).text == text
    with pytest.raises(ValueError, match="253"):
        hub.write(GPU_USAGE, text, node="n" * 254)


def test_without_a_row_the_state_folder_file_is_read(ledger, tmp_path):
    """A hub's files from before its upgrade, or a watchdog without a ledger."""
    folder = FolderDocuments(str(tmp_path))
    folder.write(PREEMPTIONS, '[{"container": "quota-a"}]')
    folder.write(GPU_USAGE, '{"version": 1}')
    hub = DatabaseDocuments(ledger.engine, "hub-1", fallback=folder)
    assert hub.read(PREEMPTIONS).text == '[{"container": "quota-a"}]'
    assert [d.text for d in hub.read_all(GPU_USAGE)] == ['{"version": 1}']
    hub.write(PREEMPTIONS, "[]")  # from the first write on, the database's
    assert hub.read(PREEMPTIONS).text == "[]"
    assert DatabaseDocuments(ledger.engine, "hub-1").read(PREEMPTIONS).text == "[]"


def test_folder_documents_are_files_written_atomically(tmp_path):
    folder = FolderDocuments(str(tmp_path))
    assert folder.read(GPUS) is None and folder.read_all(GPUS) == []
    folder.write(GPUS, "{}")
    assert (tmp_path / GPUS.file).read_text() == "{}"
    assert [d.text for d in folder.read_all(GPUS)] == ["{}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [GPUS.file]  # no temporary left


def test_concurrent_writers_of_one_row_and_of_many_lose_nothing(ledger):
    """The hub and two watchdogs write at once, each its own row, and two writers the same
    row: every write lands or is replaced by a later one, and none deadlocks."""
    errors: list[BaseException] = []

    def writer(node: str, kind, n: int) -> None:
        rows = DatabaseDocuments(ledger.engine, "hub-1")
        try:
            for i in range(n):
                rows.write(kind, json.dumps({"node": node, "i": i}), node=node)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=args) for args in (
        ("gpu-a", GPU_USAGE, 40), ("gpu-b", GPU_USAGE, 40), ("", GPUS, 40), ("", GPUS, 40))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    rows = DatabaseDocuments(ledger.engine, "hub-1")
    assert {d.node: json.loads(d.text)["i"] for d in rows.read_all(GPU_USAGE)} == {
        "gpu-a": 39, "gpu-b": 39}
    assert json.loads(rows.read(GPUS).text)["i"] == 39
